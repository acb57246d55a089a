"""The figures of ``posenc bench`` (``posenc.bench.plots``): one line per variant, in the order
the rows name them, through each variant's rows sorted by n (rows without the figure left
out), time in milliseconds and memory in MiB on log-log axes; the figures stay out of
pyplot."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from posenc.bench.plots import scaling_figure, time_memory_figure

ROWS: list[dict[str, Any]] = [
    {"variant": "sdpa", "n": 2048, "median_s": 0.004, "extra_mib": 64.0},
    {"variant": "flex", "n": 1024, "median_s": 0.003, "extra_mib": None},
    {"variant": "sdpa", "n": 1024, "median_s": 0.001, "extra_mib": 16.0},
    {"variant": "flex", "n": 2048, "median_s": 0.006, "extra_mib": 8.0},
    {"variant": "mine", "n": 1024, "median_s": 0.002, "extra_mib": 0.0},
]


def test_time_and_memory_lines_per_variant() -> None:
    before = plt.get_fignums()
    fig = time_memory_figure(ROWS, "a title")
    assert plt.get_fignums() == before  # not registered with pyplot
    time_ax, memory_ax = fig.axes
    times = {line.get_label(): line for line in time_ax.get_lines()}
    assert list(times) == ["posenc sdpa", "posenc flex", "mine"]
    np.testing.assert_array_equal(times["posenc sdpa"].get_xdata(), [1024, 2048])
    np.testing.assert_allclose(times["posenc sdpa"].get_ydata(), [1.0, 4.0])  # ms
    np.testing.assert_allclose(times["posenc flex"].get_ydata(), [3.0, 6.0])
    memory = {line.get_label(): line for line in memory_ax.get_lines()}
    assert list(memory) == ["posenc sdpa", "posenc flex"]  # 0 MiB cannot go on a log axis
    np.testing.assert_array_equal(memory["posenc flex"].get_xdata(), [2048])  # None left out
    for ax in (time_ax, memory_ax):
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert fig._suptitle.get_text() == "a title"


def test_scaling_figure_is_rope_above_attention() -> None:
    rope = [{"variant": "posenc", "n": n, "median_s": n * 1e-6, "extra_mib": n / 512}
            for n in (512, 1024)]  # fmt: skip
    fig = scaling_figure(rope, ROWS)
    assert len(fig.axes) == 4
    labels = [[line.get_label() for line in ax.get_lines()] for ax in fig.axes]
    assert labels[0] == labels[1] == ["posenc RotaryEmbedding"]
    assert labels[2] == ["posenc sdpa", "posenc flex", "mine"]
    assert fig.axes[2].get_ylabel() == "bias attention: time per call (ms)"
    np.testing.assert_allclose(fig.axes[1].get_lines()[0].get_ydata(), [1.0, 2.0])
