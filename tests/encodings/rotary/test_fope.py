"""FoPE (Hua et al. 2025) against vLLM's ``FourierRotaryEmbedding`` (``rotary_embedding/
fope.py``: its table build and ``forward_native``) written out here in float64 (vLLM is not
installed), per-head and shared coefficients, values and gradients; with identity coefficients
against posenc's RoPE over the kept frequencies; and a StreamingCache step against a forward
over what the cache holds."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.encodings.rotary.fope import FoPE
from tests.misuse import Misuse, cases, check

D, HQ, HK, N = 16, 4, 2, 7


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    error = (got.detach().double() - want.detach().double()).abs().max()
    return float(error / want.detach().double().abs().max())


def _vllm(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_coef: torch.Tensor,
    sin_coef: torch.Tensor,
    *,
    max_position: int,
    num_inv_freq: int | None,
    sep_head: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's FoPE on ``(tokens, heads, head_size)`` queries and keys, in float64: frequencies
    ``> 2π / max_position`` kept (or the first ``num_inv_freq``), a ``(max_position, g, d)``
    table of mixed cos and sin padded with 1 and 0 and repeated over the halves, rows taken at
    ``positions``; query heads grouped over the key heads in order; NeoX rotation."""
    d = q.shape[-1]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    keep = torch.ones_like(inv_freq, dtype=torch.bool)
    if num_inv_freq is not None:
        keep[num_inv_freq:] = False
    else:
        keep = inv_freq > 2.0 * math.pi / max_position
    inv_freq = inv_freq[keep]
    t = torch.arange(max_position, dtype=torch.float64)
    freqs = t[:, None] * inv_freq[None, :]  # (t, K)
    g = cos_coef.shape[0]
    if sep_head:
        cos = torch.einsum("htD,hDd->thd", freqs.cos().expand(g, -1, -1), cos_coef.double())
        sin = torch.einsum("htD,hDd->thd", freqs.sin().expand(g, -1, -1), sin_coef.double())
    else:
        cos = (freqs.cos() @ cos_coef[0].double())[:, None]  # (t, 1, K)
        sin = (freqs.sin() @ sin_coef[0].double())[:, None]
    pad = d // 2 - cos.shape[-1]
    cos = torch.nn.functional.pad(cos, (0, pad), value=1.0)
    sin = torch.nn.functional.pad(sin, (0, pad), value=0.0)
    cos, sin = torch.cat([cos, cos], -1)[positions], torch.cat([sin, sin], -1)[positions]

    def rotate_neox(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)

    n, hq, hk = q.shape[0], q.shape[1], k.shape[1]
    groups = cos.shape[1]
    qv = q.double().reshape(n, groups, hq // groups, d)
    kv = k.double().reshape(n, groups, hk // groups, d)
    c, s = cos[:, :, None], sin[:, :, None]
    q_out = (qv * c + rotate_neox(qv) * s).reshape(n, hq, d)
    k_out = (kv * c + rotate_neox(kv) * s).reshape(n, hk, d)
    return q_out, k_out


@pytest.mark.parametrize(
    ("sep_head", "num_inv_freq", "max_position"),
    [(True, None, 64), (False, None, 64), (True, 5, 40)],
)
def test_fope_matches_vllm_values_and_gradients(
    sep_head: bool, num_inv_freq: int | None, max_position: int
) -> None:
    torch.manual_seed(0)
    pe = FoPE(
        D,
        num_kv_heads=HK if sep_head else 1,
        max_position_embeddings=max_position,
        num_inv_freq=num_inv_freq,
        init_std=0.3,
    )
    if num_inv_freq is None:  # ω_k ≤ 2π/64 zeroed: 1, 10^-0.5 and 0.1 kept of 8
        assert pe.inv_freq.shape == (3,)
    q = torch.randn(1, HQ, N, D, requires_grad=True)
    k = torch.randn(1, HK, N, D, requires_grad=True)
    positions = torch.tensor([0, 1, 2, 5, 9, 17, 39])
    got_q, got_k = pe(q, k, positions)
    want_q, want_k = _vllm(
        q[0].transpose(0, 1), k[0].transpose(0, 1), positions, pe.cos_coef, pe.sin_coef,
        max_position=max_position, num_inv_freq=num_inv_freq, sep_head=sep_head,
    )  # fmt: skip
    want_q, want_k = want_q.transpose(0, 1)[None], want_k.transpose(0, 1)[None]
    assert _relative_error(got_q, want_q) <= 2e-5 and _relative_error(got_k, want_k) <= 2e-5

    inputs = [q, k, pe.cos_coef, pe.sin_coef]
    scores = got_q @ got_k.repeat_interleave(HQ // HK, 1).transpose(-1, -2)
    ref = want_q @ want_k.repeat_interleave(HQ // HK, 1).transpose(-1, -2)
    weight = torch.randn(scores.shape, dtype=torch.float64)
    ours = torch.autograd.grad((scores * weight.float()).sum(), inputs)
    theirs = torch.autograd.grad((ref * weight).sum(), inputs)
    for a, b in zip(ours, theirs, strict=True):
        assert _relative_error(a, b) <= 2e-5


def test_identity_coefficients_are_rope_over_the_kept_frequencies() -> None:
    pe = FoPE(D, num_kv_heads=2, init_std=0.0, num_inv_freq=8)
    rope = posenc.RotaryEmbedding(D)
    q, k = torch.randn(2, 2, N, D), torch.randn(2, 2, N, D)
    for a, b in zip(pe(q, k), rope(q, k), strict=True):
        assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_batched_positions_give_each_row_its_own_transform() -> None:
    pe = FoPE(D, num_kv_heads=2, init_std=0.3)
    q, k = torch.randn(2, 2, N, D), torch.randn(2, 2, N, D)
    pos = torch.stack([torch.arange(N), torch.arange(N) * 3 + 1])
    bq, bk = pe(q, k, pos)
    for r in range(2):
        rq, rk = pe(q[r : r + 1], k[r : r + 1], pos[r])
        assert_close(bq[r : r + 1], rq) and assert_close(bk[r : r + 1], rk)


def test_grouped_query_attention_decodes_like_one_forward() -> None:
    torch.manual_seed(0)
    model = posenc.Encoder(
        D * 2, 2, HQ, pe="fope", causal=True, num_kv_heads=HK, pe_kwargs={"num_kv_heads": HK}
    ).eval()
    x = torch.randn(2, 8, D * 2)
    with torch.no_grad():
        full = model(x)
        cache = posenc.KVCache()
        out = torch.cat([model(s, cache=cache) for s in (x[:, :5], x[:, 5:6], x[:, 6:])], 1)
    assert_close(out, full, atol=2e-5, rtol=1e-4)


MISUSE = [
    Misuse("odd", lambda: FoPE(7), ValueError, "head_dim", 7),
    Misuse("kv-heads", lambda: FoPE(8, num_kv_heads=0), ValueError, "num_kv_heads", 0),
    Misuse("num-inv-freq", lambda: FoPE(8, num_inv_freq=5), ValueError, "num_inv_freq", 5),
    Misuse("init-std", lambda: FoPE(8, init_std=-1.0), ValueError, "init_std", -1.0),
    Misuse("none-kept", lambda: FoPE(2, base=1e9, max_position_embeddings=1), ValueError,
           "max_position_embeddings", 1),
    Misuse("groups", lambda: FoPE(8, num_kv_heads=3)(torch.randn(1, 4, 2, 8),
                                                   torch.randn(1, 4, 2, 8)), ValueError,
           "num_kv_heads", 3),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_bad_input_is_a_clear_error(case: Misuse) -> None:
    check(case)
