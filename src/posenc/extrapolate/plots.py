"""The figure of ``posenc extrapolate``: bits per byte against evaluation length (log-2 axis),
one line per encoding and scaling, and the same by position within the longest windows."""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from .summary import curves, lengths_of, mean, position_curves


def plot_extrapolation(results: dict[str, Any], *, clip: float = 2.5) -> Figure:
    """Two panels: left, bits per byte (mean over seeds) against evaluation length; right,
    against the end of each position bucket at the longest length. A dotted line marks the
    training length L. The y axis stops at ``clip`` times the best value at L, or just above
    the largest value (curves that leave it are drawn to the edge)."""
    L = results["config"]["train_len"]
    lengths = lengths_of(results)
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    left, right = fig.subplots(1, 2)
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
    return fig


def _styles(labels: list[str]) -> dict[str, dict[str, Any]]:
    """One colour per encoding; scaled and fine-tuned RoPE curves dashed in their own colours."""
    import matplotlib as mpl

    colours = mpl.colormaps["tab10"].colors
    out = {}
    for i, label in enumerate(labels):
        style: dict[str, Any] = {"color": colours[i % len(colours)], "marker": "o", "markersize": 3}
        if "+" in label:
            style["linestyle"] = "--" if " ft" not in label else "-."
        out[label] = style
    return out
