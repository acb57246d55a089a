"""The rotation (Su et al. 2021, "RoFormer", eq. 34) as one Triton kernel, for CUDA tensors.

Each pair ``(x1, x2)`` of a query or key row turns by its angle ``θ``:

    x1' = x1 cos θ - x2 sin θ,      x2' = x2 cos θ + x1 sin θ                       (eq. 34)

One launch turns ``q`` and ``k`` (their own head counts: grouped keys) by the same table rows:
each program owns ``BLOCK_N`` rows of up to ``HEADS`` heads of one tensor, loads their table
rows once, and reads and writes every element once, in float32 registers with one rounding to
the output dtype (bfloat16, float16, float32). It does what the rotary modules ask of the C
kernel (``_rotary_native.c``):

* the half layout ``(x[i], x[i + r/2])`` and the interleaved one ``(x[2i], x[2i+1])``;
* partial rotation: channels from ``r`` on pass through (copied out of place, untouched in
  place);
* clockwise (``-θ``), which is also the backward: eq. 34 is orthogonal, so the gradient is
  the incoming one turned the other way by the same kernel;
* tables either broadcast against ``x.shape[:-1]`` (as ``expand`` would view them), or whole
  ``(positions, r/2)`` tables indexed on the device by integer ``positions`` of shape ``(n,)``
  or ``(b, n)`` (offsets, per-row positions, packed documents, left padding): no gathered
  table is ever materialised;
* in place or into another tensor, any strides (``q`` and ``k`` sliced from a fused ``qkv``
  projection, heads-last layouts).

Peers read (not copied): flash-attention's ``flash_attn/ops/triton/rotary.py`` (one pass,
float32 in registers, the backward conjugated), Liger Kernel's RoPE (all heads of a row per
program), vLLM's in-place kernel over a cos/sin cache indexed by positions.

Triton is imported with this module, which only :mod:`.triton_entry` imports, on the first
rotation it runs: ``import posenc`` and the CLI never import triton. Under
``TRITON_INTERPRET=1`` (set before this module is imported) the kernel runs in Triton's
interpreter on CPU tensors, which is how the tests check it without a GPU.

An out-of-range position never reads a wrong row: :func:`rotate_triton` checks positions
against the table (one read of their extent) unless the caller says it knows their bounds
(``checked=True``), and the kernel itself masks any row outside the table to NaN.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` channels of ``x``,
``r`` rotary channels (``r <= d``). The kernel sees every tensor as ``(B, H, N, d)``: the
caller's leading dims, padded on the left with size-1 dims.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ...errors import PosencTypeError, PosencValueError
from .kernel import overlap

__all__ = ["rotate_pair_triton", "rotate_triton"]

#: Pairs of one tile ``(BLOCK_N, r/2)`` a program turns at a time: compiled for sm_90, a
#: 1024-pair tile takes 48-64 registers a thread with 4 warps (float32 and bfloat16, both
#: layouts, no spills), leaving room for 32 warps per SM to hide memory latency; 2048 take
#: 80-127 and 4096 up to 255.
TILE_ELEMENTS = 1024
#: Warps of a full tile (fewer for a smaller one, e.g. a decode step's single row).
NUM_WARPS = 4
#: Heads a program turns with the same table rows (the table is loaded once for them).
HEADS_PER_PROGRAM = 4


# fmt: off
# (the kernel's long argument lists, one line per group of strides)


@triton.jit
def _table(COS, SIN, POS, b, h, rows, row_ok, mask, jt, ROWS, c_sb, c_sh, c_sn, c_sd,
           s_sb, s_sh, s_sn, s_sd, p_sb, p_sh, p_sn, SIGN: tl.constexpr, HAS_POS: tl.constexpr):
    """cos and sin ``(BLOCK_N, BLOCK_HALF)`` in float32 for rows ``rows`` of batch ``b``,
    head ``h``: read where the positions say (a row outside the table is NaN, never another
    row), or walked as ``expand`` would view broadcast tables."""
    if HAS_POS:
        p = tl.load(POS + b * p_sb + h * p_sh + rows * p_sn, mask=row_ok, other=0).to(tl.int64)
        valid = (p >= 0) & (p < ROWS)
        c_at = p * c_sn
        s_at = p * s_sn
    else:
        valid = row_ok
        c_at = b * c_sb + h * c_sh + rows * c_sn
        s_at = b * s_sb + h * s_sh + rows * s_sn
    m = mask & valid[:, None]
    cos = tl.load(COS + c_at[:, None] + jt[None, :] * c_sd, mask=m, other=float("nan"))
    sin = tl.load(SIN + s_at[:, None] + jt[None, :] * s_sd, mask=m, other=float("nan"))
    return cos.to(tl.float32), sin.to(tl.float32) * SIGN


@triton.jit
def _heads(X, O, h0, H, b, rows, row_ok, mask, jt, cos, sin, HALF, REST,
           x_sb, x_sh, x_sn, x_sd, o_sb, o_sh, o_sn, o_sd,
           COS, SIN, POS, ROWS, c_sb, c_sh, c_sn, c_sd, s_sb, s_sh, s_sn, s_sd, p_sb, p_sh, p_sn,
           SIGN: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_POS: tl.constexpr,
           TABLE_PER_HEAD: tl.constexpr, COPY_REST: tl.constexpr, HEADS: tl.constexpr,
           BLOCK_N: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr):
    """Turn heads ``h0 .. h0 + HEADS - 1`` (those below ``H``) of ``X`` into ``O``, rows
    ``rows`` of batch ``b``, by ``cos``/``sin`` (or each head's own table rows)."""
    for i in tl.static_range(HEADS):
        h = (h0 + i).to(tl.int64)
        # (BLOCK_N,), not a 0-d boolean: Triton 3.9's interpreter widens one broadcast into
        # a mask to int32, which its loads refuse
        head_ok = rows * 0 + (h0 + i) < H
        if TABLE_PER_HEAD:  # tables (or positions) that differ from head to head
            cos, sin = _table(COS, SIN, POS, b, h, rows, row_ok, mask, jt, ROWS, c_sb, c_sh,
                              c_sn, c_sd, s_sb, s_sh, s_sn, s_sd, p_sb, p_sh, p_sn, SIGN, HAS_POS)
        x_row = X + b * x_sb + h * x_sh + rows[:, None] * x_sn  # (BLOCK_N, 1)
        o_row = O + b * o_sb + h * o_sh + rows[:, None] * o_sn
        if INTERLEAVED:  # whole rows read and written in order, the pairs split in registers
            c = tl.arange(0, 2 * BLOCK_HALF).to(tl.int64)
            xm = (row_ok & head_ok)[:, None] & (c < 2 * HALF)[None, :]  # (BLOCK_N, 2 BLOCK_HALF)
            x = tl.load(x_row + c[None, :] * x_sd, mask=xm, other=0.0).to(tl.float32)
            x1, x2 = tl.split(tl.reshape(x, (BLOCK_N, BLOCK_HALF, 2)))
            y1 = x1 * cos - x2 * sin  # eq. 34, in float32; one rounding on the store
            y2 = x2 * cos + x1 * sin
            y = tl.reshape(tl.join(y1, y2), (BLOCK_N, 2 * BLOCK_HALF))
            tl.store(o_row + c[None, :] * o_sd, y.to(O.dtype.element_ty), mask=xm)
        else:  # the halves x[:r/2] and x[r/2:r]
            xm = mask & head_ok[:, None]
            x1 = tl.load(x_row + jt[None, :] * x_sd, mask=xm, other=0.0).to(tl.float32)
            x2 = tl.load(x_row + (jt + HALF)[None, :] * x_sd, mask=xm, other=0.0).to(tl.float32)
            y1 = x1 * cos - x2 * sin
            y2 = x2 * cos + x1 * sin
            tl.store(o_row + jt[None, :] * o_sd, y1.to(O.dtype.element_ty), mask=xm)
            tl.store(o_row + (jt + HALF)[None, :] * o_sd, y2.to(O.dtype.element_ty), mask=xm)
        if COPY_REST:  # out of place: channels r .. d - 1 pass through
            c = tl.arange(0, BLOCK_REST)
            rest = (row_ok & head_ok)[:, None] & (c < REST)[None, :]
            c64 = (c + 2 * HALF).to(tl.int64)
            kept = tl.load(x_row + c64[None, :] * x_sd, mask=rest)
            tl.store(o_row + c64[None, :] * o_sd, kept, mask=rest)


@triton.jit
def _rotary_kernel(
    Q, OQ, K, OK, COS, SIN, POS,
    HQ, HK, N, HALF, REST, ROWS,
    q_sb, q_sh, q_sn, q_sd, oq_sb, oq_sh, oq_sn, oq_sd,
    k_sb, k_sh, k_sn, k_sd, ok_sb, ok_sh, ok_sn, ok_sd,
    c_sb, c_sh, c_sn, c_sd, s_sb, s_sh, s_sn, s_sd, p_sb, p_sh, p_sn,
    GROUPS_Q,
    SIGN: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_POS: tl.constexpr,
    TABLE_PER_HEAD: tl.constexpr, COPY_REST: tl.constexpr, HEADS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr,
):
    """Program ``(i, b, g)``: rows ``i * BLOCK_N ...`` of batch ``b``, heads ``g * HEADS ...``
    of q (the first ``GROUPS_Q`` groups) or of k (the rest)."""
    b = tl.program_id(1).to(tl.int64)
    g = tl.program_id(2)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) along n
    j = tl.arange(0, BLOCK_HALF)  # (BLOCK_HALF,) pairs
    row_ok = rows < N
    mask = row_ok[:, None] & (j < HALF)[None, :]  # (BLOCK_N, BLOCK_HALF)
    rows = rows.to(tl.int64)
    jt = j.to(tl.int64)
    if TABLE_PER_HEAD:  # each head reads its own rows (in _heads)
        cos = tl.zeros((BLOCK_N, BLOCK_HALF), tl.float32)
        sin = cos
    else:  # one table tile for every head of the program, q's and k's alike
        cos, sin = _table(COS, SIN, POS, b, 0, rows, row_ok, mask, jt, ROWS, c_sb, c_sh, c_sn,
                          c_sd, s_sb, s_sh, s_sn, s_sd, p_sb, p_sh, p_sn, SIGN, HAS_POS)
    # q and k in separate calls, so that no variable holds a value of both (Triton may
    # specialise one's stride to a constant and not the other's)
    if g < GROUPS_Q:
        _heads(Q, OQ, g * HEADS, HQ, b, rows, row_ok, mask, jt, cos, sin, HALF, REST,
               q_sb, q_sh, q_sn, q_sd, oq_sb, oq_sh, oq_sn, oq_sd,
               COS, SIN, POS, ROWS, c_sb, c_sh, c_sn, c_sd, s_sb, s_sh, s_sn, s_sd,
               p_sb, p_sh, p_sn, SIGN, INTERLEAVED, HAS_POS, TABLE_PER_HEAD, COPY_REST, HEADS,
               BLOCK_N, BLOCK_HALF, BLOCK_REST)
    else:
        _heads(K, OK, (g - GROUPS_Q) * HEADS, HK, b, rows, row_ok, mask, jt, cos, sin,
               HALF, REST, k_sb, k_sh, k_sn, k_sd, ok_sb, ok_sh, ok_sn, ok_sd,
               COS, SIN, POS, ROWS, c_sb, c_sh, c_sn, c_sd, s_sb, s_sh, s_sn, s_sd,
               p_sb, p_sh, p_sn, SIGN, INTERLEAVED, HAS_POS, TABLE_PER_HEAD, COPY_REST, HEADS,
               BLOCK_N, BLOCK_HALF, BLOCK_REST)


