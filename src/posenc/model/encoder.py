"""The Transformer encoder (Vaswani et al. 2017, §3.1–3.3) built to take any positional scheme.

An additive encoding is applied once to the input; a rotary or bias encoding is handed to
every layer's attention (one shared module, so learned bias tables are shared across layers
as in T5); a conditional one (CPVT's PEG) replaces the hidden states after block
``after_block``. The model never looks at which scheme it holds, only at its family.

Dimension legend: ``b`` batch, ``n`` sequence, ``D`` model width, ``V`` vocabulary.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.backends import Backend
from ..attention.checks import check_attention_pe, check_reach_axes
from ..attention.config import AttentionConfig
from ..attention.names import padding_from_attention_mask, positions_or_ids
from ..attention.query_scale import QueryScale
from ..encodings.base import AdditiveEncoding, ConditionalEncoding, PositionalEncoding
from ..encodings.checks import check_input, check_input_dtype
from ..encodings.schedule import (
    layers_of_types,
    rescaled_schedule,
    resolve_pe,
    resolve_schedule,
)
from ..errors import PosencTypeError, PosencValueError
from ..sequence.cache import KVCache
from ..sequence.context import SequenceContext, position_state
from ..sequence.masks import check_key_padding_mask
from ..sequence.memo import sharing_within_forward
from ..sequence.positions import randomize_positions
from ..sequence.streaming import StreamingCache
from .config import Activation, EncoderConfig, FeedForwardKind, Norm
from .layers import EncoderLayer, make_norm

__all__ = ["Encoder", "sharing_copy"]


class Encoder(nn.Module):
    """A stack of ``depth`` encoder layers with one positional scheme.

    Args:
        dim: model width; num_heads must divide it unless ``head_dim`` is given.
        depth: number of layers.
        num_heads: attention (query) heads.
        num_kv_heads: key/value heads, grouped-query attention (default ``num_heads``; see
            :class:`~posenc.MultiHeadAttention`).
        head_dim: size of each head (default ``dim / num_heads``).
        pe: a registry name (see :func:`posenc.available`), a module, or ``None`` (NoPE);
            or a list with one such entry per layer (``"none"`` for a NoPE layer; equal names
            share one module; an additive scheme only as the single model-wide ``pe``; see
            :mod:`posenc.encodings.schedule`).
        window: a sliding window for every layer (an int), or per layer (a list, ``None``
            for full attention); see :class:`~posenc.MultiHeadAttention`.
        chunk: chunked attention (Llama 4), as ``window``.
        query_scale: a :class:`~posenc.QueryScale` for every layer, or a per-layer list
            (``None`` there: none); Llama 4 scales its NoPE layers' queries.
        sinks: learned attention sinks (see :class:`~posenc.MultiHeadAttention`) in every
            layer (a bool), or per layer (a list of bools).
        softcap: logit soft-capping ``c`` for every layer (a float), or per layer (a list,
            ``None`` there: none).
        softmax_scale: the logits' scale for every layer (``None``: ``1 / sqrt(head_dim)``).
        ffn_dim: feed-forward width (default ``4 * dim``; ``8 * dim // 3`` for SwiGLU).
        norm: ``"layer"`` (LayerNorm, default) or ``"rms"`` (RMSNorm), in every layer and
            at the end of a pre-norm stack.
        ffn: ``"mlp"`` (default) or ``"swiglu"`` (Llama's gated feed-forward).
        bias: biases in the projections, the feed-forward and the norms (default True);
            ``norm="rms", ffn="swiglu", bias=False`` is the Llama block.
        norm_eps: the norms' epsilon.
        dropout: dropout in attention, feed-forward and residuals.
        causal: mask future positions (decoder-only models).
        norm_first: pre-norm (default) or the paper's post-norm.
        pe_kwargs: extra constructor arguments when ``pe`` is a name. A causal Encoder starts
            from the scheme's ``causal_defaults`` (T5: unidirectional buckets).
        random_positions: ``L`` for randomized positions (Ruoss et al. 2023): in training
            each sequence's positions are mapped through sorted distinct positions drawn
            from ``[0, L)`` (:func:`randomize_positions`); evaluation uses the positions
            given. Works with every scheme; ``None`` (default) turns it off.

    >>> enc = Encoder(32, 2, 4, pe="sinusoidal")
    >>> enc(torch.randn(2, 10, 32)).shape
    torch.Size([2, 10, 32])
    """

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        *,
        pe: str | PositionalEncoding | None = "sinusoidal",
        ffn_dim: int | None = None,
        dropout: float = 0.0,
        causal: bool = False,
        norm_first: bool = True,
        activation: Activation = "relu",
        backend: Backend = "auto",
        pe_kwargs: dict[str, Any] | None = None,
        random_positions: int | None = None,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        window: int | list[int | None] | None = None,
        chunk: int | list[int | None] | None = None,
        query_scale: QueryScale | list[QueryScale | None] | None = None,
        sinks: bool | list[bool] = False,
        softcap: float | list[float | None] | None = None,
        softmax_scale: float | None = None,
        norm: Norm = "layer",
        ffn: FeedForwardKind = "mlp",
        bias: bool = True,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        attention = AttentionConfig(
            dim,
            num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            causal=causal,
            dropout=dropout,
            bias=bias,
            backend=backend,
            softmax_scale=softmax_scale,
        )
        config = EncoderConfig(
            attention,
            depth,
            pe=pe,
            ffn_dim=ffn_dim,
            norm_first=norm_first,
            activation=activation,
            pe_kwargs=pe_kwargs,
            random_positions=random_positions,
            window=window,
            chunk=chunk,
            query_scale=query_scale,
            sinks=sinks,
            softcap=softcap,
            norm=norm,
            ffn=ffn,
            bias=bias,
            norm_eps=norm_eps,
        )
        self._build(config)

    @classmethod
    def from_config(cls, config: EncoderConfig) -> Encoder:
        """The encoder ``config`` describes (an :class:`~posenc.EncoderConfig`): under one seed
        the same parameters, with the same names, as the keyword form.

        >>> config = EncoderConfig(AttentionConfig(32, 4), depth=2, pe="rope")
        >>> Encoder.from_config(config)(torch.randn(1, 5, 32)).shape
        torch.Size([1, 5, 32])
        """
        if not isinstance(config, EncoderConfig):
            raise PosencTypeError(
                f"config must be a posenc.EncoderConfig, got {type(config).__name__}"
            )
        encoder = cls.__new__(cls)
        nn.Module.__init__(encoder)
        encoder._build(config)
        return encoder

    def _build(self, config: EncoderConfig) -> None:
        """Make the encodings and the layers from a checked record."""
        #: The record this encoder was built from.
        self.config = config
        att = config.attention
        dim, depth, num_heads, head_dim = att.dim, config.depth, att.num_heads, att.head_dim
        assert head_dim is not None and att.num_kv_heads is not None
        self.dim, self.depth, self.num_heads = dim, depth, num_heads
        self.causal = att.causal
        self.random_positions = config.random_positions
        self.num_kv_heads, self.head_dim = att.num_kv_heads, head_dim
        distinct, self._pe_index = resolve_schedule(
            config.pe,
            depth,
            lambda item: resolve_pe(
                item,
                dim,
                num_heads,
                causal=att.causal,
                head_dim=head_dim,
                pe_kwargs=config.pe_kwargs,
            ),
        )
        # one encoding: ``self.pe``, as always (its parameters keep their names); several:
        # ``self.encodings``, and ``self.pe`` is None
        self.pe: PositionalEncoding | None = distinct[0] if len(distinct) == 1 else None
        if self.pe is None:
            self.encodings = nn.ModuleList(distinct)
        self.layers = nn.ModuleList(
            EncoderLayer.from_config(config, attention) for attention in config.layer_attention()
        )
        # A pre-norm stack leaves its residual stream unnormalised: normalise once at the end.
        self.norm = (
            make_norm(config.norm, dim, eps=config.norm_eps, bias=bool(config.bias))
            if config.norm_first
            else nn.Identity()
        )
        # Validate the pairing now rather than at the first forward.
        for encoding in distinct:
            if encoding.family not in ("additive", "conditional"):
                check_attention_pe(encoding, num_heads, head_dim, att.num_kv_heads)
            for layer in self.layers:  # the context of a forward reads the widest positions
                check_reach_axes(encoding, layer.attn.config)
        if isinstance(self.pe, ConditionalEncoding):
            check_conditional(self.pe, depth, config.random_positions)

    @classmethod
    def from_hf_config(cls, config: Any, *, device: Any = None, **overrides: Any) -> Encoder:
        """An encoder with the schedule of the model ``config`` describes (a transformers
        config, or a ``config.json`` dict, read as transformers' config class for its
        ``model_type`` reads it; see :mod:`posenc.hf.schedule`): its width, heads, key/value
        heads, head size, feed-forward width, and per layer its encoding (RoPE as the layer
        type reads it, or NoPE), window, chunk and query temperature; causal, unless the
        family's model attends both ways (ModernBERT and the other encoders of
        ``posenc.hf.schedule.BIDIRECTIONAL_MODEL_TYPES``), with random weights. ``overrides``
        change sizes first (``num_layers=``, ``hidden_size=``, ...); ``device="meta"``
        allocates nothing. :attr:`layer_types` records each layer's type.

        >>> from transformers import Gemma3TextConfig
        >>> enc = Encoder.from_hf_config(Gemma3TextConfig(), num_layers=6, device="meta")
        >>> [(t, layer.attn.window) for t, layer in zip(enc.layer_types, enc.layers)][4:]
        [('sliding_attention', 4096), ('full_attention', None)]
        """
        from ..hf.schedule import build_from_hf_config  # the one call up to posenc.hf

        return build_from_hf_config(cls, config, device=device, overrides=overrides)

    def distinct_pes(self) -> list[PositionalEncoding]:
        """The encodings of this encoder, each once, in order of first use."""
        return [self.pe] if self.pe is not None else list(self.encodings)

    @property
    def pes(self) -> list[PositionalEncoding]:
        """The encoding of each layer (one entry per layer; shared modules repeat)."""
        distinct = self.distinct_pes()
        return [distinct[i] for i in self._pe_index]

    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        cache: KVCache | StreamingCache | None = None,
        document_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Shapes: x ``(b, n, D)``; positions ``(n,)`` or ``(b, n)``; key_padding_mask
        ``(b, n)`` bool with True = padding; document_ids ``(b, n)`` integers. Returns
        ``(b, n, D)``. ``position_ids`` and ``attention_mask`` (1 = attend) are transformers'
        names for ``positions`` and the opposite of ``key_padding_mask``, taken instead of
        them (:mod:`posenc.attention.names`).

        The encoding is asked once per forward: an additive one is added to ``x``; a rotary
        or bias one makes its :meth:`~posenc.PositionalEncoding.position_state` (positions
        validated, cos/sin or bias computed), which every layer then applies; a conditional
        one checks its grid first and replaces ``x`` after block ``after_block``.

        ``cache`` (a :class:`~posenc.KVCache`): ``x`` holds the new tokens, which attend to
        every cached one and join the cache; positions continue where it stands unless
        given. A :class:`~posenc.StreamingCache` keeps only the sinks and the window, at
        positions inside the cache (:mod:`posenc.sequence.streaming`). ``document_ids``: packed
        documents, each attended to alone, with positions restarting at 0 in each (see
        :mod:`posenc.sequence.context`).
        """
        check_input(x, self.dim)
        check_input_dtype(x, self.layers[0].attn.qkv.weight.dtype, "Encoder")
        b, n, _ = x.shape
        positions = positions_or_ids(positions, position_ids)
        key_padding_mask = padding_from_attention_mask(attention_mask, key_padding_mask, b, n)
        distinct = self.distinct_pes()
        widest = distinct[0]  # the encoding with the most position axes
        for pe in distinct[1:]:
            widest = pe if pe.axes > widest.axes else widest
        windowed = False
        for layer in self.layers:
            windowed = windowed or layer.attn.reads_positions
        context = SequenceContext.build(
            batch=b,
            seq=n,
            device=x.device,
            positions=positions,
            key_padding_mask=key_padding_mask,
            document_ids=document_ids,
            cache=cache,
            axes=widest.axes,
            scheme=widest.registry_name() or type(widest).__name__,
            windowed=windowed,
        )
        if context is None:
            return self._stack(x, positions, key_padding_mask, None, cache)
        try:
            out = self._stack(x, positions, key_padding_mask, context, cache)
        except BaseException:
            context.rollback()  # the cache stays as it was
            raise
        context.commit()
        return out

    def _stack(
        self,
        x: Tensor,
        positions: Tensor | None,
        key_padding_mask: Tensor | None,
        context: SequenceContext | None,
        cache: KVCache | StreamingCache | None,
    ) -> Tensor:
        """:meth:`forward` once its context is made: the encodings, then every layer."""
        b, n, _ = x.shape
        if context is None:
            check_key_padding_mask(key_padding_mask, b, n, read_values=True)
        else:
            # the context holds both (additive encodings add at absolute_positions: those
            # of the tokens in their rows, where a StreamingCache's in-cache ones differ)
            positions, key_padding_mask = context.absolute_positions, None
        if self.training and self.random_positions is not None and cache is None:
            positions = randomize_positions(positions, n, self.random_positions, device=x.device)
            if context is not None:
                context.positions = context.key_positions = positions
                context.absolute_positions = positions
                context.bound = None
        conditional = self.pe if isinstance(self.pe, ConditionalEncoding) else None
        if conditional is not None:  # its arguments checked before any work
            prepared = conditional.prepare(x, positions, key_padding_mask=key_padding_mask)
        if isinstance(self.pe, AdditiveEncoding):
            x = self.pe(x, positions)
        # once per distinct encoding, shared by the layers that use it (none for a
        # conditional one, which attention never sees)
        states = [position_state(pe, x, positions, context) for pe in self.distinct_pes()]
        # the layers share what they make alike (a block mask): in the context, or in a
        # memo of this forward (a compiled forward shares it through the graph instead)
        plain = context is None and not torch.compiler.is_compiling()
        with sharing_within_forward() if plain else contextlib.nullcontext():
            for block, (layer, index) in enumerate(zip(self.layers, self._pe_index, strict=True)):
                if conditional is not None and block == conditional.after_block:
                    x = conditional.generate(x, prepared)
                state = states[index]
                x = layer(x, key_padding_mask=key_padding_mask, state=state, context=context)
            if conditional is not None and conditional.after_block == len(self.layers):
                x = conditional.generate(x, prepared)
        return self.norm(x)

    #: The sequence length this encoder was trained at, when known (``posenc extrapolate``
    #: sets it and saves it with its checkpoints; it is not in the ``state_dict``). It fills
    #: a missing ``original_max_position_embeddings`` in :meth:`with_rope_scaling`.
    trained_length: int | None = None

    #: The type of each layer (transformers' ``layer_types``: ``"full_attention"``,
    #: ``"sliding_attention"``, ...), when known; :meth:`with_rope_scaling` may select by it.
    layer_types: list[str] | None = None

    def with_rope_scaling(
        self, scaling: Mapping[str, Any] | None, *, layer_types: Iterable[str] | None = None
    ) -> Encoder:
        """This encoder with its rotary embeddings' scaling replaced by ``scaling`` (a Hugging
        Face ``rope_scaling`` dict, or ``None`` for plain RoPE): how a RoPE model trained at
        length ``L`` is evaluated with position interpolation, dynamic NTK or YaRN. Every
        RoPE layer is rescaled, or, with ``layer_types``, those whose entry in
        :attr:`layer_types` is one of them (Gemma 3 scales its global layers only).

        The result is a new :class:`Encoder` that *shares* every layer, norm and weight with
        this one (training either trains both; ``copy.deepcopy`` it to fine-tune apart); only
        the rotary modules are new (:meth:`posenc.RotaryEmbedding.with_scaling`). This encoder
        is left as it is. A dictionary whose rope type needs the original context
        (:attr:`posenc.RopeType.needs_original`) and lacks ``original_max_position_embeddings``
        gets :attr:`trained_length`.

        >>> enc = Encoder(16, 1, 2, pe="rope")
        >>> enc.trained_length = 64
        >>> enc.with_rope_scaling({"rope_type": "yarn", "factor": 4.0}).pe.scaling["factor"]
        4.0
        """
        if scaling is not None and not isinstance(scaling, Mapping):
            raise PosencTypeError(f"scaling must be a dict or None, got {type(scaling).__name__}")
        chosen = layers_of_types(self.layer_types, layer_types, self.depth)
        distinct, index = rescaled_schedule(self.pes, chosen, scaling, self.trained_length)
        new = sharing_copy(self)
        new._pe_index = index
        if len(distinct) == 1:
            new.pe = distinct[0]
            new._modules.pop("encodings", None)
        else:
            new._modules.pop("pe", None)
            new.pe = None
            new.encodings = nn.ModuleList(distinct)
        return new

    def extra_repr(self) -> str:
        return "" if self.trained_length is None else f"trained_length={self.trained_length}"


def check_conditional(pe: ConditionalEncoding, depth: int, random_positions: int | None) -> None:
    """Refuse, naming the value, a conditional encoding placed past the last block or asked
    for randomized positions (its positions are a grid it convolves over)."""
    if pe.after_block > depth:
        raise PosencValueError(
            f"pe={type(pe).__name__} has after_block={pe.after_block} but the encoder has "
            f"depth={depth}: it must be at most the depth"
        )
    if random_positions is not None:
        raise PosencValueError(
            f"random_positions={random_positions} cannot be used with the conditional "
            f"pe={type(pe).__name__}: its positions must be the tokens' own grid"
        )


def sharing_copy(module: nn.Module) -> Any:
    """A new module object whose submodules, parameters and buffers are this one's (the
    registries are new dicts, so replacing a submodule of the copy leaves ``module`` as is)."""
    new = copy.copy(module)
    new._modules = dict(module._modules)
    new._parameters = dict(module._parameters)
    new._buffers = dict(module._buffers)
    return new
