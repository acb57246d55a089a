"""The host's side of the Triton rotation (:mod:`.triton_kernel`): plans and launches.

A launch is planned once per key (:func:`launch`): the shapes, strides, dtypes, device,
16-byte alignment of every pointer and the switches of a call select a :class:`LaunchPlan`
(the checks, the grid and the kernel's argument tuple, in plain integer arithmetic) made by
the first call with that key. The first launch of a plan goes through Triton's
``JITFunction.run`` (binding, specialisation, compilation); later ones call the compiled
kernel's launcher directly with the plan's arguments, as ``JITFunction.run`` does once it has
found the kernel (where this Triton's ``JITFunction.run`` is seen to make that call:
otherwise every launch goes through it), so that a decode step's host time is the launcher's
(``posenc bench host`` times it). Every program lies along grid x (:func:`launch_grid`), so
that no count meets the 65,535 limit of y and z; tensors on a device other than the current
one are launched under ``torch.cuda.device``. Under ``torch.compile`` the pair
is :func:`~.triton_op.rotary_pair_op`, whose launch inductor makes itself.

An out-of-range position never reads a wrong row: :func:`launch_one` and :func:`launch_pair`
check positions against the table (one read of their extent) unless the caller says it knows
their bounds (``checked=True``), and the kernel itself masks any row outside the table to NaN.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` channels of ``x``,
``r`` rotary channels (``r <= d``); the kernel sees every tensor as ``(B, H, N, d)``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from triton.runtime import JITFunction
from triton.runtime import driver as _driver

from ....errors import PosencTypeError, PosencValueError
from .kernel import overlap
from .triton_kernel import HEADS_PER_PROGRAM, NUM_WARPS, TILE_ELEMENTS, rotary_kernel

__all__ = ["LaunchPlan", "launch", "launch_one", "launch_pair", "plan_launch"]

try:
    from triton import knobs as _knobs
except ImportError:  # (before Triton 3.4)
    _knobs = None


def _calls_the_launcher_as_we_do() -> bool:
    """Whether this Triton's ``JITFunction.run`` launches a compiled kernel with the call
    :func:`_launch_compiled` repeats (read in its source once, at import): only then do later
    launches of a plan skip it; otherwise every launch goes through it."""
    try:
        source = inspect.getsource(JITFunction.run)
    except (OSError, TypeError):
        return False
    call = (
        "kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, "
        "launch_metadata,"
    )
    hooks = "knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *bound_args.values())"
    flat = " ".join(source.split())
    return _knobs is not None and call in flat and hooks in flat


#: Whether a plan's later launches call the compiled kernel directly (:func:`_run`).
_DIRECT = _calls_the_launcher_as_we_do()


#: The most programs along grid x (CUDA's limit; y and z take 65,535).
MAX_GRID_X = 2**31 - 1
#: Launch plans kept (:func:`launch`); past this many the cache starts over (a prefill of
#: every length from 1 to this makes one plan each).
MAX_PLANS = 1024


def launch_grid(row_blocks: int, batch: int, groups: int) -> tuple[int, int, int]:
    """The grid of a launch over ``row_blocks`` blocks of rows, ``batch`` batches and
    ``groups`` groups of heads (q's and k's): every program along grid x, numbered
    ``i + row_blocks * (g + groups * b)`` as :func:`rotary_kernel` reads it, so that no
    count lands on y or z, where CUDA takes at most 65,535 (a heads-last ``(b, n, h, d)``
    pair is ``2 n`` groups of one head)."""
    programs = row_blocks * batch * groups
    if programs > MAX_GRID_X:
        raise PosencValueError(
            f"the rotation needs {programs} programs ({row_blocks} blocks of rows x {batch} "
            f"x {groups} groups of heads), more than CUDA's {MAX_GRID_X}"
        )
    return programs, 1, 1


def _lead4(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Strides of a tensor's dims as the kernel's ``(B, H, N, channels)``: leading dims padded
    on the left with stride 0 (size 1), a size-1 dim given stride 0 (broadcast)."""
    own = [s if n != 1 else 0 for n, s in zip(shape, stride, strict=True)]
    strides = [0] * (4 - len(shape)) + own
    return strides[0], strides[1], strides[2], strides[3]