# fmt: on


def _lead4(t: Tensor) -> tuple[int, int, int, int]:
    """Strides of ``t``'s dims as the kernel's ``(B, H, N, channels)``: leading dims padded
    on the left with stride 0 (size 1), a size-1 dim given stride 0 (broadcast)."""
    own = [s if n != 1 else 0 for n, s in zip(t.shape, t.stride(), strict=True)]
    strides = [0] * (4 - t.dim()) + own
    return strides[0], strides[1], strides[2], strides[3]


def _shape4(t: Tensor) -> tuple[int, int, int, int]:
    """``t``'s shape as the kernel's ``(B, H, N, channels)``."""
    shape = (1,) * (4 - t.dim()) + tuple(t.shape)
    return shape[0], shape[1], shape[2], shape[3]


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


def _broadcasts(name: str, t: Tensor, lead: tuple[int, int, int], dims: int) -> None:
    """Raise unless the first ``dims`` dims of ``t`` broadcast against ``lead``."""
    shape = tuple(t.shape[:dims])
    if len(shape) > 3 or any(
        s not in (1, want) for s, want in zip(reversed(shape), reversed(lead), strict=False)
    ):
        raise PosencValueError(
            f"{name} of shape {tuple(t.shape)} does not broadcast against the leading dims "
            f"{lead} of the rotated tensor"
        )


