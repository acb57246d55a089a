"""Validation of what users hand to an encoding: sizes, probabilities, flags, dtypes, input
tensors and positions. Every check raises :class:`~posenc.errors.PosencValueError` or
:class:`~posenc.errors.PosencTypeError` naming the argument and the bad value, before any work.

Dimension legend: ``b`` batch, ``n`` sequence, ``d`` model or head dim.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
from torch import Tensor

from ..errors import PosencTypeError, PosencValueError


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` if it is a positive ``int``; raise naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise PosencTypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < 1:
        raise PosencValueError(f"{name} must be >= 1, got {value}")
    return value


def check_positive_float(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a finite number > 0; raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PosencTypeError(f"{name} must be a number, got {type(value).__name__} ({value!r})")
    value = float(value)
    if not value > 0 or value == float("inf"):
        raise PosencValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def check_probability(name: str, value: object) -> float:
    """Return ``value`` if it is a number in [0, 1); raise naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PosencTypeError(f"{name} must be a number, got {type(value).__name__} ({value!r})")
    if not 0.0 <= float(value) < 1.0:
        raise PosencValueError(f"{name} must be in [0, 1), got {value}")
    return float(value)


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a ``bool``; raise naming ``name`` otherwise (``bool("no")`` is
    True, so strings and numbers are refused rather than converted)."""
    if not isinstance(value, bool):
        raise PosencTypeError(f"{name} must be a bool, got {type(value).__name__} ({value!r})")
    return value


def check_float_dtype(name: str, value: object) -> torch.dtype:
    """Return ``value`` if it is a floating-point ``torch.dtype``; raise naming ``name``."""
    if not isinstance(value, torch.dtype):
        raise PosencTypeError(
            f"{name} must be a torch.dtype, got {type(value).__name__} ({value!r})"
        )
    if not value.is_floating_point:
        raise PosencTypeError(f"{name} must be a floating-point dtype, got {value}")
    return value


def check_finite(name: str, values: Tensor) -> Tensor:
    """Raise naming ``name`` if a floating ``values`` holds NaN or ±inf (skipped where values
    cannot be read: meta tensors, inside ``torch.compile``/export)."""
    readable = _eager() and values.device.type != "meta"
    if readable and values.is_floating_point() and not bool(torch.isfinite(values).all()):
        bad = values[~torch.isfinite(values)].flatten()[0].item()
        raise PosencValueError(f"{name} must be finite, got {bad}")
    return values


#: The variable that has positions on a GPU read and checked as on the CPU (``1``).
CHECK_VARIABLE = "POSENC_CHECK_POSITIONS"
#: Whether the values of CPU tensors (positions, document runs) are read on the host where
#: that costs no synchronisation: by the checks here, the bias family, the rotary tables and
#: the sequence context. The tests clear it to send CPU tensors down the path a GPU's take.
CPU_IS_HOST = True


def on_host(t: Tensor) -> bool:
    """Whether reading ``t``'s values costs no synchronisation: a CPU tensor
    (:data:`CPU_IS_HOST`)."""
    return CPU_IS_HOST and t.is_cpu


def reads_values(positions: object) -> bool:
    """Whether the values of ``positions`` are read on the host (checked, or a table sized
    from them): on the CPU, or anywhere under ``POSENC_CHECK_POSITIONS=1``; never inside
    ``torch.compile``/export nor on the meta device. Anything but a tensor: True (a check
    refuses it, naming it). Elsewhere a read would synchronise the host with the device in
    every eager call: tables are sized from host-known bounds, or the bias formed per score,
    and the value checks are skipped."""
    if not isinstance(positions, Tensor):
        return True
    if not _eager() or positions.device.type == "meta":
        return False
    return on_host(positions) or os.environ.get(CHECK_VARIABLE) == "1"


def _eager() -> bool:
    """True outside ``torch.compile`` / export tracing, where data-dependent checks are free."""
    return not torch.compiler.is_compiling()


#: The largest position taken: float64, in which angles and distances are formed, holds every
#: whole number up to 2**53 and not past it (2**53 + 1 rounds to 2**53).
MAX_POSITION = 2**53


def check_position_range(name: str, low: float, high: float) -> None:
    """Raise naming ``name`` where the smallest position ``low`` is negative or the largest
    ``high`` is past :data:`MAX_POSITION` (values the caller already read: no read here)."""
    if low < 0:
        raise PosencValueError(f"{name} must be >= 0, got a minimum of {low}")
    if high > MAX_POSITION:
        raise PosencValueError(
            f"{name} must be at most 2**53 = {MAX_POSITION} (past it float64, in which the "
            f"angles are formed, does not hold every whole number), got a maximum of {high}"
        )


def resolve_positions(
    positions: Tensor | None,
    seq_len: int,
    *,
    batch: int | None = None,
    device: torch.device | None = None,
    integer: bool = False,
    name: str = "positions",
    values: bool = True,
) -> Tensor:
    """Validate ``positions`` for a sequence of ``seq_len`` tokens, or make ``arange(seq_len)``.

    Accepted shapes are ``(n,)`` and ``(b, n)`` (with ``b`` equal to ``batch`` when given).
    Positions must be finite, in ``[0, 2**53]`` (:func:`check_position_range`, both ends in
    one read) and, with ``integer=True``, whole numbers, where their values are read
    (:func:`reads_values`: on the CPU, or under ``POSENC_CHECK_POSITIONS=1``; a GPU's are
    left unread, a read would synchronise). ``values=False``: none of these value checks
    (the caller checks the values itself: :func:`resolve_bounded_positions`).
    """
    if positions is None:
        return torch.arange(seq_len, device=device)
    if not isinstance(positions, Tensor):
        raise PosencTypeError(f"{name} must be a torch.Tensor, got {type(positions).__name__}")
    if positions.dtype == torch.bool or positions.is_complex():
        raise PosencTypeError(
            f"{name} must be an integer or float tensor, got dtype {positions.dtype}"
        )
    positions = wide_integers(positions)
    if positions.dim() not in (1, 2) or positions.shape[-1] != seq_len:
        raise PosencValueError(
            f"{name} must have shape (seq,) or (batch, seq) with seq={seq_len}, "
            f"got {tuple(positions.shape)}"
        )
    if positions.dim() == 2 and batch is not None and positions.shape[0] not in (1, batch):
        raise PosencValueError(
            f"{name} has batch size {positions.shape[0]} but the input has batch size {batch}"
        )
    values = values and reads_values(positions)  # (a GPU's: unread, see reads_values)
    if values:
        check_finite(name, positions)
    checkable = _eager() and positions.device.type != "meta"
    needs_whole_check = integer and values and checkable and positions.is_floating_point()
    if needs_whole_check and not torch.equal(positions, positions.round()):
        bad = positions[positions != positions.round()].flatten()[0].item()
        raise PosencValueError(f"{name} must hold whole numbers for this encoding, got {bad}")
    if values and checkable and positions.numel():
        check_position_range(name, *torch.stack(torch.aminmax(positions)).tolist())  # one read
    return positions


_NARROW_INTEGERS = (torch.int8, torch.int16, torch.uint8, torch.uint16, torch.uint32, torch.uint64)


def wide_integers(positions: Tensor) -> Tensor:
    """``positions`` of an integer dtype narrower than int32 or unsigned as int64, anything
    else as it is: torch indexes with int32 and int64 only, and reads a uint8 index as a boolean
    mask."""
    if positions.dtype in _NARROW_INTEGERS:
        return positions.long()
    return positions


def take_position_ids(positions: Tensor | None, position_ids: Tensor | None) -> Tensor | None:
    """The positions of a call given as ``positions`` or as ``position_ids`` (transformers',
    PyTorch's and ONNX's name for the same argument); both given: a
    :class:`~posenc.errors.PosencValueError` naming both."""
    if position_ids is None:
        return positions
    if positions is not None:
        raise PosencValueError(
            "positions and position_ids are two names of one argument; give one, got both"
        )
    return position_ids


class PositionBound(NamedTuple):
    """A number the host knows without reading the device: every position of a call is at
    most ``largest``, and equals it somewhere where ``exact``. It sizes the rotary tables of
    a cached call (:mod:`posenc.sequence.context`) so that no position is read on the host."""

    largest: int
    exact: bool


def resolve_bounded_positions(
    positions: Tensor, seq_len: int, *, batch: int, device: torch.device | None, name: str
) -> tuple[Tensor, PositionBound | None]:
    """:func:`resolve_positions` for given ``positions``, and for integer ones whose values
    are read (:func:`reads_values`) their largest value: the range check and the largest in
    one transfer (the one read an explicit position tensor costs a forward on the CPU).
    ``None`` where nothing was read (a GPU's positions: the rotary tables are then sized
    ahead, see :mod:`posenc.encodings.rotary.tables`)."""
    readable = (
        isinstance(positions, Tensor)
        and not (positions.is_floating_point() or positions.is_complex())
        and positions.dtype != torch.bool
        and reads_values(positions)
    )
    positions = resolve_positions(
        positions, seq_len, batch=batch, device=device, name=name, values=not readable
    )
    if not readable or not positions.numel():
        return positions, None
    low, high = torch.stack(torch.aminmax(positions)).tolist()  # one transfer
    check_position_range(name, low, high)
    return positions, PositionBound(high, True)


def check_grid_positions(positions: object, n: int, axes: int, batch: int) -> Tensor:
    """``positions`` as coordinates of ``n`` grid points, ``(n, axes)`` or ``(batch or 1, n,
    axes)``, of a real dtype; raise naming ``positions`` and what it holds otherwise."""
    if not isinstance(positions, Tensor):
        raise PosencTypeError(f"positions must be a torch.Tensor, got {type(positions).__name__}")
    if positions.dtype == torch.bool or positions.is_complex():
        raise PosencTypeError(
            f"positions must be an integer or float tensor, got {positions.dtype}"
        )
    shape = tuple(positions.shape)
    if positions.dim() not in (2, 3) or shape[-2:] != (n, axes):
        raise PosencValueError(
            f"positions must be grid coordinates of shape (seq, {axes}) or "
            f"(batch, seq, {axes}) with seq={n}, got {shape}"
        )
    if positions.dim() == 3 and shape[0] not in (1, batch):
        raise PosencValueError(f"positions has batch size {shape[0]} but the input has {batch}")
    return positions


def check_input(x: object, dim: int, *, name: str = "x", rank: int = 3) -> Tensor:
    """Check that ``x`` is a floating tensor of rank ``rank`` whose last dimension is ``dim``."""
    if not isinstance(x, Tensor):
        raise PosencTypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise PosencTypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() != rank:
        raise PosencValueError(f"{name} must have {rank} dimensions, got shape {tuple(x.shape)}")
    if x.shape[-1] != dim:
        raise PosencValueError(f"{name} has last dimension {x.shape[-1]}, expected dim={dim}")
    return x


def check_input_dtype(x: Tensor, params: torch.dtype, owner: str, *, name: str = "x") -> None:
    """Refuse ``x`` whose dtype differs from ``params`` (the dtype of ``owner``'s parameters)
    outside autocast, naming both, before any work (else a Linear or LayerNorm fails deep
    inside). Under autocast on ``x``'s device the layers cast their inputs, so mixed dtypes
    are taken, except float64 on either side, which autocast never casts."""
    dtype = x.dtype
    if dtype is params:
        return
    if torch.is_autocast_enabled(x.device.type) and torch.float64 not in (dtype, params):
        return
    raise PosencTypeError(
        f"{name} has dtype {dtype} but the parameters of {owner} are {params}: convert one "
        f"to the other ({name}.to({params}) or module.to({dtype})), or run under "
        "torch.autocast (which casts neither float64)"
    )


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype arithmetic is done in: fp32 for half types, the input's own otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