def _shape4(t: Tensor) -> tuple[int, int, int, int]:
    """``t``'s shape as the kernel's ``(B, H, N, channels)``."""
    shape = (1,) * (4 - t.dim()) + tuple(t.shape)
    return shape[0], shape[1], shape[2], shape[3]


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_positions(positions: Tensor, rows: int) -> None:
    """Raise where integer ``positions`` leave the table (one read of their extent)."""
    if not positions.numel():
        return
    lo, hi = torch.aminmax(positions)
    lo, hi = int(lo), int(hi)
    if lo < 0 or hi >= rows:
        raise PosencValueError(
            f"positions must lie in [0, {rows}) (the table's rows), got values from {lo} to {hi}"
        )


def _broadcasts(name: str, shape: tuple[int, ...], lead: tuple[int, int, int]) -> None:
    """Raise unless ``shape`` (a tensor's leading dims) broadcasts against ``lead``."""
    if len(shape) > 3 or any(
        s not in (1, want) for s, want in zip(reversed(shape), reversed(lead), strict=False)
    ):
        raise PosencValueError(
            f"{name} of shape {shape} does not broadcast against the leading dims "
            f"{lead} of the rotated tensor"
        )


def _table_strides(
    cos: Tensor,
    sin: Tensor,
    positions: Tensor | None,
    lead: tuple[int, int, int],
    half: int,
) -> tuple[tuple, tuple, tuple, int]:
    """The table and position strides the kernel walks over ``(B, H, N, pairs)`` and the
    number of table rows (0 without positions)."""
    for t in (cos, sin):
        if t.dim() < 1 or t.shape[-1] != half or t.shape != cos.shape:
            raise PosencValueError(
                f"cos and sin must have {half} pairs and one shape, got {tuple(cos.shape)} "
                f"and {tuple(sin.shape)}"
            )
    if positions is None:
        _broadcasts("cos", tuple(cos.shape[:-1]), lead)
        c = _lead4(tuple(cos.shape), cos.stride())
        return c, _lead4(tuple(sin.shape), sin.stride()), (0, 0, 0), 0
    if positions.dtype not in (torch.int64, torch.int32):
        raise PosencTypeError(f"positions must be int64 or int32, got {positions.dtype}")
    if cos.dim() != 2:
        raise PosencValueError(
            f"with positions, cos and sin must be whole (rows, {half}) tables, got "
            f"{tuple(cos.shape)}"
        )
    shape, stride = tuple(positions.shape), positions.stride()
    if len(shape) == 2 and shape == (lead[0], lead[2]) and lead[1] > 1:
        shape, stride = (shape[0], 1, shape[1]), (stride[0], 0, stride[1])  # (b, n) -> (b, 1, n)
    _broadcasts("positions", shape, lead)
    p_strides = _lead4((*shape, 1), (*stride, 1))[:3]
    c_strides = (0, 0, cos.stride(0), cos.stride(1))
    s_strides = (0, 0, sin.stride(0), sin.stride(1))
    return c_strides, s_strides, p_strides, cos.shape[0]


@dataclass(eq=False)
class LaunchPlan:
    """What a launch for one set of shapes, strides, dtypes, alignments and switches passes,
    computed once (:func:`plan_launch`) and reused by every later call with the same key.

    ``grid``: :func:`launch_grid`'s (``None``: nothing to turn); ``tail``: the kernel's
    arguments after its seven tensors, in its order (integers and constexprs); ``rows``: the
    table rows positions index (0 without positions); ``device``: the CUDA device index
    (``None`` for CPU tensors under the interpreter); ``compiled``: the compiled kernel once
    a first launch through ``JITFunction.run`` made it, which later launches call directly
    (:func:`_launch_compiled`)."""

    grid: tuple[int, int, int] | None
    tail: tuple
    num_warps: int
    rows: int
    device: int | None
    compiled: Any = None


