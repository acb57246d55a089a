"""Figures for the attention-bias family: the bias matrix of every head, the bias against the
distance ``i - j`` per head, and a gallery of every bias scheme side by side.

Schemes that read the queries and keys (Shaw, Transformer-XL, CoPE) or the layer's input
(FoX, Inkling) are drawn for random ``q, k`` or ``x`` from a seeded generator, so their
pictures show one sample, not a fixed function.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import matplotlib

from ..errors import PosencTypeError, PosencValueError

matplotlib.use("Agg")  # no window, ever: figures are returned or saved

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

from ..encodings.base import BiasEncoding
from ..encodings.checks import check_positive_int
from ..encodings.registry import available, build_for_model, entry


def _check(pe: object) -> BiasEncoding:
    if not isinstance(pe, BiasEncoding):
        raise PosencTypeError(f"pe must be a bias encoding, got {type(pe).__name__}")
    return pe


def bias_values(
    pe: BiasEncoding, q_positions: Tensor, k_positions: Tensor, *, seed: int = 0
) -> Tensor:
    """The bias ``(h, nq, nk)`` in float64, with seeded random ``q, k`` for schemes that read
    them. ``pe`` itself is left untouched (a float64 copy is evaluated)."""
    pe = copy.deepcopy(_check(pe)).double().eval()
    q = k = None
    reads = {}
    if pe.needs_x:  # a data-dependent bias: one seeded sample of the layer's input
        gen_x = torch.Generator().manual_seed(seed)
        shape_x = (1, k_positions.shape[-1], int(pe.dim))  # type: ignore[attr-defined]
        reads["x"] = torch.randn(shape_x, generator=gen_x, dtype=torch.float64)
    if pe.needs_qk:
        head_dim = int(pe.head_dim)  # type: ignore[attr-defined]
        gen = torch.Generator().manual_seed(seed)
        shape = (1, pe.num_heads, q_positions.shape[-1], head_dim)
        q = torch.randn(shape, generator=gen, dtype=torch.float64)
        k = torch.randn((1, pe.num_heads, k_positions.shape[-1], head_dim), generator=gen).double()
    with torch.no_grad():
        bias = pe.bias(q_positions, k_positions, q=q, k=k, **reads)
    return bias.reshape(-1, pe.num_heads, *bias.shape[-2:])[0]


def _matrix(ax: Axes, data: np.ndarray, title: str) -> None:
    limit = float(np.abs(data).max()) or 1.0
    image = ax.imshow(data, cmap="RdBu_r", vmin=-limit, vmax=limit)
    ax.set_title(title, fontsize="small")
    ax.set_xlabel("key j", fontsize="small")
    ax.set_ylabel("query i", fontsize="small")
    ax.figure.colorbar(image, ax=ax, shrink=0.8)


def bias_matrices(
    pe: BiasEncoding, *, positions: int = 32, max_heads: int = 8, title: str | None = None
) -> Figure:
    """The ``positions × positions`` bias of each head (up to ``max_heads``), each with its own
    symmetric colour scale (slopes differ by orders of magnitude between heads)."""
    check_positive_int("positions", positions)
    check_positive_int("max_heads", max_heads)
    pos = torch.arange(positions)
    bias = bias_values(pe, pos, pos).numpy()
    heads = min(pe.num_heads, max_heads)
    cols = min(heads, 4)
    rows = -(-heads // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False, layout="constrained"
    )
    for h, ax in enumerate(axes.flat):
        if h < heads:
            _matrix(ax, bias[h], f"head {h}")
        else:
            ax.axis("off")
    fig.suptitle(title or f"{type(pe).__name__}: bias per head")
    return fig


def _distance_curves(ax: Axes, pe: BiasEncoding, max_distance: int, max_heads: int) -> None:
    n = 2 * max_distance + 1
    pos = torch.arange(n)
    query = max_distance  # the middle query sees keys max_distance away on both sides
    row = bias_values(pe, pos, pos)[:, query, :].numpy()  # (h, n); CoPE needs every query
    distance = query - np.arange(n)  # i - j: positive for keys before the query
    for h in range(min(pe.num_heads, max_heads)):
        ax.plot(distance, row[h], label=f"head {h}")
    ax.set_xlabel("distance i - j (key before the query > 0)")
    ax.set_ylabel("bias")
    ax.grid(alpha=0.3)


def bias_against_distance(
    pe: BiasEncoding, *, max_distance: int = 64, max_heads: int = 8, title: str | None = None
) -> Figure:
    """The bias of query ``i = max_distance`` on keys ``j = 0 .. 2·max_distance``, against
    ``i - j``, one curve per head."""
    check_positive_int("max_distance", max_distance)
    check_positive_int("max_heads", max_heads)
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    _distance_curves(ax, _check(pe), max_distance, max_heads)
    ax.legend(fontsize="small", ncols=2)
    ax.set_title(title or f"{type(pe).__name__}: bias against distance, per head")
    return fig


def bias_gallery(
    names: Sequence[str] | None = None,
    *,
    positions: int = 32,
    max_distance: int = 64,
    dim: int = 64,
    num_heads: int = 4,
) -> Figure:
    """One row per scheme (default: every registered bias scheme on sequences, as the grid
    schemes such as ``swin-bias`` take coordinates): head 0's bias matrix, and
    every head's bias against distance. Learned schemes are shown at their (seeded)
    initialisation."""
    check_positive_int("positions", positions)
    check_positive_int("max_distance", max_distance)
    if names is None:
        names = [name for name in available("bias") if entry(name).cls.axes == 1]
    if not names:
        raise PosencValueError(f"names must hold at least one bias scheme, got {names!r}")
    fig, axes = plt.subplots(
        len(names), 2, figsize=(10, 3.0 * len(names)), squeeze=False, layout="constrained"
    )
    for row, name in zip(axes, names, strict=True):
        torch.manual_seed(0)
        pe = _check(build_for_model(name, dim, num_heads))
        pos = torch.arange(positions)
        _matrix(row[0], bias_values(pe, pos, pos)[0].numpy(), f"{name}: head 0")
        _distance_curves(row[1], pe, max_distance, num_heads)
        row[1].set_title(f"{name}: bias against distance", fontsize="small")
    axes[0, 1].legend(fontsize="x-small", ncols=2)
    return fig


__all__ = ["bias_against_distance", "bias_gallery", "bias_matrices", "bias_values"]