def _table_strides(
    cos: Tensor,
    sin: Tensor,
    positions: Tensor | None,
    lead: tuple[int, int, int],
    half: int,
) -> tuple[tuple, tuple, tuple, Tensor, int]:
    """The table and position strides the kernel walks over ``(B, H, N, pairs)``, the
    positions tensor it reads (``cos`` as a dummy where there are none) and the number of
    table rows (0 without positions)."""
    for t in (cos, sin):
        if t.dim() < 1 or t.shape[-1] != half or t.shape != cos.shape:
            raise PosencValueError(
                f"cos and sin must have {half} pairs and one shape, got {tuple(cos.shape)} "
                f"and {tuple(sin.shape)}"
            )
    if positions is None:
        _broadcasts("cos", cos, lead, cos.dim() - 1)
        return _lead4(cos), _lead4(sin), (0, 0, 0), cos, 0
    if positions.dtype not in (torch.int64, torch.int32):
        raise PosencTypeError(f"positions must be int64 or int32, got {positions.dtype}")
    if cos.dim() != 2:
        raise PosencValueError(
            f"with positions, cos and sin must be whole (rows, {half}) tables, got "
            f"{tuple(cos.shape)}"
        )
    if positions.dim() == 2 and positions.shape == (lead[0], lead[2]) and lead[1] > 1:
        positions = positions[:, None]  # (b, n) -> (b, 1, n): one row per batch, all heads
    _broadcasts("positions", positions, lead, positions.dim())
    strides = _lead4(positions[..., None])[:3]
    c_strides = (0, 0, cos.stride(0), cos.stride(1))
    s_strides = (0, 0, sin.stride(0), sin.stride(1))
    return c_strides, s_strides, strides, positions, cos.shape[0]


