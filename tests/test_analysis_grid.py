"""The grid measures (posenc.analysis.grid) against hand-made matrices and the formulas of the
schemes they measure: rope2d's and sinusoidal-2d's contributions written out in float64."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.analysis import grid_coordinates
from posenc.analysis.grid import (
    analyze_grid,
    axis_profiles,
    euclidean_profile,
    grid_decay_fraction,
    grid_matrix,
    grid_shift_residual,
    isotropy_gap,
)
from posenc.errors import PosencValueError

SHAPE = (4, 3)


def _offsets(shape: tuple[int, ...]) -> torch.Tensor:
    c = grid_coordinates(shape).double()
    return c[:, None, :] - c[None, :, :]  # (n, n, axes)


def test_shift_residual_is_zero_for_a_function_of_the_offset_and_measures_a_break() -> None:
    off = _offsets(SHAPE)
    m = (torch.cos(0.7 * off[..., 0]) + 0.3 * off[..., 1] ** 2).unsqueeze(0)  # f(p - q)
    assert grid_shift_residual(m, SHAPE) == 0.0
    broken = m.clone()
    broken[0, 0, 1] += 0.5  # pair (0,0)-(0,1): offset (0, -1), shared with other pairs
    assert grid_shift_residual(broken, SHAPE) == pytest.approx(0.5 / float(broken.abs().max()))


def test_euclidean_profile_and_decay_against_a_loop() -> None:
    off = _offsets(SHAPE)
    dist = off.pow(2).sum(-1).sqrt()
    m = torch.stack([-dist, dist])  # head 0 decays, head 1 rises
    distances, profile = euclidean_profile(m, SHAPE)
    expected = sorted({round(float(d), 12) for d in dist.flatten()})
    assert distances.tolist() == pytest.approx(expected)
    assert profile[0].tolist() == pytest.approx([-d for d in expected])
    assert grid_decay_fraction(m[:1], SHAPE) == 1.0
    assert grid_decay_fraction(m[1:], SHAPE) == 0.0
    assert grid_decay_fraction(m, SHAPE) == 0.5


def test_axis_profiles_and_isotropy_against_a_loop() -> None:
    g = torch.Generator().manual_seed(0)
    n = 12
    m = torch.randn(1, n, n, generator=g, dtype=torch.float64)
    coords = grid_coordinates(SHAPE).tolist()
    rows, cols = axis_profiles(m, SHAPE)
    for delta in (1, 2):
        r = [
            m[0, i, j]
            for i in range(n)
            for j in range(n)
            if abs(coords[i][0] - coords[j][0]) == delta and coords[i][1] == coords[j][1]
        ]
        c = [
            m[0, i, j]
            for i in range(n)
            for j in range(n)
            if abs(coords[i][1] - coords[j][1]) == delta and coords[i][0] == coords[j][0]
        ]
        assert float(rows[0, delta - 1]) == pytest.approx(float(sum(r) / len(r)))
        assert float(cols[0, delta - 1]) == pytest.approx(float(sum(c) / len(c)))
    gap = float((rows - cols).abs().max() / m.abs().max())
    assert isotropy_gap(m, SHAPE) == pytest.approx(gap)


def test_rope2d_expected_similarity_is_the_cosine_sum_formula() -> None:
    d = 16
    pe = posenc.Rotary2DEmbedding(head_dim=d).double()
    m = grid_matrix(pe, SHAPE)
    # E_q <R(i)q, R(j)q> / sqrt(d) = 2 sum_pairs cos(angle_i - angle_j) / sqrt(d): rows on the
    # first d/4 pairs, columns on the next, frequencies base^(-2k/(d/2))
    off = _offsets(SHAPE)
    freqs = 10000.0 ** (-torch.arange(0, d // 2, 2, dtype=torch.float64) / (d // 2))
    angles = torch.cat([off[..., :1] * freqs, off[..., 1:] * freqs], dim=-1)  # (n, n, d/2)
    expected = 2 * torch.cos(angles).sum(-1) / math.sqrt(d)
    torch.testing.assert_close(m[0], expected, rtol=1e-12, atol=1e-12)
    assert grid_shift_residual(m, SHAPE) < 1e-12  # exactly translation invariant
    assert isotropy_gap(m, SHAPE) < 1e-12  # rows and columns share the frequencies


def test_sinusoidal_2d_similarity_is_the_sum_formula() -> None:
    d = 32
    pe = posenc.build("sinusoidal-2d", dim=d).double()
    m = grid_matrix(pe, SHAPE)
    off = _offsets(SHAPE)
    half = d // 2
    freqs = 10000.0 ** (-torch.arange(0, half, 2, dtype=torch.float64) / half)
    # PE(p)·PE(q) = sum over axes and frequencies of cos(w Δ): sin·sin + cos·cos
    expected = (torch.cos(off[..., :1] * freqs) + torch.cos(off[..., 1:] * freqs)).sum(-1)
    torch.testing.assert_close(m[0], expected / math.sqrt(d), rtol=1e-12, atol=1e-12)


def test_analyze_grid_tells_the_schemes_apart() -> None:
    rope = analyze_grid("rope2d", grid=(5, 4), dim=32)
    assert rope.shift_residual < 1e-12 and rope.isotropy_gap < 1e-12
    # DINOv3 normalises each axis by its own extent: a 5 x 4 grid is not isotropic
    assert analyze_grid("rope-dinov3", grid=(5, 4), dim=32).isotropy_gap > 1e-3
    swin = analyze_grid("swin-bias", grid=(4, 4), dim=32)
    assert swin.shift_residual == 0.0 and swin.isotropy_gap > 1e-3  # a random table
    assert analyze_grid("rope3d", grid=(3, 3), dim=48).grid == (3, 3, 3)
    with pytest.raises(PosencValueError, match="encodes sequences"):
        analyze_grid("rope")
    with pytest.raises(PosencValueError, match="grid must be 2 sides"):
        analyze_grid("rope2d", grid=(1, 4))


def test_a_conditional_scheme_shows_no_positional_measures() -> None:
    # a PEG's term reads the hidden states: the zeros of positions alone are no measure of it
    # (a decay of 1.00 would read as monotone decay), so its rows say n/a
    from posenc.analysis import analyze, format_analysis
    from posenc.analysis.grid import format_grid_analysis

    row = format_analysis(analyze("peg", length=4, dim=16, num_heads=2))
    assert row[:2] == ["peg", "conditional"] and set(row[2:]) == {"n/a"}
    grid = format_grid_analysis(analyze_grid("peg", grid=(3, 3), dim=16, num_heads=2))
    assert grid == ["peg", "conditional", "3x3", "n/a", "n/a", "n/a"]
    assert format_grid_analysis(analyze_grid("rope2d", grid=(3, 3), dim=16))[3] != "n/a"
