"""Scaled dot-product attention and multi-head attention that apply any positional scheme
through the family hooks (rotary: rotate q and k; bias: add to the logits).

Attention knows the hooks, never the schemes. A bias scheme reaches the logits in one of two
ways:

* materialised: ``bias(q_positions, k_positions, q=, k=)`` is an ``(h, n, n)`` (or
  ``(b, h, n, n)``) tensor added before the softmax (backends ``math`` and ``sdpa``);
* fused: ``score_mod(...)`` is handed to :func:`torch.nn.attention.flex_attention`, which
  adds the bias inside its kernel, block by block, so no ``n × n`` tensor ever exists
  (backend ``flex``; the machinery is in :mod:`posenc.flex`).

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence (``nq``/``nk``), ``d`` head dim,
``D`` model width.
"""

from __future__ import annotations

import functools
from enum import Enum
from typing import Any

import torch
from torch import Tensor, nn

from . import flex
from .attention_checks import check_attention_pe, check_heads, check_reach
from .cache import KVCache
from .context import SequenceContext
from .encodings.base import PositionalEncoding, ScoreMod
from .encodings.checks import (
    check_bool,
    check_input,
    check_positive_int,
    check_probability,
    compute_dtype,
)
from .encodings.state import BiasState, PositionState, RotaryState
from .errors import PosencValueError
from .masks import attention_mask, check_key_padding_mask
from .query_scale import QueryScale
from .schedule import resolve_pe
from .sdpa import fused_attention, scaled_dot_product_attention

__all__ = [
    "BACKENDS",
    "FLEX_AUTO_MIN_ELEMENTS",
    "Backend",
    "MultiHeadAttention",
]


class Backend(str, Enum):
    """Where :class:`MultiHeadAttention` runs the softmax (see its ``backend`` argument). A
    ``str`` enum: ``Backend.SDPA == "sdpa"``, and the plain strings are accepted wherever a
    backend is."""

    AUTO = "auto"
    FLEX = "flex"
    SDPA = "sdpa"
    MATH = "math"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


BACKENDS: tuple[str, ...] = tuple(backend.value for backend in Backend)

#: ``auto`` switches a bias scheme to compiled flex attention once a materialised bias would
#: hold this many elements per batch row (``h · nq · nk``; 2**24 is 64 MiB in fp32, e.g.
#: 16 heads at n = 1024). Below it, compiling (tens of seconds per shape on a CPU) costs more
#: than materialising saves.
FLEX_AUTO_MIN_ELEMENTS = 2**24


