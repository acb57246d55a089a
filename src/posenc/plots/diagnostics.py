"""Figures that work for every encoding, through the family hooks: the position-similarity
matrix, the logit contribution against distance, the per-head bias matrices, 2-D grids and
side-by-side comparisons."""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib

from ..errors import PosencValueError

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ..analysis import contribution_matrix, distance_profile, grid_coordinates
from ..encodings.base import PositionalEncoding


def _draw_matrix(ax: Axes, matrix: torch.Tensor, title: str) -> None:
    """Diverging colours centred on 0 when the values take both signs, sequential otherwise."""
    data = matrix.detach().double().numpy()
    low, high = float(data.min()), float(data.max())
    if low < 0 < high:
        limit = max(-low, high)
        image = ax.imshow(data, cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="nearest")
    else:
        image = ax.imshow(data, cmap="viridis", interpolation="nearest")
    ax.figure.colorbar(image, ax=ax, shrink=0.8)
    ax.set_title(title, fontsize="medium")
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")


def _draw_profile(ax: Axes, matrix: torch.Tensor, title: str, *, max_heads: int = 8) -> None:
    profile = distance_profile(matrix).numpy()  # (heads, n)
    for h, row in enumerate(profile[:max_heads]):
        label = f"head {h}" if profile.shape[0] > 1 else None
        ax.plot(range(len(row)), row, label=label, lw=1.3)
    ax.set_title(title, fontsize="medium")
    ax.set_xlabel("distance |i - j|")
    ax.set_ylabel("logit contribution")
    ax.grid(alpha=0.3)
    if profile.shape[0] > 1:
        ax.legend(fontsize="x-small", ncol=2)


def similarity(pe: PositionalEncoding, name: str, positions: int = 64) -> Figure:
    """The position-position logit contribution as a matrix (head 0 for bias schemes)."""
    m = contribution_matrix(pe, positions)
    fig, ax = plt.subplots(figsize=(5.5, 4.8), layout="constrained")
    _draw_matrix(ax, m[0], f"{name}: contribution of (i, j) to the logit")
    return fig


def distance(pe: PositionalEncoding, name: str, positions: int = 64) -> Figure:
    """The logit contribution averaged over pairs at each distance, per head."""
    m = contribution_matrix(pe, positions)
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    _draw_profile(ax, m, f"{name}: logit contribution against distance")
    return fig


def heads(pe: PositionalEncoding, name: str, positions: int = 32, max_heads: int = 8) -> Figure:
    """The bias (or contribution) matrix of each head, side by side."""
    m = contribution_matrix(pe, positions)[:max_heads]
    cols = min(4, m.shape[0])
    rows = math.ceil(m.shape[0] / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), layout="constrained")
    flat = list(getattr(axes, "flat", [axes]))
    for h, ax in enumerate(flat):
        if h < m.shape[0]:
            _draw_matrix(ax, m[h], f"head {h}")
        else:
            ax.axis("off")
    fig.suptitle(f"{name}: bias per head")
    return fig


