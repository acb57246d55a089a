"""The figure of ``posenc probe``: held-out R² of the position probe and of the recurrence
distance probe against depth, one line per model (:mod:`posenc.probe`)."""

from __future__ import annotations

from collections.abc import Mapping

from matplotlib.figure import Figure

from ..probe import ProbeResult


def plot_probe(results: Mapping[str, ProbeResult]) -> Figure:
    """Two panels, R² against depth (0: the embedding, k: after block k), one line per model
    of ``results`` (label -> result): left, each token's absolute position; right, the
    ``log2`` distance to the previous occurrence of its token. A result whose ``extra`` says
    ``trained: False`` (a model as initialised) is dashed, in the colour of the model it
    follows. R² below -0.1 is drawn at the bottom edge."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True)
    depths = max((len(r.rows) for r in results.values()), default=1)
    colour = None
    for label, result in results.items():
        xs = [row.depth for row in result.rows]
        trained = result.extra.get("trained", True)
        style = {"marker": "o", "label": label}
        if trained or colour is None:
            (line,) = left.plot(xs, [row.position_r2 for row in result.rows], **style)
            colour = line.get_color()
        else:
            style.update(color=colour, linestyle="--", marker=".")
            left.plot(xs, [row.position_r2 for row in result.rows], **style)
        right.plot(xs, [row.distance_r2 for row in result.rows], **{**style, "color": colour})
    for ax, title in (
        (left, "absolute position"),
        (right, "log₂ distance to the previous occurrence"),
    ):
        ax.set_title(f"linear probe of {title}")
        ax.set_xlabel("depth (0 = embedding, k = after block k)")
        ax.set_xticks(range(depths))
        ax.set_ylim(-0.1, 1.02)
        ax.axhline(0.0, color="0.6", linewidth=0.8)
        ax.grid(True, alpha=0.3)
    left.set_ylabel("held-out R²")
    left.legend(fontsize=8)
    return fig
