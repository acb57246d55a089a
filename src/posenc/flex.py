"""Flex attention for :class:`~posenc.MultiHeadAttention`'s ``flex`` backend: the block mask
for causal and key-padding masks, a ``score_mod`` reading a materialised bias, and
:func:`torch.nn.attention.flex_attention` compiled once per shape (with a fallback when
compilation fails).

A bias scheme's ``score_mod`` adds its bias inside the kernel, block by block, so no
``n × n`` tensor ever exists; the causal and padding masks become a block-sparse
``BlockMask`` that skips whole blocks of masked keys.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence (``nq``/``nk``), ``d`` head dim.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .encodings.base import ScoreMod
from .sdpa import kernel_dtype

__all__ = [
    "FLEX_BLOCK_SIZE",
    "bias_score_mod",
    "flex_attention_forward",
    "flex_available",
    "flex_block_mask",
    "flex_cache_clear",
]

#: Block size of the BlockMask built for causal and padding masks (flex_attention's default).
FLEX_BLOCK_SIZE = 128


def flex_available() -> bool:
    """Whether this torch has ``torch.nn.attention.flex_attention``."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:  # pragma: no cover - torch < 2.5
        return False
    return True


def flex_block_mask(
    batch: int,
    nq: int,
    nk: int,
    *,
    causal: bool,
    key_padding_mask: Tensor | None,
    device: torch.device,
    q_documents: Tensor | None = None,
    k_documents: Tensor | None = None,
    q_positions: Tensor | None = None,
    k_positions: Tensor | None = None,
    window: int | None = None,
    chunk: int | None = None,
) -> Any:
    """A flex_attention ``BlockMask`` for a causal, key-padding and/or document mask (all
    blocks full when there is none). Documents are run numbers, ``(b, nq)`` and ``(b, nk)``,
    that never decrease along a row (:mod:`posenc.context`), so a block's documents span
    from its first token's to its last token's. A sliding ``window`` and a ``chunk`` read positions,
    ``(b, nq)`` and ``(b, nk)`` (as :func:`~posenc.masks.attention_mask`); a block is skipped
    when no pair in it can be near enough (or share a chunk), judged from the block's
    smallest and largest positions.

    Built from block-level reasoning, ``(b, 1, nq/128, nk/128)`` booleans, never from an
    ``nq × nk`` mask (``create_block_mask`` would evaluate every pair). Blocks with every pair
    allowed are "full" (no mask_mod call), blocks with some allowed "partial", the rest are
    skipped. Causal masking aligns the last query with the last key, as in
    :func:`attention_mask`.

    A mask is passed even when nothing is masked: without one, flex_attention's CPU kernel
    works on the whole ``nq × nk`` as a single block, a per-thread ``nq × nk`` buffer
    (0.5 GiB at n = 8192 on two threads) and about 3x slower at that length.
    """
    from torch.nn.attention.flex_attention import BlockMask

    bs = FLEX_BLOCK_SIZE
    mq, mk = -(-nq // bs), -(-nk // bs)
    q_first = torch.arange(mq, device=device) * bs
    q_last = (q_first + bs).clamp(max=nq) - 1
    k_first = torch.arange(mk, device=device) * bs
    k_last = (k_first + bs).clamp(max=nk) - 1
    some = torch.ones(1, mq, mk, dtype=torch.bool, device=device)  # (B, mq, mk)
    every = some.clone()
    offset = nk - nq
    if causal:  # key j is allowed for query i when j <= i + offset
        some = some & (k_first.view(1, 1, mk) <= q_last.view(1, mq, 1) + offset)
        every = every & (k_last.view(1, 1, mk) <= q_first.view(1, mq, 1) + offset)
    keep: Tensor | None = None
    if key_padding_mask is not None:
        keep = ~key_padding_mask  # (b, nk)
        tail = mk * bs - nk
        some_keys = F.pad(keep, (0, tail), value=False).view(batch, mk, bs).any(-1)
        every_keys = F.pad(keep, (0, tail), value=True).view(batch, mk, bs).all(-1)
        some = some & some_keys.view(batch, 1, mk)
        every = every & every_keys.view(batch, 1, mk)
    documents = q_documents is not None and k_documents is not None
    if documents:
        assert q_documents is not None and k_documents is not None
        q_lo, q_hi = q_documents[:, q_first].view(batch, mq, 1), q_documents[:, q_last]
        k_lo, k_hi = k_documents[:, k_first].view(batch, 1, mk), k_documents[:, k_last]
        q_hi, k_hi = q_hi.view(batch, mq, 1), k_hi.view(batch, 1, mk)
        some = some & (q_lo <= k_hi) & (k_lo <= q_hi)  # the two blocks share a document
        every = every & (q_lo == q_hi) & (k_lo == k_hi) & (q_lo == k_lo)  # ... and only it
    if window is not None or chunk is not None:
        assert q_positions is not None and k_positions is not None
        q_lo, q_hi = _block_range(q_positions, bs, mq)  # (b, mq) each
        k_lo, k_hi = _block_range(k_positions, bs, mk)
        q_lo, q_hi = q_lo.view(batch, mq, 1), q_hi.view(batch, mq, 1)
        k_lo, k_hi = k_lo.view(batch, 1, mk), k_hi.view(batch, 1, mk)
        if window is not None:  # the nearest pair is within reach / the farthest one is
            gap = torch.maximum(k_lo - q_hi, q_lo - k_hi)
            some = some & (gap < window)
            every = every & (torch.maximum(q_hi - k_lo, k_hi - q_lo) < window)
        if chunk is not None:
            cq_lo, cq_hi, ck_lo, ck_hi = (
                torch.div(t, chunk, rounding_mode="floor") for t in (q_lo, q_hi, k_lo, k_hi)
            )
            some = some & (cq_lo <= ck_hi) & (ck_lo <= cq_hi)
            every = every & (cq_lo == cq_hi) & (ck_lo == ck_hi) & (cq_lo == ck_lo)
    partial, full = some & ~every, every

    def as_indices(blocks: Tensor) -> tuple[Tensor, Tensor]:
        counts = blocks.sum(-1, dtype=torch.int32)  # (B, mq)
        order = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return counts.unsqueeze(1), order.unsqueeze(1)  # (B, 1, mq), (B, 1, mq, mk)

    kv_num, kv_idx = as_indices(partial)
    full_num, full_idx = as_indices(full)
    mask_mod = _mask_mod(causal, offset, keep, device)  # None when neither
    if documents:
        mask_mod = _document_mask_mod(mask_mod, q_documents, k_documents)
    if window is not None or chunk is not None:
        mask_mod = _position_mask_mod(mask_mod, q_positions, k_positions, window, chunk)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=bs, mask_mod=mask_mod, seq_lengths=(nq, nk)
    )