def _launch(
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
    c_strides, s_strides, p_strides, pos, rows = _table_strides(
        cos, sin, positions, (bq, hq, n), half
    )
    if positions is not None and not checked:
        _check_positions(positions, rows)
    table_per_head = c_strides[1] != 0 or s_strides[1] != 0 or p_strides[1] != 0
    if table_per_head and hk and hk != hq:
        raise PosencValueError(
            f"tables that differ from head to head need as many key heads as query heads, "
            f"got {hq} and {hk}"
        )
    if not (q.numel() and n):
        return
    block_half = triton.next_power_of_2(half)
    block_n = max(1, min(triton.next_power_of_2(n), TILE_ELEMENTS // block_half))
    heads = 1 if table_per_head else HEADS_PER_PROGRAM
    groups_q = triton.cdiv(hq, heads)
    groups = groups_q + triton.cdiv(hk, heads)
    # (where one of q, k turns in place, it copies its own channels onto themselves)
    copy_rest = r < d and not (out_q is q and out_k is k)
    grid = (triton.cdiv(n, block_n), bq, groups)
    warps = max(1, min(NUM_WARPS, block_n * block_half // 256))
    _rotary_kernel[grid](
        q,
        out_q,
        k,
        out_k,
        cos,
        sin,
        pos,
        hq,
        hk,
        n,
        half,
        d - r,
        rows,
        *_lead4(q),
        *_lead4(out_q),
        *_lead4(k),
        *_lead4(out_k),
        *c_strides,
        *s_strides,
        *p_strides,
        groups_q,
        SIGN=-1.0 if clockwise else 1.0,
        INTERLEAVED=interleaved,
        HAS_POS=positions is not None,
        TABLE_PER_HEAD=table_per_head,
        COPY_REST=copy_rest,
        HEADS=heads,
        BLOCK_N=block_n,
        BLOCK_HALF=block_half,
        BLOCK_REST=triton.next_power_of_2(max(d - r, 1)),
        num_warps=warps,
        enable_fp_fusion=True,  # (Triton's default before 3.10, stated: 3.9 warns where unset)
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


def rotate_triton(
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
    _launch(x, out, None, None, cos, sin, positions, interleaved, clockwise, checked)
    return out


def rotate_pair_triton(
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
    """:func:`rotate_triton` for ``q`` ``(b, hq, n, d)`` and ``k`` ``(b, hk, n, d)`` turned by
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
    _launch(q, out_q, k, out_k, cos, sin, positions, interleaved, clockwise, checked)
    return out_q, out_k
