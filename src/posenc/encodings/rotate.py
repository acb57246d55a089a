"""The rotary arithmetic (Su et al. 2021, "RoFormer", eq. 34): the formula, a native kernel
built at install time, and a pure-torch fast path where that kernel is not built.

Each pair of channels ``(x1, x2)`` of a query or key turns by its angle ``θ``:

    x1' = x1 cos θ - x2 sin θ,      x2' = x2 cos θ + x1 sin θ                       (eq. 34)

Pairs are ``(x[i], x[i + r/2])`` in the half layout (GPT-NeoX, Llama, Hugging Face) and
``(x[2i], x[2i+1])`` in the interleaved one (GPT-J, RoFormer); channels from ``r`` on pass
through. Callers hand in ``cos`` and ``sin`` of the angles, ``(..., n, r/2)``, already scaled
where a scheme scales them (an attention factor, xPos's decay).

* :func:`rotate_reference` is eq. 34 in torch operations: differentiable in ``x``, ``cos``
  and ``sin``, exact in float64. It runs in an ONNX export (which lowers it to ONNX
  operations), where no native kernel is built, under ``torch.jit.trace`` and ``torch.func``
  transforms, and when ``cos``/``sin`` require grad (learned frequencies).
* ``_rotary_native.c`` (:func:`_rotate_native`) is the kernel: each row read once and
  written once, in place or into a fresh tensor, float32 arithmetic and one rounding for
  bfloat16, results identical to :func:`rotate_reference`'s. setup.py builds it for the
  baseline instruction set with run-time dispatch to AVX2/AVX-512; it takes float32 and
  bfloat16 CPU tensors with contiguous channels (any strides elsewhere).
* :func:`_rotate_torch` is the pure-torch fast path, for every other tensor and machine: it
  goes one cache-sized block of rows at a time. The interleaved pairs are turned as one
  complex multiply; the half layout with four operations, in place keeping a copy of ``x1``.
  Half-precision inputs are widened block by block into a float32 buffer and rounded back
  once.
* :func:`apply_rotary` (a new tensor) and :func:`apply_rotary_` (in place) choose between them;
  under autograd the fast path is one :class:`torch.autograd.Function` whose backward turns
  the incoming gradient back. Inside ``torch.compile`` and ``torch.export`` the rotation is
  one operator, ``posenc::rotary`` (out of place, with its fake and autograd kernels; where
  the native kernel is built, else inductor fuses the formula) or ``posenc::rotary_`` (in
  place without autograd, on the tensor's own storage).

Nothing here compiles anything at import or on a call, or keeps global state: no
``torch.compile``, no C compiler, no switch. See ``benchmarks/rope.md`` for the speed of each
path.

Dimension legend: ``n`` sequence, ``d`` channels of ``x``, ``r`` rotary channels (``r <= d``).
"""

from __future__ import annotations

import itertools
import math
import warnings

import torch
from torch import Tensor

from ..errors import PosencTypeError, PosencValueError
from .base import compute_dtype

__all__ = ["apply_rotary", "apply_rotary_", "rotate_reference", "set_rotary_compile"]

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


# --------------------------------------------------------------------------- the formula


