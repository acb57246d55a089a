"""Tests of ``src/posenc/encodings/rotary/axial.py``: axial N-D RoPE against
rotary-embedding-torch and a float64 transcription of Heo et al. 2024, eq. 12, and its
relative property over coordinates; and every N-D scheme's refusal without coordinates."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc import AxialRotaryEmbedding
from posenc.encodings.registry import build_for_model
from tests.encodings.rotary.test_rope import _scores, inv_freq64, qk, rope_reference
from tests.schemes import NAMES, coordinates


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


@pytest.mark.parametrize("name", [name for name in NAMES if posenc.entry(name).cls.axes > 1])
def test_n_d_schemes_refuse_to_run_without_coordinates(name: str) -> None:
    """Every surface that builds an N-D scheme (rope2d, rope3d, sinusoidal-2d/3d, swin-bias,
    any later one) refuses a flattened input without coordinates, naming the positions it needs; the
    axial RoPE rotated every token along the first axis instead. With coordinates it runs."""
    axes = posenc.entry(name).cls.axes
    x, tokens = torch.randn(2, 6, 24), torch.randint(0, 10, (2, 6))
    coords = torch.stack([torch.arange(6) + a for a in range(axes)], dim=-1)  # (n, axes)
    coords = coordinates(name, 6, coords)  # (a full 2 x 3 grid for a scheme that needs one)
    pe = build_for_model(name, 24, 2)
    surfaces = {
        "Encoder": (posenc.Encoder(24, 1, 2, pe=name), x),
        "TransformerModel": (posenc.TransformerModel(10, 24, 1, 2, pe=name), tokens),
    }
    if pe.family == "rotary":
        q = torch.randn(2, 2, 6, 12)
        surfaces["MultiHeadAttention"] = (posenc.MultiHeadAttention(24, 2, pe=name), x)
        for call in (lambda **kw: pe(q, q, **kw)[0], lambda **kw: pe.rotate(q, **kw)):
            with pytest.raises(ValueError, match=rf"needs positions.*\(seq, {axes}\)"):
                call()
            assert call(positions=coords).shape == q.shape
    elif pe.family == "bias":  # a bias has no forward of its own: attention asks it
        surfaces["MultiHeadAttention"] = (posenc.MultiHeadAttention(24, 2, pe=name), x)
    else:
        surfaces["module"] = (pe, x)
    for what, (module, inputs) in surfaces.items():
        with pytest.raises(ValueError, match=rf"positions.*\(seq, {axes}\)"):
            module(inputs)
        assert module(inputs, positions=coords).shape[:2] == (2, 6), what