def _mask_mod(
    causal: bool, offset: int, keep: Tensor | None, device: torch.device
) -> Callable[..., Tensor] | None:
    if not causal and keep is None:
        return None
    # a tensor: no recompilation per offset; filled on the device (torch.tensor would copy
    # from the host, which on CUDA waits for the stream)
    shift = torch.full((), offset, device=device)
    if causal and keep is not None:
        return lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx + shift) & keep[b, kv_idx]
    if causal:
        return lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + shift
    assert keep is not None
    return lambda b, h, q_idx, kv_idx: keep[b, kv_idx]


def _document_mask_mod(
    inner: Callable[..., Tensor] | None, q_documents: Any, k_documents: Any
) -> Callable[..., Tensor]:
    """``inner`` (or nothing) and: the query and the key lie in the same document."""
    if inner is None:
        return lambda b, h, q_idx, kv_idx: q_documents[b, q_idx] == k_documents[b, kv_idx]

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        same = q_documents[b, q_idx] == k_documents[b, kv_idx]
        return same & inner(b, h, q_idx, kv_idx)

    return mask_mod


def _block_range(positions: Tensor, bs: int, blocks: int) -> tuple[Tensor, Tensor]:
    """The smallest and largest position in each block of ``bs`` tokens: ``(b, blocks)``."""
    n = positions.shape[-1]
    tail = blocks * bs - n
    # past the end: above every position, and exact in the positions' dtype (the pad value
    # passes through a double: int64's largest would round up and wrap to its most negative)
    top = (
        float("inf")
        if positions.is_floating_point()
        else min(2**62, torch.iinfo(positions.dtype).max)
    )
    low = F.pad(positions, (0, tail), value=top)
    high = F.pad(positions, (0, tail), value=-1)
    return low.view(-1, blocks, bs).amin(-1), high.view(-1, blocks, bs).amax(-1)


