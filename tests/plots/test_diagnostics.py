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
