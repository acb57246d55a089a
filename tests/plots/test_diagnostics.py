"""The figures every encoding has (``posenc.plots.diagnostics``), drawn for ALiBi, whose
contribution is written out here (``-m_h |i - j|``): the similarity matrix, the profile
against distance and each head's matrix show those numbers; diverging colours are centred on
0 exactly when the values take both signs; the 2-D grid and the side-by-side comparison lay
out their panels."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest

import posenc
from posenc.errors import PosencValueError
from posenc.plots import diagnostics

SLOPES = [2.0 ** (-8 * h / 4) for h in range(1, 5)]  # ALiBi, 4 heads


def alibi_bias(head: int, n: int) -> np.ndarray:
    i = np.arange(n)
    return -SLOPES[head] * np.abs(i[None, :] - i[:, None])


def test_similarity_is_head_zero_in_sequential_colours() -> None:
    fig = diagnostics.similarity(posenc.ALiBi(4), "alibi", positions=10)
    image = fig.axes[0].images[0]
    np.testing.assert_allclose(np.asarray(image.get_array()), alibi_bias(0, 10), atol=1e-6)
    assert image.get_cmap().name == "viridis"  # all values <= 0: no diverging map
    plt.close(fig)


def test_a_signed_matrix_gets_colours_centred_on_zero() -> None:
    fig = diagnostics.similarity(posenc.SinusoidalPositionalEncoding(4), "sin", positions=64)
    image = fig.axes[0].images[0]
    low, high = image.get_clim()
    data = np.asarray(image.get_array())
    assert data.min() < 0 < data.max()
    assert image.get_cmap().name == "RdBu_r" and low == -high == -np.abs(data).max()
    plt.close(fig)


def test_distance_profile_is_each_head_slope() -> None:
    fig = diagnostics.distance(posenc.ALiBi(4), "alibi", positions=12)
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == [f"head {h}" for h in range(4)]
    for h, line in enumerate(lines):
        np.testing.assert_allclose(line.get_ydata(), -SLOPES[h] * np.arange(12), atol=1e-6)
    plt.close(fig)


def test_heads_lays_out_one_panel_per_head() -> None:
    fig = diagnostics.heads(posenc.ALiBi(6), "alibi", positions=5)
    shown = [ax for ax in fig.axes if ax.images]
    assert len(shown) == 6  # 2 rows of 4 panels, the last 2 empty
    assert [ax.get_title() for ax in shown] == [f"head {h}" for h in range(6)]
    plt.close(fig)
    fig = diagnostics.heads(posenc.ALiBi(4), "alibi", positions=5, max_heads=2)
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 2
    np.testing.assert_allclose(np.asarray(images[1].get_array()), alibi_bias(1, 5), atol=1e-6)
    plt.close(fig)


def test_grid_shows_the_grid_around_the_centre_and_the_corner() -> None:
    fig = diagnostics.grid(posenc.Rotary2DEmbedding(head_dim=16), "rope2d", side=6)
    centre, corner = (np.asarray(ax.images[0].get_array()) for ax in fig.axes if ax.images)
    assert centre.shape == corner.shape == (6, 6)
    assert np.argmax(centre) == 3 * 6 + 3 and np.argmax(corner) == 0  # most like itself
    plt.close(fig)


def test_compare_lays_out_panels_and_refuses_other_kinds() -> None:
    pes = [(f"alibi {h}", posenc.ALiBi(h)) for h in (1, 2, 4, 8, 16)]
    fig = diagnostics.compare(pes, kind="distance", positions=8)
    drawn = [ax for ax in fig.axes if ax.get_lines()]
    assert [ax.get_title() for ax in drawn] == [name for name, _ in pes]
    assert sum(not ax.axison for ax in fig.axes) == 3  # 2 rows of 4: 3 empty panels
    plt.close(fig)
    with pytest.raises(PosencValueError, match="kind 'similarity' or 'distance', got 'heads'"):
        diagnostics.compare(pes, kind="heads")


def _peg_term(pe: posenc.PositionEncodingGenerator, h: int, w: int) -> np.ndarray:
    """What a PEG adds to hidden states of ones, written out: each channel's bias plus its
    kernel's taps that land inside the grid (zero padding past it), ``(h, w, D)``."""
    weight = pe.proj.weight.detach().double().numpy()[:, 0]  # (D, k, k)
    bias = pe.proj.bias.detach().double().numpy()
    k = weight.shape[-1]
    term = np.empty((h, w, weight.shape[0]))
    for r in range(h):
        for c in range(w):
            taps = [
                weight[:, a, b]
                for a in range(k)
                for b in range(k)
                if 0 <= r + a - k // 2 < h and 0 <= c + b - k // 2 < w
            ]
            term[r, c] = bias + np.sum(taps, axis=0)
    return term


def test_a_pegs_grid_is_its_term_on_constant_hidden_states() -> None:
    """A PEG's picture (its term depends on the hidden states, not positions alone): over
    hidden states of ones, each patch's term dotted with the centre's and the corner's over
    sqrt(D); equal inside, different at the border; the position-only kinds are not
    offered for it, and a side-by-side plot refuses it by name."""
    pe = posenc.plots.build_for_plot("peg")
    fig = diagnostics.grid(pe, "peg", shape=(5, 6))
    term = _peg_term(pe, 5, 6).reshape(30, -1)
    panels = [ax for ax in fig.axes if ax.images]  # (not the colour bars)
    for ax, ref in zip(panels, (2 * 6 + 3, 0), strict=True):
        want = (term @ term[ref] / pe.dim**0.5).reshape(5, 6)
        np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), want, rtol=1e-12)
    inside = want[1:-1, 1:-1]
    assert np.ptp(inside) < 1e-9 * np.abs(inside).max() and not np.isclose(want[0, 0], want[2, 2])
    plt.close(fig)
    assert posenc.plots.kinds_for(pe) == ["grid"]
    with pytest.raises(PosencValueError, match="peg: a conditional encoding"):
        diagnostics.compare([("peg", pe), ("alibi", posenc.ALiBi(4))])
