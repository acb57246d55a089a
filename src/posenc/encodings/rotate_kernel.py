"""The fast rotation (Su et al. 2021, "RoFormer", eq. 34) on plain tensors: the native kernel
built at install time (``_rotary_native.c``) and the blocked pure-torch path where that
kernel is not built or cannot take the tensors.

* :func:`_rotate_native` is the kernel: each row read once and written once, in place or into
  a fresh tensor, float32 arithmetic and one rounding for bfloat16, results identical to
  :func:`~.rotate.rotate_reference`'s. setup.py builds it for the baseline instruction set
  with run-time dispatch to AVX2/AVX-512; it takes float32 and bfloat16 CPU tensors with
  contiguous channels (any strides elsewhere). :func:`rotate_pair_native` turns a query and a
  key by the same tables in one go (a decode step).
* :func:`_rotate_torch` is the pure-torch path, for every other tensor and machine: it goes
  one cache-sized block of rows at a time. The interleaved pairs are turned as one complex
  multiply; the half layout with four operations, in place keeping a copy of ``x1``.
  Half-precision inputs are widened block by block into a float32 buffer and rounded back
  once.

Both stand behind the kernel interface (:mod:`.kernels.kernel`; :func:`rotate_native`,
:func:`rotate_pair_native`). Which kernel runs, and whether one runs at all, is decided by
:func:`~.rotate_select.select`; what is here only checks what the data allow (dtype, layout,
address).

Dimension legend: ``n`` sequence, ``d`` channels of ``x``, ``r`` rotary channels (``r <= d``).
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from .kernels.kernel import pair_refused

#: Elements (of the work dtype) per block of :func:`_rotate_torch`: 2**19 float32 values are
#: 2 MiB, so a block, its tables and its temporary stay in the last-level cache while the
#: operations of a block run over it (measured on a 2-core AMD EPYC: 2**18 and 2**20 are
#: 5-25% slower for (4, 16, 2048, 128)). Smaller tensors are one block.
BLOCK_ELEMENTS = 1 << 19

#: Leading dims (all but the channels) the native kernel takes; more go to the torch path.
NATIVE_MAX_LEAD = 4
#: From this many elements the native kernel splits the rows over torch's thread count
#: (below it, starting threads costs more than it saves: a decode step is one thread).
NATIVE_THREAD_MIN = 1 << 16

try:  # built at install time from _rotary_native.c; absent where no C compiler was found
    from ._rotary_native import rotate as _native
except ImportError:  # pragma: no cover - depends on the build
    _native = None


def _complex_ok(t: Tensor) -> bool:
    """Whether ``view_as_complex`` can view the channel pairs of ``t`` where they lie."""
    return (
        t.dtype in (torch.float32, torch.float64)
        and t.stride(-1) == 1
        and t.storage_offset() % 2 == 0
        and all(s % 2 == 0 for s in t.stride()[:-1])
    )


def _blocks(lead: tuple[int, ...], rows: int) -> list[tuple[int | slice, ...]]:
    """Indices cutting a tensor whose leading dims (all but the channels) are ``lead`` into
    blocks of at most ``rows`` rows: whole inner dims, a slice of the next one out, and
    single indices of the dims outside it.

    >>> _blocks((2, 3, 4), 8)
    [(0, slice(0, 2, None)), (0, slice(2, 4, None)), (1, slice(0, 2, None)), (1, slice(2, 4, None))]
    """
    inner, m = 1, len(lead)
    while m > 0 and inner * lead[m - 1] <= rows:
        m -= 1
        inner *= lead[m]
    if m == 0:
        return [()]
    step = max(1, rows // inner)
    outer = itertools.product(*(range(size) for size in lead[: m - 1]))
    return [
        (*index, slice(start, start + step))
        for index in outer
        for start in range(0, lead[m - 1], step)
    ]


def _turn(
    src: Tensor,
    dst: Tensor,
    cos: Tensor,
    sin: Tensor,
    table: Tensor | None,
    spare: Tensor | None = None,
) -> None:
    """Write eq. 34 of the ``(..., r)`` channels ``src`` into ``dst``: through ``table``
    (complex ``cos + i sin``) for interleaved pairs; else in halves ``x1 = x[:r/2]``,
    ``x2 = x[r/2:r]``, in place (``dst is src``) keeping ``x1`` in ``spare`` ``(..., r/2)``.
    Both orders of operations give the same values."""
    if table is not None:  # (x1 + i x2)(cos + i sin)
        half = table.shape[-1]
        pairs = torch.view_as_complex(src.unflatten(-1, (half, 2)))
        out = pairs if dst is src else torch.view_as_complex(dst.unflatten(-1, (half, 2)))
        torch.mul(pairs, table, out=out)
        return
    x1, x2 = src.chunk(2, -1)  # (..., r/2) each
    if dst is src:
        x1_before = x1.clone() if spare is None else spare.copy_(x1)
        x1.mul_(cos).addcmul_(x2, sin, value=-1)
        x2.mul_(cos).addcmul_(x1_before, sin)
        return
    out1, out2 = dst.chunk(2, -1)
    torch.mul(x1, cos, out=out1).addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=out2).addcmul_(x1, sin)


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
    against ``x.shape[:-1]`` inside the kernel, as ``expand`` would). Tensors of
    :data:`NATIVE_THREAD_MIN` elements or more are split over torch's thread count."""
    threads = torch.get_num_threads() if x.numel() >= NATIVE_THREAD_MIN else 1
    _native(x_at, out_at, *tables, threads)  # type: ignore[misc]


