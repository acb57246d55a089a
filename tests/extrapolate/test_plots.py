"""The figures of ``posenc extrapolate`` (``posenc.extrapolate.plots``), drawn from a results
document made up here: one line per run label with the mean over seeds at each length, the
position panel at the longest length, the context-gain panel, the training length marked,
the y axis clipped at ``clip`` times the best value at L; and the retrieval heat maps."""

from __future__ import annotations

import copy
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest

from posenc.extrapolate.plots import plot_extrapolation, plot_retrieval


def run(pe: str, seed: int, bpb: dict[int, float], scaling: dict | None = None) -> dict[str, Any]:
    eval_rows = [
        {"length": n, "bpb": v, "by_position": {f"0-{n // 2}": v - 0.1, f"{n // 2}-{n}": v + 0.1}}
        for n, v in bpb.items()
    ]
    return {"pe": pe, "seed": seed, "scaling": scaling, "finetune_steps": 0, "eval": eval_rows}


RESULTS = {
    "config": {"train_len": 8},
    "corpus": {"name": "tiny-corpus"},
    "runs": [
        run("rope", 0, {8: 2.0, 16: 3.0, 32: 9.0}),
        run("rope", 1, {8: 2.2, 16: 3.4, 32: 11.0}),
        run("alibi", 0, {8: 2.1, 16: 2.1, 32: 2.2}),
        run("rope", 0, {8: 2.0, 16: 2.5, 32: 3.0}, {"rope_type": "yarn", "factor": 4.0}),
    ],
}


def test_one_line_per_label_with_the_mean_over_seeds() -> None:
    fig = plot_extrapolation(RESULTS)
    left, right = fig.axes[:2]
    lines = {line.get_label(): line for line in left.get_lines() if line.get_marker() == "o"}
    assert list(lines) == ["rope", "alibi", "rope+yarn"]
    np.testing.assert_array_equal(lines["rope"].get_xdata(), [8, 16, 32])
    np.testing.assert_allclose(lines["rope"].get_ydata(), [2.1, 3.2, 10.0])
    np.testing.assert_allclose(lines["alibi"].get_ydata(), [2.1, 2.1, 2.2])
    assert lines["rope+yarn"].get_linestyle() == "--" and lines["rope"].get_linestyle() == "-"
    # right: the position buckets of the longest windows, at each bucket's end
    by_position = {line.get_label(): line for line in right.get_lines() if line.get_marker() == "o"}
    np.testing.assert_array_equal(by_position["rope"].get_xdata(), [16, 32])
    np.testing.assert_allclose(by_position["rope"].get_ydata(), [9.9, 10.1])
    assert right.get_title() == "by position, windows of 32 tokens"
    assert left.get_title() == "tiny-corpus: trained at L = 8, tested longer"
    for ax in (left, right):
        dotted = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
        assert len(dotted) == 1 and list(dotted[0].get_xdata()) == [8, 8]
    plt.close(fig)


@pytest.mark.parametrize(("clip", "top"), [(2.5, 2.5 * 2.0), (100.0, 1.05 * 10.0)])
def test_the_y_axis_stops_at_clip_times_the_best_at_l(clip: float, top: float) -> None:
    fig = plot_extrapolation(RESULTS, clip=clip)
    bottom = 0.95 * 2.0  # the smallest mean anywhere: rope+yarn at L
    for ax in fig.axes[:2]:
        assert ax.get_ylim() == pytest.approx((bottom, top))
    plt.close(fig)


def measured() -> dict[str, Any]:
    """RESULTS with a context gain on every run and retrieval on the RoPE runs."""
    results = copy.deepcopy(RESULTS)
    gains = [{0: 2.6, 2: 2.4, 8: 2.3, 32: 2.5}, {0: 2.8, 2: 2.6, 8: 2.5, 32: 2.9},
             {0: 2.7, 2: 2.5, 8: 2.4, 32: 2.3}, {0: 2.6, 2: 2.4, 8: 2.3, 32: 2.4}]  # fmt: skip
    for run, gain in zip(results["runs"], gains, strict=True):
        run["by_context"] = {str(c): v for c, v in gain.items()}
    for seed, run in enumerate(results["runs"][:2]):
        run["retrieval"] = [
            {"length": n, "depth": d, "copy_accuracy": 0.25 * seed + d / n, "bits_saved": 1.0}
            for n in (8, 16, 32)
            for d in (0.1, 0.9)
        ]
    return results


def test_the_context_panel_plots_the_mean_gain_on_a_symlog_axis() -> None:
    fig = plot_extrapolation(measured())
    assert len(fig.axes) == 3
    panel = fig.axes[2]
    lines = {line.get_label(): line for line in panel.get_lines() if line.get_marker() == "o"}
    assert list(lines) == ["rope", "alibi", "rope+yarn"]
    np.testing.assert_array_equal(lines["rope"].get_xdata(), [0, 2, 8, 32])
    np.testing.assert_allclose(lines["rope"].get_ydata(), [2.7, 2.5, 2.4, 2.7])  # two seeds
    np.testing.assert_allclose(lines["alibi"].get_ydata(), [2.7, 2.5, 2.4, 2.3])
    assert panel.get_xscale() == "symlog"
    dotted = [line for line in panel.get_lines() if line.get_linestyle() == ":"]
    assert len(dotted) == 1 and list(dotted[0].get_xdata()) == [8, 8]
    assert panel.get_ylim() == pytest.approx((0.95 * 2.3, 1.05 * 2.7))
    assert len(plot_extrapolation(RESULTS).axes) == 2  # no context gain: no panel
    plt.close(fig)


def test_the_retrieval_figure_has_one_heat_map_per_label() -> None:
    fig = plot_retrieval(measured())
    maps = [ax for ax in fig.axes if ax.get_images()]
    assert [ax.get_title() for ax in maps] == ["rope"]  # the two seeds of one label
    image = maps[0].get_images()[0].get_array()
    want = [[0.125 + 0.1 / n for n in (8, 16, 32)], [0.125 + 0.9 / n for n in (8, 16, 32)]]
    np.testing.assert_allclose(image, want)  # rows: depth; columns: length; mean over seeds
    assert image.shape == (2, 3) and maps[0].get_images()[0].get_clim() == (0.0, 1.0)
    assert [t.get_text() for t in maps[0].get_xticklabels()] == ["8", "16", "32"]
    assert len(maps[0].texts) == 6 and maps[0].texts[0].get_text() == f"{want[0][0]:.2f}"
    plt.close(fig)
