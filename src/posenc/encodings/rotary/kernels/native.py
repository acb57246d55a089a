"""The native rotation kernel (Su et al. 2021, "RoFormer", eq. 34), built at install time from
``_rotary_native.c`` (its Python interface and bounds checks) and ``_rotary_rows.c`` (its
arithmetic) beside this file: each row read once and written once, in place or into a fresh
tensor, float32 arithmetic and one rounding for bfloat16, results identical to
:func:`~.rotate.rotate_reference`'s. setup.py builds it for the baseline instruction set with
run-time dispatch to AVX2/AVX-512; it takes float32 and bfloat16 CPU tensors with contiguous
channels (any strides elsewhere). :func:`turn_pair` turns a query and a key by the same
tables in one go (a decode step).

It stands behind the kernel interface (:mod:`.kernel`: :func:`turn`, :func:`turn_pair`).
Whether it runs is decided by :func:`~.select.select`; what is here only checks what the
data allow (dtype, layout, address). ``_native`` is ``None`` where no C compiler was found at
install time (``tests/encodings/rotary/kernels/test_native.py`` fails if a compiler exists but
the kernel was not built).

Dimension legend: ``n`` sequence, ``d`` channels of ``x``, ``r`` rotary channels (``r <= d``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .kernel import pair_refused
from .pytorch import turn_tiled

#: Leading dims (all but the channels) the native kernel takes; more go to the torch path.
NATIVE_MAX_LEAD = 4

try:  # built at install time from _rotary_native.c; absent where no C compiler was found
    from ._rotary_native import rotate as _native
    from ._rotary_native import rotate_pair as _native_pair
except ImportError:  # pragma: no cover - depends on the build
    _native = _native_pair = None


#: The dtypes the native kernel rotates (float32 arithmetic, one rounding for bfloat16).
_NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def _native_tensor(x: Tensor) -> bool:
    """Whether the native kernel takes ``x``: a float32 or bfloat16 CPU tensor with
    contiguous channels and at most :data:`NATIVE_MAX_LEAD` leading dims."""
    return (
        x.is_cpu
        and x.dtype in _NATIVE_DTYPES
        and 1 <= x.dim() <= NATIVE_MAX_LEAD + 1
        and (x.stride(-1) == 1 or x.shape[-1] == 1)
    )


def _native_tables(cos: Tensor, sin: Tensor) -> bool:
    """Whether the native kernel takes the tables: float32 with contiguous channels."""
    return (
        cos.dtype is torch.float32
        and sin.dtype is torch.float32
        and (cos.stride(-1) == 1 or cos.shape[-1] == 1)
        and (sin.stride(-1) == 1 or sin.shape[-1] == 1)
    )


def _native_buffer(t: Tensor, item: int) -> tuple | None:
    """What the native kernel is told about ``t`` (``item`` bytes per element): the address
    and size in bytes of its storage, its offset, sizes and strides, from which the kernel
    computes every address and checks that each lies inside the storage. ``None`` where the
    storage's address is not a multiple of ``item`` (e.g. ``torch.frombuffer`` at an odd
    offset), which the kernel refuses: such tensors take the pure-torch path."""
    storage = t.untyped_storage()
    address = storage.data_ptr()
    if address % item:
        return None
    return address, storage.nbytes(), t.storage_offset(), t.shape, t.stride()


def _kernel_tables(
    cos: Tensor, sin: Tensor, bf16: bool, interleaved: bool, first_row: int | None = None
) -> tuple | None:
    """The arguments of the native kernel that depend only on the tables and the layout (what
    tensors rotated by the same tables share), or ``None`` where it refuses the tables'
    addresses (:func:`_native_buffer`). With ``first_row``, ``cos`` and ``sin`` are whole
    ``(positions, r/2)`` tables and the kernel reads their rows ``first_row`` to
    ``first_row + n - 1`` where they lie, as ``cos[first_row : first_row + n]`` would view
    them (``n`` the rows of the rotated tensor; the kernel checks that they exist)."""
    cos_at, sin_at = _native_buffer(cos, 4), _native_buffer(sin, 4)  # (float32 tables)
    if cos_at is None or sin_at is None:
        return None
    return cos_at, sin_at, first_row, bf16, interleaved


def _run_kernel(x: Tensor, x_at: tuple, out_at: tuple, tables: tuple) -> None:
    """The native kernel on ``x`` (described by ``x_at``) into ``out`` (``out_at``: ``x``
    itself, or contiguous) with :func:`_kernel_tables`'s arguments (the tables broadcast
    against ``x.shape[:-1]`` inside the kernel, as ``expand`` would). A large rotation is
    shared among the threads of torch's own OpenMP runtime (``torch.get_num_threads()`` of
    them), whose workers wait for work after each of torch's parallel operators; threads the
    kernel started itself would fight those waiting workers for the cores (setup.py,
    ``benchmarks/hf.md``)."""
    _native(x_at, out_at, *tables)  # type: ignore[misc]


def _turn_c(x: Tensor, out: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> bool:
    """The native kernel (``_rotary_native.c``): every element read once and written once,
    ``out`` being ``x`` (in place) or a fresh contiguous tensor; channels past ``r`` are
    copied by torch. ``False``, with nothing written, where the kernel refuses an address
    (:func:`_native_buffer`)."""
    bf16 = x.dtype is torch.bfloat16
    item = 2 if bf16 else 4
    x_at = _native_buffer(x, item)
    out_at = x_at if out is x else _native_buffer(out, item)
    tables = _kernel_tables(cos, sin, bf16, interleaved)
    if x_at is None or out_at is None or tables is None:
        return False
    r = 2 * cos.shape[-1]
    if r < x.shape[-1] and out is not x:
        out[..., r:].copy_(x[..., r:])
    _run_kernel(x, x_at, out_at, tables)
    return True


def turn(
    x: Tensor, out: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, clockwise: bool = False
) -> None:
    """The native kernel's ``turn`` (:mod:`.kernel`): write the rotation of ``x`` into
    ``out`` (``x`` itself, or a fresh tensor of its shape), on the pure-torch path only where
    the kernel refuses an address (:func:`_native_buffer`); clockwise by ``-sin``."""
    if x.numel() == 0:
        return
    if clockwise:
        sin = -sin
    # ``out`` is x or contiguous: every caller makes it so
    if not _turn_c(x, out, cos, sin, interleaved):
        turn_tiled(x, out, cos, sin, interleaved)


def turn_pair(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
    inplace: bool,
    rows: int | Tensor | None = None,
    clockwise: bool = False,
) -> tuple[Tensor, Tensor] | None:
    """The native kernel's ``turn_pair`` (:mod:`.kernel`): ``q`` and ``k`` turned by the
    same tables, what they share checked once. ``None``, with nothing written, where the data
    rule it out: :func:`~.kernel.pair_refused` (a partial rotation's copy of the channels past
    ``r`` is :func:`_turn_c`'s), tables that are not float32 with contiguous channels,
    or an address the kernel refuses (:func:`_native_buffer`); and ``rows`` given as a
    tensor (the kernel reads one run of rows, an ``int``)."""
    if pair_refused(q, k, cos, inplace) or not _native_tables(cos, sin):
        return None
    if rows is not None and not isinstance(rows, int):
        return None
    if clockwise:
        sin = -sin
    bf16 = q.dtype is torch.bfloat16
    item = 2 if bf16 else 4
    tables = _kernel_tables(cos, sin, bf16, interleaved, rows)  # made once
    q_at, k_at = _native_buffer(q, item), _native_buffer(k, item)
    if tables is None or q_at is None or k_at is None:
        return None  # an address the kernel refuses (see _native_buffer)
    if inplace:
        out_q, out_k, out_q_at, out_k_at = q, k, q_at, k_at
    else:
        out_q = torch.empty_like(q, memory_format=torch.contiguous_format)
        out_k = torch.empty_like(k, memory_format=torch.contiguous_format)
        out_q_at, out_k_at = _native_buffer(out_q, item), _native_buffer(out_k, item)
    _run_kernel(q, q_at, out_q_at, tables)
    _run_kernel(k, k_at, out_k_at, tables)
    return out_q, out_k


def prepare_tables(cos: Tensor, sin: Tensor) -> tuple[tuple, tuple] | None:
    """The C kernel's descriptions of the tables ``cos`` and ``sin`` (float32 CPU tensors with
    contiguous channels), made once for every :func:`turn_pair_prepared` that turns by them
    (or by views of them a caller describes from these); ``None`` where the kernel is not
    built or does not take them. The caller keeps ``cos`` and ``sin`` alive while the
    descriptions are in use."""
    if _native is None or not (cos.is_cpu and sin.is_cpu) or not _native_tables(cos, sin):
        return None
    cos_at, sin_at = _native_buffer(cos, 4), _native_buffer(sin, 4)
    if cos_at is None or sin_at is None:
        return None
    return cos_at, sin_at


def prepare_joint_halves(rows: Tensor, b: int, n: int) -> tuple[tuple, tuple] | None:
    """What :func:`prepare_tables` would describe for the first halves of ``cos`` and ``sin``
    ``= rows.chunk(2, -1)``, broadcast over heads as ``(b, 1, n, w/2)`` views, from ``rows``
    alone: a float32 CPU tensor ``(b, n, 2w)`` fresh from ``index_select``
    (contiguous, storage offset 0, so its storage is its own elements). ``None`` where the
    kernel is not built or refuses the address (:func:`_native_buffer`)."""
    address = rows.data_ptr()
    if _native is None or address % 4:
        return None
    two_w = rows.shape[-1]
    at = (address, 4 * b * n * two_w)
    shape, strides = (b, 1, n, two_w // 4), (n * two_w, 0, two_w, 1)
    return (*at, 0, shape, strides), (*at, two_w // 2, shape, strides)


def turn_pair_prepared(
    q: Tensor, k: Tensor, tables: tuple[tuple, tuple], interleaved: bool
) -> bool:
    """``q`` and ``k`` turned in place by the tables ``(cos, sin)`` that
    :func:`prepare_tables` described (or views of them), broadcasting against the leading
    dims of each, for a caller that has checked that the C kernel would run eagerly
    (:func:`~.select.turn_prepared_pair`): one call into the kernel, which checks the tensors (CPU,
    float32 or bfloat16, one dtype), describes them from their own methods and checks both
    before it writes either. ``False``, with nothing written, where the pair is ruled out:
    a device or dtype the kernel does not take, an inference tensor outside inference mode,
    ``q`` and ``k`` in one storage, an address or a shape the kernel refuses."""
    if not torch.is_inference_mode_enabled() and (q.is_inference() or k.is_inference()):
        return False
    try:
        return _native_pair(q, k, *tables, interleaved, *_NATIVE_DTYPES)  # type: ignore[misc]
    except (ValueError, IndexError):
        return False
