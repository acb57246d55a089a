"""The record an attention layer is built from: :class:`AttentionConfig`, its fields named as
:class:`~posenc.MultiHeadAttention`'s keyword arguments and checked once, when it is made.

A model holds one record per layer: the sizes and options every layer shares, with each
layer's own reach (``window``, ``chunk``, ``query_scale``, ``sinks``, ``softcap``) put in by
:meth:`AttentionConfig.for_layer`. The keyword constructors build the record and nothing else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..encodings.checks import (
    check_bool,
    check_positive_float,
    check_positive_int,
    check_probability,
)
from ..errors import PosencTypeError, PosencValueError
from .backends import Backend
from .checks import check_heads, check_reach
from .flex import flex_available
from .query_scale import QueryScale

__all__ = ["BACKENDS", "AttentionConfig"]

#: The backends' names, as ``backend=`` takes them.
BACKENDS: tuple[str, ...] = tuple(backend.value for backend in Backend)


@dataclass(frozen=True)
class AttentionConfig:
    """One attention layer: sizes, masking and options (see :class:`~posenc.MultiHeadAttention`
    for what each does). ``num_kv_heads`` and ``head_dim`` are filled in (``num_heads`` and
    ``dim / num_heads`` by default) and ``backend`` becomes a :class:`Backend`, so two records
    that build the same layer are equal.

    >>> AttentionConfig(64, 4, num_kv_heads=2).head_dim
    16
    >>> AttentionConfig(64, 4).for_layer(window=128).window
    128
    """

    dim: int  #: model width ``D``
    num_heads: int  #: query heads ``h``
    num_kv_heads: int | None = None  #: key/value heads ``g`` (grouped-query attention)
    head_dim: int | None = None  #: the size ``d`` of each head
    causal: bool = False  #: mask future keys
    dropout: float = 0.0  #: dropout on the attention weights (training only)
    bias: bool = True  #: biases in the projections
    backend: Backend | str = Backend.AUTO  #: where the softmax runs
    compile_flex: bool = True  #: compile flex attention (else its eager reference)
    window: int | None = None  #: sliding window: keys less than ``window`` positions away
    chunk: int | None = None  #: chunked attention: keys of the query's own chunk
    query_scale: QueryScale | None = None  #: queries scaled with the log of their position
    sinks: bool = False  #: a learned sink logit per head (gpt-oss)
    softcap: float | None = None  #: logits ``c · tanh(logits / c)`` before the mask (Gemma 2)
    softmax_scale: float | None = None  #: logits ``s · q kᵀ`` (``None``: ``1 / sqrt(d)``)

    def __post_init__(self) -> None:
        check_positive_int("dim", self.dim)
        check_positive_int("num_heads", self.num_heads)
        head_dim, num_kv_heads = check_heads(
            self.dim, self.num_heads, self.num_kv_heads, self.head_dim
        )
        backend = self.backend
        if not isinstance(backend, str) or backend not in BACKENDS:
            raise PosencValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        if backend == Backend.FLEX and not flex_available():
            raise PosencValueError(
                "backend='flex' needs torch.nn.attention.flex_attention (torch>=2.5)"
            )
        window, chunk, query_scale = check_reach(self.window, self.chunk, self.query_scale)

        if isinstance(self.softmax_scale, (list, tuple)):
            raise PosencTypeError(
                "softmax_scale is one number for every layer (or None), got a list "
                f"{self.softmax_scale!r}"
            )

        def positive_or_none(name: str, value: float | None) -> float | None:
            return None if value is None else check_positive_float(name, value)

        fields = {
            "head_dim": head_dim,
            "num_kv_heads": num_kv_heads,
            "backend": Backend(backend),
            "window": window,
            "chunk": chunk,
            "query_scale": query_scale,
            "causal": check_bool("causal", self.causal),
            "dropout": check_probability("dropout", self.dropout),
            "bias": check_bool("bias", self.bias),
            "compile_flex": check_bool("compile_flex", self.compile_flex),
            "sinks": check_bool("sinks", self.sinks),
            "softcap": positive_or_none("softcap", self.softcap),
            "softmax_scale": positive_or_none("softmax_scale", self.softmax_scale),
        }
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def for_layer(self, **reach: object) -> AttentionConfig:
        """This record with one layer's own ``window``, ``chunk``, ``query_scale``, ``sinks``
        and ``softcap`` (any of them; the others as they are), checked as any record is."""
        own = {"window", "chunk", "query_scale", "sinks", "softcap"}
        unknown = sorted(set(reach) - own)
        if unknown:
            raise PosencValueError(
                f"for_layer takes {', '.join(sorted(own))}; got {', '.join(unknown)}"
            )
        return dataclasses.replace(self, **reach)  # type: ignore[arg-type]