def _rotate_native(x: Tensor, out: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> bool:
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


def rotate_native(x: Tensor, out: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> None:
    """The native kernel's ``rotate`` (:mod:`.kernels.kernel`): write the rotation of ``x``
    into ``out`` (``x`` itself, or a fresh tensor of its shape), on the pure-torch path only
    where the kernel refuses an address (:func:`_native_buffer`)."""
    if x.numel() == 0:
        return
    # ``out`` is x or contiguous: every caller makes it so
    if not _rotate_native(x, out, cos, sin, interleaved):
        _rotate_torch(x, out, cos, sin, interleaved)


def _rotate_torch(x: Tensor, out: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> None:
    """The pure-torch fast path (where the native kernel is not built or cannot take the
    tensors). Write the rotation of ``x`` into ``out``: ``x`` itself (in place) or a tensor of its
    shape and dtype. ``cos``/``sin`` are in the work dtype and broadcast to
    ``x.shape[:-1] + (r/2,)``.

    Each block of rows is rotated from ``x`` into ``out`` or in place, or, when ``x`` is not
    in the work dtype or its interleaved pairs cannot be viewed as complex numbers, widened
    into a reused buffer of the work dtype, rotated there in place and rounded into ``out``
    once. On CPU, tensors above :data:`BLOCK_ELEMENTS` go block by block.
    """
    half = cos.shape[-1]
    r, d = 2 * half, x.shape[-1]
    work, inplace = cos.dtype, out is x
    direct = x.dtype == work and (not interleaved or (_complex_ok(x) and _complex_ok(out)))
    table = torch.complex(cos, sin) if interleaved else None  # (..., n, r/2)
    if x.numel() <= BLOCK_ELEMENTS or x.device.type != "cpu" or x.dim() < 2:  # one block
        if direct and r == d:  # the common case, straight to the arithmetic
            _turn(x, out, cos, sin, table)
        else:
            _rotate_block(x, out, cos, sin, table, r, direct, inplace, None, None)
        return
    lead = x.shape[:-1]
    rows = max(1, BLOCK_ELEMENTS // d)
    cos, sin = cos.expand(*lead, half), sin.expand(*lead, half)  # views
    if table is not None:
        table = table.expand(*lead, half)
    spare = buffer = None  # reused by every block
    if not interleaved:
        spare = torch.empty(rows * half, dtype=work, device=x.device)
    if not direct:
        buffer = torch.empty(rows * r, dtype=work, device=x.device)
    for index in _blocks(tuple(lead), rows):
        t = None if table is None else table[index]
        dst = x[index] if inplace else out[index]
        _rotate_block(x[index], dst, cos[index], sin[index], t, r, direct, inplace, spare, buffer)


def _rotate_block(
    src: Tensor,
    dst: Tensor,
    cos: Tensor,
    sin: Tensor,
    table: Tensor | None,
    r: int,
    direct: bool,
    inplace: bool,
    spare: Tensor | None,
    buffer: Tensor | None,
) -> None:
    """One block of :func:`_rotate_torch`; ``spare`` (half the block's rotary channels) and
    ``buffer`` (all of them) are flat reused work-dtype storage, or ``None`` for new."""
    d = src.shape[-1]
    if r < d:
        if not inplace:
            dst.narrow(-1, r, d - r).copy_(src.narrow(-1, r, d - r))
        src, dst = src.narrow(-1, 0, r), dst.narrow(-1, 0, r)
    if spare is not None:
        spare = _scratch(spare, (*src.shape[:-1], r // 2), cos)
    if direct and not inplace and spare is not None:
        # a large tensor: copy the block into the fresh output, then rotate it there in place
        # (measured faster than four operations writing into fresh memory)
        src, inplace = dst.copy_(src), True
    if direct:
        _turn(src, src if inplace else dst, cos, sin, table, spare)
        return
    widened = _scratch(buffer, src.shape, cos).copy_(src)
    _turn(widened, widened, cos, sin, table, spare)
    dst.copy_(widened)  # rounds once


def _scratch(flat: Tensor | None, shape: tuple[int, ...] | torch.Size, like: Tensor) -> Tensor:
    """A tensor of ``shape`` in ``like``'s dtype: a view of the reused ``flat`` storage, or
    new where there is none."""
    if flat is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    return flat[: math.prod(shape)].view(shape)


def rotate_pair_native(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
    inplace: bool,
    first_row: int | None = None,
) -> tuple[Tensor, Tensor] | None:
    """The native kernel's ``rotate_pair`` (:mod:`.kernels.kernel`): ``q`` and ``k`` turned by
    the same tables, what they share checked once. ``None``, with nothing written, where the
    data rule it out: :func:`~.kernels.kernel.pair_refused` (a partial rotation's copy of the
    channels past ``r`` is :func:`_rotate_native`'s), tables that are not float32 with
    contiguous channels, or an address the kernel refuses (:func:`_native_buffer`)."""
    if pair_refused(q, k, cos, inplace) or not _native_tables(cos, sin):
        return None
    bf16 = q.dtype is torch.bfloat16
    item = 2 if bf16 else 4
    tables = _kernel_tables(cos, sin, bf16, interleaved, first_row)  # made once
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
