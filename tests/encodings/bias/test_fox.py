"""FoX (Lin et al. 2025) against x-transformers 2.31's ``DataDependentAlibi`` with the weights
copied (causal and bidirectional; bias and gradients, float32), against the sum of log forget
gates written out in float64 pair by pair, and through attention: the flex score_mod of a
cached step, a KV cache against one forward, and the StreamingCache refused by name."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close
from x_transformers.x_transformers import DataDependentAlibi

import posenc
from posenc.encodings.bias.fox import FoX
from tests.encodings.bias.scores import on_grid
from tests.misuse import MISSING, Misuse, cases, check

D, H, N = 12, 3, 7


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    error = (got.detach().double() - want.detach().double()).abs().max()
    return float(error / want.detach().double().abs().max())


def _pair(causal: bool, seed: int = 0) -> tuple[FoX, DataDependentAlibi]:
    torch.manual_seed(seed)
    peer = DataDependentAlibi(D, H, causal=causal, bias_init=0.5, post_log_scale=1.5)
    pe = FoX(D, H, causal=causal, bias_init=0.5, post_log_scale=1.5)
    linear = peer.to_forget_gates[0]
    pe.load_state_dict({"gate.weight": linear.weight, "gate.bias": linear.bias})
    return pe, peer


@pytest.mark.parametrize("causal", [True, False])
def test_fox_matches_x_transformers_values_and_gradients(causal: bool) -> None:
    pe, peer = _pair(causal)
    x = torch.randn(2, N, D, requires_grad=True)
    got = pe.bias(torch.arange(N), torch.arange(N), x=x)
    want = peer(x)
    assert got.shape == want.shape == (2, H, N, N)
    assert _relative_error(got, want) <= 2e-5
    weight = torch.randn(2, H, N, N)
    ours = torch.autograd.grad((got * weight).sum(), [x, pe.gate.weight, pe.gate.bias])
    linear = peer.to_forget_gates[0]
    theirs = torch.autograd.grad((want * weight).sum(), [x, linear.weight, linear.bias])
    for a, b in zip(ours, theirs, strict=True):
        assert _relative_error(a, b) <= 2e-5


def _formula(pe: FoX, x: torch.Tensor) -> torch.Tensor:
    """``Σ_{l=j+1..i} s·log σ(w_h·x_l + b_h)`` for ``j ≤ i``, and the backward gates' sum over
    ``l = i+1..j`` for ``j > i``, one entry at a time in float64."""
    w, bias = pe.gate.weight.double(), pe.gate.bias.double()
    b, n, _ = x.shape
    out = torch.zeros(b, pe.num_heads, n, n, dtype=torch.float64)
    for r in range(b):
        for h in range(pe.num_heads):
            for i in range(n):
                for j in range(n):
                    row, span = (h, range(j + 1, i + 1)) if j <= i else (h + pe.num_heads, [])
                    if j > i and not pe.causal:
                        span = range(i + 1, j + 1)
                    elif j > i:  # a causal FoX's F_i - F_j past the query: minus the gates
                        row, span = h, range(i + 1, j + 1)
                    total = sum(
                        math.log(1 / (1 + math.exp(-float(w[row] @ x[r, t].double() + bias[row]))))
                        for t in span
                    )
                    sign = -1.0 if (pe.causal and j > i) else 1.0
                    out[r, h, i, j] = sign * pe.post_log_scale * total
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_fox_follows_the_sum_of_log_forget_gates(causal: bool) -> None:
    pe = FoX(D, H, causal=causal, bias_init=0.3, post_log_scale=0.7).double()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    got = pe.bias(torch.arange(5), torch.arange(5), x=x)
    assert_close(got, _formula(pe, x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_a_cached_steps_score_mod_equals_its_bias(causal: bool) -> None:
    """Two new queries against five keys: the sums of the queries are the last two."""
    pe = FoX(D, H, causal=causal).double()
    gates = pe.log_gates(torch.randn(2, 5, D, dtype=torch.float64))
    qp, kp = torch.arange(3, 5), torch.arange(5)
    want = pe.bias(qp, kp, gates=gates)
    full = pe.bias(kp, kp, gates=gates)
    assert_close(want, full[:, :, 3:])
    got = on_grid(pe.score_mod(qp, kp, gates=gates), 2, H, 2, 5)
    assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("window", [None, 3])
def test_a_kv_cache_equals_one_forward_across_layers(window: int | None) -> None:
    torch.manual_seed(0)
    model = posenc.Encoder(D, 2, H, pe="fox", causal=True, window=window).eval()
    x = torch.randn(2, 9, D)
    with torch.no_grad():
        full = model(x)
        cache = posenc.KVCache()
        steps = [x[:, :4], x[:, 4:5], x[:, 5:8], x[:, 8:]]
        out = torch.cat([model(step, cache=cache) for step in steps], dim=1)
    assert _relative_error(out, full) <= 2e-5


def test_fox_refuses_a_streaming_cache_by_name() -> None:
    model = posenc.Encoder(D, 1, H, pe="fox", causal=True)
    with pytest.raises(posenc.errors.PosencValueError, match="fox cannot join a StreamingCache"):
        model(torch.randn(1, 3, D), cache=posenc.StreamingCache(sink_tokens=1, window=2))


MISUSE = [
    Misuse("dim", lambda: FoX(0, 2), ValueError, "dim", 0),
    Misuse("causal", lambda: FoX(4, 2, causal="yes"), TypeError, "causal", "str"),
    Misuse("bias-init", lambda: FoX(4, 2, bias_init="5"), TypeError, "bias_init", "str"),
    Misuse("no-x", lambda: FoX(4, 2).bias(torch.arange(3), torch.arange(3)), ValueError, "x=",
           MISSING),
    Misuse("x-width", lambda: FoX(4, 2).bias(torch.arange(3), torch.arange(3),
                                             x=torch.randn(1, 3, 5)), ValueError, "x", (1, 3, 5)),
    Misuse("x-length", lambda: FoX(4, 2).bias(torch.arange(3), torch.arange(3),
                                              x=torch.randn(1, 4, 4)), ValueError, "keys",
           "4 tokens"),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_bad_input_is_a_clear_error(case: Misuse) -> None:
    check(case)
