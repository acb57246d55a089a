"""Flex attention for :class:`~posenc.MultiHeadAttention`'s ``flex`` backend: the block mask
of a :class:`~posenc.sequence.masks.MaskSpec`, a ``score_mod`` reading a materialised bias, and
:func:`torch.nn.attention.flex_attention` compiled once per shape (with a fallback when
compilation fails).

A bias scheme's ``score_mod`` adds its bias inside the kernel, block by block, so no
``n × n`` tensor ever exists; the mask becomes a block-sparse ``BlockMask`` that skips whole
blocks of masked keys.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence (``nq``/``nk``), ``d`` head dim.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..encodings.base import ScoreMod
from ..sequence.masks import MaskSpec
from .groups import fold_flex_call, groups_of, unfold_groups
from .sdpa import kernel_dtype

__all__ = [
    "FLEX_BLOCK_SIZE",
    "append_sink_key",
    "bias_score_mod",
    "block_mask",
    "flex_attention_forward",
    "flex_available",
    "flex_block_mask",
    "flex_cache_clear",
    "lse_route",
    "mask_mod",
    "sink_score_mod",
    "softcap_score_mod",
    "with_sinks",
]

#: Block size of the BlockMasks posenc builds (flex_attention's default).
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
    sink_key: bool = False,
) -> Any:
    """:func:`block_mask` of the :class:`~posenc.sequence.masks.MaskSpec` these arguments
    describe (as :func:`~posenc.sequence.masks.attention_mask`'s)."""
    spec = MaskSpec.build(
        batch, nq, nk, causal=causal, key_padding_mask=key_padding_mask,
        q_documents=q_documents, k_documents=k_documents,
        q_positions=q_positions, k_positions=k_positions, window=window, chunk=chunk,
    )  # fmt: skip
    return block_mask(spec, device, sink_key=sink_key)


def block_mask(spec: MaskSpec, device: torch.device, *, sink_key: bool = False) -> Any:
    """A flex_attention ``BlockMask`` for the rules of ``spec`` (every block full when no
    rule is in force).

    Built from :meth:`~posenc.sequence.masks.MaskSpec.blocks`, ``(B, mq, mk)`` booleans per
    block of 128 by 128, never from an ``nq × nk`` mask (``create_block_mask`` would evaluate
    every pair). Blocks with every pair allowed are "full" (no mask_mod call), blocks with
    some allowed "partial", the rest are skipped; in a partial block the kernel asks
    :func:`mask_mod`, which is :meth:`~posenc.sequence.masks.MaskSpec.allows`.

    ``sink_key``: one more key, number ``nk``, that every query reads (sinks on the CPU's
    compiled kernel, see :func:`sink_score_mod`); the mask is ``nq × (nk + 1)``.

    A mask is passed even when nothing is masked: without one, flex_attention's CPU kernel
    works on the whole ``nq × nk`` as a single block, with a per-thread ``nq × nk`` buffer.
    """
    from torch.nn.attention.flex_attention import BlockMask

    some, every = spec.blocks(FLEX_BLOCK_SIZE, device)
    partial, full = some & ~every, every
    rule = mask_mod(spec, device)  # None when no rule is in force
    if sink_key:
        partial, full, rule = _with_sink_key(partial, full, rule, spec.nk, device)

    def as_indices(blocks: Tensor) -> tuple[Tensor, Tensor]:
        counts = blocks.sum(-1, dtype=torch.int32)  # (B, mq)
        order = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return counts.unsqueeze(1), order.unsqueeze(1)  # (B, 1, mq), (B, 1, mq, mk)

    kv_num, kv_idx = as_indices(partial)
    full_num, full_idx = as_indices(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=FLEX_BLOCK_SIZE, mask_mod=rule,
        seq_lengths=(spec.nq, spec.nk + int(sink_key)),
    )  # fmt: skip


def mask_mod(spec: MaskSpec, device: torch.device) -> Callable[..., Tensor] | None:
    """Flex's ``mask_mod`` for ``spec``: :meth:`~posenc.sequence.masks.MaskSpec.allows` of
    one pair (``None`` when no rule is in force). Its ``code_key`` names the rules in force,
    so compiled kernels of different rules are kept apart."""
    if not spec.restricts:
        return None
    # the causal offset as a tensor: no recompilation per offset; filled on the device
    # (torch.tensor would copy from the host, which on CUDA waits for the stream)
    offset = torch.full((), spec.nk - spec.nq, device=device) if spec.causal else 0

    def allowed(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return spec.allows(b, q_idx, kv_idx, offset)

    allowed.code_key = (allowed.__code__, spec.rules)  # type: ignore[attr-defined]
    return allowed


def _with_sink_key(
    partial: Tensor,
    full: Tensor,
    inner: Callable[..., Tensor] | None,
    nk: int,
    device: torch.device,
) -> tuple[Tensor, Tensor, Callable[..., Tensor] | None]:
    """The block grids ``(B, mq, mk)`` and mask_mod of ``nk`` keys extended by a sink key,
    number ``nk``, allowed for every query. When it starts a block of its own, that block
    is full for every query block (the kernel bounds it at ``nk + 1`` keys; no mask_mod
    call). Otherwise its block (the last) is read by every query block, as partial unless
    already full. The mask_mod allows the sink key and asks ``inner`` about the others, at
    indices clamped into range (the eager kernel asks it about every pair)."""
    if nk % FLEX_BLOCK_SIZE == 0:  # a block of its own
        partial, full = F.pad(partial, (0, 1)), F.pad(full, (0, 1), value=True)
    elif inner is not None:  # (without a mask_mod every block is full, the last one too)
        partial = partial.clone()
        partial[..., -1] |= ~full[..., -1]
    if inner is None:
        return partial, full, None
    sink = torch.full((), nk, device=device)  # a tensor: no recompilation per length

    def with_sink(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (kv_idx == sink) | inner(b, h, q_idx, torch.minimum(kv_idx, sink - 1))

    with_sink.code_key = (with_sink.__code__, _code_key(inner))  # type: ignore[attr-defined]
    return partial, full, with_sink


def bias_score_mod(bias: Tensor) -> ScoreMod:
    """A score_mod reading a materialised bias ``(h, nq, nk)`` or ``(b, h, nq, nk)``."""
    if bias.dim() == 3:
        return lambda score, b, h, q_idx, kv_idx: score + bias[h, q_idx, kv_idx].to(score.dtype)
    if bias.shape[0] == 1:
        one = bias[0]
        return lambda score, b, h, q_idx, kv_idx: score + one[h, q_idx, kv_idx].to(score.dtype)
    return lambda score, b, h, q_idx, kv_idx: score + bias[b, h, q_idx, kv_idx].to(score.dtype)


def softcap_score_mod(inner: ScoreMod | None, softcap: float) -> ScoreMod:
    """``inner`` (a scheme's score_mod, or nothing) followed by logit soft-capping:
    ``c · tanh(score / c)`` (Gemma 2), applied to the scaled score with its bias added.
    The wrapper's ``code_key`` names the inner code too, so compiled kernels of different
    schemes under one cap are kept apart."""
    if inner is None:

        def capped(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return softcap * torch.tanh(score / softcap)

    else:

        def capped(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return softcap * torch.tanh(inner(score, b, h, q_idx, kv_idx) / softcap)

    capped.code_key = (capped.__code__, _code_key(inner))  # type: ignore[attr-defined]
    return capped


def sink_score_mod(inner: ScoreMod | None, sinks: Tensor, nk: int) -> ScoreMod:
    """Sinks as one more key, number ``nk`` (a zero key and value appended by
    :func:`append_sink_key`): ``inner`` (or nothing) scores the ``nk`` real keys, and the
    sink key's score is its head's sink logit. The CPU's compiled flex kernel (torch 2.13)
    cannot return the log-sum-exp that :func:`with_sinks` folds them through; this costs one
    more key per row, and the scores are still never materialised."""
    sink = torch.tensor(nk, device=sinks.device)  # a tensor: no recompilation per length
    if inner is None:

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return torch.where(kv_idx == sink, sinks[h].to(score.dtype), score)

    else:

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            scored = inner(score, b, h, q_idx, torch.minimum(kv_idx, sink - 1))
            return torch.where(kv_idx == sink, sinks[h].to(score.dtype), scored)

    mod.code_key = (mod.__code__, _code_key(inner))  # type: ignore[attr-defined]
    return mod


def append_sink_key(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """``k`` and ``v`` ``(b, h, nk, d)`` with a zero key and a zero value appended (the sink's:
    its weight multiplies nothing)."""
    k = torch.cat([k, k.new_zeros(*k.shape[:-2], 1, k.shape[-1])], dim=-2)
    v = torch.cat([v, v.new_zeros(*v.shape[:-2], 1, v.shape[-1])], dim=-2)
    return k, v


def lse_route(device: torch.device, compile: bool) -> bool:
    """Whether flex folds sinks through its returned log-sum-exp here: everywhere except the
    CPU's compiled kernel (torch 2.13: "torch.compile on CPU only supports inference and
    `return_lse` is not supported yet"), where :func:`sink_score_mod` adds a sink key."""
    compiled = compile or torch.compiler.is_compiling()
    return not (device.type == "cpu" and compiled)


def _code_key(fn: Any) -> Any:
    """What a compiled flex kernel keys a score_mod or mask_mod by: its code (a wrapper's
    ``code_key`` when it wraps another function)."""
    return getattr(fn, "code_key", getattr(fn, "__code__", None))


# Compiled flex attention, one wrapper per (rank, heads, head dims, dtype, device, score_mod
# and mask_mod code), compiled with automatic dynamic shapes: the first length gets a static
# kernel, the second a kernel with symbolic lengths that serves every later one, so a run
# whose batches vary in length, or an evaluation at L..16L, compiles each wrapper at most
# twice (``tests/attention/test_flex_compile.py`` counts). Each wrapper gets its own code object,
# hence
# its own dynamo cache, so many wrappers never exhaust torch's recompile limit.
_FLEX_COMPILED: dict[tuple[Any, ...], Callable[..., Tensor]] = {}
_FLEX_FAILED: dict[tuple[Any, ...], str] = {}


def _compiled_flex(key: tuple[Any, ...]) -> Callable[..., Tensor]:
    fn = _FLEX_COMPILED.get(key)
    if fn is None:

        def run(
            q: Tensor, k: Tensor, v: Tensor, score_mod: Any, block_mask: Any, scale: Any
        ) -> Any:
            return _flex(q, k, v, score_mod, block_mask, scale, lse=key[-1])

        run.__code__ = run.__code__.replace()  # a fresh code object: a cache of its own
        fn = torch.compile(run, dynamic=None)  # static first, then symbolic lengths
        _FLEX_COMPILED[key] = fn
    return fn


def compile_key(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, ...]:
    """What a compiled flex kernel is keyed by besides dtype, device and code: the heads and
    head sizes, not the batch or the lengths (those are symbolic after the first change)."""
    return (q.dim(), q.shape[-3], k.shape[-3], q.shape[-1], v.shape[-1])


def _flex(
    q: Tensor, k: Tensor, v: Tensor, score_mod: Any, block_mask: Any, scale: Any, *, lse: bool
) -> Any:
    """``flex_attention``: the output, or ``(output, lse)`` with ``lse`` (the natural-log
    log-sum-exp of each row's scores, ``(b, h, nq)``, fp32; torch converts its kernels'
    base-2 statistics). Keys and values with fewer heads than the queries are grouped heads
    (``enable_gqa``: the compiled kernels read each key/value head for its query heads)."""
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    gqa = q.shape[-3] != k.shape[-3]
    if not lse:
        return flex_attention(
            q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa
        )
    out, aux = flex_attention(
        q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa,
        return_aux=AuxRequest(lse=True),
    )  # fmt: skip
    return out, aux.lse


def with_sinks(out: Tensor, lse: Tensor, sinks: Tensor) -> Tensor:
    """Flex's output ``(b, h, nq, d)`` as a softmax with one more logit per head, ``sinks``
    ``(h,)``, whose column is dropped: the row's weights shrink by ``Z / (Z + exp(sink))``
    with ``Z = exp(lse)``, i.e. ``out · sigmoid(lse - sink)``. In fp32 (float64 for float64),
    rounded once to the output's dtype; a fully masked row (``lse = -inf``, output 0) stays 0."""
    work = torch.promote_types(out.dtype, torch.float32)
    factor = torch.sigmoid(lse.to(work) - sinks.to(work).view(-1, 1))  # (b, h, nq)
    return (out.to(work) * factor.unsqueeze(-1)).to(out.dtype)


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
    scale: float | None = None,
    sinks: Tensor | None = None,
) -> Tensor | None:
    """``flex_attention(q, k, v)`` with the inputs in :func:`~posenc.attention.sdpa.kernel_dtype`
    (bf16/fp16 stay so on a GPU: flex's kernel computes the scores, runs the ``score_mod``
    and keeps the softmax statistics in fp32 itself; fp32 on the CPU); ``None`` when
    compilation failed (the caller then uses another backend; the failure is warned about
    once per key).

    ``compile=False`` runs flex_attention's eager reference, which is correct but
    materialises the scores; it exists for tests and for platforms without a compiler.

    ``scale`` multiplies ``q kᵀ`` (``None``: ``1 / sqrt(d)``). ``sinks`` ``(h,)``: learned
    attention sinks, folded in through the log-sum-exp flex returns (:func:`with_sinks`), so
    no extra key or column is made; only where :func:`lse_route` holds (the CPU's compiled
    kernel returns no lse: there :func:`posenc.attention.backends.flex_backend` passes no
    ``sinks`` and adds a sink key with :func:`sink_score_mod` instead).
    """
    out_dtype, work = q.dtype, kernel_dtype(q)
    q, k, v = q.to(work), k.to(work), v.to(work)
    lse = sinks is not None
    if torch.compiler.is_compiling():  # inside a user's torch.compile: let it fuse
        result = _flex(q, k, v, score_mod, block_mask, scale, lse=lse)
        return _finish(result, sinks, out_dtype)
    if q.device.type == "cpu" and min(q.shape[-2], k.shape[-2]) < FLEX_BLOCK_SIZE:
        # torch 2.13's compiled CPU kernel is intermittently wrong (0.2-0.6 off, once NaN)
        # below one block of queries or keys; the eager reference is right and cheap there
        compile = False
    if not compile:
        groups = groups_of(q, k, v)
        if groups > 1:  # grouped heads: folded, so the reference copies no key or value
            folded = fold_flex_call(q, k.shape[-2], score_mod, block_mask, groups, FLEX_BLOCK_SIZE)
            q, score_mod, block_mask = folded
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch")
            result = _flex(q, k, v, score_mod, block_mask, scale, lse=lse)
        if groups > 1 and lse:  # (b, g, G·nq, ·) -> (b, h, nq, ·); the lse (b, g, G·nq)
            out, rows = result
            result = unfold_groups(out, groups), unfold_groups(rows[..., None], groups)[..., 0]
        elif groups > 1:
            result = unfold_groups(result, groups)
        return _finish(result, sinks, out_dtype)
    key = (
        compile_key(q, k, v),
        work,
        q.device.type,
        _code_key(score_mod),
        _code_key(getattr(block_mask, "mask_mod", None)),
        lse,  # last: the compiled wrapper reads it
    )
    if key in _FLEX_FAILED:
        return None
    try:
        result = _compiled_flex(key)(q, k, v, score_mod, block_mask, scale)
    except Exception as error:  # a missing compiler, an unsupported op: fall back, still correct
        _FLEX_FAILED[key] = f"{type(error).__name__}: {error}"
        warnings.warn(
            f"compiling flex_attention failed ({type(error).__name__}); using SDPA with a "
            f"materialised bias instead for this shape",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return _finish(result, sinks, out_dtype)


def _finish(result: Any, sinks: Tensor | None, out_dtype: torch.dtype) -> Tensor:
    """Flex's result (the output, or ``(output, lse)`` when ``sinks`` are given) with the
    sinks folded in, in ``out_dtype``."""
    if sinks is None:
        return result.to(out_dtype)
    out, lse = result
    return with_sinks(out, lse, sinks).to(out_dtype)
