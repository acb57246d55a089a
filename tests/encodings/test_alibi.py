"""The attention-bias schemes against their papers' equations (float64 transcriptions, written
out pair by pair) and against the peers people run: Hugging Face BLOOM's, Falcon's and MPT's
ALiBi tensors, Hugging Face T5's buckets and bias, x-transformers' dynamic position bias."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close
from transformers import T5Config
from transformers.models.bloom.modeling_bloom import _get_alibi_slopes, build_alibi_tensor
from transformers.models.falcon.modeling_falcon import build_alibi_tensor as falcon_alibi_tensor
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor
from transformers.models.t5.modeling_t5 import T5Attention
from x_transformers.x_transformers import DynamicPositionBias as XDynamicPositionBias

import posenc
from posenc.encodings import (
    FIRE,
    KERPLE,
    ALiBi,
    CoPE,
    DynamicPositionBias,
    ShawRelativeBias,
    T5RelativeBias,
    TransformerXLRelativeBias,
    alibi_slopes,
    t5_relative_position_bucket,
)

BIAS_NAMES = ["alibi", "t5", "kerple", "fire", "shaw", "xl", "dpb", "cope"]


def qk(b: int, h: int, n: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(b, h, n, d, dtype=torch.float64), torch.randn(
        b, h, n, d, dtype=torch.float64
    )


# --------------------------------------------------------------------------- ALiBi


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


# --------------------------------------------------------------------------- T5

SETTINGS = [
    (True, 32, 128),
    (True, 16, 64),
    (True, 4, 8),
    (True, 64, 1000),
    (True, 10, 37),
    (False, 32, 128),
    (False, 33, 100),
    (False, 2, 2),
    (False, 8, 8),
    (False, 3, 50),
]


@pytest.mark.parametrize(("bidirectional", "num_buckets", "max_distance"), SETTINGS)
def test_t5_buckets_match_transformers(
    bidirectional: bool, num_buckets: int, max_distance: int
) -> None:
    rel = torch.arange(-3000, 3001)
    ours = t5_relative_position_bucket(
        rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    theirs = T5Attention._relative_position_bucket(
        rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    torch.testing.assert_close(ours, theirs.long(), rtol=0, atol=0)
    assert int(ours.min()) >= 0 and int(ours.max()) < num_buckets


def test_t5_two_buckets_bidirectional_split_by_direction() -> None:
    # one bucket per side (Hugging Face divides by zero here): before/at vs after the query
    rel = torch.arange(-5, 6)
    got = t5_relative_position_bucket(rel, bidirectional=True, num_buckets=2, max_distance=2)
    assert_close(got, (rel > 0).long())


@pytest.mark.parametrize(("bidirectional", "past"), [(True, 0), (False, 0), (False, 7), (True, 3)])
def test_t5_bias_matches_transformers(bidirectional: bool, past: int) -> None:
    config = T5Config(
        d_model=32,
        d_kv=8,
        num_heads=4,
        relative_attention_num_buckets=16,
        relative_attention_max_distance=40,
        is_decoder=not bidirectional,
    )
    hf = T5Attention(config, has_relative_attention_bias=True)
    pe = T5RelativeBias(4, num_buckets=16, max_distance=40, bidirectional=bidirectional)
    with torch.no_grad():
        hf.relative_attention_bias.weight.copy_(pe.relative_attention_bias.weight)
        want = hf.compute_bias(9, 9 + past, past_seen_tokens=past)[0]  # (h, q, k)
    got = pe.bias(torch.arange(9) + past, torch.arange(9 + past))
    assert_close(got, want, rtol=0, atol=0)


def test_t5_rejects_fractional_positions() -> None:
    with pytest.raises(ValueError, match="whole numbers for T5RelativeBias"):
        T5RelativeBias(2).bias(torch.tensor([0.0, 0.5]), torch.tensor([0.0, 1.0]))


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


# --------------------------------------------------------------------------- Shaw


def test_shaw_key_term_formula() -> None:
    h, d, K = 2, 4, 3
    pe = ShawRelativeBias(h, d, max_distance=K).double()
    q, _ = qk(2, h, 7, d)
    qp, kp = torch.arange(7) + 2, torch.arange(7)
    got = pe.bias(qp, kp, q=q)
    w = pe.key_embeddings.weight
    want = torch.empty(2, h, 7, 7, dtype=torch.float64)
    for b in range(2):
        for hh in range(h):
            for i in range(7):
                for j in range(7):
                    r = max(-K, min(K, int(kp[j]) - int(qp[i])))  # clip(j - i, k)
                    want[b, hh, i, j] = q[b, hh, i] @ w[r + K] / math.sqrt(d)
    assert_close(got, want, rtol=1e-12, atol=1e-13)


def test_shaw_value_term_formula() -> None:
    h, d, K, n = 2, 3, 2, 6
    pe = ShawRelativeBias(h, d, max_distance=K, values=True).double()
    weights = torch.rand(1, h, n, n, dtype=torch.float64).softmax(-1)
    pos = torch.arange(n)
    got = pe.value_term(weights, pos, pos)
    wv = pe.value_embeddings.weight  # type: ignore[union-attr]
    want = torch.zeros(1, h, n, d, dtype=torch.float64)
    for hh in range(h):
        for i in range(n):
            for j in range(n):
                want[0, hh, i] += weights[0, hh, i, j] * wv[max(-K, min(K, j - i)) + K]
    assert_close(got, want, rtol=1e-12, atol=1e-13)


# --------------------------------------------------------------------------- Transformer-XL


def test_xl_formula() -> None:
    h, d, n, rel = 2, 4, 5, 6
    pe = TransformerXLRelativeBias(h, d, rel_dim=rel, base=100.0).double()
    q, k = qk(1, h, n, d)
    pos = torch.arange(n)
    got = pe.bias(pos, pos, q=q, k=k) + q @ k.transpose(-2, -1) / math.sqrt(d)
    W = pe.pos_proj.weight.view(h, d, rel)  # W_R per head
    u, v = pe.u, pe.v

    def R(t: int) -> torch.Tensor:  # sinusoidal encoding of the distance t (interleaved)
        out = []
        for m in range(rel // 2):
            out += [math.sin(t / 100.0 ** (2 * m / rel)), math.cos(t / 100.0 ** (2 * m / rel))]
        return torch.tensor(out, dtype=torch.float64)

    want = torch.empty(1, h, n, n, dtype=torch.float64)
    for hh in range(h):
        for i in range(n):
            for j in range(n):
                r = W[hh] @ R(i - j)
                qi, kj = q[0, hh, i], k[0, hh, j]
                a_ij = qi @ kj + qi @ r + u[hh] @ kj + v[hh] @ r  # Dai et al. 2019, §3.3
                want[0, hh, i, j] = a_ij / math.sqrt(d)
    assert_close(got, want, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- CoPE


@pytest.mark.parametrize("max_positions", [3, 16])
def test_cope_formula(max_positions: int) -> None:
    h, d, n = 2, 4, 6
    pe = CoPE(h, d, max_positions=max_positions).double()
    with torch.no_grad():
        pe.embeddings.normal_()
    q, k = qk(1, h, n, d)
    pos = torch.arange(n)
    got = pe.bias(pos, pos, q=q, k=k)
    e = pe.embeddings  # (d, P)
    want = torch.empty(1, h, n, n, dtype=torch.float64)
    for hh in range(h):
        for i in range(n):
            gates = [torch.sigmoid(q[0, hh, i] @ k[0, hh, t]).item() for t in range(n)]
            for j in range(n):
                lo, hi = min(i, j), max(i, j)  # the paper's t = j..i; mirrored for j > i
                p = min(sum(gates[lo : hi + 1]), max_positions - 1)
                f = p - math.floor(p)
                emb = f * e[:, math.ceil(p)] + (1 - f) * e[:, math.floor(p)]
                want[0, hh, i, j] = q[0, hh, i] @ emb / math.sqrt(d)
    assert_close(got, want, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- score_mod


def _eval_score_mod(mod, b: int, h: int, nq: int, nk: int) -> torch.Tensor:
    grid = (
        torch.arange(b).view(b, 1, 1, 1),
        torch.arange(h).view(1, h, 1, 1),
        torch.arange(nq).view(1, 1, nq, 1),
        torch.arange(nk).view(1, 1, 1, nk),
    )
    return mod(torch.zeros(b, h, nq, nk, dtype=torch.float64), *grid)


@pytest.mark.parametrize("name", BIAS_NAMES)
@pytest.mark.parametrize("batched", [False, True])
def test_score_mod_equals_bias(name: str, batched: bool) -> None:
    pe = posenc.build_for_model(name, 16, 4).double()
    q, k = qk(2, 4, 9, 4)
    qp = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [3, 4, 5, 6, 7, 8, 9, 10, 11]])
    qp = qp if batched else qp[0]
    with torch.no_grad():
        mod = pe.score_mod(qp, qp, q=q, k=k)
        want = pe.bias(qp, qp, q=q, k=k).expand(2, 4, 9, 9)
    if name in ("xl", "cope"):
        assert mod is None  # these read every pair: attention materialises their bias
        return
    assert mod is not None
    assert_close(_eval_score_mod(mod, 2, 4, 9, 9), want, rtol=1e-6, atol=1e-7)


def test_alibi_score_mod_handles_fractional_positions() -> None:
    pe = ALiBi(2)
    pos = torch.tensor([0.0, 0.5, 2.25])
    got = _eval_score_mod(pe.score_mod(pos, pos), 1, 2, 3, 3)
    assert_close(got, pe.bias(pos, pos).double().unsqueeze(0), rtol=1e-6, atol=1e-7)


def test_distance_schemes_without_integer_positions_have_no_table() -> None:
    pos = torch.tensor([0.0, 0.5, 2.25])
    assert KERPLE(2).score_mod(pos, pos) is None
    assert DynamicPositionBias(2).score_mod(pos, pos) is None


# --------------------------------------------------------------------------- shared


@pytest.mark.parametrize("name", BIAS_NAMES)
def test_registry_and_for_model(name: str) -> None:
    assert name in posenc.available()
    pe = posenc.build_for_model(name, 24, 3)
    assert pe.family == "bias" and pe.num_heads == 3
    assert pe.paper
    if name in ("shaw", "xl", "cope"):
        assert pe.head_dim == 8  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", BIAS_NAMES)
def test_bias_shapes_and_explicit_positions(name: str) -> None:
    pe = posenc.build_for_model(name, 16, 4)
    q, k = torch.randn(2, 4, 6, 4), torch.randn(2, 4, 6, 4)
    pos = torch.arange(6)
    with torch.no_grad():
        flat = pe.bias(pos, pos, q=q, k=k)
        batched = pe.bias(pos.expand(2, 6), pos.expand(2, 6), q=q, k=k)
    assert flat.shape[-3:] == (4, 6, 6)
    assert batched.shape == (2, 4, 6, 6)
    assert_close(batched, flat.expand(2, 4, 6, 6))


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: ALiBi(0), ValueError, "num_heads must be >= 1, got 0"),
        (lambda: T5RelativeBias(0), ValueError, "num_heads must be >= 1, got 0"),
        (lambda: KERPLE(-1), ValueError, "num_heads must be >= 1, got -1"),
        (lambda: FIRE(0), ValueError, "num_heads must be >= 1, got 0"),
        (lambda: ShawRelativeBias(0, 4), ValueError, "num_heads must be >= 1, got 0"),
        (lambda: TransformerXLRelativeBias(0, 4), ValueError, "num_heads must be >= 1, got 0"),
        (lambda: DynamicPositionBias(0), ValueError, "num_heads must be >= 1, got 0"),
        (lambda: CoPE(0, 4), ValueError, "num_heads must be >= 1, got 0"),
        (lambda: ALiBi(2.0), TypeError, r"num_heads must be an int, got float \(2.0\)"),
        (lambda: ALiBi(2, max_bias=0), ValueError, r"max_bias must be a finite number > 0, got 0"),
        (lambda: ALiBi(2, max_bias="8"), TypeError, r"max_bias must be a number, got str"),
        (lambda: T5RelativeBias(2, num_buckets=1), ValueError, "num_buckets must be >= 2, got 1"),
        (
            lambda: T5RelativeBias(2, num_buckets=7),
            ValueError,
            "num_buckets must be even with bidirectional=True.*got 7",
        ),
        (
            lambda: T5RelativeBias(2, num_buckets=32, max_distance=16),
            ValueError,
            r"max_distance \(16\) must be >= num_buckets \(32\)",
        ),
        (lambda: KERPLE(2, kernel="exp"), ValueError, "kernel must be 'log' or 'power', got 'exp'"),
        (lambda: ShawRelativeBias(2, 4, max_distance=0), ValueError, "max_distance must be >= 1"),
    ],
)
def test_bad_construction(make, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("name", BIAS_NAMES)
def test_mismatched_positions_rejected(name: str) -> None:
    pe = posenc.build_for_model(name, 16, 4)
    q = torch.randn(2, 4, 5, 4)
    with pytest.raises(ValueError, match=r"mismatched batch sizes \(2 vs 3\)"):
        pe.bias(torch.zeros(2, 5, dtype=torch.long), torch.zeros(3, 5, dtype=torch.long), q=q, k=q)
    with pytest.raises(
        ValueError, match=r"must have shape \(seq,\) or \(batch, seq\), got \(1, 2, 5\)"
    ):
        pe.bias(torch.zeros(1, 2, 5, dtype=torch.long), torch.arange(5), q=q, k=q)
    with pytest.raises(TypeError, match=r"q_positions must be a torch\.Tensor, got list"):
        pe.bias([0, 1], torch.arange(5), q=q, k=q)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["shaw", "xl", "cope"])
def test_qk_schemes_need_queries(name: str) -> None:
    pe = posenc.build_for_model(name, 16, 4)
    pos = torch.arange(5)
    with pytest.raises(ValueError, match="needs q="):
        pe.bias(pos, pos)
    with pytest.raises(
        ValueError, match=r"expects q of shape \(b, h=4, n, d=4\), got \(1, 2, 5, 4\)"
    ):
        pe.bias(pos, pos, q=torch.randn(1, 2, 5, 4), k=torch.randn(1, 2, 5, 4))
