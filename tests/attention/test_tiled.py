"""The ``tiled`` backend (:mod:`posenc.attention.tiled`): SDPA per tile of queries, each tile
making its rows of a learned bias and dropping them. Forced on the CPU (``backend="tiled"``),
its outputs and the gradients of q, k, v and of the bias's parameters equal float64 math
attention written out here; at most one tile's bias is made at a time, in the forward and
again in the backward."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.attention import tiled
from posenc.attention.backends import AttentionCall, tiled_backend
from tests.host_reads import host_reads

B, H, N, D = 2, 2, 7, 4
LEARNED = ["t5", "kerple", "dpb", "fire"]


def _pe(name: str) -> posenc.BiasEncoding:
    torch.manual_seed(0)
    pe = posenc.build_for_model(name, H * D, H)
    with torch.no_grad():  # (T5's table starts near zero: make its buckets tell apart)
        for p in pe.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return pe


def _attention64(q, k, v, bias, allowed):  # type: ignore[no-untyped-def]
    """softmax(q kᵀ / sqrt(d) + bias) v in float64, masked where ``allowed`` is False."""
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    scores = scores.masked_fill(~allowed, -math.inf)
    return scores.softmax(-1) @ v.double()


@pytest.mark.parametrize("name", LEARNED)
@pytest.mark.parametrize("padded", [False, True], ids=["causal", "causal+padding"])
def test_tiles_equal_float64_attention_with_gradients(
    name: str, padded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tiled, "TILE_ELEMENTS", B * H * 2 * N)  # tiles of 2 queries
    pe = _pe(name)
    pe64 = copy.deepcopy(pe).double()
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, N, D, generator=gen, requires_grad=True) for _ in range(3))
    padding = None
    allowed = torch.ones(N, N, dtype=torch.bool).tril().expand(B, 1, N, N)
    if padded:  # the last two keys of row 1
        padding = torch.zeros(B, N, dtype=torch.bool)
        padding[1, -2:] = True
        allowed = allowed & ~padding.view(B, 1, 1, N)
    state = pe.position_state(None, torch.zeros(B, N, H * D))
    call = AttentionCall(batch=B, nq=N, state=state, causal=True, key_padding_mask=padding)
    out, _ = tiled_backend(q, k, v, call)
    assert out is not None
    positions = torch.arange(N)
    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = _attention64(*leaves64, pe64.bias(positions, positions), allowed)
    assert_close(out.double(), want, atol=2e-6, rtol=1e-5)
    weight = torch.randn(B, H, N, D, generator=gen)
    (out * weight).sum().backward()
    (want * weight.double()).sum().backward()
    for got, ref in zip((q, k, v), leaves64, strict=True):
        assert_close(got.grad.double(), ref.grad, atol=1e-5, rtol=1e-5)
    for (pname, p), p64 in zip(pe.named_parameters(), pe64.parameters(), strict=True):
        assert p.grad is not None, pname
        assert_close(p.grad.double(), p64.grad, atol=1e-5, rtol=1e-4, msg=pname)


@pytest.mark.parametrize("name", LEARNED)
def test_tiles_after_a_cache_equal_float64_attention(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk of 3 queries after a cached prompt of 5 (the causal mask offset by the cache),
    one query per tile: the output and every parameter's gradient equal the float64 math
    backend's."""
    monkeypatch.setattr(tiled, "TILE_ELEMENTS", 1)
    torch.manual_seed(0)
    attn = posenc.MultiHeadAttention(H * D, H, pe=_pe(name), causal=True, backend="tiled")
    ref = copy.deepcopy(attn).double()
    ref.backend = posenc.attention.backends.Backend.MATH
    x = torch.randn(B, 8, H * D, generator=torch.Generator().manual_seed(2))
    outs = []
    for module, dtype in ((attn, torch.float32), (ref, torch.float64)):
        cache = posenc.KVCache()
        with torch.no_grad():
            module(x[:, :5].to(dtype), cache=cache)
        out = module(x[:, 5:].to(dtype), cache=cache)
        out.square().sum().backward()
        outs.append(out)
    assert attn.last_backend == "tiled" and ref.last_backend == "math"
    assert_close(outs[0].double(), outs[1], atol=1e-5, rtol=1e-5)
    for (pname, p), p64 in zip(attn.named_parameters(), ref.parameters(), strict=True):
        assert_close(p.grad.double(), p64.grad, atol=1e-4, rtol=1e-4, msg=pname)


