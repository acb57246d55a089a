"""Inkling's relative bias against transformers 5.24's ``Inkling2RelativePositionBias`` (a global
layer with its log-position temperature, and a local one) with the weights copied, values
``(b, h, i, j)`` and gradients in float32; with ``clip=None`` against x-transformers 2.31's
``RelativeProjPositionalBias``; and against the formula written out in float64."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close
from transformers.models.inkling2.configuration_inkling2 import Inkling2TextConfig
from transformers.models.inkling2.modeling_inkling2 import Inkling2RelativePositionBias
from x_transformers.x_transformers import RelativeProjPositionalBias

import posenc
from posenc.encodings.bias.inkling import Inkling
from tests.misuse import MISSING, Misuse, cases, check

D, H, R, EXTENT, N = 16, 2, 4, 5, 9


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    error = (got.detach().double() - want.detach().double()).abs().max()
    return float(error / want.detach().double().abs().max())


@pytest.mark.parametrize("log_scaling", [True, False])
def test_inkling_matches_transformers_values_and_gradients(log_scaling: bool) -> None:
    config = Inkling2TextConfig(
        hidden_size=D,
        d_rel=R,
        rel_l2_clip_threshold=0.3,  # small: some heads' states are clipped, some are not
        log_scaling_alpha=0.5,
        log_scaling_n_floor=3,  # the temperature grows from position 2 on
    )
    torch.manual_seed(0)
    peer = Inkling2RelativePositionBias(config, H, EXTENT, log_scaling)
    with torch.no_grad():
        peer.proj.normal_()
        peer.norm.scale.uniform_(0.2, 2.0)
    pe = Inkling(
        D, H, extent=EXTENT, states=R, clip=0.3, log_scaling=log_scaling,
        log_scaling_alpha=0.5, log_scaling_n_floor=3,
    )  # fmt: skip
    pe.load_state_dict(
        {"linear.weight": peer.linear.weight, "scale": peer.norm.scale, "proj": peer.proj}
    )
    x = torch.randn(2, N, D, requires_grad=True)
    positions = torch.arange(N)
    distance = positions[:, None] - positions[None, :]
    want = peer(x, distance, positions[None].expand(2, N))
    got = pe.bias(positions, positions, x=x)
    assert got.shape == want.shape == (2, H, N, N)
    assert _relative_error(got, want) <= 2e-5
    weight = torch.randn(2, H, N, N)
    ours = torch.autograd.grad((got * weight).sum(), [x, pe.linear.weight, pe.scale, pe.proj])
    theirs = torch.autograd.grad(
        (want * weight).sum(), [x, peer.linear.weight, peer.norm.scale, peer.proj]
    )
    for a, b in zip(ours, theirs, strict=True):
        assert _relative_error(a, b) <= 2e-5


def test_inkling_without_clip_matches_x_transformers() -> None:
    torch.manual_seed(1)
    peer = RelativeProjPositionalBias(D, H, num_distance_basis=R, max_dist=EXTENT)
    pe = Inkling(D, H, extent=EXTENT, states=R, clip=None, linear_bias=True)
    linear = peer.to_distance_weights[0]
    pe.load_state_dict(
        {
            "linear.weight": linear.weight,
            "linear.bias": linear.bias,
            "scale": torch.ones(H, R),
            "proj": peer.distance_bank,
        }
    )
    x = torch.randn(2, 3, D, requires_grad=True)
    # three new queries after four cached keys, as x-transformers places them
    got = pe.bias(torch.arange(4, 7), torch.arange(7), x=x)
    want = peer(x, seq_len_k=7)
    assert _relative_error(got, want) <= 2e-5
    ours = torch.autograd.grad(got.square().sum(), [x, pe.proj])
    theirs = torch.autograd.grad(want.square().sum(), [x, peer.distance_bank])
    for a, b in zip(ours, theirs, strict=True):
        assert _relative_error(a, b) <= 2e-5


def test_inkling_follows_its_formula() -> None:
    """``[clip(s ⊙ W x_i) τ(p_i)]ᵀ P[:, p_i - p_j]`` for ``0 ≤ p_i - p_j < R``, entry by entry."""
    torch.manual_seed(2)
    pe = Inkling(D, H, extent=3, states=R, clip=0.5, log_scaling=True,
                 log_scaling_alpha=0.2, log_scaling_n_floor=2).double()  # fmt: skip
    with torch.no_grad():
        pe.proj.normal_()
    x = torch.randn(1, 4, D, dtype=torch.float64)
    qp, kp = torch.tensor([0, 2, 3, 7]), torch.tensor([0, 1, 2, 3, 6, 7])
    got = pe.bias(qp, kp, x=x)
    w, s, p = pe.linear.weight, pe.scale, pe.proj
    for h in range(H):
        for a, i in enumerate(qp.tolist()):
            v = s[h] * (w[h * R : (h + 1) * R] @ x[0, a])
            v = v * min(1.0, 0.5 / (float(v.norm()) + 1e-6))
            v = v * (1 + 0.2 * math.log(max((i + 1) / 2, 1.0)))
            for c, j in enumerate(kp.tolist()):
                want = float(v @ p[:, i - j]) if 0 <= i - j < 3 else 0.0
                assert abs(float(got[0, h, a, c]) - want) <= 1e-12


def test_a_cached_decode_equals_one_forward() -> None:
    torch.manual_seed(0)
    model = posenc.Encoder(D, 2, H, pe="inkling", causal=True, pe_kwargs={"extent": 3}).eval()
    x = torch.randn(2, 8, D)
    with torch.no_grad():
        full = model(x)
        cache = posenc.KVCache()
        out = torch.cat([model(s, cache=cache) for s in (x[:, :5], x[:, 5:6], x[:, 6:])], 1)
    assert_close(out, full, atol=2e-5, rtol=1e-4)


MISUSE = [
    Misuse("extent", lambda: Inkling(4, 2, extent=0), ValueError, "extent", 0),
    Misuse("clip", lambda: Inkling(4, 2, clip=-1.0), ValueError, "clip", -1.0),
    Misuse("alpha", lambda: Inkling(4, 2, log_scaling_alpha="a"), TypeError, "log_scaling_alpha",
           "str"),
    Misuse("no-x", lambda: Inkling(4, 2).bias(torch.arange(3), torch.arange(3)), ValueError,
           "x=", MISSING),
    Misuse("x-shape", lambda: Inkling(4, 2).bias(torch.arange(3), torch.arange(3),
                                                 x=torch.randn(1, 2, 4)), ValueError, "x",
           (1, 2, 4)),
    Misuse("fractional", lambda: Inkling(4, 2).bias(torch.tensor([0.5]), torch.arange(3),
                                                    x=torch.randn(1, 1, 4)), ValueError,
           "q_positions", 0.5),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_bad_input_is_a_clear_error(case: Misuse) -> None:
    check(case)
