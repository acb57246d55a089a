"""The layers of :class:`~posenc.Encoder`: the position-wise feed-forward network and the
encoder layer (self-attention and feed-forward, each in a residual block with layer norm;
Vaswani et al. 2017, §3.1–3.3), and the parts of today's block: RMSNorm (Zhang & Sennrich
2019) and the SwiGLU feed-forward (Shazeer 2020). ``norm="rms", ffn="swiglu", bias=False``
with pre-norm is the Llama decoder layer (transformers' ``LlamaDecoderLayer``).

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
from .config import ACTIVATIONS, Activation, EncoderConfig, FeedForwardKind, Norm

__all__ = ["EncoderLayer", "FeedForward", "RMSNorm", "ResidualStep", "SwiGLU", "make_norm"]

#: A residual step of an encoder layer: ``(h, residual) -> residual + sublayer(h)``.
ResidualStep = Callable[[Tensor, Tensor], Tensor]


class FeedForward(nn.Module):
    """Position-wise feed-forward network: ``W2 · act(W1 x + b1) + b2`` (eq. 2 of the paper).

    >>> FeedForward(8, 32)(torch.zeros(2, 3, 8)).shape
    torch.Size([2, 3, 8])
    """

    def __init__(
        self,
        dim: int,
        hidden: int,
        *,
        dropout: float = 0.0,
        activation: Activation = "relu",
        bias: bool = True,
    ) -> None:
        super().__init__()
        check_positive_int("dim", dim)
        check_positive_int("hidden", hidden)
        if activation not in ACTIVATIONS:
            raise PosencValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
        self.activation = activation
        self.up = nn.Linear(dim, hidden, bias=bias)
        self.down = nn.Linear(hidden, dim, bias=bias)
        self.dropout = nn.Dropout(check_probability("dropout", dropout))

    def act(self, hidden: Tensor) -> Tensor:
        """The activation, in place for ReLU (the up-projection's backward needs its input,
        not its output)."""
        return F.relu(hidden, inplace=True) if self.activation == "relu" else F.gelu(hidden)

    def hidden(self, x: Tensor) -> Tensor:
        """``act(W1 x + b1)`` ``(..., F)``: what the down-projection reads (before dropout)."""
        return self.act(self.up(x))

    def forward(self, x: Tensor) -> Tensor:
        """Shapes: x ``(..., D)`` -> ``(..., D)``."""
        return self.down(self.dropout(self.hidden(x)))


class SwiGLU(nn.Module):
    """The gated feed-forward of Shazeer 2020 (``FFN_SwiGLU``), Llama's MLP:
    ``W2 (silu(W1 x) ⊙ W3 x)`` (``down(silu(gate(x)) * up(x))``), biases optional.

    >>> SwiGLU(8, 16, bias=False)(torch.zeros(2, 3, 8)).shape
    torch.Size([2, 3, 8])
    """

    activation = "swiglu"

    def __init__(self, dim: int, hidden: int, *, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        check_positive_int("dim", dim)
        check_positive_int("hidden", hidden)
        self.gate = nn.Linear(dim, hidden, bias=bias)
        self.up = nn.Linear(dim, hidden, bias=bias)
        self.down = nn.Linear(hidden, dim, bias=bias)
        self.dropout = nn.Dropout(check_probability("dropout", dropout))

    def hidden(self, x: Tensor) -> Tensor:
        """``silu(W1 x) ⊙ W3 x`` ``(..., F)``: what the down-projection reads."""
        return F.silu(self.gate(x)) * self.up(x)

    def forward(self, x: Tensor) -> Tensor:
        """Shapes: x ``(..., D)`` -> ``(..., D)``."""
        return self.down(self.dropout(self.hidden(x)))


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019): ``w ⊙ x / sqrt(mean(x²) + eps)`` over the
    last dimension, the statistics and the product in float32, rounded once to ``x``'s dtype.

    >>> RMSNorm(4)(torch.tensor([[3.0, -3.0, 3.0, -3.0]])).detach()
    tensor([[ 1.0000, -1.0000,  1.0000, -1.0000]])
    """

    def __init__(self, dim: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """Shapes: x ``(..., D)`` -> ``(..., D)``."""
        work = x.float()
        scale = torch.rsqrt(work.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return (work * scale * self.weight.float()).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


def make_norm(kind: Norm, dim: int, *, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """A norm over ``dim`` features: ``"layer"`` (``nn.LayerNorm``, its bias if ``bias``) or
    ``"rms"`` (:class:`RMSNorm`, which has none)."""
    if kind == "rms":
        return RMSNorm(dim, eps=eps)
    if kind != "layer":
        raise PosencValueError(f"norm must be 'layer' or 'rms', got {kind!r}")
    return nn.LayerNorm(dim, eps=eps, bias=bias)


def make_feed_forward(config: EncoderConfig, dim: int, dropout: float) -> nn.Module:
    """The feed-forward network ``config`` describes (its kind, width, activation, biases)."""
    bias = bool(config.bias)
    if config.ffn == "swiglu":
        return SwiGLU(dim, config.hidden, dropout=dropout, bias=bias)
    return FeedForward(dim, config.hidden, dropout=dropout, activation=config.activation, bias=bias)


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each in a residual block with layer norm.

    ``norm_first=False`` is the paper's post-norm ``x = norm(x + sublayer(x))``;
    ``norm_first=True`` (default) is the pre-norm ``x = x + sublayer(norm(x))`` that trains
    stably without warm-up tricks. ``norm="rms"`` uses RMSNorm, ``ffn="swiglu"`` the SwiGLU
    feed-forward, ``bias=False`` drops every bias (projections, feed-forward, norms):
    all three with pre-norm and a rotary ``pe`` make the Llama decoder layer.
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
            window=window,
            chunk=chunk,
            query_scale=query_scale,
            sinks=sinks,
            softcap=softcap,
            softmax_scale=softmax_scale,
        )
        config = EncoderConfig(
            attention,
            depth=1,
            ffn_dim=ffn_dim,
            norm_first=norm_first,
            activation=activation,
            norm=norm,
            ffn=ffn,
            bias=bias,
            norm_eps=norm_eps,
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
        self.ffn = make_feed_forward(config, dim, dropout)
        norm = (config.norm, dim)
        bias = bool(config.bias)
        self.norm1 = make_norm(*norm, eps=config.norm_eps, bias=bias)
        self.norm2 = make_norm(*norm, eps=config.norm_eps, bias=bias)
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
