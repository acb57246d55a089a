"""The relative-distance bias schemes of ``posenc.encodings.bias.relative`` against their papers'
equations (float64 transcriptions, written out pair by pair) and against x-transformers'
dynamic position bias: KERPLE (Chi et al. 2022), FIRE (Li et al. 2023), dynamic position
bias, Shaw et al. 2018 and Transformer-XL (Dai et al. 2019)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close
from x_transformers.x_transformers import DynamicPositionBias as XDynamicPositionBias

from posenc.encodings.bias.relative import FIRE, KERPLE, DynamicPositionBias
from posenc.encodings.bias.relative_qk import ShawRelativeBias, TransformerXLRelativeBias
from tests.misuse import MISSING, Misuse, cases, check

NAN, INF = float("nan"), float("inf")


# --------------------------------------------------------------------------- KERPLE


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_kerple_formula(kernel: str) -> None:
    pe = KERPLE(3, kernel=kernel).double()  # type: ignore[arg-type]
    with torch.no_grad():
        pe.r1.copy_(
            torch.tensor([0.5, 1.7, 0.001], dtype=torch.float64)
        )  # the last is clamped to eps = 0.01
        pe.r2.copy_(torch.tensor([0.3, 1.9, 2.5], dtype=torch.float64))  # power clamps 2.5 to 2
    pos = torch.arange(6)
    got = pe.bias(pos, pos, q=torch.zeros(1, 3, 6, 2, dtype=torch.float64))
    want = torch.empty(3, 6, 6, dtype=torch.float64)
    r1s, r2s = [0.5, 1.7, 0.01], [0.3, 1.9, 2.5 if kernel == "log" else 2.0]
    for h in range(3):
        for i in range(6):
            for j in range(6):
                r1, r2, dist = r1s[h], r2s[h], abs(i - j)
                want[h, i, j] = -r1 * (math.log(1 + r2 * dist) if kernel == "log" else dist**r2)
    assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_kerple_power_gradient_is_finite_at_zero_distance() -> None:
    pe = KERPLE(2, kernel="power")
    pe.bias(torch.arange(4), torch.arange(4)).sum().backward()
    assert torch.isfinite(pe.r2.grad).all() and pe.r2.grad.abs().sum() > 0


# --------------------------------------------------------------------------- FIRE


def test_fire_formula() -> None:
    pe = FIRE(2, mlp_dim=5, c=0.7, threshold=3.0).double()
    qp, kp = torch.arange(2, 8), torch.arange(0, 8)
    got = pe.bias(qp, kp)
    w1, b1 = pe.mlp[0].weight[:, 0].tolist(), pe.mlp[0].bias.tolist()
    w2, b2 = pe.mlp[2].weight.tolist(), pe.mlp[2].bias.tolist()

    c, L = pe.c.item(), pe.threshold.item()

    def psi(x: float) -> float:
        return math.log(c * x + 1)

    want = torch.empty(2, 6, 8, dtype=torch.float64)
    for a, i in enumerate(qp.tolist()):
        for b, j in enumerate(kp.tolist()):
            x = math.copysign(psi(abs(i - j)), i - j) / psi(max(L, i))  # paper for j <= i
            hidden = [max(0.0, w * x + c) for w, c in zip(w1, b1, strict=True)]
            for h in range(2):
                want[h, a, b] = sum(w * z for w, z in zip(w2[h], hidden, strict=True)) + b2[h]
    assert_close(got, want, rtol=1e-12, atol=1e-13)


# --------------------------------------------------------------------------- DPB


@pytest.mark.parametrize("log_distance", [False, True])
def test_dpb_matches_x_transformers(log_distance: bool) -> None:
    # norm=False only: x-transformers' first-layer norm is bias-less, its later ones are not
    norm = False
    pe = DynamicPositionBias(3, mlp_dim=16, depth=2, log_distance=log_distance, norm=norm)
    peer = XDynamicPositionBias(16, heads=3, depth=2, log_distance=log_distance, norm=norm)
    ours_params, peer_params = list(pe.parameters()), list(peer.parameters())
    assert [p.shape for p in ours_params] == [p.shape for p in peer_params]
    with torch.no_grad():
        for mine, theirs in zip(ours_params, peer_params, strict=True):
            theirs.copy_(mine)
        want = peer(11, 11)  # (h, i, j)
    got = pe.bias(torch.arange(11), torch.arange(11))
    assert_close(got, want, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- bad input


def _shaw_bias(**kw: object) -> object:
    return ShawRelativeBias(2, 4).bias(torch.arange(3), torch.arange(3), **kw)


MISUSE = [
    Misuse("kerple-heads-negative", lambda: KERPLE(-1), ValueError, "num_heads", -1),
    Misuse("kerple-kernel", lambda: KERPLE(2, kernel="exp"), ValueError, "kernel", "exp"),
    Misuse("kerple-eps-nan", lambda: KERPLE(2, eps=NAN), ValueError, "eps", NAN),
    Misuse("kerple-positions-nan",
           lambda: KERPLE(2).bias(torch.tensor([0.0, NAN]), torch.arange(2)), ValueError,
           "q_positions", NAN),
    Misuse("fire-heads-zero", lambda: FIRE(0), ValueError, "num_heads", 0),
    Misuse("fire-c-nan", lambda: FIRE(2, c=NAN), ValueError, "c", NAN),
    Misuse("fire-threshold-zero", lambda: FIRE(2, threshold=0), ValueError, "threshold", 0.0),
    Misuse("fire-positions-nan",
           lambda: FIRE(2).bias(torch.tensor([0.0, NAN]), torch.arange(2)), ValueError,
           "q_positions", NAN),
    Misuse("dpb-heads-zero", lambda: DynamicPositionBias(0), ValueError, "num_heads", 0),
    Misuse("dpb-depth-zero", lambda: DynamicPositionBias(2, depth=0), ValueError, "depth", 0),
    Misuse("dpb-positions-inf",
           lambda: DynamicPositionBias(2).bias(torch.tensor([0.0, INF]), torch.arange(2)),
           ValueError, "q_positions", INF),
    Misuse("shaw-heads-zero", lambda: ShawRelativeBias(0, 4), ValueError, "num_heads", 0),
    Misuse("shaw-max-distance-zero", lambda: ShawRelativeBias(2, 4, max_distance=0),
           ValueError, "max_distance", 0),
    Misuse("shaw-no-q", lambda: _shaw_bias(), ValueError, "q=", MISSING),
    Misuse("shaw-q-heads", lambda: _shaw_bias(q=torch.randn(1, 3, 3, 4)), ValueError, "q",
           (1, 3, 3, 4)),
    Misuse("shaw-q-list", lambda: _shaw_bias(q=[1.0]), TypeError, "q", "list"),
    Misuse("shaw-q-int", lambda: _shaw_bias(q=torch.ones(1, 2, 3, 4, dtype=torch.long)),
           TypeError, "q", torch.int64),
    Misuse("shaw-q-length", lambda: _shaw_bias(q=torch.randn(1, 2, 4, 4)), ValueError,
           "q has", 4),
    Misuse("shaw-value-term-without-values",
           lambda: ShawRelativeBias(2, 4).value_term(torch.rand(1, 2, 3, 3), torch.arange(3),
                                                     torch.arange(3)),
           ValueError, "value_term", "values=True"),
    Misuse("xl-heads-zero", lambda: TransformerXLRelativeBias(0, 4), ValueError, "num_heads", 0),
    Misuse("xl-base-one", lambda: TransformerXLRelativeBias(2, 4, base=1.0), ValueError, "base",
           1.0),
    Misuse("xl-rel-dim-zero", lambda: TransformerXLRelativeBias(2, 4, rel_dim=0), ValueError,
           "rel_dim", 0),
    Misuse("xl-no-k",
           lambda: TransformerXLRelativeBias(2, 4).bias(torch.arange(3), torch.arange(3),
                                                        q=torch.randn(1, 2, 3, 4)),
           ValueError, "k=", MISSING),
    Misuse("xl-q-length",
           lambda: TransformerXLRelativeBias(2, 4).bias(torch.arange(3), torch.arange(3),
                                                        q=torch.randn(1, 2, 4, 4),
                                                        k=torch.randn(1, 2, 3, 4)),
           ValueError, "q has", 4),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse_names_the_argument_and_the_value(case: Misuse) -> None:
    check(case)
