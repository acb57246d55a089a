"""Figures for additive (absolute) encodings and for the tour's attention demonstration."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

from ..errors import PosencValueError

matplotlib.use("Agg")  # no window, ever: figures are returned or saved

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from torch import Tensor

from ..analysis import PermutationResult


def _array(t: Tensor | np.ndarray) -> np.ndarray:
    return t.detach().cpu().double().numpy() if isinstance(t, Tensor) else np.asarray(t)


def heatmap(table: Tensor | np.ndarray, *, title: str = "Sinusoidal positional encoding") -> Figure:
    """The table as an image: position down, dimension across, diverging colours."""
    data = _array(table)
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    limit = float(np.abs(data).max()) or 1.0  # sin/cos tables span ±1; learned ones far less
    mesh = ax.pcolormesh(data, cmap="RdBu_r", vmin=-limit, vmax=limit, shading="auto")
    ax.invert_yaxis()
    ax.set_xlabel("dimension")
    ax.set_ylabel("position")
    ax.set_title(title)
    fig.colorbar(mesh, ax=ax, label="value")
    return fig


def dimension_waves(
    table: Tensor | np.ndarray,
    dims: Sequence[int] = (0, 1, 30, 31),
    *,
    title: str = "Encoding value against position, per dimension",
) -> Figure:
    """One curve per chosen dimension against position: low dimensions oscillate fast,
    high ones slowly (the seed's dims 0, 1, 30, 31)."""
    data = _array(table)
    bad = [d for d in dims if not 0 <= d < data.shape[1]]
    if bad:
        raise PosencValueError(f"dims {bad} are outside the table's {data.shape[1]} dimensions")
    fig, ax = plt.subplots(figsize=(8, 4), layout="constrained")
    for d in dims:
        kind = "sin" if d % 2 == 0 else "cos"
        ax.plot(np.arange(data.shape[0]), data[:, d], label=f"dim {d} ({kind})")
    ax.set_xlabel("position")
    ax.set_ylabel("value")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize="small")
    ax.grid(alpha=0.3)
    return fig


def permutation_weights(result: PermutationResult) -> Figure:
    """Attention weights for the sentence and its shuffle, without and with positions."""
    panels = [
        (result.weights_plain, result.words, "no positions"),
        (result.weights_plain_shuffled, result.shuffled_words, "no positions, shuffled"),
        (result.weights_pos, result.words, "with positions"),
        (result.weights_pos_shuffled, result.shuffled_words, "with positions, shuffled"),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(13, 3.4), layout="constrained")
    for ax, (w, words, title) in zip(axes, panels, strict=True):
        data = _array(w)
        ax.imshow(data, cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_xticks(range(len(words)), words)
        ax.set_yticks(range(len(words)), words)
        for i in range(data.shape[0]):
            for j in range(data.shape[1]):
                ax.text(j, i, f"{data[i, j]:.2f}", ha="center", va="center", color="w", fontsize=8)
        ax.set_title(title, fontsize="medium")
    fig.suptitle(
        f"Attention weights: order gap {result.gap_plain:.1e} without positions, "
        f"{result.gap_pos:.2f} with"
    )
    return fig