def rotate_reference(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """Eq. 34, computed in ``cos``'s dtype and cast back to ``x``'s once.

    Args:
        x: ``(..., n, d)``.
        cos, sin: ``(..., n, r/2)``, broadcastable against ``x.shape[:-1]``; ``2 * r/2 <= d``.
        interleaved: pairs ``(x[2i], x[2i+1])`` instead of ``(x[i], x[i + r/2])``.

    Returns a new tensor of ``x``'s shape and dtype. Differentiable in all three inputs.
    """
    half = cos.shape[-1]
    r = 2 * half
    work = x.to(cos.dtype)
    # two spellings of eq. 34, each the one inductor compiles to its fastest loop (measured
    # in benchmarks/rope.md): a pair's channels side by side, or the halves stacked
    if interleaved:
        x1, x2 = work[..., 0:r:2], work[..., 1:r:2]  # (..., n, r/2) each
        turned = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:  # [x1', x2'] = [x1, x2] cos + [x2, x1] [-sin, sin]
        pairs = work[..., :r].unflatten(-1, (2, half))  # (..., n, 2, r/2): x1 above x2
        turned = pairs * cos[..., None, :] + pairs.flip(-2) * torch.stack((-sin, sin), dim=-2)
    rotated = turned.flatten(-2)  # (..., n, r)
    if r < x.shape[-1]:
        rotated = torch.cat((rotated, work[..., r:]), dim=-1)
    return rotated.to(x.dtype)


# --------------------------------------------------------------------------- the fast path


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


def _native_takes(x: Tensor, cos: Tensor, sin: Tensor) -> bool:
    """Whether the native kernel can rotate ``x`` with these tables: it is built, ``x`` is a
    float32 or bfloat16 CPU tensor with contiguous channels and at most
    :data:`NATIVE_MAX_LEAD` leading dims, and the tables are float32 with contiguous
    channels."""
    return _native is not None and _native_tensor(x) and _native_tables(cos, sin)


def _native_tensor(x: Tensor) -> bool:
    """:func:`_native_takes`'s conditions on the rotated tensor."""
    return (
        x.is_cpu
        and (x.dtype is torch.float32 or x.dtype is torch.bfloat16)
        and 1 <= x.dim() <= NATIVE_MAX_LEAD + 1
        and (x.stride(-1) == 1 or x.shape[-1] == 1)
    )


def _native_tables(cos: Tensor, sin: Tensor) -> bool:
    """:func:`_native_takes`'s conditions on the tables."""
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


def _rotate_fast(x: Tensor, out: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> None:
    """Write the rotation of ``x`` into ``out`` (``x`` itself, or a fresh tensor of its
    shape): the native kernel where it takes the tensors, else the pure-torch path."""
    if x.numel() == 0:
        return
    # ``out`` is x or contiguous: every caller makes it so
    if not (_native_takes(x, cos, sin) and _rotate_native(x, out, cos, sin, interleaved)):
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


@torch.library.custom_op("posenc::rotary_", mutates_args=("x",))
def _rotate_in_place_op(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> None:
    """The fast path in place as one operator, for ``torch.compile``: inductor calls it on
    the tensor's own storage, where the traced formula plus a copy back would write a fresh
    tensor and then copy it (measured 1.2-1.4x a clone, against 0.3x for this)."""
    _rotate_fast(x, x, cos, sin, interleaved)


@torch.library.custom_op("posenc::rotary", mutates_args=())
def _rotate_op(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """The fast path out of place as one operator, for ``torch.compile`` and ``torch.export``
    where the native kernel is built: one pass over memory, where inductor's fusion of the
    formula takes up to 3x a clone (bfloat16, interleaved)."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _rotate_fast(x, out, cos, sin, interleaved)
    return out


@_rotate_op.register_fake
def _(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _rotate_op_context(ctx: object, inputs: tuple, output: Tensor) -> None:
    _, cos, sin, interleaved = inputs
    ctx.save_for_backward(cos, sin)  # type: ignore[attr-defined]
    ctx.interleaved = interleaved  # type: ignore[attr-defined]


def _rotate_op_backward(ctx: object, grad: Tensor) -> tuple[Tensor, None, None, None]:
    cos, sin = ctx.saved_tensors  # type: ignore[attr-defined]
    return _rotate_op(grad, cos, -sin, ctx.interleaved), None, None, None  # type: ignore[attr-defined]


_rotate_op.register_autograd(_rotate_op_backward, setup_context=_rotate_op_context)


class _Rotation(torch.autograd.Function):
    """The fast rotation as one autograd node. Eq. 34 is linear in ``x`` with the matrix
    ``[[cos, -sin], [sin, cos]]`` per pair, so the gradient is the incoming one turned by the
    transpose, which is eq. 34 with ``-sin``. ``cos``/``sin`` get no gradient (callers send
    those that require one to :func:`rotate_reference`)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        interleaved: bool,
        inplace: bool,
    ) -> Tensor:
        out = x if inplace else torch.empty_like(x, memory_format=torch.contiguous_format)
        _rotate_fast(x, out, cos, sin, interleaved)
        if inplace:
            ctx.mark_dirty(x)
        ctx.save_for_backward(cos, sin)
        ctx.interleaved = interleaved  # type: ignore[attr-defined]
        return out

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad: Tensor
    ) -> tuple[Tensor, None, None, None, None]:
        cos, sin = ctx.saved_tensors  # type: ignore[attr-defined]
        back = apply_rotary(grad, cos, -sin, interleaved=ctx.interleaved)  # type: ignore[attr-defined]
        return back, None, None, None, None


# --------------------------------------------------------------------------- entry points


def _tables(x: object, cos: object, sin: object) -> tuple[Tensor, Tensor]:
    """Check the arguments of :func:`apply_rotary`; return ``cos, sin`` in the work dtype."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise PosencTypeError(
            f"x must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}"
        )
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            got = getattr(t, "dtype", type(t).__name__)
            raise PosencTypeError(f"{name} must be a floating-point tensor, got {got}")
    assert isinstance(cos, Tensor) and isinstance(sin, Tensor)
    shape = cos.shape
    if shape != sin.shape:
        raise PosencValueError(f"cos and sin differ in shape: {tuple(shape)} vs {tuple(sin.shape)}")
    lead, table_lead = x.shape[:-1], shape[:-1]
    half = shape[-1] if shape else 0
    if x.dim() < 1 or half < 1 or 2 * half > x.shape[-1]:
        raise PosencValueError(
            f"cos/sin of shape {tuple(shape)} need x with at least 2 * {half} channels, "
            f"got x of shape {tuple(x.shape)}"
        )
    if table_lead != lead[len(lead) - len(table_lead) :] and (
        len(table_lead) > len(lead)
        or any(t not in (1, s) for t, s in zip(reversed(table_lead), reversed(lead), strict=False))
    ):
        raise PosencValueError(
            f"cos/sin of shape {tuple(shape)} do not broadcast against x of shape "
            f"{tuple(x.shape)}: their leading dims must broadcast to x.shape[:-1]"
        )
    work = compute_dtype(x.dtype)
    if cos.dtype != work or sin.dtype != work:
        work = torch.promote_types(torch.promote_types(cos.dtype, sin.dtype), work)
        cos, sin = cos.to(work), sin.to(work)
    return cos, sin


def fast_path_ok(x: Tensor) -> bool:
    """Whether the blocked path may run: eager, not traced, a plain tensor (not a
    ``torch.func`` wrapper or a subclass, which see only the operations they intercept)."""
    return (
        not torch.compiler.is_compiling()
        and torch._C._get_tracing_state() is None
        and type(x) is Tensor
        and not torch._C._functorch.is_functorch_wrapped_tensor(x)
    )


def rotate_pair(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
    inplace: bool,
    first_row: int | None = None,
) -> tuple[Tensor, Tensor] | None:
    """``q`` and ``k`` turned by the same tables with the native kernel, what they share
    checked once: the common eager call, a decode step above all, where checks and calls cost
    more than the arithmetic. ``first_row``: ``cos`` and ``sin`` are whole cached tables
    ``(positions, r/2)`` and ``q``/``k`` sit at positions ``first_row, first_row + 1, ...``,
    read from the tables where they lie (no sliced views). ``None`` where this does not apply
    (autograd records, compiling or tracing, a dtype, layout or address the kernel does not
    take, an in-place rotation that :func:`check_inplace` must explain): the caller then
    rotates each through :func:`rotate`."""
    if (
        _native is None
        or torch.compiler.is_compiling()
        or torch._C._get_tracing_state() is not None
        or type(q) is not Tensor
        or type(k) is not Tensor
        or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
        or cos.requires_grad
        or sin.requires_grad
        or k.dtype is not q.dtype
        or not (_native_tensor(q) and _native_tensor(k) and _native_tables(cos, sin))
        or torch._C._functorch.is_functorch_wrapped_tensor(q)
        or torch._C._functorch.is_functorch_wrapped_tensor(k)
    ):
        return None
    if not q.numel() or not k.numel() or 2 * cos.shape[-1] != q.shape[-1]:
        return None  # (partial rotation: _rotate_native copies the channels past r)
    if inplace:
        if (q.is_inference() or k.is_inference()) and not torch.is_inference_mode_enabled():
            return None
        if q.data_ptr() == k.data_ptr() or 1 in (
            torch._debug_has_internal_overlap(q),
            torch._debug_has_internal_overlap(k),
        ):
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


def rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, inplace: bool) -> Tensor:
    """The rotation behind :func:`apply_rotary` and :func:`apply_rotary_` once their arguments
    are checked (``cos``/``sin`` in the work dtype and broadcasting against ``x``; for in
    place, :func:`check_inplace` passed). The rotary modules call it with the tables they
    made, so a forward pays for no check twice."""
    if not fast_path_ok(x):
        grad = torch.is_grad_enabled() and (
            x.requires_grad or cos.requires_grad or sin.requires_grad
        )
        # under torch.compile and torch.export, the operators; an ONNX export gets the
        # formula, which it lowers to ONNX operations
        compiling = torch.compiler.is_compiling() and not (
            torch.compiler.is_exporting() and torch.onnx.is_in_onnx_export()
        )
        if inplace and compiling and not grad:
            _rotate_in_place_op(x, cos, sin, interleaved)
            return x
        tables_grad = cos.requires_grad or sin.requires_grad
        if not inplace and compiling and not tables_grad and _native_takes(x, cos, sin):
            return _rotate_op(x, cos, sin, interleaved)
        rotated = rotate_reference(x, cos, sin, interleaved=interleaved)
        return x.copy_(rotated) if inplace else rotated
    if torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad):
        if cos.requires_grad or sin.requires_grad:  # learned frequencies; never in place
            return rotate_reference(x, cos, sin, interleaved=interleaved)
        return _Rotation.apply(x, cos, sin, interleaved, inplace)
    out = x if inplace else torch.empty_like(x, memory_format=torch.contiguous_format)
    _rotate_fast(x, out, cos, sin, interleaved)
    return out


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """Rotate the first ``r = 2 * cos.shape[-1]`` channels of ``x`` pairwise (RoFormer eq. 34)
    into a new tensor.

    Args:
        x: ``(..., n, d)`` queries or keys, any float dtype; ``d >= r``.
        cos, sin: ``(..., n, r/2)`` cos and sin of the angles (one per pair), broadcastable
            against ``x.shape[:-1]``; e.g. ``(n, r/2)`` or ``(b, 1, n, r/2)`` for ``x`` of
            shape ``(b, h, n, d)``, and ``(n, 1, r/2)`` for a heads-last ``(b, n, h, d)``.
            They set the work dtype: half-precision ``x`` is rotated in the tables' dtype
            (float32) and cast back once.
        interleaved: pairs ``(x[2i], x[2i+1])`` (GPT-J) instead of ``(x[i], x[i+r/2])``
            (GPT-NeoX / Llama).

    Returns a new contiguous tensor like ``x``; channels ``r:`` are copied unchanged.
    Differentiable in ``x``, ``cos`` and ``sin``.

    >>> x = torch.tensor([[1.0, 0.0, 2.0, 5.0]])  # one position, d = 4, r = 2
    >>> apply_rotary(x, torch.tensor([[0.0]]), torch.tensor([[1.0]]))  # rotate by 90 degrees
    tensor([[0., 1., 2., 5.]])
    """
    cos, sin = _tables(x, cos, sin)
    return rotate(x, cos, sin, interleaved, inplace=False)


def check_inplace(x: Tensor, cos: Tensor, sin: Tensor, *, name: str = "x") -> None:
    """Raise a :class:`~posenc.errors.PosencValueError` naming ``name`` where ``x`` cannot be
    rotated in its own storage: under autograd with ``cos``/``sin`` requiring grad (their
    gradient needs ``x`` before the rotation) or ``x`` a leaf requiring grad, or a view that
    autograd forbids changing; an inference tensor outside ``torch.inference_mode``; ``x``
    with elements sharing memory (``expand``)."""
    grad = torch.is_grad_enabled()
    if grad and (cos.requires_grad or sin.requires_grad):
        raise PosencValueError(
            f"cannot rotate {name} in place while cos or sin require grad (learned "
            "frequencies: their gradient needs the input before the rotation); rotate "
            "out of place, or under torch.no_grad()"
        )
    if not fast_path_ok(x):  # compiling, tracing, torch.func, subclasses: torch's own checks
        return  # apply (and reading x's autograd state under compile replays changed views)
    if grad and x.requires_grad and x.is_leaf:
        raise PosencValueError(
            f"cannot rotate {name} in place: it is a leaf tensor that requires grad; "
            "rotate out of place, or rotate a tensor computed from it"
        )
    if grad and x.requires_grad and x._is_view():
        try:  # autograd refuses in-place changes to some views (unbind, split outputs)
            x[..., :0].mul_(1)
        except RuntimeError as error:
            raise PosencValueError(
                f"cannot rotate {name} in place under autograd: {error} (index the "
                "fused tensor instead, e.g. qkv[:, :, 0], or rotate out of place)"
            ) from None
    if x.is_inference() and not torch.is_inference_mode_enabled():
        raise PosencValueError(
            f"cannot rotate {name} in place: it is an inference tensor (made under "
            "torch.inference_mode) and torch forbids changing it outside inference mode"
        )
    if torch._debug_has_internal_overlap(x) == 1:
        raise PosencValueError(
            f"cannot rotate {name} in place: several of its elements share memory "
            f"(strides {tuple(x.stride())}, e.g. from expand), so they would turn more than "
            "once; rotate out of place or pass a copy"
        )


def apply_rotary_(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """:func:`apply_rotary` in ``x``'s own storage; returns ``x``, as torch's in-place
    operations return self.

    ``x`` may be any strided view, e.g. queries sliced from a fused projection,
    ``qkv.view(b, n, 3, h, d)[:, :, 0]`` (heads-last, with cos/sin ``(n, 1, r/2)``) or its
    ``.transpose(1, 2)`` (with ``(n, r/2)``). Under autograd the gradient flows to ``x``'s
    earlier value (the backward turns the incoming gradient back); ``cos`` and ``sin`` must
    not require grad then. Raises :class:`~posenc.errors.PosencValueError` where ``x`` cannot
    change in place (:func:`check_inplace` lists the cases).

    >>> x = torch.tensor([[1.0, 0.0, 2.0, 5.0]])
    >>> apply_rotary_(x, torch.tensor([[0.0]]), torch.tensor([[1.0]])) is x, x
    (True, tensor([[0., 1., 2., 5.]]))
    """
    cos, sin = _tables(x, cos, sin)
    check_inplace(x, cos, sin)
    return rotate(x, cos, sin, interleaved, inplace=True)


def set_rotary_compile(enabled: bool) -> None:
    """Deprecated, does nothing: rotary embeddings no longer compile kernels (no
    ``torch.compile``, no C compiler), so there is nothing to switch. Compile your model with
    ``torch.compile`` to get inductor's fused rotation."""
    warnings.warn(
        "posenc.set_rotary_compile is deprecated and does nothing: rotary embeddings no longer "
        "compile kernels; it will be removed in a future release",
        DeprecationWarning,
        stacklevel=2,
    )
