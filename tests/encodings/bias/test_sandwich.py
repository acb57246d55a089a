"""Sandwich (Chi et al. 2023) against its formula written out in float64, pair by pair, and
against NeMo's ``SandwichRelativePositionEmbedding`` transcribed in float64 (NeMo is not
installed: its forward is a few tensor lines, restated here)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.encodings.bias.sandwich import Sandwich
from tests.encodings.bias.scores import on_grid
from tests.misuse import Misuse, cases, check


def _formula(qp: list[float], kp: list[float], heads: int, d: int, base: float) -> torch.Tensor:
    """``(sum_{k=1}^{d/2} cos((i - j) / base^(2k/d)) - d/2) / (8h/H)``, one entry at a time."""
    out = torch.empty(heads, len(qp), len(kp), dtype=torch.float64)
    for h in range(1, heads + 1):
        for a, i in enumerate(qp):
            for b, j in enumerate(kp):
                s = sum(math.cos((i - j) / base ** (2 * k / d)) for k in range(1, d // 2 + 1))
                out[h - 1, a, b] = (s - d / 2) / (8 * h / heads)
    return out


def _nemo(query_length: int, key_length: int, heads: int, hidden_size: int) -> torch.Tensor:
    """NeMo's forward (bidirectional), float64: the relative positions ``j - i`` of the last
    ``query_length`` queries, ``(1, H, nq, nk)``."""
    n = max(query_length, key_length)
    context, memory = torch.arange(n)[:, None], torch.arange(n)[None, :]
    relative = (memory - context)[-query_length:, -key_length:].double()
    inv_freq = 1.0 / (
        10000 ** (2 * torch.arange(1, hidden_size / 2 + 1, dtype=torch.float64) / hidden_size)
    )
    bias = (relative[:, :, None].repeat(1, 1, len(inv_freq)) * inv_freq).cos().sum(2)
    bias = bias.repeat(heads, 1, 1)
    scales = torch.arange(1, heads + 1, 1, dtype=torch.float64)[:, None, None]
    return ((bias - hidden_size / 2) / (scales * 8 / heads)).unsqueeze(0)


@pytest.mark.parametrize(("heads", "head_dim", "base"), [(4, 16, 10000.0), (3, 8, 500.0)])
def test_sandwich_follows_the_formula(heads: int, head_dim: int, base: float) -> None:
    pe = Sandwich(heads, head_dim, base=base)
    qp, kp = [0.0, 2.5, 7.0, 40.0], [1.0, 3.0, 4.0, 9.5, 300.0]
    q = torch.zeros(1, heads, 4, head_dim, dtype=torch.float64)
    got = pe.bias(torch.tensor(qp), torch.tensor(kp), q=q)
    want = _formula(qp, kp, heads, head_dim, base)
    assert_close(got, want, rtol=0, atol=1e-12)
    got32 = pe.bias(torch.tensor(qp), torch.tensor(kp))  # the module's float32
    assert got32.dtype == torch.float32
    assert (got32.double() - want).abs().max() / want.abs().max() <= 2e-5


@pytest.mark.parametrize(("nq", "nk"), [(9, 9), (1, 12), (5, 12)])
def test_sandwich_matches_nemo(nq: int, nk: int) -> None:
    pe = Sandwich(8, 64)
    want = _nemo(nq, nk, 8, 64)[0]
    # NeMo's queries are the last nq of nk positions
    got = pe.bias(torch.arange(nk - nq, nk), torch.arange(nk))
    assert (got.double() - want).abs().max() / want.abs().max() <= 2e-5
    got64 = pe.bias(torch.arange(nk - nq, nk), torch.arange(nk), q=want)
    assert_close(got64, want, rtol=0, atol=1e-12)


def test_sandwich_score_mod_equals_bias_and_long_distances_keep_float64() -> None:
    pe = Sandwich(4, 32)
    pos = torch.tensor([[0, 1, 2, 3, 4], [5000, 5001, 5002, 9000, 20000]])
    q = torch.zeros(2, 4, 5, 32)
    want = pe.bias(pos, pos, q=q)
    got = on_grid(pe.score_mod(pos, pos, q=q), 2, 4, 5, 5).float()
    assert torch.equal(got, want)
    exact = torch.stack([_formula(row.tolist(), row.tolist(), 4, 32, 1e4) for row in pos])
    assert (want.double() - exact).abs().max() / exact.abs().max() <= 2e-6
    frac = torch.tensor([0.0, 0.5, 2.25])
    assert pe.score_mod(frac, frac) is None  # no finite table: attention materialises the bias


def test_sandwich_for_model_and_repr() -> None:
    pe = posenc.build_for_model("sandwich", 32, 4)
    assert (pe.num_heads, pe.head_dim) == (4, 8)
    assert repr(pe) == "Sandwich(num_heads=4, head_dim=8)"
    assert "base=500" in repr(Sandwich(2, 4, base=500))


MISUSE = [
    Misuse("heads-zero", lambda: Sandwich(0, 8), ValueError, "num_heads", 0),
    Misuse("dim-odd", lambda: Sandwich(2, 7), ValueError, "head_dim", 7),
    Misuse("dim-float", lambda: Sandwich(2, 8.0), TypeError, "head_dim", 8.0),
    Misuse("base-zero", lambda: Sandwich(2, 8, base=0), ValueError, "base", 0),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse_names_the_argument_and_the_value(case: Misuse) -> None:
    check(case)