def test_at_most_one_tile_of_bias_is_made_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every bias the tiled backend makes holds at most its budget of elements (3 query rows
    here), the forward makes one per tile and the backward makes each again (none is kept)."""
    n, rows = 10, 3
    budget = B * H * rows * n
    monkeypatch.setattr(tiled, "TILE_ELEMENTS", budget)
    pe = _pe("dpb")
    made: list[tuple[int, ...]] = []
    real = type(pe).bias

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        bias = real(self, *args, **kwargs)
        made.append(tuple(bias.shape))
        return bias

    monkeypatch.setattr(type(pe), "bias", counted)
    attn = posenc.MultiHeadAttention(H * D, H, pe=pe, causal=True, backend="tiled")
    x = torch.randn(B, n, H * D, requires_grad=True)
    out = attn(x)
    forward = list(made)
    out.sum().backward()
    tiles = math.ceil(n / rows)
    assert [shape[-2] for shape in forward] == [3, 3, 3, 1]
    assert len(made) == 2 * tiles  # each tile's bias made again by its backward
    assert max(math.prod(shape) * (B if len(shape) == 3 else 1) for shape in made) <= budget
    assert x.grad is not None and pe.mlp[0].weight.grad is not None


def test_tile_rows_fit_the_budget() -> None:
    assert tiled.tile_rows(2, 16, 4096, 4096, budget=2**26) == 512
    assert tiled.tile_rows(1, 16, 100, 10**9, budget=2**26) == 1  # at least one row
    assert tiled.tile_rows(1, 1, 5, 5, budget=2**26) == 5  # at most every row


@pytest.mark.parametrize("name", LEARNED)
def test_a_tiled_training_step_reads_nothing_on_the_host(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forward and backward through tiles (3 query rows each) read no value on the host."""
    monkeypatch.setattr(tiled, "TILE_ELEMENTS", B * H * 3 * N)
    attn = posenc.MultiHeadAttention(H * D, H, pe=_pe(name), causal=True, backend="tiled")
    x = torch.randn(B, N, H * D)
    with host_reads(monkeypatch) as calls:
        attn(x).square().mean().backward()
    assert attn.last_backend == "tiled"
    assert calls == [], calls


def test_tiles_with_grouped_heads_and_sinks_equal_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    """One key/value head for two query heads and learned sinks, in tiles of 2 queries:
    output and gradients equal the float64 math backend's."""
    monkeypatch.setattr(tiled, "TILE_ELEMENTS", B * H * 2 * N)
    torch.manual_seed(3)
    attn = posenc.MultiHeadAttention(
        H * D, H, num_kv_heads=1, pe=_pe("kerple"), causal=True, sinks=True, backend="tiled"
    )
    with torch.no_grad():
        attn.sinks.normal_()
    ref = copy.deepcopy(attn).double()
    ref.backend = posenc.attention.backends.Backend.MATH
    x = torch.randn(B, N, H * D, generator=torch.Generator().manual_seed(4))
    got, want = attn(x), ref(x.double())
    assert attn.last_backend == "tiled"
    assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    got.square().sum().backward()
    want.square().sum().backward()
    for (pname, p), p64 in zip(attn.named_parameters(), ref.parameters(), strict=True):
        assert_close(p.grad.double(), p64.grad, atol=1e-4, rtol=1e-4, msg=pname)