#: Plans by :func:`_key`.
_PLANS: dict[tuple, LaunchPlan] = {}


def _key(
    q: Tensor,
    out_q: Tensor,
    k: Tensor | None,
    out_k: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor | None,
    interleaved: bool,
    clockwise: bool,
) -> tuple:
    """Everything a plan depends on: shapes, strides, dtypes, the device, which outputs are
    the inputs, whether each pointer is 16-byte aligned (Triton compiles aligned pointers
    into wider accesses) and the switches."""
    key = (
        q.shape,
        q.stride(),
        out_q.stride(),
        q.dtype,
        q.device,
        out_q is q,
        not q.data_ptr() & 15,
        not out_q.data_ptr() & 15,
        cos.shape,
        cos.stride(),
        sin.shape,
        sin.stride(),
        cos.dtype,
        sin.dtype,
        not cos.data_ptr() & 15,
        not sin.data_ptr() & 15,
        interleaved,
        clockwise,
    )
    if k is not None:
        assert out_k is not None
        key += (
            k.shape,
            k.stride(),
            out_k.stride(),
            k.dtype,
            k.device,
            out_k is k,
            not k.data_ptr() & 15,
            not out_k.data_ptr() & 15,
        )
    if positions is not None:
        key += (
            positions.shape,
            positions.stride(),
            positions.dtype,
            positions.device,
            not positions.data_ptr() & 15,
        )
    return key


