"""Figures for rotary embeddings: what each context-extension method does to the frequency
spectrum, and RoFormer's long-term decay of the relative upper bound."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no window, ever: figures are returned or saved

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from ..encodings.checks import check_positive_float, check_positive_int
from ..encodings.rope_types.registry import ROPE_TYPES, rope_parameters, rope_type_keys


def _example_value(key: str, factor: float, original: int, pairs: int) -> object | None:
    """An example value of a scaling parameter, by its name (``None``: no example)."""
    examples: dict[str, object] = {
        "factor": factor,
        "alpha": factor,  # NTK-alpha (HunYuan): the base stretched as NTK-aware's by factor
        "original_max_position_embeddings": original,
        "low_freq_factor": 1.0,  # Llama 3.1's published values
        "high_freq_factor": 4.0,
        "short_factor": [1.0] * pairs,  # LongRoPE searches per-pair factors for each model;
        "long_factor": [factor] * pairs,  # uniform ones stand in for them here
    }
    return examples.get(key)


def default_scalings(
    factor: float, original: int, head_dim: int = 128
) -> dict[str, dict[str, Any]]:
    """One Hugging Face scaling dict per registered ``rope_type`` (:data:`ROPE_TYPES`, but
    those without parameters), extending ``original`` positions ``factor`` times: the type's
    required keys, and ``factor`` where it takes one, set to :func:`_example_value`'s values.
    A type with a required key that has no example value is left out."""
    scalings = {}
    for rope_type in ROPE_TYPES:
        required, optional = rope_type_keys(rope_type)
        if not required | optional:
            continue  # no parameters (``default``): the original frequencies, drawn anyway
        keys = required | ({"factor"} & optional)
        values = {key: _example_value(key, factor, original, head_dim // 2) for key in keys}
        if all(value is not None for value in values.values()):
            scalings[rope_type] = {"rope_type": rope_type, **dict(sorted(values.items()))}
    return scalings


def rope_scaling_spectrum(
    head_dim: int = 128,
    *,
    base: float = 10000.0,
    factor: float = 8.0,
    original_max_position_embeddings: int = 4096,
    scalings: Mapping[str, Mapping[str, Any]] | None = None,
) -> Figure:
    """Left: the wavelength ``2π / θ_i`` of every rotary pair ``i`` (log scale), original and
    per scaling method, with the original context length marked. Right: each method's
    frequency over the original one (log scale): 1 where a pair is left alone (extrapolated),
    ``1 / factor`` where it is fully interpolated.

    ``scalings`` maps a label to a Hugging Face ``rope_scaling`` dict (default: every
    registered ``rope_type`` for ``factor``, see :func:`default_scalings`). Every method is
    drawn at ``seq_len = factor * original`` (only ``dynamic`` and ``longrope`` depend on it).
    Frequencies come from :mod:`rope_scaling`.
    """
    check_positive_int("head_dim", head_dim)
    check_positive_float("factor", factor)
    original = check_positive_int(
        "original_max_position_embeddings", original_max_position_embeddings
    )
    methods = default_scalings(factor, original, head_dim) if scalings is None else dict(scalings)
    extended = factor * original
    reference, _ = rope_parameters(None, head_dim, base)
    index = np.arange(head_dim // 2)

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    left.plot(index, (2 * math.pi / reference).numpy(), color="black", lw=2, label="original")
    for label, params in methods.items():
        inv_freq, attention = rope_parameters(
            params,
            head_dim,
            base,
            max_position_embeddings=original,
            seq_len=extended,
        )
        text = label if attention == 1.0 else f"{label} (attention x{attention:.3f})"
        left.plot(index, (2 * math.pi / inv_freq).numpy(), lw=1.3, label=text)
        right.plot(index, (inv_freq / reference).numpy(), lw=1.3, label=label)
    for ax in (left, right):
        ax.set_yscale("log")
        ax.set_xlabel("rotary pair i")
        ax.grid(alpha=0.3, which="both")
    left.axhline(original, color="grey", ls="--", lw=1)
    left.annotate(f"original context {original}", (0, original), va="bottom", fontsize="small")
    left.set_ylabel("wavelength 2π/θ_i (positions)")
    left.set_title(f"RoPE wavelengths, head_dim={head_dim}, base={base:g}")
    left.legend(fontsize="small")
    right.axhline(1 / factor, color="grey", ls=":", lw=1)
    right.set_ylabel("θ_i scaled / θ_i original")
    right.set_title(f"frequency ratio (1 = kept, 1/{factor:g} = interpolated)")
    return fig


def relative_upper_bound(
    head_dim: int, distances: np.ndarray | torch.Tensor, *, base: float = 10000.0
) -> np.ndarray:
    """RoFormer §3.4.3, eq. 36: ``(1 / (d/2)) Σ_{j=1}^{d/2} |S_j|`` with
    ``S_j = Σ_{k<j} exp(i m θ_k)``, the bound on ``|<R(m) q, k>|`` (up to ``max |h|``) as a
    function of the relative distance ``m``. float64."""
    check_positive_int("head_dim", head_dim)
    m = torch.as_tensor(np.asarray(distances), dtype=torch.float64)
    theta, _ = rope_parameters(None, head_dim, base)  # (d/2,)
    angles = m[:, None] * theta  # (len(m), d/2)
    partial = torch.polar(torch.ones_like(angles), angles).cumsum(dim=-1)  # S_1 .. S_{d/2}
    return partial.abs().mean(dim=-1).numpy()


def rope_long_term_decay(
    head_dim: int = 128,
    *,
    base: float = 10000.0,
    max_distance: int = 256,
    bases: tuple[float, ...] | None = None,
) -> Figure:
    """The long-term decay of RoFormer §3.4.3 (Figure 2 of the paper): the relative upper
    bound against the relative distance, for ``base`` (and any extra ``bases`` to compare)."""
    check_positive_int("max_distance", max_distance)
    distances = np.arange(max_distance + 1)
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    for b in (base, *(bases or ())):
        ax.plot(distances, relative_upper_bound(head_dim, distances, base=b), label=f"base {b:g}")
    ax.set_xlabel("relative distance m - n")
    ax.set_ylabel("relative upper bound")
    ax.set_title(f"RoPE long-term decay (RoFormer §3.4.3), head_dim={head_dim}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig
