"""Learned-table biases train on every path attention routes them to (issue #43 item 3):
T5, KERPLE, DPB and FIRE, through the math backend, SDPA with the bias materialised (what a
GPU trains them on: ``choose_backend``'s row for a learned table) and flex with the scheme's
``score_mod`` (what inference runs, and what an explicit ``backend="flex"`` trains on), give
the output and the gradients of the scheme's parameters of a float64 reference: attention
written out here with each scheme's bias transcribed from its paper (T5's buckets from
transformers).

flex_attention refuses a backward on the CPU, compiled or eager; the flex path here runs
flex's eager reference forward (torch's ``math_attention``, what ``flex_attention`` computes
on the CPU: the ``score_mod`` and ``mask_mod`` evaluated on every pair) with posenc's
``score_mod``, block mask and scale, and lets autograd differentiate it. Compiled flex's
backward on CUDA is left to the GPU script."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.testing import assert_close
from transformers.models.t5.modeling_t5 import T5Attention

import posenc
from posenc.attention import flex
from posenc.attention import module as attention_module
from posenc.attention.backends import Backend

B, N, DIM, HEADS = 2, 7, 16, 4


def _distances() -> Tensor:
    """``i - j`` (query minus key), float64 ``(N, N)``."""
    i = torch.arange(N, dtype=torch.float64)
    return i.view(-1, 1) - i.view(1, -1)


def _t5(pe: posenc.T5RelativeBias) -> Tensor:
    relative = -_distances().long()  # key minus query
    buckets = T5Attention._relative_position_bucket(
        relative, bidirectional=pe.bidirectional, num_buckets=pe.num_buckets,
        max_distance=pe.max_distance,
    )  # fmt: skip
    return pe.relative_attention_bias.weight[buckets].permute(2, 0, 1)  # (h, N, N)


def _kerple(pe: posenc.KERPLE) -> Tensor:  # logarithmic: -r1 · log(1 + r2 · |i - j|)
    r1, r2 = pe.r1.clamp(min=pe.eps).view(-1, 1, 1), pe.r2.clamp(min=pe.eps).view(-1, 1, 1)
    return -r1 * torch.log(1 + r2 * _distances().abs())


def _dpb(pe: posenc.DynamicPositionBias) -> Tensor:  # an MLP of i - j, SiLU between layers
    x = _distances().unsqueeze(-1)  # (N, N, 1)
    linears = [layer for layer in pe.mlp if isinstance(layer, torch.nn.Linear)]
    for layer in linears[:-1]:
        x = x @ layer.weight.T + layer.bias
        x = x * torch.sigmoid(x)
    return (x @ linears[-1].weight.T + linears[-1].bias).permute(2, 0, 1)


def _fire(pe: posenc.FIRE) -> Tensor:  # f(sign(i - j) ψ(|i - j|) / ψ(max(L, i)))
    c, L = pe.c.abs(), pe.threshold.abs()

    def psi(t: Tensor) -> Tensor:
        return torch.log(c * t + 1)

    d = _distances()
    i = torch.arange(N, dtype=torch.float64).view(-1, 1)
    x = (torch.sign(d) * psi(d.abs()) / psi(torch.maximum(i, L)).clamp(min=1e-6)).unsqueeze(-1)
    hidden = torch.relu(x @ pe.mlp[0].weight.T + pe.mlp[0].bias)
    return (hidden @ pe.mlp[2].weight.T + pe.mlp[2].bias).permute(2, 0, 1)


FORMULAS: dict[str, Callable[..., Tensor]] = {
    "t5": _t5,
    "kerple": _kerple,
    "dpb": _dpb,
    "fire": _fire,
}


def _reference(attn: posenc.MultiHeadAttention, x: Tensor, weight: Tensor, name: str):  # type: ignore[no-untyped-def]
    """The loss's output and gradients (of the bias's parameters), float64, written out."""
    ref = copy.deepcopy(attn).double()
    h, d = ref.num_heads, ref.head_dim
    qkv = F.linear(x.double(), ref.qkv.weight, ref.qkv.bias).view(B, N, 3, h, d)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (b, h, n, d) each
    scores = q @ k.transpose(-2, -1) / math.sqrt(d) + FORMULAS[name](ref.pe)
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    heads = scores.masked_fill(~causal, -math.inf).softmax(-1) @ v  # (b, h, n, d)
    out = F.linear(heads.transpose(1, 2).reshape(B, N, h * d), ref.out.weight, ref.out.bias)
    loss = (out * weight.double()).sum()
    return out, torch.autograd.grad(loss, list(ref.pe.parameters()))


def _differentiable_flex(q, k, v, score_mod, block_mask, scale, *, lse):  # type: ignore[no-untyped-def]
    """flex_attention's eager forward on the CPU, without its refusal of a backward."""
    from torch._higher_order_ops.flex_attention import math_attention

    assert score_mod is not None and not lse and q.shape[1] == k.shape[1]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    out, _, _ = math_attention(q, k, v, score_mod, block_mask.as_tuple(), scale, {})
    return out


@pytest.mark.parametrize("path", ["math", "sdpa", "flex"])
@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_learned_table_gradients_equal_the_float64_formula(
    name: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    attn = posenc.MultiHeadAttention(DIM, HEADS, pe=name, causal=True, backend=path)
    attn.compile_flex = False
    if path == "flex":  # (the chooser sends CPU training to SDPA: flex's eager reference here)
        monkeypatch.setattr(attention_module, "choose_backend", lambda request: Backend.FLEX)
        monkeypatch.setattr(flex, "_flex", _differentiable_flex)
    x = torch.randn(B, N, DIM)
    weight = torch.randn(B, N, DIM)
    want_out, want_grads = _reference(attn, x, weight, name)
    out = attn(x)
    assert attn.last_backend == path
    (out * weight).sum().backward()
    assert_close(out.double(), want_out, rtol=1e-4, atol=1e-5)
    params = list(attn.pe.parameters())
    assert params and all(p.grad is not None for p in params)
    for param, want in zip(params, want_grads, strict=True):
        assert want.abs().max() > 0  # (every parameter's gradient reaches the loss)
        assert_close(param.grad.double(), want, rtol=1e-4, atol=1e-5)