def plan_launch(
    q: Tensor,
    out_q: Tensor,
    k: Tensor | None,
    out_k: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor | None,
    interleaved: bool,
    clockwise: bool,
) -> LaunchPlan:
    """Check the tensors and compute the launch (plain integer arithmetic)."""
    for name, t in (("q", q), ("k", k)):
        if t is not None and not 1 <= t.dim() <= 4:
            raise PosencValueError(f"{name} must have 1 to 4 dims, got shape {tuple(t.shape)}")
    half = cos.shape[-1]
    r, d = 2 * half, q.shape[-1]
    bq, hq, n, _ = _shape4(q)
    if k is None:
        k, out_k, bk, hk, nk = q, out_q, bq, 0, n
    else:
        bk, hk, nk, _ = _shape4(k)
    assert out_k is not None
    if (bk, nk, k.shape[-1]) != (bq, n, d) or k.dtype is not q.dtype:
        raise PosencValueError(
            f"q and k must share batch, sequence, channels and dtype: q {tuple(q.shape)} "
            f"{q.dtype} vs k {tuple(k.shape)} {k.dtype}"
        )
    if r > d:
        raise PosencValueError(f"tables of {half} pairs need at least {r} channels, got {d}")
    c_strides, s_strides, p_strides, rows = _table_strides(cos, sin, positions, (bq, hq, n), half)
    table_per_head = c_strides[1] != 0 or s_strides[1] != 0 or p_strides[1] != 0
    if table_per_head and hk and hk != hq:
        raise PosencValueError(
            f"tables that differ from head to head need as many key heads as query heads, "
            f"got {hq} and {hk}"
        )
    device = q.device.index if q.is_cuda else None
    if not (q.numel() and n):
        return LaunchPlan(None, (), 1, rows, device)
    block_half = _next_power_of_2(half)
    block_n = max(1, min(_next_power_of_2(n), TILE_ELEMENTS // block_half))
    heads = 1 if table_per_head else HEADS_PER_PROGRAM
    groups_q = _cdiv(hq, heads)
    groups = groups_q + _cdiv(hk, heads)
    row_blocks = _cdiv(n, block_n)
    # (where one of q, k turns in place, it copies its own channels onto themselves)
    copy_rest = r < d and not (out_q is q and out_k is k)
    tail = (
        hq,
        hk,
        n,
        half,
        d - r,
        rows,
        *_lead4(tuple(q.shape), q.stride()),
        *_lead4(tuple(out_q.shape), out_q.stride()),
        *_lead4(tuple(k.shape), k.stride()),
        *_lead4(tuple(out_k.shape), out_k.stride()),
        *c_strides,
        *s_strides,
        *p_strides,
        groups_q,
        groups,
        row_blocks,
        -1.0 if clockwise else 1.0,  # SIGN
        interleaved,
        positions is not None,  # HAS_POS
        table_per_head,
        copy_rest,
        heads,
        block_n,
        block_half,
        _next_power_of_2(max(d - r, 1)),  # BLOCK_REST
    )
    warps = max(1, min(NUM_WARPS, block_n * block_half // 256))
    return LaunchPlan(launch_grid(row_blocks, bq, groups), tail, warps, rows, device)


def launch(
    q: Tensor,
    out_q: Tensor,
    k: Tensor | None,
    out_k: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor | None,
    interleaved: bool,
    clockwise: bool,
    checked: bool,
) -> None:
    """One launch turning ``q`` into ``out_q`` (and ``k`` into ``out_k``), by the plan made
    for these tensors' key (:func:`_key`) on the first such call: the checks and the
    arithmetic of :func:`plan_launch` run once per key, not per call."""
    key = _key(q, out_q, k, out_k, cos, sin, positions, interleaved, clockwise)
    plan = _PLANS.get(key)
    if plan is None:
        plan = plan_launch(q, out_q, k, out_k, cos, sin, positions, interleaved, clockwise)
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    if positions is not None and not checked:
        _check_positions(positions, plan.rows)
    if plan.grid is None:
        return
    if k is None:
        k, out_k = q, out_q
    pos = cos if positions is None else positions  # (a dummy pointer without positions)
    device = plan.device
    if device is not None and device != torch.cuda.current_device():
        with torch.cuda.device(device):  # (the kernel is loaded, and runs, on q's device)
            _run(plan, q, out_q, k, out_k, cos, sin, pos)
    else:
        _run(plan, q, out_q, k, out_k, cos, sin, pos)


def _run(plan: LaunchPlan, *tensors: Tensor) -> None:
    """The plan's launch on the current device: the compiled kernel called directly where a
    first launch made it, else (that first launch, or Triton's interpreter) through
    ``JITFunction.run``, which binds, specialises and compiles."""
    compiled = plan.compiled
    if compiled is not None:
        _launch_compiled(compiled, plan, tensors)
        return
    assert plan.grid is not None
    made = rotary_kernel[plan.grid](
        *tensors,
        *plan.tail,
        num_warps=plan.num_warps,
        enable_fp_fusion=True,  # (Triton's default before 3.10, stated: 3.9 warns where unset)
    )
    if _DIRECT and hasattr(made, "packed_metadata") and hasattr(made, "function"):
        plan.compiled = made


def _launch_compiled(compiled: Any, plan: LaunchPlan, tensors: tuple[Tensor, ...]) -> None:
    """What ``JITFunction.run`` does once it has found the compiled kernel (Triton 3.4-3.6):
    the launcher called with the grid, the current stream, the kernel's handle and metadata,
    the launch hooks, and every argument in the kernel's order."""
    drv = _driver.active
    device = plan.device  # (the current device here: launch made it so)
    stream = drv.get_current_stream(drv.get_current_device() if device is None else device)
    grid = plan.grid
    assert grid is not None
    args = (*tensors, *plan.tail)
    enter = _knobs.runtime.launch_enter_hook
    metadata = None if enter is None else compiled.launch_metadata(grid, stream, *args)
    compiled.run(
        grid[0],
        grid[1],
        grid[2],
        stream,
        compiled.function,
        compiled.packed_metadata,
        metadata,
        enter,
        _knobs.runtime.launch_exit_hook,
        *args,
    )


def _output(x: Tensor, out: Tensor | None) -> Tensor:
    if out is None:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    if out.shape != x.shape or out.dtype is not x.dtype or out.device != x.device:
        raise PosencValueError(
            f"out must match x's shape, dtype and device: {tuple(out.shape)} {out.dtype} "
            f"vs {tuple(x.shape)} {x.dtype}"
        )
    return out


def launch_one(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    *,
    out: Tensor | None = None,
    positions: Tensor | None = None,
    interleaved: bool = False,
    clockwise: bool = False,
    checked: bool = False,
) -> Tensor:
    """Turn ``x`` by eq. 34 with one launch and return the result (``out``).

    Args:
        x: ``(..., n, d)``, at most three leading dims, bfloat16/float16/float32, any
            strides (what :func:`~.triton_entry.takes` checks).
        cos, sin: float32. Without ``positions``: ``(..., n, r/2)`` broadcasting against
            ``x.shape[:-1]`` (e.g. ``(n, r/2)``, ``(b, 1, n, r/2)``, ``(n, 1, r/2)`` for a
            heads-last ``(b, n, h, d)``). With ``positions``: whole ``(rows, r/2)`` tables.
        out: where to write, ``x`` itself (in place) or a tensor of ``x``'s shape and dtype
            (any strides, not overlapping ``x``); ``None``: a new contiguous tensor.
        positions: int64/int32 integer rows of the tables, broadcasting against
            ``x.shape[:-1]`` as the tables would (``(n,)``, ``(b, 1, n)``, ``(n, 1)``
            heads-last); ``(b, n)`` for ``(b, h, n, d)`` means ``(b, 1, n)``. Element
            ``[..., i]`` of ``x`` turns by table row ``positions[..., i]``.
        interleaved: pairs ``(x[2i], x[2i+1])`` instead of ``(x[i], x[i + r/2])``.
        clockwise: turn by ``-θ`` (the inverse, and the backward).
        checked: the caller knows the positions lie inside the tables; else they are checked
            (one read of their extent, a host synchronisation on CUDA).
    """
    out = _output(x, out)
    launch(x, out, None, None, cos, sin, positions, interleaved, clockwise, checked)
    return out


def launch_pair(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    *,
    out_q: Tensor | None = None,
    out_k: Tensor | None = None,
    positions: Tensor | None = None,
    interleaved: bool = False,
    clockwise: bool = False,
    checked: bool = False,
) -> tuple[Tensor, Tensor]:
    """:func:`launch_one` for ``q`` ``(b, hq, n, d)`` and ``k`` ``(b, hk, n, d)`` turned by
    the same table rows in one launch (tables that differ from head to head, e.g. heads-last
    ``(b, n, h, d)`` pairs, need ``hq == hk``).
    ``out_q``/``out_k``: ``q``/``k`` themselves for in place, others, or ``None`` for new
    contiguous tensors; given ones must not share memory (:func:`~.kernel.overlap`), which
    would turn the shared elements twice: :class:`~posenc.errors.PosencValueError`."""
    if out_q is not None and out_k is not None and overlap(out_q, out_k) is not False:
        raise PosencValueError(
            f"q and k's outputs share memory, or may (out_q and out_k: q and k in place), "
            f"which would turn the shared elements twice: out_q at byte "
            f"{out_q.data_ptr()}, strides {tuple(out_q.stride())}; out_k at byte "
            f"{out_k.data_ptr()}, strides {tuple(out_k.stride())}"
        )
    out_q, out_k = _output(q, out_q), _output(k, out_k)
    launch(q, out_q, k, out_k, cos, sin, positions, interleaved, clockwise, checked)
    return out_q, out_k
