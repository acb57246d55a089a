"""Tests of ``src/posenc/encodings/rotary/xpos.py``: xPos against rotary-embedding-torch and a
float64 transcription of Sun et al. 2022, eq. 9; its public tables; what it no longer
carries from RotaryEmbedding."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

import posenc
from posenc import XPos
from tests.encodings.rotary.test_rope import inv_freq64, qk, rope_reference


@pytest.mark.parametrize(("n", "scale_base"), [(64, 512.0), (300, 64.0)])
def test_xpos_matches_rotary_embedding_torch(n: int, scale_base: float) -> None:
    ret = pytest.importorskip("rotary_embedding_torch")
    peer = ret.RotaryEmbedding(16, use_xpos=True, xpos_scale_base=scale_base)
    q, k = qk(2, 2, n, 16)
    want_q, want_k = peer.rotate_queries_and_keys(q, k)
    got_q, got_k = XPos(16, interleaved=True, scale_base=scale_base)(q, k)
    assert_close(got_q, want_q, rtol=1e-4, atol=1e-4)
    assert_close(got_k, want_k, rtol=1e-4, atol=1e-4)


def test_xpos_matches_float64_formula() -> None:
    xpos = XPos(8, scale_base=16.0, center=3.0)
    q, k = qk(1, 1, 7, 8, dtype=torch.float64)
    positions = torch.arange(7)
    got_q, got_k = xpos(q, k, positions)
    zeta = (torch.arange(0, 8, 2, dtype=torch.float64) + 0.4 * 8) / (1.4 * 8)
    power = (positions.double()[:, None] - 3.0) / 16.0
    angles = positions.double()[:, None] * inv_freq64(8)
    assert_close(got_q, rope_reference(q, angles, interleaved=False, scale=zeta**power))
    assert_close(got_k, rope_reference(k, angles, interleaved=False, scale=zeta**-power))


def test_xpos_public_tables_are_the_ones_it_rotates_by() -> None:
    """``XPos.cos_sin`` gives the scaled tables of queries (``key=True``: of keys), the float64
    formula, not plain RoPE's tables."""
    xpos = XPos(8, scale_base=16.0, center=3.0)
    positions = torch.arange(7)
    zeta = (torch.arange(0, 8, 2, dtype=torch.float64) + 0.4 * 8) / (1.4 * 8)
    power = (positions.double()[:, None] - 3.0) / 16.0
    angles = positions.double()[:, None] * inv_freq64(8)
    for key, scale in ((False, zeta**power), (True, zeta**-power)):
        cos, sin = xpos.cos_sin(positions, 7, dtype=torch.float64, key=key)
        assert_close(cos, angles.cos() * scale)
        assert_close(sin, angles.sin() * scale)


def test_xpos_stands_beside_rotary_embedding() -> None:
    """xPos shares the rotation with RoPE and nothing else: no cached tables, no context
    extension; its frequencies stay float64 after a cast and come back after ``to_empty``."""
    xpos = XPos(8, base=500.0, rotary_dim=4)
    assert not isinstance(xpos, posenc.RotaryEmbedding)
    assert {name for name, _ in xpos.named_buffers()} == {"inv_freq"}
    for missing in ("with_scaling", "scaling", "cos_cached", "rope_type", "learned_freq"):
        assert not hasattr(xpos, missing), missing
    assert (xpos.head_dim, xpos.rotary_dim, xpos.base, xpos.clockwise) == (8, 4, 500.0, False)
    assert_close(xpos.double().inv_freq, inv_freq64(4, 500.0), rtol=0, atol=0)
    with torch.device("meta"):
        lazy = XPos(8, base=500.0, rotary_dim=4)
    lazy = lazy.to_empty(device="cpu")
    lazy.reset_tables()
    assert_close(lazy.inv_freq, inv_freq64(4, 500.0), rtol=0, atol=0)
    assert repr(xpos) == "XPos(head_dim=8, rotary_dim=4, base=500, scale_base=512)"


def _scaled64(positions: Tensor, center: float, scale_base: float, key: bool) -> Tensor:
    """xPos's scale ``ζ^(±(p - center)/γ)`` for head size 8, float64 ``(n, 4)``."""
    zeta = (torch.arange(0, 8, 2, dtype=torch.float64) + 0.4 * 8) / (1.4 * 8)
    power = (positions.double()[:, None] - center) / scale_base
    return zeta ** (-power if key else power)


#: The reach ``|p - center| / γ`` past which ``(7/2)^reach`` is not finite, per dtype.
REACH = {torch.float32: 70.82, torch.bfloat16: 70.82, torch.float16: 8.85}


