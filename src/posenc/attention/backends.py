"""The three attention backends as plain functions with one signature, and the one pure
function that chooses between them.

* :func:`math_backend`: ``softmax(q kᵀ/sqrt(d) + bias) v`` written out (the weights, and a
  value-side term, are only available here);
* :func:`sdpa_backend`: :func:`torch.nn.functional.scaled_dot_product_attention`, a bias
  materialised into its additive mask;
* :func:`flex_backend`: :func:`torch.nn.attention.flex_attention` with the scheme's
  ``score_mod`` (or, for a scheme without a fused form, one reading its materialised bias)
  and a block-sparse mask (``None`` only when compiling failed: the caller then runs SDPA);
* :func:`tiled_backend`: SDPA over tiles of queries, each making its rows of a bias that
  depends on the positions alone and dropping them (:mod:`posenc.attention.tiled`).

Each takes ``(q, k, v, call)``: the heads ready for the softmax and an :class:`AttentionCall`
saying what surrounds them (bias, masks, dropout). Keys and values keep their ``g`` grouped
heads (``g`` divides ``h``): every backend serves each key/value head to its ``h / g`` query
heads without copying it. Which one runs is :func:`choose_backend` of a :class:`Request`, a
record of everything the choice reads (device, dtype, sizes, kind of bias and of mask,
autograd, dropout, compilation), so the whole policy is one table
(``tests/attention/test_backends.py`` holds it, a row per device kind).

Dimension legend: ``b`` batch, ``h`` heads, ``g`` key/value heads, ``nq``/``nk`` queries and
keys, ``d`` head dim.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

import torch
from torch import Tensor

from ..encodings.base import ScoreMod
from ..encodings.checks import compute_dtype
from ..encodings.state import BiasState
from ..errors import PosencValueError
from ..sequence.context import SequenceContext
from ..sequence.masks import MaskSpec
from ..sequence.memo import forward_memo
from . import flex
from .sdpa import fused_attention, scaled_dot_product_attention
from .tiled import tiled_attention

__all__ = [
    "BACKEND_FUNCTIONS",
    "FLEX_AUTO_MIN_ELEMENTS",
    "AttentionCall",
    "Backend",
    "Request",
    "choose_backend",
    "flex_backend",
    "fused_here",
    "learns",
    "learns_table",
    "math_backend",
    "sdpa_backend",
    "tiled_backend",
    "tiles_bias",
]


class Backend(str, Enum):
    """Where :class:`~posenc.MultiHeadAttention` runs the softmax (see its ``backend``
    argument). A ``str`` enum: ``Backend.SDPA == "sdpa"``, and the plain strings are accepted
    wherever a backend is."""

    AUTO = "auto"
    FLEX = "flex"
    SDPA = "sdpa"
    MATH = "math"
    #: SDPA per tile of queries, the bias made per tile (:mod:`posenc.attention.tiled`)
    TILED = "tiled"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


#: On the CPU, ``auto`` switches a bias scheme to compiled flex attention once a materialised
#: bias would hold this many elements per batch row (``h · nq · nk``; 2**24 is 64 MiB in fp32,
#: e.g. 16 heads at n = 1024). Below it, compiling a kernel on a CPU costs more than not
#: materialising saves. On a GPU a kernel compiles once per scheme (dynamic shapes), and the
#: materialised bias is what makes SDPA slow: there is no threshold
#: (``benchmarks/bias.md`` records where the CPU crosses over).
FLEX_AUTO_MIN_ELEMENTS = 2**24

#: How a bias reaches the logits: ``none``; ``score_mod`` (the scheme has a fused form here:
#: :attr:`~posenc.encodings.base.BiasEncoding.has_score_mod` and ``fused_at`` its positions);
#: ``materialised`` (it has none: Transformer-XL, CoPE, a table by distance at fractional
#: positions); ``value`` (it also adds a value-side term, Shaw et al. with values: only the
#: math backend computes the weights it needs).
BiasKind = Literal["none", "score_mod", "materialised", "value"]
#: The mask: ``none``, ``causal``, ``padding`` (key padding, with or without causal) or
#: ``packed`` (documents, a window or a chunk: flex's block mask skips whole blocks).
MaskKind = Literal["none", "causal", "padding", "packed"]


# not frozen: it is made in every attention call and only read, and a frozen dataclass sets
# each field through object.__setattr__ when made
@dataclass(slots=True)
class Request:
    """Everything :func:`choose_backend` reads about one attention call (made per call and
    only read; compared field by field in the decision-table test)."""

    requested: Backend  #: the module's ``backend`` argument
    device: str  #: ``q.device.type``
    dtype: torch.dtype  #: the dtype of q, k, v
    heads: int  #: query heads ``h``
    nq: int  #: queries
    nk: int  #: keys (more than ``nq`` for a cached decoding step)
    bias: BiasKind = "none"
    mask: MaskKind = "none"
    grad: bool = False  #: autograd records through q, k, v or the bias's parameters
    #: autograd records through a tensor the bias's fused form reads by index (a learned
    #: table: T5's buckets, KERPLE's, DPB's and FIRE's per-distance values; Shaw's per-query
    #: terms): flex's backward adds its gradient with one atomic add per score
    table_grad: bool = False
    dropout: bool = False  #: dropout on the weights (training)
    need_weights: bool = False  #: the caller wants the weights
    compile_flex: bool = True  #: the module's ``compile_flex``
    flex_available: bool = True  #: this torch has flex_attention
    softcap: bool = False  #: logit soft-capping (SDPA cannot: flex's score_mod or math)
    sinks: bool = False  #: learned attention sinks (SDPA then materialises its mask)
    #: the bias depends on the positions alone (no q, k, x or layer; 1-D positions): a tile
    #: of queries can make its own rows of it (:func:`tiles_bias`)
    tiles: bool = False

    @staticmethod
    def kind_of(state: BiasState | None, nk: int | None = None) -> BiasKind:
        """The :data:`BiasKind` of a forward's bias state against its last ``nk`` keys
        (default: all): what the scheme declares (``has_value_term``, ``has_score_mod``) and,
        for a fused form, whether it exists at these positions (``fused_at``, asked once per
        forward and key count)."""
        if state is None:
            return "none"
        if state.has_value_term:
            return "value"
        return "score_mod" if fused_here(state, nk) else "materialised"


def fused_here(state: BiasState, nk: int | None = None) -> bool:
    """Whether ``state``'s scheme has its fused form against its last ``nk`` keys (default:
    all): :attr:`~posenc.encodings.base.BiasEncoding.has_score_mod`, then ``fused_at`` of the
    positions (kept for the forward's other layers)."""
    pe = state.pe
    if not pe.has_score_mod:
        return False
    nk = state.key_positions.shape[-1] if nk is None else nk
    return bool(
        state.keep(("fused", nk), lambda: pe.fused_at(state.positions, state.last_keys(nk)))
    )


def choose_backend(request: Request) -> Backend:
    """The backend to run.

    Explicit requests are honoured where they can run: ``math`` always; ``sdpa`` unless the
    weights or a value term are needed; ``flex`` unless dropout is on, autograd records on a
    CPU (flex has no CPU backward), or a compiled kernel would meet a cached decoding step
    (more keys than queries). ``auto`` adds: a bias without a fused form, or no bias and no
    packed mask, runs on SDPA; on the CPU flex only pays once a materialised bias would hold
    :data:`FLEX_AUTO_MIN_ELEMENTS`; on a GPU every fused bias and every packed mask runs on
    flex, except a fused bias whose learned table trains (``table_grad``): flex's backward
    would add each score's gradient into the table with an atomic add (about ``h · n²`` of
    them onto ``h · (2n - 1)`` addresses), so the bias is materialised for SDPA, whose
    backward reduces its gradient with ordinary reductions.

    Soft-capping cannot run inside SDPA: wherever SDPA would be chosen (asked for, or as
    flex's fallback) a soft-capped call runs on ``math``, and under ``auto`` it counts as a
    fused bias (a ``score_mod``). Sinks run on every backend; under ``auto`` sinks with a
    mask count as a fused bias too, since SDPA then materialises an ``(h, nq, nk + 1)`` mask
    (without a mask, its additive mask is one row per head).

    ``tiled`` (SDPA per tile of queries, each making its rows of the bias) is what ``auto``
    runs for such a learned table where the bias depends on the positions alone
    (``tiles``: T5, KERPLE, DPB, FIRE): the gradient is reduced as with SDPA, and at most one
    tile's bias is held instead of ``h · nq · nk`` values. Asked for, it runs wherever the
    bias tiles (on the CPU too), else falls back as ``sdpa`` does.
    """
    r = request
    if r.need_weights or r.requested == Backend.MATH or r.bias == "value":
        return Backend.MATH
    fallback = Backend.MATH if r.softcap else Backend.SDPA
    tiled = Backend.TILED if r.tiles and not r.softcap else fallback
    if r.requested == Backend.SDPA:
        return fallback
    if r.requested == Backend.TILED:
        return tiled
    flex_runs = r.flex_available and not r.dropout and not (r.device == "cpu" and r.grad)
    # the compiled kernel keeps the lengths symbolic, but a decoding step's one query is
    # served far better by SDPA with its (h, 1, nk) bias
    flex_runs = flex_runs and (r.nq == r.nk or not r.compile_flex)
    if r.requested == Backend.FLEX:
        return Backend.FLEX if flex_runs else fallback
    shaped = r.mask == "packed" or r.softcap or (r.sinks and r.mask != "none")
    fusable = r.bias == "score_mod" or (r.bias == "none" and shaped)
    if not (fusable and flex_runs and r.compile_flex):
        return fallback
    if r.device == "cpu" and r.heads * r.nq * r.nk < FLEX_AUTO_MIN_ELEMENTS:
        return fallback
    if r.bias == "score_mod" and r.table_grad:  # (on a GPU: the CPU has no flex backward)
        return tiled
    return Backend.FLEX


@dataclass(slots=True)
class AttentionCall:
    """What surrounds the heads of one attention call: the bias state, the masks and the
    options. ``nq`` queries (the new tokens), ``context`` for a cached, packed or windowed
    forward (it then holds the padding mask and the positions)."""

    batch: int
    nq: int
    state: BiasState | None = None
    causal: bool = False
    key_padding_mask: Tensor | None = None
    context: SequenceContext | None = None
    window: int | None = None
    chunk: int | None = None
    dropout_p: float = 0.0
    compile_flex: bool = True
    scale: float | None = None  #: the logits are ``scale · q kᵀ`` (``None``: ``1 / sqrt(d)``)
    softcap: float | None = None  #: ``c``: logits ``c · tanh(logits / c)`` before the mask
    sinks: Tensor | None = None  #: ``(h,)`` learned sink logits, one per query head

    @property
    def windowed(self) -> bool:
        return self.window is not None or self.chunk is not None

    @property
    def packed(self) -> bool:
        """A document, window or chunk mask (flex's block mask skips its empty blocks)."""
        return self.windowed or (self.context is not None and self.context.q_runs is not None)

    def mask_kind(self) -> MaskKind:
        if self.packed:
            return "packed"
        if self.key_padding_mask is not None:
            return "padding"
        return "causal" if self.causal else "none"

    def mask_spec(self, nk: int) -> MaskSpec:
        """The rules of this call's mask over ``nk`` keys, read by the dense mask and by
        flex's block mask alike."""
        if self.context is None:
            return MaskSpec.build(
                self.batch, self.nq, nk, causal=self.causal, key_padding_mask=self.key_padding_mask
            )
        return self.context.mask_spec(self.causal, self.nq, nk, self.window, self.chunk)

    def mask_key(self, nk: int) -> tuple[Any, ...]:
        """What tells this call's mask from another layer's within one forward: the shape
        and the kind of layer (with a context, which holds the rest), or the padding mask."""
        if self.context is None:
            return (self.batch, self.nq, nk, self.causal, self.key_padding_mask)
        return (self.batch, self.nq, nk, self.causal, self.window, self.chunk)

    def dense_mask(self, nk: int, device: torch.device) -> Tensor | None:
        """The boolean mask ``(b|1, 1, nq, nk)`` (True = attend), or ``None``."""
        if self.context is None:
            return self.mask_spec(nk).dense(device)
        return self.context.mask(self.causal, self.nq, nk, device, self.window, self.chunk)


#: ``backend(q, k, v, call) -> (out (b, h, nq, d) or None, weights (b, h, nq, nk) or None)``.
BackendFn = Callable[[Tensor, Tensor, Tensor, AttentionCall], tuple[Tensor | None, Tensor | None]]


def math_backend(
    q: Tensor, k: Tensor, v: Tensor, call: AttentionCall
) -> tuple[Tensor | None, Tensor | None]:
    """The written-out softmax, returning the weights; adds a value-side term."""
    state = call.state
    bias = None if state is None else state.bias(q, k)  # (h|b·h, nq, nk)
    mask = call.dense_mask(k.shape[-2], q.device)
    out, weights = scaled_dot_product_attention(
        q, k, v, mask, bias=bias, dropout_p=call.dropout_p,
        scale=call.scale, softcap=call.softcap, sinks=call.sinks,
    )  # fmt: skip
    if state is not None and state.has_value_term:
        extra = state.value_term(weights.to(compute_dtype(q.dtype)))
        out = (out.to(extra.dtype) + extra).to(out.dtype)  # (b, h, nq, d)
    return out, weights


def sdpa_backend(
    q: Tensor, k: Tensor, v: Tensor, call: AttentionCall
) -> tuple[Tensor | None, Tensor | None]:
    """PyTorch's fused SDPA; the bias and the mask folded into one additive mask, made once
    per forward for every layer that shares them (per layer with sinks, which run as one
    more key: :func:`~posenc.attention.sdpa.fused_attention`). Soft-capping never comes here."""
    assert call.softcap is None, "soft-capping runs on flex or math (choose_backend)"
    state, context = call.state, call.context
    nk = k.shape[-2]
    bias = None if state is None else state.bias(q, k)  # (h|b·h, nq, nk)
    mask = call.dense_mask(nk, q.device)
    plain = call.key_padding_mask is None and not call.packed
    plain_causal = call.causal and plain and call.nq == nk
    keep = None  # the additive mask is the same in every layer: make it once
    memo: Any = context if state is None else state
    if memo is None:  # a plain forward's layers share it too
        memo = forward_memo()
    if memo is not None and call.sinks is None:
        # the context keeps one mask per kind of layer; else the padding decides (and the
        # key/value heads: a mask may be folded for grouped heads)
        padding = mask if context else call.key_padding_mask
        key = ("sdpa mask", call.causal, padding, q.dtype, k.shape[-3])
        keep = functools.partial(memo.keep, key)
    out = fused_attention(
        q, k, v, mask, bias, call.dropout_p,
        plain_causal=plain_causal, keep=keep, scale=call.scale, sinks=call.sinks,
    )  # fmt: skip
    return out, None


def flex_backend(
    q: Tensor, k: Tensor, v: Tensor, call: AttentionCall
) -> tuple[Tensor | None, Tensor | None]:
    """Flex attention with the scheme's ``score_mod`` where it has a fused form here
    (:func:`fused_here`), else one reading its materialised bias; soft-capping composed after
    it, sinks folded in through flex's log-sum-exp (on the CPU's compiled kernel, which
    returns none, as one more key: :func:`posenc.attention.flex.sink_score_mod`);
    ``(None, None)`` when compiling failed (warned)."""
    nk = k.shape[-2]
    state, context = call.state, call.context
    score_mod: ScoreMod | None = None
    if state is not None and fused_here(state, nk):
        score_mod = state.score_mod(q, k)
        if score_mod is None:
            name = type(state.pe).__name__
            raise PosencValueError(
                f"{name}.score_mod returned None where {name}.fused_at says it has a fused "
                f"form; declare has_score_mod and fused_at as score_mod behaves"
            )
    elif state is not None:
        score_mod = flex.bias_score_mod(state.bias(q, k))  # the kernel reads the bias
    if call.softcap is not None:
        score_mod = flex.softcap_score_mod(score_mod, call.softcap)
    sinks = call.sinks
    sink_key = sinks is not None and not flex.lse_route(q.device, call.compile_flex)
    if sink_key:  # the CPU's compiled kernel returns no lse: the sink as one more key
        assert sinks is not None
        score_mod = flex.sink_score_mod(score_mod, sinks, nk)
        k, v = flex.append_sink_key(k, v)
        sinks = None

    def make_block_mask() -> Any:
        return flex.block_mask(call.mask_spec(nk), q.device, sink_key=sink_key)

    # the layers of one forward share it: made by the first, keyed by shape and mask
    memo = context.memo if context is not None else forward_memo()
    if memo is None:
        block_mask = make_block_mask()
    else:
        key = ("block mask", *call.mask_key(nk), sink_key, q.device)
        block_mask = memo.keep(key, make_block_mask)
    out = flex.flex_attention_forward(
        q, k, v, score_mod=score_mod, block_mask=block_mask, compile=call.compile_flex,
        scale=call.scale, sinks=sinks,
    )  # fmt: skip
    return out, None


def tiled_backend(
    q: Tensor, k: Tensor, v: Tensor, call: AttentionCall
) -> tuple[Tensor | None, Tensor | None]:
    """SDPA per tile of queries, each tile making its rows of the bias from the positions
    and of the mask from the call's rules (:func:`~posenc.attention.tiled.tiled_attention`);
    at most one tile's bias is held, in the forward and in the backward. Needs a bias that
    tiles (:func:`tiles_bias`; :func:`choose_backend` sees to it); soft-capping never comes
    here."""
    state = call.state
    assert state is not None and tiles_bias(state), "a bias of the positions alone tiles"
    assert call.softcap is None, "soft-capping runs on flex or math (choose_backend)"
    nk = k.shape[-2]
    q_pos, k_pos = state.positions, state.last_keys(nk)
    pe = state.pe

    def bias(start: int, stop: int, q_tile: Tensor) -> Tensor:  # (h|b·h, t, nk)
        return pe.bias(q_pos[..., start:stop], k_pos, q=q_tile)

    out = tiled_attention(
        q, k, v, bias, call.mask_spec(nk), dropout_p=call.dropout_p, scale=call.scale,
        sinks=call.sinks,
    )  # fmt: skip
    return out, None


BACKEND_FUNCTIONS: dict[Backend, BackendFn] = {
    Backend.MATH: math_backend,
    Backend.SDPA: sdpa_backend,
    Backend.FLEX: flex_backend,
    Backend.TILED: tiled_backend,
}


def learns(q: Tensor, state: BiasState | None, sinks: Tensor | None = None) -> bool:
    """Whether autograd records this call: through ``q``, the bias's parameters or the
    sinks."""
    if not torch.is_grad_enabled():
        return False
    params = () if state is None else state.pe.parameters()
    sinks_learn = sinks is not None and sinks.requires_grad
    return q.requires_grad or sinks_learn or any(p.requires_grad for p in params)


def tiles_bias(state: BiasState | None) -> bool:
    """Whether ``state``'s bias can be made one tile of queries at a time: it depends on the
    positions alone (no ``q``, ``k``, layer input or layer, no value-side term) and they
    are 1-D, so the rows of queries ``start .. stop - 1`` are ``bias(q_pos[start:stop],
    k_pos)``."""
    return (
        state is not None
        and not state.per_layer
        and not state.has_value_term
        and state.pe.axes == 1
    )


def learns_table(q: Tensor, state: BiasState | None) -> bool:
    """Whether autograd records through what the bias's fused form reads by index: the
    scheme's parameters (its tables are made from them), or, for a scheme that reads the
    queries (Shaw's per-query terms), ``q``."""
    if state is None or not state.pe.has_score_mod or not torch.is_grad_enabled():
        return False
    if state.needs_qk and q.requires_grad:
        return True
    return any(p.requires_grad for p in state.pe.parameters())
