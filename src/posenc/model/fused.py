"""The encoder layer's inference fast path: its two residual steps computed with the same sums
as :meth:`posenc.EncoderLayer.residual_steps`, with fewer passes over memory. The layer's
topology (pre- or post-norm) is written once, in :meth:`posenc.EncoderLayer.apply_residual_steps`,
which takes either pair of steps; ``EncoderLayer.forward`` picks these outside autograd and
outside autocast (whose conversions the in-place GEMMs would escape).

With autograd off, each residual step ``x + W h + b`` starts its output buffer as ``x + b``
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


def residual_steps(
    layer: Any, state: Any, key_padding_mask: Tensor | None, context: Any = None
) -> tuple[Any, Any]:
    """The two residual steps of an :class:`~posenc.EncoderLayer` (``layer``) for inference,
    each ``(h, residual) -> residual + sublayer(h)`` as
    :meth:`~posenc.EncoderLayer.apply_residual_steps` takes them: the same sums as
    :meth:`~posenc.EncoderLayer.residual_steps`, for use without autograd, without active dropout
    and outside autocast. ``state`` is the encoding's
    position state and ``key_padding_mask`` the layer's mask, both already checked;
    ``context`` the forward's :class:`~posenc.sequence.context.SequenceContext` when it is cached or
    packed."""
    attn, ffn = layer.attn, layer.ffn

    def attention(h: Tensor, residual: Tensor) -> Tensor:  # residual + attn(h)
        heads, _ = attn.attend(h, state, key_padding_mask=key_padding_mask, context=context)
        return residual_linear(attn.out, heads, residual).view(residual.shape)

    def feed_forward(h: Tensor, residual: Tensor) -> Tensor:  # residual + ffn(h)
        if ffn.activation == "relu" and _FUSED_RELU and ffn.up.bias is not None:
            flat = h.reshape(-1, h.shape[-1])  # (b·n, D)
            hidden = torch._addmm_activation(ffn.up.bias, flat, ffn.up.weight.t())  # (b·n, F)
        else:
            hidden = ffn.hidden(h)
        return residual_linear(ffn.down, hidden, residual).view(residual.shape)

    return attention, feed_forward


def residual_linear(linear: nn.Linear, h: Tensor, residual: Tensor) -> Tensor:
    """``residual + linear(h)`` as one GEMM into a buffer that starts as ``residual + bias``.

    Shapes: h ``(..., Din)``, residual ``(..., Dout)``; returns ``(tokens, Dout)``, a fresh
    contiguous buffer.
    """
    out = residual + linear.bias if linear.bias is not None else residual.clone()
    out = out.reshape(-1, out.shape[-1])  # (tokens, Dout)
    return out.addmm_(h.reshape(-1, h.shape[-1]), linear.weight.t())
