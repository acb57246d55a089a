"""Sinusoidal absolute encodings (Vaswani et al. 2017, "Attention Is All You Need", §3.5).

    PE[p, 2i]   = sin(p / base^(2i/d))
    PE[p, 2i+1] = cos(p / base^(2i/d))

Angles are always formed in float64 and cast at the end, so a float32 table is within
float32 rounding (6e-8) of the exact value at every position up to 1e6 and beyond; the usual
float32 evaluation is off by 4.7e-4 at position 8192 already. An odd ``d`` ends on a sine.

Also here: the scaled variant with a learned gain (as in x-transformers'
``ScaledSinusoidalEmbedding``) and the N-D tables for images and volumes (the layout of the
``positional-encodings`` package: one interleaved block per axis, concatenated).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    import numpy as np

from ...errors import PosencTypeError, PosencValueError, check_bytes
from .. import checks
from ..base import AdditiveEncoding
from ..checks import (
    check_input,
    check_positive_float,
    check_positive_int,
    check_probability,
    compute_dtype,
    resolve_positions,
    take_position_ids,
)
from ..registry import register
from ..tiles import add_encoding

PAPER = "Vaswani et al. 2017, Attention Is All You Need, §3.5"


def _check_table_args(num_positions: object, dim: object, base: object) -> float:
    if isinstance(num_positions, bool) or not isinstance(num_positions, int):
        raise PosencTypeError(
            f"num_positions must be an int, got {type(num_positions).__name__} ({num_positions!r})"
        )
    if num_positions < 0:
        raise PosencValueError(f"num_positions must be >= 0, got {num_positions}")
    check_positive_int("dim", dim)
    base = check_positive_float("base", base)
    if base == 1.0:
        raise PosencValueError("base must not be 1.0 (every frequency would be equal)")
    return base


def table_bytes(count: int, dim: int, dtype: torch.dtype = torch.float32) -> int:
    """Peak bytes of building ``count`` rows of a ``dim``-wide table: the float64 angles, their
    sin and cos, the interleaved float64 stack and the cast result."""
    return count * (math.ceil(dim / 2) * 8 * 5 + dim * dtype.itemsize)


def inverse_frequencies(dim: int, base: float = 10000.0, *, device: Any = None) -> Tensor:
    """``1 / base^(2i/dim)`` for ``i = 0 .. ceil(dim/2) - 1``, in float64."""
    exponent = torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim
    return base**-exponent


def sinusoidal_angles_to_table(angles: Tensor, dim: int, dtype: torch.dtype) -> Tensor:
    """Interleave ``sin`` and ``cos`` of ``angles`` (``(..., ceil(dim/2))``, float64) into
    ``(..., dim)`` columns ``sin, cos, sin, cos, ...`` and cast once to ``dtype``."""
    table = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (..., 2*ceil(d/2))
    return table[..., :dim].to(dtype)


def sinusoidal_table(
    num_positions: int,
    dim: int,
    *,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """The sinusoidal table for positions ``0 .. num_positions - 1``: ``(num_positions, dim)``.

    Row ``p``, column ``2i`` is ``sin(p / base**(2i/dim))``, column ``2i+1`` the matching cos.

    >>> sinusoidal_table(3, 4)
    tensor([[ 0.0000,  1.0000,  0.0000,  1.0000],
            [ 0.8415,  0.5403,  0.0100,  0.9999],
            [ 0.9093, -0.4161,  0.0200,  0.9998]])
    """
    base = _check_table_args(num_positions, dim, base)
    checks.check_float_dtype("dtype", dtype)
    nbytes = table_bytes(num_positions, dim, dtype)
    check_bytes("num_positions x dim", f"{num_positions} x {dim}", nbytes, device=device)
    positions = torch.arange(num_positions, dtype=torch.float64, device=device)
    return sinusoidal_encode(positions, dim, base=base, dtype=dtype)


def sinusoidal_encode(
    positions: Tensor, dim: int, *, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The sinusoidal encoding of arbitrary (integer or float) ``positions``: ``(..., dim)``."""
    if not isinstance(positions, Tensor):
        raise PosencTypeError(f"positions must be a torch.Tensor, got {type(positions).__name__}")
    base = _check_table_args(0, dim, base)
    checks.check_float_dtype("dtype", dtype)
    if not torch.compiler.is_compiling():  # symbolic sizes there
        count = positions.numel()
        nbytes = table_bytes(count, dim, dtype)
        check_bytes("positions x dim", f"{count} x {dim}", nbytes, device=positions.device)
    inv_freq = inverse_frequencies(dim, base, device=positions.device)
    angles = positions.to(torch.float64).unsqueeze(-1) * inv_freq  # (..., ceil(d/2))
    return sinusoidal_angles_to_table(angles, dim, dtype)


