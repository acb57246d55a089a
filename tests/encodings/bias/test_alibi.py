"""ALiBi (Press et al. 2022) against its paper's equations (float64 transcriptions, written
out pair by pair) and against the peers people run: Hugging Face BLOOM's, Falcon's and MPT's
ALiBi tensors."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close
from transformers.models.bloom.modeling_bloom import _get_alibi_slopes, build_alibi_tensor
from transformers.models.falcon.modeling_falcon import build_alibi_tensor as falcon_alibi_tensor
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor
from x_transformers.x_transformers import AlibiPositionalBias

from posenc.encodings.bias.alibi import ALiBi, alibi_slopes
from tests.encodings.bias.scores import on_grid
from tests.misuse import Misuse, cases, check


@pytest.mark.parametrize("num_heads", range(1, 65))
def test_alibi_slopes_match_bloom(num_heads: int) -> None:
    ours = ALiBi(num_heads).slopes
    bloom = _get_alibi_slopes(num_heads, torch.device("cpu"))
    assert ours.shape == (num_heads,)
    assert_close(ours.float(), bloom, rtol=1e-6, atol=0)
    # BLOOM's full tensor is slope * key position (softmax-equivalent to -slope * (i - j))
    alibi = build_alibi_tensor(torch.ones(1, 5), num_heads, torch.float32)  # (h, 1, 5)
    expected = ours.float().view(-1, 1, 1) * torch.arange(5.0).view(1, 1, 5)
    assert_close(alibi, expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("num_heads", [1, 2, 4, 8, 16, 32])
def test_alibi_slopes_power_of_two_follow_the_paper(num_heads: int) -> None:
    # Press et al. 2022, §3: the sequence starts at 2^(-8/n) with that same ratio
    expected = [2.0 ** (-8.0 * h / num_heads) for h in range(1, num_heads + 1)]
    assert_close(
        alibi_slopes(num_heads), torch.tensor(expected, dtype=torch.float64), rtol=1e-15, atol=0
    )


def test_alibi_slopes_other_counts_interleave_the_next_power() -> None:
    # 12 heads: the 8-head slopes, then 2^(-8h/16) for h = 1, 3, 5, 7 (paper's footnote)
    expected = [2.0 ** (-h) for h in range(1, 9)] + [2.0 ** (-h / 2) for h in (1, 3, 5, 7)]
    assert_close(alibi_slopes(12), torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("max_bias", [8, 4, 16, 6.5, 12])
@pytest.mark.parametrize("num_heads", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 32, 40, 64])
def test_alibi_max_bias_matches_mpt(num_heads: int, max_bias: float) -> None:
    """MPT's ``alibi_bias_max``: its slopes, and its bias ``m_h · (j - (L - 1))`` (one row,
    the last query, broadcast over the others), which is posenc's causal bias at query
    ``L - 1``; under a causal mask every row gives MPT's softmax."""
    n = 24
    mpt = build_mpt_alibi_tensor(num_heads, n, alibi_bias_max=max_bias)  # (h, 1, n) float32
    pe = ALiBi(num_heads, max_bias=max_bias, causal=True)
    # MPT computes the exponent and the power in float32: a few ulps from the float64 slopes
    assert_close(pe.slopes.float(), -mpt[:, 0, -2], rtol=1e-6, atol=0)
    assert_close(pe.bias(torch.tensor([n - 1]), torch.arange(n)), mpt, rtol=1e-6, atol=0)
    scores = torch.randn(num_heads, n, n, dtype=torch.float64)
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    ours = (scores + pe.bias(torch.arange(n), torch.arange(n), q=scores)).masked_fill(
        future, -math.inf
    )
    theirs = (scores + mpt.double()).masked_fill(future, -math.inf)
    # theirs carries MPT's float32 rounding of m * (j - (L - 1)) (~1e-6 at L = 24)
    assert_close(ours.softmax(-1), theirs.softmax(-1), rtol=1e-5, atol=1e-7)


def test_alibi_max_bias_default_is_the_paper_and_survives_casts() -> None:
    for num_heads in (1, 5, 8, 12, 64):
        assert torch.equal(alibi_slopes(num_heads, max_bias=8.0), alibi_slopes(num_heads))
    assert_close(
        alibi_slopes(4, max_bias=4.0),
        torch.tensor([2.0**-1, 2.0**-2, 2.0**-3, 2.0**-4], dtype=torch.float64),
    )
    pe = ALiBi(3, max_bias=4.0).to(torch.bfloat16)  # a cast rebuilds the slopes with max_bias
    assert_close(pe.slopes, alibi_slopes(3, max_bias=4.0), rtol=0, atol=0)
    assert "max_bias=4" in repr(pe) and "max_bias" not in repr(ALiBi(3))


# The peers form ALiBi as one row per head, m_h * j over key positions j (BLOOM, Falcon;
# softmax-equivalent to -m_h * (i - j)): posenc's causal bias at query position 0.
PEER_LENGTH = 1024


