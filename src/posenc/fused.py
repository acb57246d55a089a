"""The encoder layer's inference fast path: the same sums as
:meth:`posenc.EncoderLayer.forward`, with fewer passes over memory.

With autograd off, each residual block ``x + W h + b`` starts its output buffer as ``x + b``
and lets the GEMM accumulate ``W h`` into it (``addmm_``), and the feed-forward's ReLU runs
inside the up-projection's GEMM (``torch._addmm_activation``, the kernel that torch's own
``TransformerEncoderLayer`` fast path uses). That saves a full read and write of the
activations per sublayer; the benchmark suite ``posenc bench encoder`` measures it against
``torch.nn.TransformerEncoder``. Training never comes here: these kernels record no autograd.

Dimension legend: ``b`` batch, ``n`` sequence, ``D`` model width, ``F`` feed-forward width.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

#: ``torch._addmm_activation`` (bias + GEMM + ReLU in one kernel), present since torch 1.13.
_FUSED_RELU = hasattr(torch, "_addmm_activation")


def encoder_layer(
    layer: Any,
    x: Tensor,
    *,
    positions: Tensor | None,
    key_padding_mask: Tensor | None,
    pe: Any,
    state: Any,
) -> Tensor:
    """One :class:`~posenc.EncoderLayer` (``layer``) applied to ``x`` ``(b, n, D)`` without
    autograd and without active dropout; the other arguments as for its ``forward``."""
    attn, ffn = layer.attn, layer.ffn
    if state is None:
        state = attn.state_for(x, positions, pe)

    def attention(h: Tensor, residual: Tensor) -> Tensor:  # residual + attn(h)
        heads, _ = attn.attend(h, state, key_padding_mask=key_padding_mask)
        return residual_linear(attn.out, heads, residual).view(x.shape)

    def feed_forward(h: Tensor, residual: Tensor) -> Tensor:  # residual + ffn(h)
        if ffn.activation == "relu" and _FUSED_RELU:
            flat = h.reshape(-1, h.shape[-1])  # (b·n, D)
            hidden = torch._addmm_activation(ffn.up.bias, flat, ffn.up.weight.t())  # (b·n, F)
        else:
            hidden = ffn.act(ffn.up(h))
        return residual_linear(ffn.down, hidden, residual).view(x.shape)

    if layer.norm_first:
        x = attention(layer.norm1(x), x)
        return feed_forward(layer.norm2(x), x)
    x = layer.norm1(attention(x, x))
    return layer.norm2(feed_forward(x, x))


def residual_linear(linear: nn.Linear, h: Tensor, residual: Tensor) -> Tensor:
    """``residual + linear(h)`` as one GEMM into a buffer that starts as ``residual + bias``.

    Shapes: h ``(..., Din)``, residual ``(..., Dout)``; returns ``(tokens, Dout)``, a fresh
    contiguous buffer.
    """
    out = residual + linear.bias if linear.bias is not None else residual.clone()
    out = out.reshape(-1, out.shape[-1])  # (tokens, Dout)
    return out.addmm_(h.reshape(-1, h.shape[-1]), linear.weight.t())
