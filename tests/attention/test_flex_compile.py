"""Compiled flex attention compiles a bounded number of times: lengths are symbolic after
the first change (``torch.compile(dynamic=None)``, keyed by heads and head sizes, never by
length), so an evaluation at several lengths, or a run whose batches vary in length, compiles
each kernel at most twice. Counted with dynamo's own counters; checked on the CPU, where flex
compiles with dynamic shapes too (and each compilation takes seconds to minutes, hence slow)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.utils import counters
from torch.testing import assert_close

import posenc
from posenc.attention import flex


@pytest.mark.slow
@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_four_lengths_compile_at_most_twice(name: str) -> None:
    torch.manual_seed(0)
    flex.flex_cache_clear()
    torch._dynamo.reset()
    pe = posenc.build_for_model(name, 32, 4)
    fused = posenc.MultiHeadAttention(32, 4, pe=pe, causal=True, backend="flex").eval()
    exact = posenc.MultiHeadAttention(32, 4, pe=pe, causal=True, backend="math").eval()
    exact.load_state_dict(fused.state_dict())
    counters.clear()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a failed compilation would fall back
        for n in (128, 200, 256, 384):
            x = torch.randn(1, n, 32)
            out = fused(x)
            assert fused.last_backend == "flex"
            assert_close(out, exact(x), rtol=1e-5, atol=1e-5)
    assert 1 <= counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])
    flex.flex_cache_clear()
    torch._dynamo.reset()
