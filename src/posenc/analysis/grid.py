"""Measured properties of 2-D and 3-D (grid) encodings: :mod:`posenc.analysis`'s sequence
properties made spatial.

All three read the logit contribution of every pair of grid points,
:func:`~posenc.analysis.contribution_matrix` on the grid's coordinates, ``(heads, n, n)``:

- :func:`grid_shift_residual`: how far the contribution of ``(p, q)`` is from a function of
  the offset ``p - q`` alone, i.e. from being unchanged when both points shift together;
- :func:`grid_decay_fraction`: whether the mean contribution falls as the Euclidean
  distance ``|p - q|`` grows;
- :func:`isotropy_gap`: how much the contribution along the rows (offsets ``(δ, 0)``)
  differs from that along the columns (``(0, δ)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..encodings.base import PositionalEncoding
from ..encodings.registry import build_for_model, entry
from ..errors import PosencValueError
from . import contribution_matrix, grid_coordinates


def check_grid(shape: Sequence[int], axes: int) -> tuple[int, ...]:
    """``shape`` as a tuple of ``axes`` sides, each >= 2 (a 2-D shape for a 3-D encoding gets a
    depth equal to its first side)."""
    shape = tuple(shape)
    if len(shape) == 2 and axes == 3:
        shape = (shape[0], *shape)
    if len(shape) != axes or any(not isinstance(s, int) or s < 2 for s in shape):
        raise PosencValueError(
            f"grid must be {axes} sides of at least 2 for an encoding on {axes} axes, "
            f"got {list(shape)}"
        )
    return shape


def _offsets(shape: Sequence[int]) -> Tensor:
    """The offset ``p_i - p_j`` of every pair of grid points, ``(n, n, axes)``."""
    coords = grid_coordinates(shape)  # (n, axes)
    return coords[:, None, :] - coords[None, :, :]


def _scale(matrix: Tensor) -> float:
    return float(matrix.abs().max())


def grid_shift_residual(matrix: Tensor, shape: Sequence[int]) -> float:
    """Largest spread (max − min) of ``matrix[..., i, j]`` over the pairs that share an offset
    ``p_i − p_j``, relative to ``max |matrix|``. 0 means the contribution is unchanged when
    both points are shifted together."""
    scale = _scale(matrix)
    if scale == 0.0:
        return 0.0
    offsets = _offsets(shape)  # (n, n, axes)
    spans = torch.tensor([2 * s - 1 for s in shape])
    shifted = offsets + torch.tensor(shape) - 1  # every axis in 0 .. 2s - 2
    strides = torch.tensor([int(spans[a + 1 :].prod()) for a in range(len(shape))])
    key = (shifted * strides).sum(-1).flatten()  # (n * n,) one id per distinct offset
    flat = matrix.double().flatten(-2).reshape(-1, key.numel())  # (heads, n * n)
    size = int(spans.prod())
    index = key.expand_as(flat)
    high = torch.full((flat.shape[0], size), -torch.inf, dtype=flat.dtype)
    low = torch.full((flat.shape[0], size), torch.inf, dtype=flat.dtype)
    high = high.scatter_reduce(-1, index, flat, "amax")
    low = low.scatter_reduce(-1, index, flat, "amin")
    seen = torch.isfinite(high)
    return float((high - low)[seen].max()) / scale


def euclidean_profile(matrix: Tensor, shape: Sequence[int]) -> tuple[Tensor, Tensor]:
    """The distinct Euclidean distances ``|p_i − p_j|`` in increasing order ``(m,)`` and the
    mean of ``matrix[..., i, j]`` over the pairs at each, ``(heads, m)``."""
    squared = (_offsets(shape) ** 2).sum(-1).flatten()  # integers: exact grouping
    distances, group = torch.unique(squared, sorted=True, return_inverse=True)
    flat = matrix.double().flatten(-2).reshape(-1, squared.numel())  # (heads, n * n)
    sums = torch.zeros(flat.shape[0], distances.numel(), dtype=torch.float64)
    sums.index_add_(-1, group, flat)
    counts = torch.bincount(group, minlength=distances.numel()).double()
    return distances.double().sqrt(), sums / counts


def grid_decay_fraction(matrix: Tensor, shape: Sequence[int], *, tol: float = 1e-9) -> float:
    """Fraction of steps between consecutive Euclidean distances at which the mean
    contribution does not rise, averaged over heads. 1 means monotone decay with distance."""
    _, profile = euclidean_profile(matrix, shape)
    steps = profile[..., 1:] <= profile[..., :-1] + tol * profile.abs().max().clamp_min(1.0)
    return float(steps.double().mean())


def axis_profiles(matrix: Tensor, shape: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Mean contribution at offsets ``±δ`` along the rows' axis and along the columns' axis
    (the last two axes; other axes' offsets 0), ``δ = 1 .. min(h, w) − 1``: two ``(heads,
    δ)`` tensors."""
    offsets = _offsets(shape)  # (n, n, axes)
    flat = matrix.double().flatten(-2).reshape(-1, offsets.shape[0] ** 2)  # (heads, n * n)
    rows_axis, cols_axis = len(shape) - 2, len(shape) - 1
    reach = min(shape[rows_axis], shape[cols_axis])
    profiles = []
    for along in (rows_axis, cols_axis):
        still = torch.ones(offsets.shape[:2], dtype=torch.bool)
        for a in range(len(shape)):
            if a != along:
                still &= offsets[..., a] == 0
        means = []
        for delta in range(1, reach):
            pick = (still & (offsets[..., along].abs() == delta)).flatten()
            means.append(flat[:, pick].mean(-1))
        profiles.append(torch.stack(means, dim=-1))
    return profiles[0], profiles[1]