def _posenc_row(num_heads: int) -> torch.Tensor:
    pe = ALiBi(num_heads, causal=True)
    return pe.bias(torch.zeros(1, dtype=torch.long), torch.arange(PEER_LENGTH))[:, 0]  # (h, L)


@pytest.mark.parametrize("num_heads", [2, 3, 5, 8, 12, 32, 71])
def test_bloom_forms_alibi_in_float32_and_casts_to_the_model_dtype(num_heads: int) -> None:
    mask = torch.ones(1, PEER_LENGTH, dtype=torch.long)
    bloom32 = build_alibi_tensor(mask, num_heads, torch.float32).view(num_heads, -1)
    bloom16 = build_alibi_tensor(mask, num_heads, torch.bfloat16).view(num_heads, -1)
    assert torch.equal(bloom16, bloom32.to(torch.bfloat16))  # fp32, then one cast
    ours = _posenc_row(num_heads)
    assert_close(ours, bloom32, rtol=1e-6, atol=0)
    # BLOOM's float32 slopes (repeated float32 powers) are a few ulps off the exact ones, so
    # cast to bf16 a few entries land one bf16 step apart; none where its slopes are exact
    # powers of two (up to 8 heads).
    ours16 = ours.to(torch.bfloat16)
    steps = (ours16.float() - bloom16.float()).abs() / bloom16.float().abs().clamp_min(1e-30)
    assert steps.max() <= 2.0**-7
    if num_heads <= 8:
        assert torch.equal(ours16, bloom16)
    else:
        assert (ours16 != bloom16).float().mean() < 0.05


@pytest.mark.parametrize("num_heads", [3, 8, 12, 32, 71])
def test_falcon_forms_alibi_in_bfloat16_whatever_the_model_dtype(num_heads: int) -> None:
    mask = torch.ones(1, PEER_LENGTH, dtype=torch.long)
    falcon32 = falcon_alibi_tensor(mask, num_heads, torch.float32).view(num_heads, -1)
    falcon16 = falcon_alibi_tensor(mask, num_heads, torch.bfloat16).view(num_heads, -1)
    assert torch.equal(falcon32, falcon16.float())  # a float32 model gets the bf16 values
    ours = _posenc_row(num_heads)
    # bf16 rounding of slope, position and product: up to ~1% off, ~5 at position 1000
    error = (falcon32 - ours).abs()
    assert error.max() > 0.1
    assert (error / ours.abs().clamp_min(1e-30)).max() < 0.011
    if num_heads == 32:
        assert 4.0 < error.max() < 6.0
    # bit for bit: round the slopes and the positions to bf16, multiply in bf16
    positions = torch.arange(PEER_LENGTH).to(torch.bfloat16)
    recipe = ALiBi(num_heads).slopes.to(torch.bfloat16)[:, None] * positions
    assert torch.equal(recipe, falcon16)


@pytest.mark.parametrize("causal", [False, True])
def test_alibi_bias_formula(causal: bool) -> None:
    pe = ALiBi(3, causal=causal)
    qp, kp = torch.tensor([0, 2, 5]), torch.tensor([1, 3, 4, 9])
    got = pe.bias(qp, kp, q=torch.zeros(1, 3, 3, 4, dtype=torch.float64))
    want = torch.empty(3, 3, 4, dtype=torch.float64)
    for h in range(3):
        m = 2.0 ** (-8.0 * (h + 1) / 2) if h < 2 else 2.0 ** (-8.0 / 4)  # 2 + every other of 4
        for i in range(3):
            for j in range(4):
                d = int(qp[i]) - int(kp[j])
                want[h, i, j] = -m * (d if causal else abs(d))
    assert_close(got, want, rtol=0, atol=1e-15)


def test_alibi_fractional_and_batched_positions() -> None:
    pe = ALiBi(2)
    pos = torch.tensor([[0.0, 0.5, 1.5], [1.0, 2.0, 4.0]])
    got = pe.bias(pos, pos)
    assert got.shape == (2, 2, 3, 3)
    want = (
        -pe.slopes.float().view(1, 2, 1, 1) * (pos[:, None, :, None] - pos[:, None, None, :]).abs()
    )
    assert_close(got, want)


def test_alibi_slopes_stay_float64_after_casts() -> None:
    pe = ALiBi(5).to(torch.bfloat16)
    assert pe.slopes.dtype == torch.float64
    assert_close(pe.slopes, alibi_slopes(5))
    assert "slopes" not in pe.state_dict()


# --------------------------------------------------------------------------- options


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).abs().max() / want.double().abs().max())


