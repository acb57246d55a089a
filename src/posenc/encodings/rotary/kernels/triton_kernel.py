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

This module is the kernel's source only; :mod:`.triton_launch` plans and makes its launches.
Triton is imported with it, which only :mod:`.triton_launch` (itself imported by
:mod:`.triton_entry` on the first rotation it runs) imports: ``import posenc`` and the CLI
never import triton. Under ``TRITON_INTERPRET=1`` (set before this module is imported) the
kernel runs in Triton's interpreter on CPU tensors, which is how the tests check it without a
GPU. A row whose position lies outside the table is masked to NaN, never another row.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` channels of ``x``,
``r`` rotary channels (``r <= d``). The kernel sees every tensor as ``(B, H, N, d)``: the
caller's leading dims, padded on the left with size-1 dims.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["HEADS_PER_PROGRAM", "NUM_WARPS", "TILE_ELEMENTS", "rotary_kernel"]

#: Pairs of one tile ``(BLOCK_N, r/2)`` a program turns at a time: small enough that a tile's
#: float32 values stay in registers without spilling with :data:`NUM_WARPS` warps (both
#: layouts), leaving room for many warps per SM to hide memory latency.
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
def rotary_kernel(
    Q, OQ, K, OK, COS, SIN, POS,
    HQ, HK, N, HALF: tl.constexpr, REST: tl.constexpr, ROWS,
    q_sb, q_sh, q_sn, q_sd, oq_sb, oq_sh, oq_sn, oq_sd,
    k_sb, k_sh, k_sn, k_sd, ok_sb, ok_sh, ok_sn, ok_sd,
    c_sb, c_sh, c_sn, c_sd, s_sb, s_sh, s_sn, s_sd, p_sb, p_sh, p_sn,
    GROUPS_Q, GROUPS, ROW_BLOCKS,
    SIGN: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_POS: tl.constexpr,
    TABLE_PER_HEAD: tl.constexpr, COPY_REST: tl.constexpr, HEADS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr,
):
    """Program ``(i, g, b)``, numbered ``i + ROW_BLOCKS * (g + GROUPS * b)`` along grid x
    (:func:`~.triton_launch.launch_grid`): rows ``i * BLOCK_N ...`` of batch ``b``, heads
    ``g * HEADS ...`` of q (the first ``GROUPS_Q`` groups) or of k (the rest). The rotated
    width (``HALF`` pairs, ``REST`` kept channels) is a constant of the compiled kernel, so
    that the masks of a width that is not a power of two (head sizes 80, 112) keep wide
    accesses."""
    pid = tl.program_id(0)
    i = pid % ROW_BLOCKS
    g = (pid // ROW_BLOCKS) % GROUPS
    b = (pid // ROW_BLOCKS // GROUPS).to(tl.int64)
    rows = i * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) along n
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
