"""Scaled dot-product attention and multi-head attention that apply any positional scheme
through the family hooks (rotary: rotate q and k; bias: add to the logits).

Attention knows the hooks, never the schemes. A bias scheme reaches the logits in one of two
ways:

* materialised: ``bias(q_positions, k_positions, q=, k=)`` is an ``(h, n, n)`` (or
  ``(b, h, n, n)``) tensor added before the softmax (backends ``math`` and ``sdpa``);
* fused: ``score_mod(...)`` is handed to :func:`torch.nn.attention.flex_attention`, which
  adds the bias inside its kernel, block by block, so no ``n × n`` tensor ever exists
  (backend ``flex``; the machinery is in :mod:`posenc.attention.flex`).

The backends are functions of one signature in :mod:`posenc.attention.backends`, with the one pure
function that chooses between them.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence (``nq``/``nk``), ``d`` head dim,
``D`` model width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..encodings.base import PositionalEncoding
from ..encodings.checks import check_input, check_input_dtype
from ..encodings.schedule import resolve_pe
from ..encodings.state import BiasState, PositionState, RotaryState
from ..errors import PosencTypeError, PosencValueError
from ..sequence.cache import KVCache
from ..sequence.context import SequenceContext
from ..sequence.masks import check_key_padding_mask
from ..sequence.streaming import StreamingCache
from . import flex
from .backends import (
    BACKEND_FUNCTIONS,
    AttentionCall,
    Backend,
    Request,
    choose_backend,
    learns,
    learns_table,
    tiles_bias,
)
from .checks import check_attention_pe, check_reach_axes
from .config import AttentionConfig
from .names import padding_from_attention_mask, positions_or_ids
from .query_scale import QueryScale, visible_keys

__all__ = ["MultiHeadAttention"]


# --------------------------------------------------------------------------- module


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention that applies a rotary or bias encoding through its hook.

    Args:
        dim: model width ``D``; must be divisible by ``num_heads`` unless ``head_dim`` is
            given.
        num_heads: number of query heads ``h``.
        num_kv_heads: number of key/value heads ``g`` (grouped-query attention, Ainslie et
            al. 2023): each serves ``h / g`` query heads; ``g = 1`` is multi-query attention.
            Default ``h``. The KV cache stores the ``g`` grouped heads, and no backend
            copies them for the query heads.
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
            temperature, Ministral 3's ``llama_4_scaling_beta``, Qwen's logn), or of the
            number of keys each query sees (SSMax, with a learned ``ssmax_scale`` per head).
        causal: mask future keys.
        dropout: dropout on the attention weights (training only).
        backend: where the softmax runs (a :class:`Backend` or its string):

            * ``"math"``: explicit ``softmax(q kᵀ/sqrt(d) + bias) v`` (always used when
              weights are requested, and for schemes with a value-side term);
            * ``"sdpa"``: ``torch.nn.functional.scaled_dot_product_attention``, a bias
              materialised as its float mask;
            * ``"flex"``: ``torch.nn.attention.flex_attention`` with the scheme's
              ``score_mod`` (compiled once per scheme, with symbolic lengths after the first
              change of length), so the bias is never materialised; schemes without a
              score_mod are read from a materialised bias. It falls back to ``sdpa`` where
              flex cannot run: dropout while training, gradients on a CPU (flex has no CPU
              backward), a cached decoding step, or a failed compilation (warned once);
            * ``"tiled"``: ``sdpa`` per tile of queries, each tile making its rows of a bias
              that depends on the positions alone and dropping them (made again in the
              backward), so at most one tile's bias is held; other biases run ``sdpa``;
            * ``"auto"``: ``flex`` for a bias scheme with a score_mod here (its
              ``has_score_mod`` and ``fused_at`` its positions; or a document, window or
              chunk mask, a soft-cap, or sinks with a mask) where flex can run: on a GPU
              always, except a learned table while training (its gradient would be added
              atomically per score: ``tiled`` where the bias depends on the positions
              alone, else ``sdpa`` with the bias materialised), on the CPU once the bias
              would hold ``FLEX_AUTO_MIN_ELEMENTS`` elements; else ``sdpa``.

            With ``softcap``, ``math`` stands wherever ``sdpa`` would (SDPA cannot cap).

            The choice is :func:`posenc.attention.backends.choose_backend`, one pure function of the
            call (device, dtype, sizes, bias, mask, autograd, dropout, compilation).
        compile_flex: compile flex_attention (the fast path). ``False`` runs its eager
            reference, which is correct but materialises the scores.
        sinks: learned attention sinks (gpt-oss; Xiao et al. 2024's sink as a logit): the
            module holds ``sinks``, an fp32 parameter ``(num_heads,)`` starting at zero, and
            each query's softmax runs over its logits and its head's sink logit, whose
            column is then dropped (the weights of a row sum to less than 1). On ``math``
            written out; on ``sdpa`` one more key (zero key, zero value, the sink as its
            additive-mask column); on ``flex`` folded through the log-sum-exp flex returns,
            ``out · sigmoid(lse - sink)`` (on the CPU's compiled kernel, which returns no
            lse, as one more key whose score is the sink logit).
        softcap: logit soft-capping (Gemma 2's ``attn_logit_softcapping``): the logits,
            scaled and with the bias added, become ``c · tanh(logits / c)`` before the mask.
            SDPA cannot run it: such a call runs on ``flex`` (composed into the score_mod)
            where flex runs and would be chosen, else on ``math``. ``None``: off.
        softmax_scale: the logits are ``softmax_scale · q kᵀ`` (``None``: ``1 / sqrt(d)``),
            e.g. Gemma's ``query_pre_attn_scalar ** -0.5``.

    A query whose keys are all masked gets uniform weights on ``math``/``sdpa`` and a zero
    output on ``flex`` (with sinks: zero weights and output everywhere, the sink takes the
    row); its output is meaningless either way.

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
        sinks: bool = False,
        softcap: float | None = None,
        softmax_scale: float | None = None,
    ) -> None:
        super().__init__()
        config = AttentionConfig(
            dim,
            num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            causal=causal,
            dropout=dropout,
            bias=bias,
            backend=backend,
            compile_flex=compile_flex,
            window=window,
            chunk=chunk,
            query_scale=query_scale,
            sinks=sinks,
            softcap=softcap,
            softmax_scale=softmax_scale,
        )
        self._build(config, pe)

    @classmethod
    def from_config(
        cls, config: AttentionConfig, *, pe: str | PositionalEncoding | None = None
    ) -> MultiHeadAttention:
        """The attention ``config`` describes (an :class:`~posenc.AttentionConfig`), with the
        encoding ``pe``: the same module, parameter for parameter, as the keyword form.

        >>> config = AttentionConfig(16, 4, causal=True, sinks=True)
        >>> MultiHeadAttention.from_config(config, pe="alibi").sinks.shape
        torch.Size([4])
        """
        if not isinstance(config, AttentionConfig):
            raise PosencTypeError(
                f"config must be a posenc.AttentionConfig, got {type(config).__name__}"
            )
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module._build(config, pe)
        return module

    def _build(self, config: AttentionConfig, pe: str | PositionalEncoding | None) -> None:
        """Make the module's parameters and attributes from a checked record."""
        #: The record this attention was built from.
        self.config = config
        dim, num_heads = config.dim, config.num_heads
        head_dim, num_kv_heads = config.head_dim, config.num_kv_heads
        assert head_dim is not None and num_kv_heads is not None  # (filled in by the record)
        self.dim, self.num_heads, self.head_dim = dim, num_heads, head_dim
        self.num_kv_heads = num_kv_heads
        self.window, self.chunk, self.query_scale = config.window, config.chunk, config.query_scale
        self.causal, self.dropout = config.causal, config.dropout
        self.backend = Backend(config.backend)
        self.compile_flex = config.compile_flex
        self.softcap, self.softmax_scale = config.softcap, config.softmax_scale
        if isinstance(pe, str):
            pe = resolve_pe(pe, dim, num_heads, causal=self.causal, head_dim=head_dim)
        self.pe = check_attention_pe(pe, num_heads, self.head_dim, num_kv_heads)
        check_reach_axes(self.pe, config)
        # one fused projection: h query heads, then g key and g value heads (3·D by default)
        self.qkv = nn.Linear(dim, (num_heads + 2 * num_kv_heads) * head_dim, bias=config.bias)
        self.out = nn.Linear(num_heads * head_dim, dim, bias=config.bias)
        #: The sink logit of each query head ``(h,)``, fp32, or ``None`` without sinks.
        self.sinks: nn.Parameter | None
        if config.sinks:
            self.sinks = nn.Parameter(torch.zeros(num_heads, dtype=torch.float32))
        else:
            self.register_parameter("sinks", None)
        #: SSMax's learned ``s`` per query head ``(h,)``, fp32, with an ``ssmax`` query scale.
        self.ssmax_scale: nn.Parameter | None = None
        if config.query_scale is not None and config.query_scale.counts_keys:
            init = torch.full((num_heads,), config.query_scale.scale, dtype=torch.float32)
            self.ssmax_scale = nn.Parameter(init)
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
        cache: KVCache | StreamingCache | None = None,
        document_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Self-attention over ``x``: ``Concat(head_1, ..., head_h) W_O`` (eq. 4 of the paper).

        Shapes:
            x: ``(b, n, D)``; positions: ``(n,)`` or ``(b, n)`` (``(…, n, axes)`` for N-D
            schemes); key_padding_mask: ``(b, n)`` bool, True = padding; document_ids:
            ``(b, n)`` integers (packed documents, see :mod:`posenc.sequence.context`).
            ``position_ids`` and ``attention_mask`` (``(b, n)`` bool or 0/1 integers, 1 =
            attend, as a tokenizer returns it) are transformers' names, taken instead of
            ``positions`` and ``key_padding_mask`` (:mod:`posenc.attention.names`).

        Returns ``(b, n, D)``, or ``((b, n, D), weights (b, h, n, nk))`` with ``need_weights``.
        With a :class:`~posenc.KVCache`, ``x`` holds the new tokens only: their keys and
        values join the cache and they attend to every cached token (``nk`` keys in all);
        with a :class:`~posenc.StreamingCache`, to the sinks and the window it keeps.
        ``pe`` overrides the module's own encoding. ``state`` is that encoding's
        :meth:`~posenc.PositionalEncoding.position_state`, made once by the caller for many
        layers (the Encoder does); ``positions`` are then not read.
        """
        check_input(x, self.dim)  # bad input fails before the encoding does any work
        check_input_dtype(x, self.qkv.weight.dtype, "MultiHeadAttention")
        b, n, _ = x.shape
        positions = positions_or_ids(positions, position_ids)
        key_padding_mask = padding_from_attention_mask(attention_mask, key_padding_mask, b, n)
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
        scale): the caller then makes a :class:`~posenc.sequence.context.SequenceContext`."""
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
        forward's :class:`~posenc.sequence.context.SequenceContext` when it is cached or packed (it
        then holds the padding mask); the other arguments as for :meth:`forward`."""
        check_input(x, self.dim)
        check_input_dtype(x, self.qkv.weight.dtype, "MultiHeadAttention")
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
        return context.state(pe, x)

    def _heads(
        self,
        x: Tensor,
        state: PositionState | None,
        key_padding_mask: Tensor | None,
        need_weights: bool,
        context: SequenceContext | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """:meth:`attend` on a checked ``x`` and mask: project, apply the position state,
        join the cache, share key/value heads, choose a backend and run it."""
        b, n, _ = x.shape
        h, d = self.num_heads, self.head_dim
        q, k, v = self._project(x)  # (b, h, n, d); k, v (b, g, n, d)
        # a StreamingCache holds keys before rotation: every key is rotated once read
        at_read = context is not None and context.keys_at_read
        if not at_read:
            q, k, bias_state = self._apply_state(q, k, state)
        if context is not None:
            k, v = context.keys_values(self, k, v)  # (b, g, nk, d): the cached keys first
            key_padding_mask = context.last_keys(k.shape[2])[1]
        if at_read:  # (never in place: k is the cache's)
            q, k, bias_state = self._apply_state(q, k, state, inplace=False)
        if bias_state is not None and (bias_state.pe.needs_x or bias_state.pe.needs_layer):
            # a data-dependent bias (FoX), or one that reads this layer's projections
            bias_state = bias_state.reading(x, self, streaming=at_read)
        if self.query_scale is not None:
            assert context is not None  # forward made one: reads_positions
            keys = None
            if self.query_scale.counts_keys:  # SSMax: the keys each query sees, (b, n)
                nk = k.shape[2]
                mask = context.mask(self.causal, n, nk, q.device, self.window, self.chunk)
                keys = visible_keys(mask, b, n, nk, q.device)
            q = self.query_scale.apply(q, context.positions, keys=keys, weight=self.ssmax_scale)
        # k, v keep their g heads (b, g, nk, d): each backend serves a key/value head to its
        # h / g query heads without copying it (SDPA's and flex's enable_gqa, or the query
        # groups folded into the query axis)
        call = AttentionCall(
            batch=b,
            nq=n,
            state=bias_state,
            causal=self.causal,
            key_padding_mask=key_padding_mask,
            context=context,
            window=self.window,
            chunk=self.chunk,
            dropout_p=self.dropout if self.training else 0.0,
            compile_flex=self.compile_flex,
            scale=self.softmax_scale,
            softcap=self.softcap,
            sinks=self.sinks,
        )
        backend = choose_backend(self._request(q, k, call, need_weights))
        out, weights = BACKEND_FUNCTIONS[backend](q, k, v, call)
        if out is None:  # compiling flex failed for this shape (warned once)
            backend = Backend.SDPA if self.softcap is None else Backend.MATH
            out, weights = BACKEND_FUNCTIONS[backend](q, k, v, call)
        assert out is not None
        self.last_backend = backend.value
        return out.transpose(1, 2).reshape(b, n, h * d), weights  # (b, n, h·d)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The fused projection split into heads: q ``(b, h, n, d)``, k and v ``(b, g, n, d)``."""
        b, n, _ = x.shape
        h, g, d = self.num_heads, self.num_kv_heads, self.head_dim
        if g == h:
            q, k, v = self.qkv(x).view(b, n, 3, h, d).unbind(2)
        else:
            q, k, v = self.qkv(x).view(b, n, h + 2 * g, d).split([h, g, g], dim=2)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    @staticmethod
    def _apply_state(
        q: Tensor, k: Tensor, state: PositionState | None, inplace: bool = True
    ) -> tuple[Tensor, Tensor, BiasState | None]:
        """A rotary state rotates ``q`` and ``k``; a bias state is handed on to the softmax."""
        if isinstance(state, RotaryState):
            # q and k are fresh projections: rotate them in their own storage where autograd
            # is off (under autograd they are unbind views, which must not change in place);
            # inside torch.compile inductor fuses the out-of-place rotation instead
            fresh = inplace and not torch.is_grad_enabled() and not torch.compiler.is_compiling()
            q, k = state(q, k, inplace=fresh)
        return q, k, state if isinstance(state, BiasState) else None

    def _request(self, q: Tensor, k: Tensor, call: AttentionCall, need_weights: bool) -> Request:
        """What :func:`~posenc.attention.backends.choose_backend` reads about this call."""
        return Request(
            requested=self.backend,
            device=q.device.type,
            dtype=q.dtype,
            heads=self.num_heads,
            nq=q.shape[-2],
            nk=k.shape[-2],
            bias=Request.kind_of(call.state, k.shape[-2]),
            mask=call.mask_kind(),
            grad=learns(q, call.state, self.sinks),
            table_grad=learns_table(q, call.state),
            tiles=tiles_bias(call.state),
            dropout=call.dropout_p > 0.0,
            need_weights=need_weights,
            compile_flex=self.compile_flex,
            flex_available=flex.flex_available(),
            softcap=self.softcap is not None,
            sinks=self.sinks is not None,
        )

    def extra_repr(self) -> str:
        text = f"dim={self.dim}, num_heads={self.num_heads}"
        if self.num_kv_heads != self.num_heads:
            text += f", num_kv_heads={self.num_kv_heads}"
        if self.head_dim * self.num_heads != self.dim:
            text += f", head_dim={self.head_dim}"
        for name in ("window", "chunk", "query_scale", "softcap", "softmax_scale"):
            if getattr(self, name) is not None:
                text += f", {name}={getattr(self, name)}"
        if self.sinks is not None:
            text += ", sinks=True"
        return text + f", causal={self.causal}, backend={self.backend.value!r}"