def sinusoidal_table_np(
    num_positions: int, dim: int, *, base: float = 10000.0, dtype: Any = "float32"
) -> np.ndarray:
    """NumPy twin of :func:`sinusoidal_table` (same float64 angles, same layout). NumPy is
    imported here, on the first call: posenc's models need torch alone."""
    import numpy as np

    base = _check_table_args(num_positions, dim, base)
    check_bytes("num_positions x dim", f"{num_positions} x {dim}", table_bytes(num_positions, dim))
    inv_freq = base ** -(np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = np.arange(num_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    table = np.stack((np.sin(angles), np.cos(angles)), axis=-1).reshape(num_positions, -1)
    return table[:, :dim].astype(dtype)


class _TableCache(nn.Module):
    """Holds a fixed float32 table as a non-persistent buffer that grows on demand.

    ``.to(dtype)`` on the model must not degrade the table (peers lose position accuracy
    that way), so after any move or cast the table is rebuilt in float32 on the new device.
    The table grows only in proportion to the work asked for: a far position is evaluated
    from the formula (:meth:`_formula`, the same float64 arithmetic, so the same values),
    never by building every row up to it.
    """

    table: Tensor
    max_len: int

    def _formula(self, positions: Tensor) -> Tensor:
        """The float32 rows of ``positions`` (any shape ``S``) -> ``(*S, d)``."""
        raise NotImplementedError

    def _build(self, num_positions: int, device: Any) -> Tensor:
        return self._formula(torch.arange(num_positions, device=device))

    def reset_tables(self, num_positions: int | None = None) -> None:
        """(Re)build the table; used after ``to_empty``/``.to()`` and when it must grow."""
        n = self.table.shape[0] if num_positions is None else num_positions
        self.table = self._build(n, self.table.device)

    def _apply(self, fn: Any, recurse: bool = True) -> _TableCache:
        super()._apply(fn, recurse)
        if self.table.device.type != "meta":
            self.reset_tables()
        return self

    def rows(self, positions: Tensor | None, n: int) -> Tensor:
        """Rows of the table for ``positions`` (``None`` means ``arange(n)``). A position past
        the table's end grows it (doubling, so growth is rare) up to ``max_len`` or four
        times the request; a position beyond that is computed from the formula directly."""
        needed = n if positions is None else _max_plus_one(positions, n)
        if needed > self.table.shape[0] and not torch.compiler.is_compiling():
            limit = max(self.max_len, 4 * n)
            if needed > limit:
                pos = torch.arange(n, device=self.table.device) if positions is None else positions
                return self._formula(pos)
            self.reset_tables(min(max(needed, 2 * self.table.shape[0]), limit))
        if positions is None:
            return self.table[:n]
        return self.table[positions]


def _max_plus_one(positions: Tensor, default: int) -> int:
    if torch.compiler.is_compiling() or positions.device.type == "meta" or not positions.numel():
        return default
    return int(positions.max()) + 1


@register("sinusoidal", "fixed sin/cos table added to the embeddings")
class SinusoidalPositionalEncoding(AdditiveEncoding, _TableCache):
    """Fixed sinusoidal encoding added to the input (Vaswani et al. 2017, §3.5).

    Checked against a float64 transcription of the formula and the ``positional-encodings``
    package.

    Args:
        dim: model width ``d`` (any ``d >= 1``; odd ends on a sine column).
        max_len: rows precomputed; longer inputs grow the table on demand.
        base: the wavelength base (10000 in the paper).
        dropout: dropout applied to the sum, as in the paper.

    Integer positions read the cached table; float positions (interpolated or randomized)
    are evaluated from the formula in float64.

    >>> pe = SinusoidalPositionalEncoding(16)
    >>> pe(torch.zeros(2, 5, 16)).shape
    torch.Size([2, 5, 16])
    """

    paper: ClassVar[str] = PAPER

    def __init__(
        self,
        dim: int,
        *,
        max_len: int = 2048,
        base: float = 10000.0,
        dropout: float = 0.0,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.max_len = check_positive_int("max_len", max_len)
        self.base = _check_table_args(0, dim, base)
        self.dropout = nn.Dropout(check_probability("dropout", dropout))
        nbytes = table_bytes(max_len, dim) + max_len * 8
        check_bytes("max_len x dim", f"{max_len} x {dim}", nbytes, device=device)
        self.register_buffer("table", self._build(max_len, device), persistent=False)

    def _formula(self, positions: Tensor) -> Tensor:
        return sinusoidal_encode(positions, self.dim, base=self.base)

    def encode(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        if positions.is_floating_point() or dtype == torch.float64:
            return sinusoidal_encode(positions, self.dim, base=self.base, dtype=dtype)
        return self.rows(positions, positions.shape[-1]).to(dtype)

    def forward(
        self, x: Tensor, positions: Tensor | None = None, *, position_ids: Tensor | None = None
    ) -> Tensor:
        """Shapes: x ``(b, n, d)``, positions ``(n,)`` or ``(b, n)`` -> ``(b, n, d)``."""
        positions = take_position_ids(positions, position_ids)
        check_input(x, self.dim)
        work = compute_dtype(x.dtype)
        if positions is None and work != torch.float64:
            pe = self.rows(None, x.shape[1]).to(work)  # fast path: a slice, no gather
        else:
            positions = resolve_positions(positions, x.shape[1], batch=x.shape[0], device=x.device)
            pe = self.encode(positions, work)
        return add_encoding(x, pe, self.dropout)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, max_len={self.max_len}, base={self.base:g}"


@register("scaled-sinusoidal", "sinusoidal table times a learned scalar gain")
class ScaledSinusoidalPositionalEncoding(SinusoidalPositionalEncoding):
    """Sinusoidal encoding times one learned scalar, initialised to ``dim ** -0.5``
    (Hua et al. 2022, "Transformer Quality in Linear Time"; x-transformers'
    ``ScaledSinusoidalEmbedding``, which uses the half layout ``[sin..., cos...]`` where this
    class keeps the paper's interleaved one)."""

    paper: ClassVar[str] = "Hua et al. 2022, Transformer Quality in Linear Time, App. A"

    def __init__(self, dim: int, **kwargs: Any) -> None:
        super().__init__(dim, **kwargs)
        self.scale = nn.Parameter(torch.tensor(dim**-0.5, device=self.table.device))

    def encode(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        return super().encode(positions, dtype) * self.scale.to(dtype)

    def forward(
        self, x: Tensor, positions: Tensor | None = None, *, position_ids: Tensor | None = None
    ) -> Tensor:
        # the generic path: resolve positions, encode (table * gain), add in the work dtype
        positions = take_position_ids(positions, position_ids)
        return AdditiveEncoding.forward(self, x, positions)


# --------------------------------------------------------------------------- N-D


def sinusoidal_nd_table(
    shape: tuple[int, ...],
    dim: int,
    *,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """Sinusoidal encoding of every point of a grid of ``shape``: ``(*shape, dim)``.

    Each axis gets a block of ``c = 2 * ceil(dim / (2 * len(shape)))`` channels holding the 1-D
    table of that axis's coordinate; blocks are concatenated in axis order and the result is
    cut to ``dim`` channels (the ``positional-encodings`` layout).
    """
    if not isinstance(shape, (tuple, list)) or not shape:
        raise PosencValueError(f"shape must be a non-empty tuple of axis sizes, got {shape!r}")
    for axis, size in enumerate(shape):
        check_positive_int(f"shape[{axis}]", size)
    count = math.prod(shape)
    nbytes = count * len(shape) * 8 * 2 + table_bytes(count, dim, dtype) * 2
    check_bytes("shape x dim", f"{tuple(shape)} x {dim}", nbytes, device=device)
    grids = torch.meshgrid(
        *(torch.arange(n, dtype=torch.float64, device=device) for n in shape), indexing="ij"
    )
    coords = torch.stack(grids, dim=-1)  # (*shape, ndim)
    return sinusoidal_nd_encode(coords, dim, base=base, dtype=dtype)


def sinusoidal_nd_encode(
    coords: Tensor, dim: int, *, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Encode coordinates ``(..., ndim)`` as ``(..., dim)`` in the layout of
    :func:`sinusoidal_nd_table`."""
    if not isinstance(coords, Tensor) or coords.dim() < 1 or coords.shape[-1] < 1:
        raise PosencValueError("coords must be a tensor of shape (..., ndim) with ndim >= 1")
    _check_table_args(0, dim, base)
    ndim = coords.shape[-1]
    channels = 2 * math.ceil(dim / (2 * ndim))
    blocks = [
        sinusoidal_encode(coords[..., a], channels, base=base, dtype=dtype) for a in range(ndim)
    ]
    return torch.cat(blocks, dim=-1)[..., :dim]


class SinusoidalNDPositionalEncoding(AdditiveEncoding):
    """Sinusoidal encoding of N-D coordinates (image patches, volumes, video).

    ``forward`` takes either a grid ``(b, *spatial, d)`` (coordinates default to the grid
    indices) or a flattened sequence ``(b, n, d)`` with ``positions`` of shape ``(n, ndim)`` or
    ``(b, n, ndim)`` giving each token's coordinates.
    """

    paper: ClassVar[str] = "Vaswani et al. 2017, extended per axis (Carion et al. 2020, DETR)"
    ndim: ClassVar[int]

    def __init__(self, dim: int, *, base: float = 10000.0, dropout: float = 0.0) -> None:
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.base = _check_table_args(0, dim, base)
        self.dropout = nn.Dropout(check_probability("dropout", dropout))

    def forward(
        self, x: Tensor, positions: Tensor | None = None, *, position_ids: Tensor | None = None
    ) -> Tensor:
        """Shapes: x ``(b, *spatial, d)`` or ``(b, n, d)``; positions ``(..., n, ndim)``."""
        positions = take_position_ids(positions, position_ids)
        grid = x.dim() == self.ndim + 2 if isinstance(x, Tensor) else False
        check_input(x, self.dim, rank=self.ndim + 2 if grid else 3)
        work = compute_dtype(x.dtype)
        if positions is None:
            if not grid:
                raise PosencValueError(
                    f"a flattened input needs positions of shape (seq, {self.ndim}); "
                    f"or pass a grid of rank {self.ndim + 2}"
                )
            pe = sinusoidal_nd_table(
                tuple(x.shape[1:-1]), self.dim, base=self.base, dtype=work, device=x.device
            )
        else:
            expected = (*x.shape[1:-1], self.ndim)
            if not isinstance(positions, Tensor):
                raise PosencTypeError(
                    f"positions must be a torch.Tensor, got {type(positions).__name__}"
                )
            if (
                tuple(positions.shape[-len(expected) :]) != expected
                or positions.dim() > len(expected) + 1
            ):
                raise PosencValueError(
                    f"positions must have shape {expected} (optionally with a batch dimension), "
                    f"got {tuple(positions.shape)}"
                )
            checks.check_finite("positions", positions)
            pe = sinusoidal_nd_encode(positions, self.dim, base=self.base, dtype=work)
        return add_encoding(x, pe, self.dropout)


@register("sinusoidal-2d", "per-axis sinusoidal encoding of 2-D coordinates (images)")
class Sinusoidal2DPositionalEncoding(SinusoidalNDPositionalEncoding):
    ndim: ClassVar[int] = 2
    axes: ClassVar[int] = 2


@register("sinusoidal-3d", "per-axis sinusoidal encoding of 3-D coordinates (volumes, video)")
class Sinusoidal3DPositionalEncoding(SinusoidalNDPositionalEncoding):
    ndim: ClassVar[int] = 3
    axes: ClassVar[int] = 3
