"""PoPE (Gopalakrishnan et al. 2025) against x-transformers 2.31's ``PolarEmbedding`` and
``apply_polar_pos_emb`` with the same phases, against its score written out in float64, and
x-transformers' ``Attention(polar_pos_emb=...)`` against posenc's ``MultiHeadAttention`` with
the weights copied: values and gradients."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close
from x_transformers.x_transformers import Attention, PolarEmbedding, apply_polar_pos_emb

import posenc
from posenc.encodings.rotary.pope import PoPE
from tests.misuse import Misuse, cases, check

H, D, N = 3, 8, 11


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    error = (got.detach().double() - want.detach().double()).abs().max()
    return float(error / want.detach().double().abs().max())


def _pair(seed: int = 0) -> tuple[PoPE, PolarEmbedding]:
    """posenc's PoPE and x-transformers' with the same random phases (some outside the clamp)."""
    torch.manual_seed(seed)
    peer = PolarEmbedding(D, H)  # its bias_uniform_init=True fails (in-place on a leaf)
    with torch.no_grad():
        peer.learned_bias.uniform_(-2.0 * math.pi, 0.0)
        peer.learned_bias[0, 0, :2] = torch.tensor([0.5, -7.0])  # clamped to 0 and -2π
    pe = PoPE(D, H)
    with torch.no_grad():
        pe.phase.copy_(peer.learned_bias[:, 0, :])
    return pe, peer


def test_pope_matches_x_transformers_values_and_gradients() -> None:
    pe, peer = _pair()
    torch.manual_seed(1)
    q = torch.randn(2, H, N, D, requires_grad=True)
    k = torch.randn(2, H, N, D, requires_grad=True)
    v = torch.randn(2, H, N, D)
    positions = torch.tensor([0, 1, 2, 5, 6, 7, 9, 12, 13, 20, 31])

    ours_q, ours_k = pe(q, k, positions)
    freqs, bias = peer(positions)
    theirs_q, theirs_k = apply_polar_pos_emb(q, freqs), apply_polar_pos_emb(k, freqs + bias)
    assert ours_q.shape == ours_k.shape == (2, H, N, 2 * D)
    # the keys carry no phase here (x-transformers' keys at δ = 0)
    assert _relative_error(ours_k, apply_polar_pos_emb(k, freqs)) <= 2e-5
    # the scores: posenc's attention divides by sqrt(2D), x-transformers' by sqrt(D)
    ours_s = ours_q @ ours_k.transpose(-1, -2) / math.sqrt(2 * D)
    theirs_s = theirs_q @ theirs_k.transpose(-1, -2) / math.sqrt(D)
    assert _relative_error(ours_s, theirs_s) <= 2e-5
    ours_o, theirs_o = ours_s.softmax(-1) @ v, theirs_s.softmax(-1) @ v
    assert _relative_error(ours_o, theirs_o) <= 2e-5

    weight = torch.randn_like(ours_o)
    ours_g = torch.autograd.grad((ours_o * weight).sum(), [q, k, pe.phase])
    theirs_g = torch.autograd.grad((theirs_o * weight).sum(), [q, k, peer.learned_bias])
    for ours, theirs in zip(ours_g, theirs_g, strict=True):
        assert _relative_error(ours, theirs.view_as(ours)) <= 2e-5
    assert torch.equal(ours_g[2][0, :2], torch.zeros(2))  # clamped entries learn nothing


def test_pope_score_follows_the_formula_in_float64() -> None:
    pe, _ = _pair(2)
    pe = pe.double()
    q, k = (
        torch.randn(1, H, 4, D, dtype=torch.float64),
        torch.randn(1, H, 4, D, dtype=torch.float64),
    )
    positions = torch.tensor([[0.0, 3.5, 4.0, 100.0]])
    ours_q, ours_k = pe(q, k, positions)
    got = ours_q @ ours_k.transpose(-1, -2) / math.sqrt(2 * D)  # as attention scales it
    delta = pe.phase.detach().clamp(-2 * math.pi, 0)
    want = torch.empty(1, H, 4, 4, dtype=torch.float64)
    for h in range(H):
        for i in range(4):
            for j in range(4):
                m, n = float(positions[0, i]), float(positions[0, j])
                want[0, h, i, j] = sum(
                    math.log1p(math.exp(q[0, h, i, c]))
                    * math.log1p(math.exp(k[0, h, j, c]))
                    * math.cos((m - n) * 10000.0 ** (-c / D) - float(delta[h, c]))
                    for c in range(D)
                ) / math.sqrt(D)
    assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_pope_attention_matches_x_transformers_attention(causal: bool) -> None:
    """x-transformers' ``Attention`` with ``polar_pos_emb`` and posenc's
    ``MultiHeadAttention(pe=PoPE)``, the same projections: outputs and every gradient."""
    pe, peer = _pair(3)
    torch.manual_seed(4)
    theirs = Attention(H * D, dim_head=D, heads=H, causal=causal)
    ours = posenc.MultiHeadAttention(H * D, H, pe=pe, causal=causal, bias=False, backend="math")
    with torch.no_grad():
        ours.qkv.weight.copy_(
            torch.cat([theirs.to_q.weight, theirs.to_k.weight, theirs.to_v.weight])
        )
        ours.out.weight.copy_(theirs.to_out.weight)
    x = torch.randn(2, N, H * D, requires_grad=True)
    got = ours(x)
    want = theirs(x, polar_pos_emb=peer(torch.arange(N)))
    assert _relative_error(got, want) <= 2e-5
    weight = torch.randn_like(got)
    ours_g = torch.autograd.grad((got * weight).sum(), [x, ours.qkv.weight, pe.phase])
    theirs_w = [theirs.to_q.weight, theirs.to_k.weight, theirs.to_v.weight]
    theirs_g = torch.autograd.grad((want * weight).sum(), [x, *theirs_w, peer.learned_bias])
    assert _relative_error(ours_g[0], theirs_g[0]) <= 2e-5
    assert _relative_error(ours_g[1], torch.cat(theirs_g[1:4])) <= 2e-5
    assert _relative_error(ours_g[2], theirs_g[4][:, 0]) <= 2e-5


def test_pope_position_state_equals_forward_and_grouped_keys_take_no_phase() -> None:
    pe, _ = _pair(5)
    q, k = torch.randn(2, H, N, D), torch.randn(2, 1, N, D)  # one key head for three queries
    positions = torch.stack([torch.arange(N), torch.arange(N) + 7])
    want = pe(q, k, positions)
    got = pe.position_state(positions, torch.zeros(2, N, H * D))(q, k)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert got[1].shape == (2, 1, N, 2 * D)
    # bf16: fp32 arithmetic on the bf16 values and phases, one rounding of each output
    half = PoPE(D, H).to(torch.bfloat16)
    with torch.no_grad():
        half.phase.copy_(pe.phase)
    assert half.inv_freq.dtype == torch.float64
    exact = PoPE(D, H)
    with torch.no_grad():
        exact.phase.copy_(half.phase.float())
    q16, k16 = q.bfloat16(), k.bfloat16()
    for got16, want32 in zip(
        half(q16, k16, positions), exact(q16.float(), k16.float(), positions), strict=True
    ):
        assert got16.dtype == torch.bfloat16
        assert torch.equal(got16, want32.detach().bfloat16())


def test_pope_build_and_repr() -> None:
    pe = posenc.build_for_model("pope", 32, 4, uniform_phase=True)
    assert (pe.head_dim, pe.num_heads) == (8, 4)
    assert pe.phase.shape == (4, 8)
    assert bool((pe.phase <= 0).all()) and bool((pe.phase >= -2 * math.pi).all())
    assert not bool((PoPE(8, 2).phase != 0).any())
    assert repr(PoPE(8, 2)) == "PoPE(head_dim=8, num_heads=2)"
    assert "phase" in PoPE(8, 2).state_dict() and "inv_freq" not in PoPE(8, 2).state_dict()


MISUSE = [
    Misuse("dim-zero", lambda: PoPE(0, 2), ValueError, "head_dim", 0),
    Misuse("heads-float", lambda: PoPE(8, 2.0), TypeError, "num_heads", 2.0),
    Misuse("base-neg", lambda: PoPE(8, 2, base=-1.0), ValueError, "base", -1.0),
    Misuse("uniform-str", lambda: PoPE(8, 2, uniform_phase="y"), TypeError, "uniform_phase", "str"),
    Misuse(
        "q-heads",
        lambda: PoPE(8, 2)(torch.zeros(1, 3, 4, 8), torch.zeros(1, 3, 4, 8)),
        ValueError,
        "num_heads",
        3,
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse_names_the_argument_and_the_value(case: Misuse) -> None:
    check(case)