@pytest.mark.parametrize("dtype", list(REACH), ids=str)
def test_xpos_refuses_scales_past_the_dtypes_range(dtype: torch.dtype) -> None:
    """A call whose scale ``(7/2)^(|p - center|/γ)`` is not finite in the rotated tensor's
    dtype is refused by name (its queries, or its keys, would be inf); one position nearer
    the centre passes, finite and equal to the float64 formula. With ``γ = 1`` the reach
    is in positions: ``center = (max + 1) // 2`` puts the first query ``top // 2`` before it."""
    xpos = XPos(8, scale_base=1.0)
    limit = int(REACH[dtype])  # the last reach that fits
    positions = torch.arange(2 * limit + 1)  # centre limit: reach limit
    q = torch.rand(1, 1, positions.numel(), 8, dtype=torch.float64).mul(0.5).to(dtype)
    got_q, got_k = xpos(q, q, positions)
    for got, key in ((got_q, False), (got_k, True)):
        assert got.isfinite().all()
        want = rope_reference(
            q.double(),
            positions.double()[:, None] * inv_freq64(8),
            interleaved=False,
            scale=_scaled64(positions, float(limit), 1.0, key),
        )
        rtol = 1e-2 if dtype != torch.float32 else 3e-5  # (two roundings: table, product)
        assert_close(got.double(), want, rtol=rtol, atol=torch.finfo(dtype).tiny)
    far = torch.arange(2 * limit + 3)  # centre limit + 1: the first query's reach limit + 1
    q = torch.zeros(1, 1, far.numel(), 8, dtype=dtype)
    with pytest.raises(posenc.PosencValueError, match=rf"queries .*{dtype}.*scale_base"):
        xpos(q, q, far)
    with pytest.raises(posenc.PosencValueError, match="queries"):
        xpos.rotate(q, far)
    with pytest.raises(posenc.PosencValueError, match="queries"):
        xpos.cos_sin(far, far.numel(), dtype=dtype)


def test_xpos_refuses_keys_past_the_range_of_a_fixed_centre() -> None:
    """With a fixed centre at 0 the keys' scales grow with the position: the keys past the
    float32 reach are refused, queries at the same positions are not (their scales shrink)."""
    xpos = XPos(8, scale_base=1.0, center=0.0)
    positions = torch.tensor([0, 71])
    x = torch.zeros(1, 1, 2, 8)
    assert xpos.rotate(x, positions).isfinite().all()
    with pytest.raises(posenc.PosencValueError, match=r"keys .* at most 71 from the centre"):
        xpos.rotate(x, positions, key=True)
    assert xpos.rotate(x[:, :, :1], positions[:1] + 70, key=True).isfinite().all()


def test_xpos_range_check_reads_nothing_on_a_gpus_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where positions are not read (a GPU's path: CPU positions stand in for a GPU's), the
    check costs no read and refuses nothing: the overflow is the formula's."""
    from posenc.encodings import checks
    from tests.host_reads import host_reads

    monkeypatch.setattr(checks, "CPU_IS_HOST", False)
    xpos = XPos(8, scale_base=1.0, center=0.0)
    x = torch.ones(1, 1, 1, 8)
    with host_reads(monkeypatch, own=True) as reads:
        got = xpos.rotate(x, torch.tensor([100]), key=True)
    assert reads == [] and not got.isfinite().all()


def test_xpos_range_is_checked_in_a_cached_decode() -> None:
    """Through a KV cache (the centre fixed at the prompt's) the range is checked where the
    host's bound on the positions does not show it safe: a key far past the centre, and a
    query far before a centre an earlier call set, are refused; a step within reach is not."""
    torch.manual_seed(0)
    encoder = posenc.Encoder(16, 1, 2, pe="xpos", causal=True, pe_kwargs={"scale_base": 1.0})
    x = torch.randn(1, 42, 16)
    with torch.no_grad():
        cache = posenc.KVCache()
        encoder.eval()(x, cache=cache, positions=torch.arange(100, 142)[None])  # centre 71
        assert encoder(x[:, :1], cache=cache, positions=torch.tensor([[141]])).isfinite().all()
        with pytest.raises(posenc.PosencValueError, match="queries"):  # reach 71
            encoder(x[:, :1], cache=cache, positions=torch.tensor([[0]]))
        cache = posenc.KVCache()
        encoder(x[:, :4], cache=cache)  # centre 2
        assert encoder(x[:, :1], cache=cache, positions=torch.tensor([[72]])).isfinite().all()
        with pytest.raises(posenc.PosencValueError, match="keys"):  # reach 71
            encoder(x[:, :1], cache=cache, positions=torch.tensor([[73]]))