def _grid_rows(
    pe: PositionalEncoding, shape: Sequence[int]
) -> tuple[torch.Tensor, list[int], list[int]]:
    """The contribution of the centre point and of the corner point to every point shown
    (the whole 2-D grid, or a 3-D volume's middle frame), ``(2, h, w)``; and the grid's and
    the picture's shape."""
    shape = list(shape)
    if pe.family == "conditional":
        return _generated_rows(pe, shape), shape, shape
    if pe.axes == 3 and len(shape) == 2:
        shape = [shape[0], *shape]  # a volume as deep as it is high
    shown = shape[-2:]
    patches = grid_coordinates(shown)  # (h * w, 2)
    if pe.axes == 3:
        middle = torch.full((patches.shape[0], 1), shape[0] // 2, dtype=patches.dtype)
        patches = torch.cat((middle, patches), dim=1)  # (h * w, 3)
    centre = torch.tensor([[s // 2 for s in shape]])
    corner = torch.zeros(1, pe.axes, dtype=patches.dtype)
    # only two rows are needed: the contribution of the centre and the corner to every patch
    # shown, not all pairs of the volume
    m = contribution_matrix(pe, torch.cat((centre, corner, patches)))[0]  # (2 + h*w, ...)
    return m[:2, 2:].reshape(2, *shown), shape, shown


def _generated_rows(pe: PositionalEncoding, shape: Sequence[int]) -> torch.Tensor:
    """A conditional encoding's (PEG's) term over an ``(h, w)`` grid of hidden states that
    are all ones, ``t = PEG(x) - x``: equal for every patch the kernel sees inside the grid,
    different where it reads the zero padding past the border (the position information
    CPVT describes). Each patch's ``t · t_ref / sqrt(D)`` with the centre's and the corner's
    term, ``(2, h, w)``."""
    h, w = shape
    dim, cls = int(pe.dim), int(getattr(pe, "cls_tokens", 0))  # type: ignore[call-overload]
    ones = torch.ones(1, cls + h * w, dim, dtype=torch.float64)
    with torch.no_grad():
        term = (pe.eval()(ones, grid=(h, w)) - ones)[0, cls:]  # (h * w, D)
    refs = term[torch.tensor([(h // 2) * w + w // 2, 0])]  # the centre, the corner
    return (refs @ term.T / dim**0.5).reshape(2, h, w)


def grid(
    pe: PositionalEncoding, name: str, side: int = 16, *, shape: Sequence[int] | None = None
) -> Figure:
    """For a 2-D (or 3-D, middle frame) encoding: how each patch of a ``side x side`` grid
    (or one of ``shape``, ``(h, w)`` or ``(t, h, w)``) relates to the centre patch and to a
    corner patch."""
    rows, full, _ = _grid_rows(pe, shape if shape is not None else [side] * pe.axes)
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2), layout="constrained")
    for ax, ref, label in zip(axes, rows, ("centre", "corner"), strict=True):
        _draw_matrix(ax, ref, f"similarity to the {label} patch")
        ax.set_xlabel("column")
        ax.set_ylabel("row")
    title = f"{name} on a {' x '.join(map(str, full))} grid"
    if pe.family == "conditional":
        title += ": its term on hidden states of ones"
    fig.suptitle(title)
    return fig


def compare_grids(
    encodings: Sequence[tuple[str, PositionalEncoding]], shape: Sequence[int]
) -> Figure:
    """Several grid encodings side by side: for each, the similarity of every patch of a grid
    of ``shape`` to the centre patch (top) and to a corner patch (bottom)."""
    count = len(encodings)
    fig, axes = plt.subplots(
        2, count, figsize=(3.6 * count, 6.4), layout="constrained", squeeze=False
    )
    for col, (name, pe) in enumerate(encodings):
        rows, _, _ = _grid_rows(pe, shape)
        for row, label in enumerate(("centre", "corner")):
            _draw_matrix(axes[row, col], rows[row], f"{name}: to the {label}")
            axes[row, col].set_xlabel("column")
            axes[row, col].set_ylabel("row")
    fig.suptitle(f"similarity over a {' x '.join(map(str, shape))} grid")
    return fig


def compare(
    encodings: Sequence[tuple[str, PositionalEncoding]],
    *,
    kind: str = "similarity",
    positions: int = 64,
) -> Figure:
    """Several encodings side by side: one panel each, four to a row, ``kind``
    ``similarity`` or ``distance``."""
    if kind not in ("similarity", "distance"):
        raise PosencValueError(
            f"a side-by-side plot takes kind 'similarity' or 'distance', got {kind!r}"
        )
    count = len(encodings)
    cols = min(count, 4)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.2 * cols, 4.0 * rows), layout="constrained", squeeze=False
    )
    for ax in axes.flat[count:]:
        ax.axis("off")
    conditional = [name for name, pe in encodings if pe.family == "conditional"]
    if conditional:
        raise PosencValueError(
            f"{', '.join(conditional)}: a conditional encoding's term depends on the hidden "
            "states, not on positions alone, so it has no logit contribution of (i, j); "
            "draw it with kind 'grid' (--grid HxW)"
        )
    for ax, (name, pe) in zip(axes.flat, encodings, strict=False):
        m = contribution_matrix(pe, positions)
        if kind == "similarity":
            _draw_matrix(ax, m[0], name)
        else:
            _draw_profile(ax, m, name)
    fig.suptitle(
        "logit contribution " + ("of (i, j)" if kind == "similarity" else "against distance")
    )
    return fig
