"""Tests of ``src/posenc/encodings/rotary/xpos.py``: xPos against rotary-embedding-torch and a
float64 transcription of Sun et al. 2022, eq. 9; its public tables; what it no longer
carries from RotaryEmbedding."""

from __future__ import annotations

import pytest
import torch
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