def _position_mask_mod(
    inner: Callable[..., Tensor] | None,
    q_positions: Any,
    k_positions: Any,
    window: int | None,
    chunk: int | None,
) -> Callable[..., Tensor]:
    """``inner`` (or nothing) and: the key is within ``window`` positions of the query, and
    in its ``chunk``."""

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        qp, kp = q_positions[b, q_idx], k_positions[b, kv_idx]
        allowed = qp == qp  # all True, of the right shape
        if window is not None:
            allowed = allowed & ((qp - kp).abs() < window)
        if chunk is not None:
            allowed = allowed & (qp // chunk == kp // chunk)
        return allowed if inner is None else allowed & inner(b, h, q_idx, kv_idx)

    return mask_mod


def bias_score_mod(bias: Tensor) -> ScoreMod:
    """A score_mod reading a materialised bias ``(h, nq, nk)`` or ``(b, h, nq, nk)``."""
    if bias.dim() == 3:
        return lambda score, b, h, q_idx, kv_idx: score + bias[h, q_idx, kv_idx].to(score.dtype)
    if bias.shape[0] == 1:
        one = bias[0]
        return lambda score, b, h, q_idx, kv_idx: score + one[h, q_idx, kv_idx].to(score.dtype)
    return lambda score, b, h, q_idx, kv_idx: score + bias[b, h, q_idx, kv_idx].to(score.dtype)


# Compiled flex attention, one wrapper per (rank, heads, head dims, dtype, device, score_mod
# and mask_mod code), compiled with automatic dynamic shapes: the first length gets a static
# kernel, the second a kernel with symbolic lengths that serves every later one, so a run
# whose batches vary in length, or an evaluation at L..16L, compiles each wrapper at most
# twice (``tests/test_flex_compile.py`` counts). Each wrapper gets its own code object, hence
# its own dynamo cache, so many wrappers never exhaust torch's recompile limit.
_FLEX_COMPILED: dict[tuple[Any, ...], Callable[..., Tensor]] = {}
_FLEX_FAILED: dict[tuple[Any, ...], str] = {}


def _compiled_flex(key: tuple[Any, ...]) -> Callable[..., Tensor]:
    fn = _FLEX_COMPILED.get(key)
    if fn is None:
        from torch.nn.attention.flex_attention import flex_attention

        def run(q: Tensor, k: Tensor, v: Tensor, score_mod: Any, block_mask: Any) -> Tensor:
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)

        run.__code__ = run.__code__.replace()  # a fresh code object: a cache of its own
        fn = torch.compile(run, dynamic=None)  # static first, then symbolic lengths
        _FLEX_COMPILED[key] = fn
    return fn


def compile_key(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, ...]:
    """What a compiled flex kernel is keyed by besides dtype, device and code: the heads and
    head sizes, not the batch or the lengths (those are symbolic after the first change)."""
    return (q.dim(), q.shape[-3], k.shape[-3], q.shape[-1], v.shape[-1])


def flex_cache_clear() -> None:
    """Forget every compiled flex kernel (and every recorded compilation failure)."""
    _FLEX_COMPILED.clear()
    _FLEX_FAILED.clear()


def flex_attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    score_mod: ScoreMod | None,
    block_mask: Any,
    compile: bool = True,
) -> Tensor | None:
    """``flex_attention(q, k, v)`` with the inputs in :func:`~posenc.sdpa.kernel_dtype`
    (bf16/fp16 stay so on a GPU: flex's kernel computes the scores, runs the ``score_mod``
    and keeps the softmax statistics in fp32 itself; fp32 on the CPU); ``None`` when
    compilation failed (the caller then uses another backend; the failure is warned about
    once per key).

    ``compile=False`` runs flex_attention's eager reference, which is correct but
    materialises the scores; it exists for tests and for platforms without a compiler.
    """
    from torch.nn.attention.flex_attention import flex_attention

    out_dtype, work = q.dtype, kernel_dtype(q)
    q, k, v = q.to(work), k.to(work), v.to(work)
    if torch.compiler.is_compiling():  # inside a user's torch.compile: let it fuse
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask).to(out_dtype)
    if q.device.type == "cpu" and min(q.shape[-2], k.shape[-2]) < FLEX_BLOCK_SIZE:
        # torch 2.13's compiled CPU kernel is intermittently wrong (0.2-0.6 off, once NaN)
        # below one block of queries or keys; the eager reference is right and cheap there
        compile = False
    if not compile:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch")
            out = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)
        return out.to(out_dtype)
    key = (
        compile_key(q, k, v),
        work,
        q.device.type,
        getattr(score_mod, "__code__", None),
        getattr(getattr(block_mask, "mask_mod", None), "__code__", None),
    )
    if key in _FLEX_FAILED:
        return None
    try:
        out = _compiled_flex(key)(q, k, v, score_mod, block_mask)
    except Exception as error:  # a missing compiler, an unsupported op: fall back, still correct
        _FLEX_FAILED[key] = f"{type(error).__name__}: {error}"
        warnings.warn(
            f"compiling flex_attention failed ({type(error).__name__}); using SDPA with a "
            f"materialised bias instead for this shape",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return out.to(out_dtype)
