"""The figures for additive encodings (``posenc.plots.absolute``): the heatmap and the
per-dimension curves draw the table's own numbers, with colour limits symmetric about 0, and
the permutation figure draws the four weight matrices it is given, each cell labelled."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from posenc.analysis import PermutationResult
from posenc.encodings.absolute.sinusoidal import sinusoidal_table
from posenc.errors import PosencValueError
from posenc.plots.absolute import dimension_waves, heatmap, permutation_weights


def test_heatmap_draws_the_table() -> None:
    table = 0.3 * torch.randn(12, 6, dtype=torch.float64)
    fig = heatmap(table, title="a table")
    mesh = fig.axes[0].collections[0]
    np.testing.assert_array_equal(np.asarray(mesh.get_array()).reshape(12, 6), table.numpy())
    limit = float(table.abs().max())
    assert mesh.get_clim() == pytest.approx((-limit, limit))
    assert fig.axes[0].get_title() == "a table"
    assert fig.axes[0].yaxis_inverted()  # position 0 at the top
    plt.close(fig)


def test_dimension_waves_draws_the_chosen_columns() -> None:
    table = sinusoidal_table(20, 8)
    fig = dimension_waves(table, dims=(0, 3, 7))
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["dim 0 (sin)", "dim 3 (cos)", "dim 7 (cos)"]
    for line, d in zip(lines, (0, 3, 7), strict=True):
        np.testing.assert_array_equal(line.get_xdata(), np.arange(20))
        np.testing.assert_allclose(line.get_ydata(), table[:, d].double().numpy())
    # Dimension 0 is sin(p): the curve is the formula.
    np.testing.assert_allclose(lines[0].get_ydata(), np.sin(np.arange(20)), atol=1e-6)
    plt.close(fig)
    with pytest.raises(PosencValueError, match=r"dims \[8, -1\] are outside the table's 8"):
        dimension_waves(table, dims=(0, 8, -1))


def test_permutation_figure_draws_each_matrix_with_its_words() -> None:
    torch.manual_seed(0)
    mats = [torch.softmax(torch.randn(3, 3), -1) for _ in range(4)]
    result = PermutationResult(
        words=("a", "b", "c"),
        shuffled_words=("c", "a", "b"),
        order=(2, 0, 1),
        weights_plain=mats[0],
        weights_plain_shuffled=mats[1],
        weights_pos=mats[2],
        weights_pos_shuffled=mats[3],
        gap_plain=0.0,
        gap_pos=0.25,
    )
    fig = permutation_weights(result)
    axes = fig.axes
    assert len(axes) == 4
    for ax, m, words in zip(axes, mats, ["abc", "cab", "abc", "cab"], strict=True):
        np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), m.double().numpy())
        assert [t.get_text() for t in ax.get_xticklabels()] == list(words)
        assert len(ax.texts) == 9 and ax.texts[1].get_text() == f"{float(m[0, 1]):.2f}"
    assert "0.0e+00 without positions, 0.25 with" in fig._suptitle.get_text()
    plt.close(fig)
