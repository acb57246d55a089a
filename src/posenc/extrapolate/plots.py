"""The figures of ``posenc extrapolate``: bits per byte against evaluation length (log-2
axis), one line per encoding and scaling, the same by position within the longest windows
and by context length (the context gain); and the retrieval heat maps, copy accuracy by
needle depth and window length, one per encoding."""

from __future__ import annotations

import math
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from ..runs.schedules import is_schedule
from .summary import context_curves, curves, lengths_of, mean, position_curves, retrieval_grid


def plot_extrapolation(results: dict[str, Any], *, clip: float = 2.5) -> Figure:
    """Two panels, three with a context gain: left, bits per byte (mean over seeds) against
    evaluation length; middle, against the end of each position bucket at the longest
    length; right, against the context length (``symlog``: 0 at the origin, log-2 past
    the shortest context). A dotted line marks the training length L. The y axes stop at
    ``clip`` times the best value at L (context L on the right), or just above the largest
    value (curves that leave it are drawn to the edge)."""
    L = results["config"]["train_len"]
    lengths = lengths_of(results)
    contexts = context_curves(results)
    fig = Figure(figsize=(18 if contexts else 12, 4.6), layout="constrained")
    left, right, *rest = fig.subplots(1, 3 if contexts else 2)
    table = curves(results)
    styles = _styles(list(table))
    for label, per in table.items():
        xs = [n for n in lengths if n in per]
        left.plot(xs, [mean(per[n]) for n in xs], label=label, **styles[label])
    if lengths:
        longest = max(lengths)
        for label, per in position_curves(results, longest).items():
            ends = [int(bucket.split("-")[1]) for bucket in per]
            right.plot(ends, [mean(v) for v in per.values()], label=label, **styles[label])
        right.set_title(f"by position, windows of {longest} tokens")
    at_l = [mean(per[L]) for per in table.values() if L in per]
    values = [mean(v) for per in table.values() for v in per.values()]
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.axvline(L, color="0.6", linestyle=":", linewidth=1)
        ax.set_ylabel("bits per byte")
        ax.grid(True, alpha=0.3)
        if at_l and values:
            ax.set_ylim(0.95 * min(values), min(clip * min(at_l), 1.05 * max(values)))
    if lengths:
        left.set_xticks(lengths)
        right.set_xticks([L * 2**k for k in range(len(lengths)) if L * 2**k <= max(lengths)])
    left.set_xlabel("evaluation length (tokens)")
    right.set_xlabel("position bucket end (tokens)")
    corpus = results["corpus"]["name"]
    left.set_title(f"{corpus}: trained at L = {L}, tested longer")
    left.legend(fontsize=8, ncol=2)
    if rest:
        _plot_context(rest[0], contexts, L, clip, styles)
    return fig


def _plot_context(
    ax: Any,
    table: dict[str, dict[int, list[float]]],
    train_len: int,
    clip: float,
    styles: dict[str, dict[str, Any]],
) -> None:
    """Bits per byte against context length, one line per label, L dotted."""
    for label, per in table.items():
        ax.plot(list(per), [mean(v) for v in per.values()], label=label, **styles.get(label, {}))
    contexts = sorted({c for per in table.values() for c in per})
    ax.set_xscale("symlog", base=2, linthresh=min((c for c in contexts if c), default=1))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_xticks(contexts)
    ax.tick_params(axis="x", labelrotation=45)
    ax.axvline(train_len, color="0.6", linestyle=":", linewidth=1)
    values = [mean(v) for per in table.values() for v in per.values()]
    at_l = [mean(per[train_len]) for per in table.values() if train_len in per]
    if values:
        top = 1.05 * max(values)
        if at_l:
            top = min(clip * min(at_l), top)
        ax.set_ylim(0.95 * min(values), top)
    ax.set_xlabel("context before the targets (tokens)")
    ax.set_ylabel("bits per byte")
    ax.set_title("context gain: the same targets, more context")
    ax.grid(True, alpha=0.3)


def plot_retrieval(results: dict[str, Any]) -> Figure:
    """One heat map per run label: copy accuracy (mean over seeds, 0 to 1) of the repeated
    needle, depth (rows) by window length (columns), each cell written in; a dotted line
    after the last length up to the training length L. Labels without ``retrieval`` are
    left out."""
    grid = retrieval_grid(results, "copy_accuracy")
    L = results["config"]["train_len"]
    labels = list(grid)
    cols = max(1, min(4, len(labels)))
    rows = max(1, math.ceil(len(labels) / cols))
    fig = Figure(figsize=(3.4 * cols + 1, 2.8 * rows + 0.4), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    image = None
    for ax, label in zip(axes, labels, strict=False):
        per = grid[label]
        depths = sorted({d for d, _ in per})
        lengths = sorted({n for _, n in per})
        values = [
            [mean(per[(d, n)]) if (d, n) in per else math.nan for n in lengths] for d in depths
        ]
        image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        for i, row in enumerate(values):
            for j, value in enumerate(row):
                if not math.isnan(value):
                    colour = "black" if value > 0.6 else "white"
                    ax.text(
                        j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color=colour
                    )
        within = sum(n <= L for n in lengths)
        if 0 < within < len(lengths):
            ax.axvline(within - 0.5, color="white", linestyle=":", linewidth=1.5)
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
        ax.set_xlabel("window length (tokens)")
        ax.set_ylabel("needle depth")
        ax.set_title(label, fontsize=10)
    for ax in axes[len(labels) :]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(image, ax=axes.tolist(), label="copy accuracy", shrink=0.8)
    fig.suptitle(f"{results['corpus']['name']}: copying a needle back, trained at L = {L}")
    return fig


def _styles(labels: list[str]) -> dict[str, dict[str, Any]]:
    """One colour per encoding (20 colours past 10 curves); scaled and fine-tuned RoPE curves
    dashed in their own colours; per-layer schedules (``rope/rope/rope/none``) with square
    markers."""
    import matplotlib as mpl

    colours = mpl.colormaps["tab10" if len(labels) <= 10 else "tab20"].colors
    out = {}
    for i, label in enumerate(labels):
        marker = "s" if is_schedule(label.split("+")[0]) else "o"
        style: dict[str, Any] = {
            "color": colours[i % len(colours)],
            "marker": marker,
            "markersize": 3,
        }
        if "+" in label:
            style["linestyle"] = "--" if " ft" not in label else "-."
        out[label] = style
    return out