# --------------------------------------------------------------------------- module


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention that applies a rotary or bias encoding through its hook.

    Args:
        dim: model width ``D``; must be divisible by ``num_heads`` unless ``head_dim`` is
            given.
        num_heads: number of query heads ``h``.
        num_kv_heads: number of key/value heads ``g`` (grouped-query attention, Ainslie et
            al. 2023): each serves ``h / g`` query heads; ``g = 1`` is multi-query attention.
            Default ``h``. The KV cache stores the ``g`` grouped heads.
        head_dim: size ``d`` of each head (default ``D / h``); queries, keys and values are
            ``h · d`` (``g · d``) wide and the output projection maps ``h · d`` back to ``D``.
        pe: a rotary, bias or none encoding (additive ones belong on the input), or its
            registry name, built as :class:`~posenc.Encoder` builds it: for ``num_heads``
            heads of ``head_dim``, from the scheme's ``causal_defaults`` when ``causal``.
        window: a sliding window: each query reads the keys less than ``window`` positions
            away (with ``causal``: keys ``i - window + 1 … i``), as Mistral's and Gemma's
            local layers do. ``None``: every key.
        chunk: chunked attention (Llama 4): each query reads the keys whose
            ``position // chunk`` is its own. ``None``: every key.
        query_scale: a :class:`~posenc.QueryScale`: queries multiplied by a factor growing
            with the log of their position, after the rotation (Llama 4's NoPE-layer
            temperature, Ministral 3's ``llama_4_scaling_beta``).
        causal: mask future keys.
        dropout: dropout on the attention weights (training only).
        backend: where the softmax runs (a :class:`Backend` or its string):

            * ``"math"``: explicit ``softmax(q kᵀ/sqrt(d) + bias) v`` (always used when
              weights are requested, and for schemes with a value-side term);
            * ``"sdpa"``: ``torch.nn.functional.scaled_dot_product_attention``, a bias
              materialised as its float mask;
            * ``"flex"``: ``torch.nn.attention.flex_attention`` with the scheme's
              ``score_mod`` (compiled, cached per shape), so the bias is never materialised;
              schemes without a score_mod are read from a materialised bias. It falls back to
              ``sdpa`` where flex cannot run: dropout while training, gradients on a CPU
              (flex has no CPU backward), or a failed compilation (warned once);
            * ``"auto"``: ``flex`` for a bias scheme with a score_mod once the bias would
              hold ``FLEX_AUTO_MIN_ELEMENTS`` elements and flex can run, else ``sdpa``.
        compile_flex: compile flex_attention (the fast path). ``False`` runs its eager
            reference, which is correct but materialises the scores.

    A query whose keys are all masked gets uniform weights on ``math``/``sdpa`` and a zero
    output on ``flex``; its output is meaningless either way.

    >>> attn = MultiHeadAttention(16, 4)
    >>> attn(torch.zeros(2, 5, 16)).shape
    torch.Size([2, 5, 16])
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        pe: str | PositionalEncoding | None = None,
        causal: bool = False,
        dropout: float = 0.0,
        bias: bool = True,
        backend: Backend | str = Backend.AUTO,
        compile_flex: bool = True,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        window: int | None = None,
        chunk: int | None = None,
        query_scale: QueryScale | None = None,
    ) -> None:
        super().__init__()
        check_positive_int("dim", dim)
        check_positive_int("num_heads", num_heads)
        head_dim, num_kv_heads = check_heads(dim, num_heads, num_kv_heads, head_dim)
        if not isinstance(backend, str) or backend not in BACKENDS:
            raise PosencValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        if backend == Backend.FLEX and not flex.flex_available():
            raise PosencValueError(
                "backend='flex' needs torch.nn.attention.flex_attention (torch>=2.5)"
            )
        self.dim, self.num_heads, self.head_dim = dim, num_heads, head_dim
        self.num_kv_heads = num_kv_heads
        self.window, self.chunk, self.query_scale = check_reach(window, chunk, query_scale)
        self.causal = check_bool("causal", causal)
        check_bool("bias", bias)
        self.dropout = check_probability("dropout", dropout)
        self.backend = Backend(backend)
        self.compile_flex = check_bool("compile_flex", compile_flex)
        if isinstance(pe, str):
            pe = resolve_pe(pe, dim, num_heads, causal=self.causal, head_dim=head_dim)
        self.pe = check_attention_pe(pe, num_heads, self.head_dim)
        # one fused projection: h query heads, then g key and g value heads (3·D by default)
        self.qkv = nn.Linear(dim, (num_heads + 2 * num_kv_heads) * head_dim, bias=bias)
        self.out = nn.Linear(num_heads * head_dim, dim, bias=bias)
        #: The backend the last forward actually used (for inspection and benchmarks).
        self.last_backend: str | None = None

    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        pe: PositionalEncoding | None = None,
        state: PositionState | None = None,
        cache: KVCache | None = None,
        document_ids: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Self-attention over ``x``: ``Concat(head_1, ..., head_h) W_O`` (eq. 4 of the paper).

        Shapes:
            x: ``(b, n, D)``; positions: ``(n,)`` or ``(b, n)`` (``(…, n, axes)`` for N-D
            schemes); key_padding_mask: ``(b, n)`` bool, True = padding; document_ids:
            ``(b, n)`` integers (packed documents, see :mod:`posenc.context`).

        Returns ``(b, n, D)``, or ``((b, n, D), weights (b, h, n, nk))`` with ``need_weights``.
        With a :class:`~posenc.KVCache`, ``x`` holds the new tokens only: their keys and
        values join the cache and they attend to every cached token (``nk`` keys in all).
        ``pe`` overrides the module's own encoding. ``state`` is that encoding's
        :meth:`~posenc.PositionalEncoding.position_state`, made once by the caller for many
        layers (the Encoder does); ``positions`` are then not read.
        """
        check_input(x, self.dim)  # bad input fails before the encoding does any work
        b, n, _ = x.shape
        encoding = self.pe if pe is None else check_attention_pe(pe, self.num_heads, self.head_dim)
        context = SequenceContext.build(
            batch=b,
            seq=n,
            device=x.device,
            positions=positions,
            key_padding_mask=key_padding_mask,
            document_ids=document_ids,
            cache=cache,
            axes=1 if encoding is None else encoding.axes,
            scheme=type(encoding).__name__,
            windowed=self.reads_positions,
        )
        if context is None:
            # the caller that made ``state`` (an Encoder) has read the mask's values already
            check_key_padding_mask(key_padding_mask, b, n, read_values=state is None)
        if state is None:
            state = self._state(x, positions, encoding, context)
        heads, weights = self._heads(x, state, key_padding_mask, need_weights, context)
        if context is not None:
            context.commit()
        out = self.out(heads)  # (b, n, D)
        return (out, weights) if need_weights else out

    @property
    def windowed(self) -> bool:
        """Whether this attention reads a sliding window or a chunk."""
        return self.window is not None or self.chunk is not None

    @property
    def reads_positions(self) -> bool:
        """Whether this attention reads positions itself (a window, a chunk or a query
        scale): the caller then makes a :class:`~posenc.context.SequenceContext`."""
        return self.windowed or self.query_scale is not None

    def state_for(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        pe: PositionalEncoding | None = None,
        context: SequenceContext | None = None,
    ) -> PositionState | None:
        """What :meth:`attend` needs of ``pe`` (default: the module's own encoding) at
        ``positions`` for the input ``x`` (``None`` without an encoding); arguments as for
        :meth:`forward`. With a ``context`` (a cached or packed forward) its positions are
        used."""
        check_input(x, self.dim)
        pe = self.pe if pe is None else check_attention_pe(pe, self.num_heads, self.head_dim)
        return self._state(x, positions, pe, context)

    def attend(
        self,
        x: Tensor,
        state: PositionState | None,
        *,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        context: SequenceContext | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """The heads before the output projection: ``Concat(head_1, ..., head_h)``
        ``(b, n, D)``, and the weights ``(b, h, n, nk)`` when ``need_weights`` (else ``None``).
        ``state`` is from :meth:`state_for` (or an Encoder's encoding); ``context`` is the
        forward's :class:`~posenc.context.SequenceContext` when it is cached or packed (it
        then holds the padding mask); the other arguments as for :meth:`forward`."""
        check_input(x, self.dim)
        if context is None:
            check_key_padding_mask(key_padding_mask, x.shape[0], x.shape[1])
            if self.reads_positions:
                raise PosencValueError(
                    "attend: a windowed, chunked or query-scaled attention needs the "
                    "forward's context (it reads positions); call forward, or pass context="
                )
        elif key_padding_mask is not None:
            raise PosencValueError("attend: pass key_padding_mask through the context alone")
        return self._heads(x, state, key_padding_mask, need_weights, context)

    @staticmethod
    def _state(
        x: Tensor,
        positions: Tensor | None,
        pe: PositionalEncoding | None,
        context: SequenceContext | None,
    ) -> PositionState | None:
        """:meth:`state_for` on a checked ``x`` and encoding."""
        if pe is None:
            return None
        if context is None:
            return pe.position_state(positions, x)
        memo = {} if context.cache is None else context.cache.memo(pe)
        return pe.context_state(context.positions, context.key_positions, x, memo)

    def _heads(
        self,
        x: Tensor,
        state: PositionState | None,
        key_padding_mask: Tensor | None,
        need_weights: bool,
        context: SequenceContext | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """:meth:`attend` on a checked ``x`` and mask."""
        b, n, _ = x.shape
        h, g, d = self.num_heads, self.num_kv_heads, self.head_dim
        if g == h:
            q, k, v = self.qkv(x).view(b, n, 3, h, d).unbind(2)
        else:
            q, k, v = self.qkv(x).view(b, n, h + 2 * g, d).split([h, g, g], dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (b, h, n, d); k, v (b, g, n, d)
        bias_state: BiasState | None = None
        if isinstance(state, RotaryState):
            # q and k are fresh projections: rotate them in their own storage where autograd
            # is off (under autograd they are unbind views, which must not change in place);
            # inside torch.compile inductor fuses the out-of-place rotation instead
            fresh = not torch.is_grad_enabled() and not torch.compiler.is_compiling()
            q, k = state(q, k, inplace=fresh)
        elif isinstance(state, BiasState):
            bias_state = state
        if self.query_scale is not None:
            assert context is not None  # forward made one: reads_positions
            q = self.query_scale.apply(q, context.positions)
        if context is not None:
            k, v = context.keys_values(self, k, v)  # (b, g, nk, d): the cached keys first
            key_padding_mask = context.last_keys(k.shape[2])[1]
        if g != h:  # each key/value head serves h / g query heads: (b, g, nk, d) -> (b, h, ...)
            k, v = (t.repeat_interleave(h // g, dim=1) for t in (k, v))
        nk = k.shape[2]

        dropout_p = self.dropout if self.training else 0.0
        packed = self.windowed or (context is not None and context.q_runs is not None)
        backend, fused_only = self._choose_backend(
            q, k, bias_state, need_weights, dropout_p, packed=packed
        )
        out: Tensor | None = None
        if backend == Backend.FLEX:
            out = self._flex(q, k, v, bias_state, key_padding_mask, context, fused_only=fused_only)
            backend = Backend.SDPA if out is None else Backend.FLEX
        weights = None
        if out is None:
            bias = None if bias_state is None else bias_state.bias(q, k)  # (h|b·h, n, nk)
            if context is None:
                mask = attention_mask(
                    b, n, nk, causal=self.causal, key_padding_mask=key_padding_mask, device=x.device
                )
            else:
                mask = context.mask(self.causal, n, nk, x.device, self.window, self.chunk)
            if backend == Backend.MATH:
                out, weights = scaled_dot_product_attention(
                    q, k, v, mask, bias=bias, dropout_p=dropout_p
                )
                if bias_state is not None and bias_state.has_value_term:
                    extra = bias_state.value_term(weights.to(compute_dtype(q.dtype)))
                    out = (out.to(extra.dtype) + extra).to(out.dtype)  # (b, h, n, d)
            else:
                plain = key_padding_mask is None and not self.windowed
                plain = plain and (context is None or context.q_runs is None)
                plain_causal = self.causal and plain and n == nk
                keep = None  # the additive mask is the same in every layer: make it once
                memo = context if bias_state is None else bias_state
                if memo is not None:
                    # the context keeps one mask per kind of layer; else the padding decides
                    key = ("sdpa mask", self.causal, mask if context else key_padding_mask, q.dtype)
                    keep = functools.partial(memo.keep, key)
                out = fused_attention(
                    q, k, v, mask, bias, dropout_p, plain_causal=plain_causal, keep=keep
                )
        self.last_backend = backend.value
        return out.transpose(1, 2).reshape(b, n, h * d), weights  # (b, n, h·d)

    def _choose_backend(
        self,
        q: Tensor,
        k: Tensor,
        pe: BiasState | None,
        need_weights: bool,
        dropout_p: float,
        *,
        packed: bool = False,
    ) -> tuple[Backend, bool]:
        """The backend to run (``auto`` resolved, and the cases where the requested one cannot
        run), and whether flex runs only for a fused ``score_mod`` (``auto``: a scheme without
        one falls back to SDPA rather than compile flex around a materialised bias). ``packed``
        (a document mask) lets ``auto`` pick flex without a bias too: its block mask skips
        other documents instead of materialising an ``n × n`` mask."""
        if need_weights or self.backend == Backend.MATH or (pe is not None and pe.has_value_term):
            return Backend.MATH, False
        if self.backend == Backend.SDPA:
            return Backend.SDPA, False
        nq, nk = q.shape[-2], k.shape[-2]
        flex_runs = flex.flex_available() and dropout_p == 0.0 and not self._needs_cpu_grad(q, pe)
        # a compiled kernel per shape: a decoding step (keys beyond its queries) would compile
        # anew at every length, so cached steps run on SDPA
        flex_runs = flex_runs and (nq == nk or not self.compile_flex)
        if self.backend == Backend.FLEX:
            return (Backend.FLEX if flex_runs else Backend.SDPA), False
        # auto: fuse only a real bias (or a document mask) big enough to be worth compiling
        if (pe is None and not packed) or not flex_runs or not self.compile_flex:
            return Backend.SDPA, False
        if self.num_heads * nq * nk >= FLEX_AUTO_MIN_ELEMENTS:
            return Backend.FLEX, pe is not None
        return Backend.SDPA, False

    @staticmethod
    def _needs_cpu_grad(q: Tensor, state: BiasState | None) -> bool:
        """flex_attention has no backward on CPU: avoid it whenever autograd is recording."""
        if q.device.type != "cpu" or not torch.is_grad_enabled():
            return False
        params = () if state is None else state.pe.parameters()
        return q.requires_grad or any(p.requires_grad for p in params)

    def _flex(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        state: BiasState | None,
        key_padding_mask: Tensor | None,
        context: SequenceContext | None,
        *,
        fused_only: bool,
    ) -> Tensor | None:
        """Flex attention, or ``None`` when it cannot run (the caller falls back to SDPA):
        compilation failed, or ``fused_only`` and the scheme has no score_mod here."""
        b, _, nq, _ = q.shape
        nk = k.shape[2]
        score_mod: ScoreMod | None = None
        if state is not None:
            score_mod = state.score_mod(q, k)
            if score_mod is None:
                if fused_only:
                    return None
                # no fused form: the kernel reads a materialised bias
                score_mod = flex.bias_score_mod(state.bias(q, k))
        where: dict[str, Any] = {}
        if context is not None:
            k_positions, _, k_runs = context.last_keys(nk)
            where = {"q_documents": context.q_runs, "k_documents": k_runs}
            if self.windowed:
                positions = context.positions.expand(b, nq), k_positions.expand(b, nk)
                where.update(q_positions=positions[0], k_positions=positions[1])
                where.update(window=self.window, chunk=self.chunk)
        block_mask = flex.flex_block_mask(
            b,
            nq,
            nk,
            causal=self.causal,
            key_padding_mask=key_padding_mask,
            device=q.device,
            **where,
        )
        return flex.flex_attention_forward(
            q, k, v, score_mod=score_mod, block_mask=block_mask, compile=self.compile_flex
        )

    def extra_repr(self) -> str:
        text = f"dim={self.dim}, num_heads={self.num_heads}"
        if self.num_kv_heads != self.num_heads:
            text += f", num_kv_heads={self.num_kv_heads}"
        if self.head_dim * self.num_heads != self.dim:
            text += f", head_dim={self.head_dim}"
        for name in ("window", "chunk", "query_scale"):
            if getattr(self, name) is not None:
                text += f", {name}={getattr(self, name)}"
        return text + f", causal={self.causal}, backend={self.backend.value!r}"