def isotropy_gap(matrix: Tensor, shape: Sequence[int]) -> float:
    """Largest ``|rows(δ) − columns(δ)|`` of :func:`axis_profiles` over ``δ`` and heads,
    relative to ``max |matrix|``. 0 means rows and columns are treated alike."""
    scale = _scale(matrix)
    if scale == 0.0:
        return 0.0
    rows, cols = axis_profiles(matrix, shape)
    return float((rows - cols).abs().max()) / scale


@dataclass(frozen=True)
class GridAnalysis:
    """Measured properties of one grid encoding (see :func:`analyze_grid`)."""

    name: str
    family: str
    grid: tuple[int, ...]
    shift_residual: float  # 0 = unchanged when both points shift together
    decay_fraction: float  # 1 = falls monotonically with Euclidean distance
    isotropy_gap: float  # 0 = rows and columns alike

    def to_dict(self) -> dict[str, object]:
        return {**self.__dict__, "grid": list(self.grid)}


GRID_COLUMNS = ("encoding", "family", "grid", "shift resid.", "decay (Euclid.)", "row/col gap")


def format_grid_analysis(row: GridAnalysis) -> list[str]:
    if row.family == "conditional":  # its term reads the hidden states: positions alone give 0
        return [row.name, row.family, "x".join(map(str, row.grid)), "n/a", "n/a", "n/a"]
    return [
        row.name,
        row.family,
        "x".join(map(str, row.grid)),
        f"{row.shift_residual:.2e}",
        f"{row.decay_fraction:.2f}",
        f"{row.isotropy_gap:.2e}",
    ]


@torch.no_grad()
def rotary_expected(pe: PositionalEncoding, positions: Tensor) -> Tensor:
    """``E_q <R(i) q, R(j) q> / sqrt(d)`` for ``q ~ N(0, I)``, exactly: the mean over the
    basis vectors ``e_1 .. e_d`` times ``d`` (``E[q qᵀ] = I``), ``(heads, n, n)``."""
    d = int(pe.head_dim)  # type: ignore[attr-defined]
    heads = int(getattr(pe, "num_heads", 1))
    n = positions.shape[0]
    basis = torch.eye(d, dtype=torch.float64)[:, None, :].expand(d, n, d)  # (d, n, d)
    # (1, d, n, d): the basis on the head axis; per-head phases: (d, h, n, d)
    q = basis.unsqueeze(0) if heads == 1 else basis.unsqueeze(1).expand(d, heads, n, d)
    rq, rk = pe.eval()(q, q, positions)
    w = rq.shape[-1]
    if heads == 1:
        rq, rk = (t.transpose(1, 2).reshape(1, n, d * w) for t in (rq, rk))
    else:
        rq, rk = (t.permute(1, 2, 0, 3).reshape(heads, n, d * w) for t in (rq, rk))
    return rq @ rk.transpose(1, 2) / w**0.5  # (heads, n, n)


def grid_matrix(pe: PositionalEncoding, shape: Sequence[int], *, seed: int = 0) -> Tensor:
    """The logit contribution of every pair of points of a grid of ``shape``, ``(heads, n,
    n)``, row-major: :func:`~posenc.analysis.contribution_matrix`, except that a rotary
    scheme's is its exact expectation over random queries (:func:`rotary_expected`), so that
    no sampling noise enters the measures."""
    coords = grid_coordinates(shape)
    if pe.family == "rotary":
        return rotary_expected(pe, coords)
    return contribution_matrix(pe, coords, seed=seed)


def analyze_grid(
    name: str,
    *,
    grid: Sequence[int] = (8, 8),
    dim: int = 96,
    num_heads: int = 4,
    seed: int = 0,
) -> GridAnalysis:
    """Measure the grid properties of the encoding registered as ``name`` (one on 2 or 3
    axes) on a grid of ``grid`` points (a model of width ``dim`` with ``num_heads`` heads,
    randomly initialised with ``seed``)."""
    cls = entry(name).cls
    if cls.axes == 1:
        raise PosencValueError(f"{name} encodes sequences, not grids: analyze() measures it")
    shape = check_grid(grid, cls.axes)
    torch.manual_seed(seed)
    pe = build_for_model(name, dim, num_heads).double()
    m = grid_matrix(pe, shape, seed=seed)
    return GridAnalysis(
        name=name,
        family=pe.family,
        grid=shape,
        shift_residual=grid_shift_residual(m, shape),
        decay_fraction=grid_decay_fraction(m, shape),
        isotropy_gap=isotropy_gap(m, shape),
    )
