"""The record an encoder is built from: :class:`EncoderConfig`, holding the layers' shared
:class:`~posenc.AttentionConfig` and the rest of :class:`~posenc.Encoder`'s keyword arguments as
fields of the same names, checked once, when it is made.

Per layer: ``window``, ``chunk``, ``query_scale``, ``sinks`` and ``softcap`` take one value for
every layer or a list with one per layer; left ``None`` they are the attention record's.
:meth:`EncoderConfig.layer_attention` gives each layer's own record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ..attention.config import AttentionConfig
from ..attention.query_scale import QueryScale
from ..encodings.checks import check_bool, check_positive_float, check_positive_int
from ..encodings.schedule import per_layer, per_layer_items
from ..errors import PosencTypeError, PosencValueError, check_bytes

__all__ = ["ACTIVATIONS", "FFNS", "NORMS", "Activation", "EncoderConfig", "FeedForwardKind", "Norm"]

Activation = Literal["relu", "gelu"]
#: The feed-forward activations.
ACTIVATIONS: tuple[str, ...] = ("relu", "gelu")
Norm = Literal["layer", "rms"]
#: The norms: LayerNorm (Ba et al. 2016) or RMSNorm (Zhang & Sennrich 2019).
NORMS: tuple[str, ...] = ("layer", "rms")
FeedForwardKind = Literal["mlp", "swiglu"]
#: The feed-forward networks: ``W2 act(W1 x)`` or SwiGLU ``W2 (silu(W1 x) ⊙ W3 x)``.
FFNS: tuple[str, ...] = ("mlp", "swiglu")

#: The attention fields a layer may set for itself.
PER_LAYER = ("window", "chunk", "query_scale", "sinks", "softcap")


@dataclass(frozen=True)
class EncoderConfig:
    """A stack of ``depth`` encoder layers (see :class:`~posenc.Encoder` for each field's
    meaning); ``attention`` is every layer's attention but for what a layer sets itself.

    >>> from posenc import AttentionConfig
    >>> config = EncoderConfig(AttentionConfig(32, 4, causal=True), depth=3, pe="rope",
    ...                        window=[None, 8, None])
    >>> [layer.window for layer in config.layer_attention()]
    [None, 8, None]
    """

    attention: AttentionConfig  #: sizes, masking and options of every layer's attention
    depth: int  #: number of layers
    pe: Any = "sinusoidal"  #: a registry name, a module, None (NoPE), or one per layer
    ffn_dim: int | None = None  #: feed-forward width (``4 * dim`` by default)
    norm_first: bool = True  #: pre-norm (else the paper's post-norm)
    activation: Activation = "relu"  #: the feed-forward's activation
    pe_kwargs: Mapping[str, Any] | None = None  #: constructor arguments when ``pe`` is a name
    random_positions: int | None = None  #: ``L`` for randomized positions in training
    window: int | Sequence[int | None] | None = None  #: per layer (``None``: the record's)
    chunk: int | Sequence[int | None] | None = None  #: per layer (``None``: the record's)
    query_scale: QueryScale | Sequence[QueryScale | None] | None = None  #: per layer
    sinks: bool | Sequence[bool] | None = None  #: per layer (``None``: the record's)
    softcap: float | Sequence[float | None] | None = None  #: per layer (``None``: the record's)
    norm: Norm = "layer"  #: the layers' norms: ``"layer"`` (LayerNorm) or ``"rms"`` (RMSNorm)
    ffn: FeedForwardKind = "mlp"  #: the feed-forward: ``"mlp"`` or ``"swiglu"`` (Llama's)
    bias: bool | None = None  #: biases in feed-forward and norms (``None``: attention.bias)
    norm_eps: float = 1e-5  #: the norms' epsilon

    @property
    def hidden(self) -> int:
        """The feed-forward width: ``ffn_dim``, else ``4 * dim`` (MLP) or ``8 * dim // 3``
        (SwiGLU: about the parameters of a ``4 * dim`` MLP, as Shazeer 2020 and Llama size it)."""
        if self.ffn_dim is not None:
            return self.ffn_dim
        dim = self.attention.dim
        return 8 * dim // 3 if self.ffn == "swiglu" else 4 * dim

    def __post_init__(self) -> None:
        if not isinstance(self.attention, AttentionConfig):
            raise PosencTypeError(
                f"attention must be a posenc.AttentionConfig, got {type(self.attention).__name__}"
            )
        depth = check_positive_int("depth", self.depth)
        if self.ffn_dim is not None:
            check_positive_int("ffn_dim", self.ffn_dim)
        check_bool("norm_first", self.norm_first)
        if self.activation not in ACTIVATIONS:
            raise PosencValueError(f"activation must be 'relu' or 'gelu', got {self.activation!r}")
        if self.norm not in NORMS:
            raise PosencValueError(f"norm must be 'layer' or 'rms', got {self.norm!r}")
        if self.ffn not in FFNS:
            raise PosencValueError(f"ffn must be 'mlp' or 'swiglu', got {self.ffn!r}")
        bias = self.attention.bias if self.bias is None else check_bool("bias", self.bias)
        object.__setattr__(self, "bias", bias)
        check_positive_float("norm_eps", self.norm_eps)
        if self.pe_kwargs is not None and not isinstance(self.pe_kwargs, Mapping):
            raise PosencTypeError(
                f"pe_kwargs must be a dict or None, got {type(self.pe_kwargs).__name__}"
            )
        if self.random_positions is not None:
            check_positive_int("random_positions", self.random_positions)
        for name in PER_LAYER:
            own, shared = getattr(self, name), getattr(self.attention, name)
            if own is not None and shared not in (None, False):
                raise PosencValueError(
                    f"{name} is set both for every layer (attention.{name}={shared!r}) and in "
                    f"the encoder ({name}={own!r}): give it in one place"
                )
            layers = _per_layer(name, shared if own is None else own, depth)
            object.__setattr__(self, name, tuple(layers))
        self._check_size()

    def layer_attention(self) -> tuple[AttentionConfig, ...]:
        """Each layer's attention record: :attr:`attention` with the layer's own reach."""
        return tuple(
            self.attention.for_layer(**{name: getattr(self, name)[i] for name in PER_LAYER})
            for i in range(self.depth)
        )

    def _check_size(self) -> None:
        """The parameters' bytes, before any is made (the memory budget)."""
        att = self.attention
        dim, heads, kv_heads, head_dim = att.dim, att.num_heads, att.num_kv_heads, att.head_dim
        assert kv_heads is not None and head_dim is not None
        hidden = self.hidden
        # per layer: q, k, v and output projections, the feed-forward's two (SwiGLU: three)
        # matrices, biases and norms
        inner = (2 * heads + 2 * kv_heads) * head_dim * dim
        matrices = 3 if self.ffn == "swiglu" else 2
        layer_params = inner + matrices * dim * hidden + hidden + 9 * dim
        check_bytes(
            "dim x depth x ffn_dim",
            f"{dim} x {self.depth} x {hidden}",
            self.depth * layer_params * torch.get_default_dtype().itemsize,
        )


def _per_layer(name: str, value: object, depth: int) -> list[Any]:
    """One checked entry per layer of the per-layer field ``name``."""
    if name in ("window", "chunk"):
        return per_layer(name, value, depth)
    if name == "sinks":
        return per_layer_items(name, value, depth, check_bool)
    if name == "softcap":
        return per_layer_items(name, value, depth, _positive_or_none)
    return per_layer_items(name, value, depth, _query_scale)


def _positive_or_none(name: str, value: object) -> float | None:
    """``value`` as a finite float > 0, or ``None``; raise naming ``name`` otherwise."""
    return None if value is None else check_positive_float(name, value)


def _query_scale(name: str, value: object) -> QueryScale | None:
    if value is not None and not isinstance(value, QueryScale):
        raise PosencTypeError(f"{name} must be a posenc.QueryScale or None, got {value!r}")
    return value
