"""The length-generalization figure: accuracy against input length, one line per encoding.

Built on ``matplotlib.figure.Figure`` without pyplot, so it never opens a window or touches
the global backend; the caller saves it.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from ..errors import PosencValueError
from .evaluate import aggregate


def plot_accuracy_vs_length(records: list[dict[str, Any]], *, metric: str = "exact") -> Figure:
    """Accuracy (%) against input length per encoding, one panel per task.

    Each line is the mean over the valid seeds of a (task, encoding) with the band from the
    worst to the best seed; the dashed line marks the longest trained length. Groups with no
    valid seed are listed in the legend as ``(0/n valid)`` and not drawn.

    Args:
        records: run records as written to ``results.jsonl``.
        metric: ``"exact"`` (exact match) or ``"token"`` (per-token accuracy).
    """
    if metric not in ("exact", "token"):
        raise PosencValueError(f"metric must be 'exact' or 'token', got {metric!r}")
    if not records:
        raise PosencValueError("records is empty: nothing to plot")
    groups = aggregate(records)
    tasks = list(dict.fromkeys(g["task"] for g in groups))
    fig = Figure(figsize=(5.5 * len(tasks), 4.2), layout="constrained")
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, task in zip(axes, tasks, strict=True):
        trained = max(
            (r["config"]["train_max_length"] for r in records if r["task"] == task), default=None
        )
        for g in (g for g in groups if g["task"] == task):
            name = f"{g['label']} ({g['valid']}/{g['runs']} valid)"
            if not g["lengths"]:
                ax.plot([], [], linestyle="none", label=name)
                continue
            xs = [row["length"] for row in g["lengths"]]
            ys = [100 * row[metric] for row in g["lengths"]]
            (line,) = ax.plot(xs, ys, marker=".", label=name)
            if metric == "exact":
                low = [100 * row["exact_min"] for row in g["lengths"]]
                high = [100 * row["exact_max"] for row in g["lengths"]]
                ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
        if trained is not None:
            ax.axvline(trained + 0.5, color="grey", linestyle="--", linewidth=1)
        ax.set_title(task)
        ax.set_xlabel("input length")
        ax.set_ylabel("exact match (%)" if metric == "exact" else "per-token accuracy (%)")
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="lower left")
    return fig
