"""The layers of :class:`~posenc.Encoder`: the position-wise feed-forward network and the
encoder layer (self-attention and feed-forward, each in a residual block with layer norm;
Vaswani et al. 2017, §3.1–3.3).

Dimension legend: ``b`` batch, ``n`` sequence, ``D`` model width.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.backends import Backend
from ..attention.config import AttentionConfig
from ..attention.module import MultiHeadAttention
from ..attention.query_scale import QueryScale
from ..encodings.base import PositionalEncoding
from ..encodings.checks import check_input, check_input_dtype, check_positive_int, check_probability
from ..encodings.state import PositionState
from ..errors import PosencTypeError, PosencValueError
from ..sequence.context import SequenceContext
from ..sequence.masks import check_key_padding_mask
from . import fused
from .config import ACTIVATIONS, Activation, EncoderConfig

__all__ = ["EncoderLayer", "FeedForward", "ResidualStep"]

#: A residual step of an encoder layer: ``(h, residual) -> residual + sublayer(h)``.
ResidualStep = Callable[[Tensor, Tensor], Tensor]


class FeedForward(nn.Module):
    """Position-wise feed-forward network: ``W2 · act(W1 x + b1) + b2`` (eq. 2 of the paper).

    >>> FeedForward(8, 32)(torch.zeros(2, 3, 8)).shape
    torch.Size([2, 3, 8])
    """

    def __init__(
        self, dim: int, hidden: int, *, dropout: float = 0.0, activation: Activation = "relu"
    ) -> None:
        super().__init__()
        check_positive_int("dim", dim)
        check_positive_int("hidden", hidden)
        if activation not in ACTIVATIONS:
            raise PosencValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
        self.activation = activation
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(check_probability("dropout", dropout))

    def act(self, hidden: Tensor) -> Tensor:
        """The activation, in place for ReLU (the up-projection's backward needs its input,
        not its output)."""
        return F.relu(hidden, inplace=True) if self.activation == "relu" else F.gelu(hidden)

    def forward(self, x: Tensor) -> Tensor:
        """Shapes: x ``(..., D)`` -> ``(..., D)``."""
        return self.down(self.dropout(self.act(self.up(x))))


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each in a residual block with layer norm.

    ``norm_first=False`` is the paper's post-norm ``x = norm(x + sublayer(x))``;
    ``norm_first=True`` (default) is the pre-norm ``x = x + sublayer(norm(x))`` that trains
    stably without warm-up tricks.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        ffn_dim: int | None = None,
        dropout: float = 0.0,
        causal: bool = False,
        norm_first: bool = True,
        activation: Activation = "relu",
        pe: PositionalEncoding | None = None,
        backend: Backend = "auto",
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
        attention = AttentionConfig(
            dim,
            num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            causal=causal,
            dropout=dropout,
            backend=backend,
            window=window,
            chunk=chunk,
            query_scale=query_scale,
            sinks=sinks,
            softcap=softcap,
            softmax_scale=softmax_scale,
        )
        config = EncoderConfig(
            attention, depth=1, ffn_dim=ffn_dim, norm_first=norm_first, activation=activation
        )
        self._build(config, config.layer_attention()[0], pe)

    @classmethod
    def from_config(
        cls,
        config: EncoderConfig,
        attention: AttentionConfig | None = None,
        pe: PositionalEncoding | None = None,
    ) -> EncoderLayer:
        """A layer of the encoder ``config`` describes, with ``attention`` (default
        ``config.attention``: one of :meth:`~posenc.EncoderConfig.layer_attention`) and the
        encoding ``pe``."""
        if not isinstance(config, EncoderConfig):
            raise PosencTypeError(
                f"config must be a posenc.EncoderConfig, got {type(config).__name__}"
            )
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._build(config, config.attention if attention is None else attention, pe)
        return layer

    def _build(
        self, config: EncoderConfig, attention: AttentionConfig, pe: PositionalEncoding | None
    ) -> None:
        dim, dropout = attention.dim, attention.dropout
        self.norm_first = config.norm_first
        self.attn = MultiHeadAttention.from_config(attention, pe=pe)
        hidden = config.ffn_dim or 4 * dim
        self.ffn = FeedForward(dim, hidden, dropout=dropout, activation=config.activation)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.drop = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        pe: PositionalEncoding | None = None,
        state: PositionState | None = None,
        context: SequenceContext | None = None,
    ) -> Tensor:
        """Shapes: x ``(b, n, D)`` -> ``(b, n, D)``. ``state`` is the encoding's per-forward
        :meth:`~posenc.PositionalEncoding.position_state` (the Encoder makes it once for all
        layers); otherwise ``pe`` (default: the attention's own) is asked with ``positions``.
        ``context`` is the Encoder's :class:`~posenc.sequence.context.SequenceContext` of a cached
        or
        packed forward (it holds the padding mask and the cache; the Encoder commits it).

        Pre-norm: ``x = x + attn(norm1(x))``, then ``x = x + ffn(norm2(x))``;
        post-norm: ``x = norm1(x + attn(x))``, then ``x = norm2(x + ffn(x))``. Outside
        autograd (and outside autocast, whose conversions its in-place GEMMs escape) each
        residual block is computed by :mod:`posenc.model.fused`, with the same sums.
        """
        if state is None:
            check_input(x, self.attn.dim)
            check_input_dtype(x, self.attn.qkv.weight.dtype, "EncoderLayer")
            if context is None:
                check_key_padding_mask(key_padding_mask, x.shape[0], x.shape[1], read_values=True)
            state = self.attn.state_for(x, positions, pe, context)
        fast = (
            not torch.is_grad_enabled()
            and not (self.training and self.drop.p > 0)
            and not torch.is_autocast_enabled(x.device.type)
        )
        if fast:
            attention, feed_forward = fused.residual_steps(self, state, key_padding_mask, context)
        else:
            attention, feed_forward = self.residual_steps(state, key_padding_mask, context)
        return self.apply_residual_steps(x, attention, feed_forward)

    def apply_residual_steps(
        self, x: Tensor, attention: ResidualStep, feed_forward: ResidualStep
    ) -> Tensor:
        """The layer's residual topology, written once: ``attention(h, r)`` and
        ``feed_forward(h, r)`` each return ``r + sublayer(h)``."""
        if self.norm_first:
            x = attention(self.norm1(x), x)
            return feed_forward(self.norm2(x), x)
        x = self.norm1(attention(x, x))
        return self.norm2(feed_forward(x, x))

    def residual_steps(
        self,
        state: PositionState | None,
        key_padding_mask: Tensor | None,
        context: SequenceContext | None = None,
    ) -> tuple[ResidualStep, ResidualStep]:
        """The two residual steps ``r + sublayer(h)`` as autograd computes them (dropout on
        each sublayer's output); :func:`posenc.model.fused.residual_steps` is the inference form."""

        def attention(h: Tensor, residual: Tensor) -> Tensor:
            heads, _ = self.attn.attend(
                h, state, key_padding_mask=key_padding_mask, context=context
            )
            return residual + self.drop(self.attn.out(heads))

        def feed_forward(h: Tensor, residual: Tensor) -> Tensor:
            return residual + self.drop(self.ffn(h))

        return attention, feed_forward
