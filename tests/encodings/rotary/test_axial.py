"""Tests of ``src/posenc/encodings/rotary/axial.py``: axial N-D RoPE against
rotary-embedding-torch and a float64 transcription of Heo et al. 2024, eq. 12, and its
relative property over coordinates."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from posenc import AxialRotaryEmbedding
from tests.encodings.rotary.test_rope import _scores, inv_freq64, qk, rope_reference


def test_axial_matches_rotary_embedding_torch_axial_freqs() -> None:
    ret = pytest.importorskip("rotary_embedding_torch")
    height, width, d = 5, 7, 16
    peer = ret.RotaryEmbedding(d // 2)
    freqs = peer.get_axial_freqs(height, width).reshape(height * width, d)  # (n, d)
    q, k = qk(2, 2, height * width, d)
    coords = AxialRotaryEmbedding.grid(height, width)
    got_q, got_k = AxialRotaryEmbedding(d, ndim=2, interleaved=True)(q, k, coords)
    assert_close(got_q, ret.apply_rotary_emb(freqs, q), rtol=1e-5, atol=1e-5)
    assert_close(got_k, ret.apply_rotary_emb(freqs, k), rtol=1e-5, atol=1e-5)


def test_axial_matches_float64_formula_in_3d() -> None:
    axial = AxialRotaryEmbedding(12, ndim=3, base=100.0)
    q, k = qk(2, 1, 6, 12, dtype=torch.float64)
    coords = torch.rand(2, 6, 3, dtype=torch.float64) * 50
    got_q, _ = axial(q, k, coords)
    per_axis = inv_freq64(4, 100.0)  # 2 pairs per axis
    angles = torch.cat([coords[..., a : a + 1] * per_axis for a in range(3)], dim=-1)  # (b, n, 6)
    assert_close(got_q, rope_reference(q, angles[:, None], interleaved=False))


def test_axial_scores_depend_only_on_coordinate_differences() -> None:
    axial = AxialRotaryEmbedding(16, ndim=2)
    q, k = qk(1, 2, 9, 16, dtype=torch.float64)
    coords = AxialRotaryEmbedding.grid(3, 3).double()
    base = _scores(*axial(q, k, coords))
    shifted = _scores(*axial(q, k, coords + torch.tensor([4.0, 11.5], dtype=torch.float64)))
    assert_close(shifted, base, rtol=1e-9, atol=1e-9)
    assert not torch.allclose(_scores(*axial(q, k, coords.flip(-1))), base)