@pytest.mark.parametrize(("num_heads", "alibi_heads"), [(8, 4), (8, 8), (6, 3), (12, 5), (4, 1)])
def test_alibi_heads_match_x_transformers(num_heads: int, alibi_heads: int) -> None:
    """x-transformers' ``alibi_num_heads``: the first heads get the slopes of that many heads,
    the rest zero bias (its ``AlibiPositionalBias(heads=alibi_num_heads, total_heads=heads)``,
    float32 slopes)."""
    peer = AlibiPositionalBias(heads=alibi_heads, total_heads=num_heads)
    pe = ALiBi(num_heads, alibi_heads=alibi_heads)
    qp, kp = torch.tensor([0, 3, 4, 7, 11]), torch.arange(13)
    want = peer.forward_custom_pos(qp, kp)  # (h, nq, nk)
    got = pe.bias(qp, kp)
    assert got.shape == want.shape == (num_heads, 5, 13)
    assert _relative_error(got, want) <= 2e-5
    assert torch.equal(got[alibi_heads:], torch.zeros_like(got[alibi_heads:]))
    assert not got[alibi_heads:].signbit().any()  # +0.0, not -0.0
    # the same with every head's causal prefix of one forward (x-transformers' forward)
    assert _relative_error(pe.bias(torch.arange(7), torch.arange(7)), peer(7, 7)) <= 2e-5


@pytest.mark.parametrize("causal", [False, True])
def test_alibi_heads_and_slopes_follow_the_formula(causal: bool) -> None:
    slopes = [0.75, 0.125, 2.0]
    pe = ALiBi(5, alibi_heads=3, slopes=slopes, causal=causal)
    qp = torch.tensor([[0.0, 2.5, 5.0], [1.0, 2.0, 9.0]])
    kp = torch.tensor([[1.0, 3.0, 4.0, 9.5], [0.0, 0.5, 7.0, 8.0]])
    q = torch.zeros(2, 5, 3, 4, dtype=torch.float64)
    got = pe.bias(qp, kp, q=q)  # (b, h, nq, nk)
    want = torch.zeros(2, 5, 3, 4, dtype=torch.float64)
    for b in range(2):
        for h, m in enumerate(slopes):
            for i in range(3):
                for j in range(4):
                    d = float(qp[b, i]) - float(kp[b, j])
                    want[b, h, i, j] = -m * (d if causal else abs(d))
    assert_close(got, want, rtol=0, atol=1e-14)
    mod = pe.score_mod(qp, kp, q=q)  # fractional positions: computed in the kernel
    grid = (
        torch.arange(2).view(2, 1, 1, 1),
        torch.arange(5).view(1, 5, 1, 1),
        torch.arange(3).view(1, 1, 3, 1),
        torch.arange(4).view(1, 1, 1, 4),
    )
    assert torch.equal(mod(torch.zeros(2, 5, 3, 4, dtype=torch.float64), *grid), got)


@pytest.mark.parametrize("alibi_heads", [2, 4])
def test_alibi_given_slopes_match_x_transformers(alibi_heads: int) -> None:
    slopes = [0.5, 0.03125, 0.2, 1.5][:alibi_heads]
    peer = AlibiPositionalBias(heads=alibi_heads, total_heads=4, slopes=slopes)
    pe = ALiBi(4, alibi_heads=alibi_heads, slopes=slopes)
    pos = torch.arange(10)
    assert _relative_error(pe.bias(pos, pos), peer.forward_custom_pos(pos, pos)) <= 2e-5
    assert_close(on_grid(pe.score_mod(pos, pos), 1, 4, 10, 10)[0], pe.bias(pos, pos).double())


def test_alibi_options_survive_casts_and_show_in_repr() -> None:
    pe = ALiBi(4, alibi_heads=2, slopes=[0.1, 0.3]).to(torch.bfloat16)
    assert pe.slopes.dtype == torch.float64
    assert pe.slopes.tolist() == [0.1, 0.3, 0.0, 0.0]
    assert "alibi_heads=2" in repr(pe) and "slopes=[0.1, 0.3]" in repr(pe)
    assert torch.equal(ALiBi(4, alibi_heads=4).slopes, ALiBi(4).slopes)
    assert torch.equal(ALiBi(6, alibi_heads=3).slopes[:3], alibi_slopes(3))


# --------------------------------------------------------------------------- bad input

MISUSE = [
    Misuse("heads-zero", lambda: ALiBi(0), ValueError, "num_heads", 0),
    Misuse("heads-float", lambda: ALiBi(2.0), TypeError, "num_heads", 2.0),
    Misuse("causal-str", lambda: ALiBi(2, causal="yes"), TypeError, "causal", "str"),
    Misuse("max-bias-zero", lambda: ALiBi(2, max_bias=0), ValueError, "max_bias", 0),
    Misuse("max-bias-str", lambda: ALiBi(2, max_bias="8"), TypeError, "max_bias", "str"),
    Misuse("alibi-heads-zero", lambda: ALiBi(2, alibi_heads=0), ValueError, "alibi_heads", 0),
    Misuse("alibi-heads-many", lambda: ALiBi(2, alibi_heads=3), ValueError, "alibi_heads", 3),
    Misuse("slopes-count", lambda: ALiBi(2, slopes=[0.5]), ValueError, "slopes", 1),
    Misuse("slopes-str", lambda: ALiBi(2, slopes="ab"), TypeError, "slopes", "str"),
    Misuse("slopes-nan", lambda: ALiBi(1, slopes=[float("nan")]), ValueError, "slopes", "nan"),
    Misuse("slopes-none-item", lambda: ALiBi(1, slopes=[None]), TypeError, "slopes", None),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse_names_the_argument_and_the_value(case: Misuse) -> None:
    check(case)
