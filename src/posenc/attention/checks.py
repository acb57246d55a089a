"""An attention layer's arguments checked: query heads, key/value heads, head size, whether a
positional encoding fits them, and what each query may reach (window, chunk, query scale)."""

from __future__ import annotations

from ..encodings.base import BiasEncoding, PositionalEncoding
from ..encodings.checks import check_positive_int
from ..encodings.rotary.heads import RotaryHeads
from ..encodings.schedule import per_layer
from ..errors import PosencTypeError, PosencValueError
from .query_scale import QueryScale

__all__ = ["check_attention_pe", "check_heads", "check_reach", "check_reach_axes"]


def check_heads(
    dim: int, num_heads: int, num_kv_heads: object, head_dim: object
) -> tuple[int, int]:
    """``(head_dim, num_kv_heads)`` with their defaults (``dim / num_heads``, ``num_heads``),
    checked: key/value heads must divide the query heads."""
    if head_dim is None:
        if dim % num_heads:
            raise PosencValueError(
                f"num_heads ({num_heads}) must divide dim ({dim}), or give head_dim"
            )
        head_dim = dim // num_heads
    head_dim = check_positive_int("head_dim", head_dim)
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    num_kv_heads = check_positive_int("num_kv_heads", num_kv_heads)
    if num_heads % num_kv_heads:
        raise PosencValueError(f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})")
    return head_dim, num_kv_heads


def check_attention_pe(
    pe: object, num_heads: int, head_dim: int | None = None, num_kv_heads: int | None = None
) -> PositionalEncoding | None:
    """Accept a rotary, bias or none encoding for attention; reject additive and conditional
    ones, and ones
    sized for another head count or (when ``head_dim`` is given) another head dim, or (when
    ``num_kv_heads`` is given) whose ``rotary_heads`` or per-head frequencies do not fit the
    query and key heads."""
    if pe is None:
        return None
    if not isinstance(pe, PositionalEncoding):
        raise PosencTypeError(f"pe must be a posenc PositionalEncoding, got {type(pe).__name__}")
    if pe.family == "additive":
        raise PosencTypeError(
            f"pe={type(pe).__name__} is additive: it acts on the input embeddings, not inside "
            "attention (Encoder adds it before the first layer)"
        )
    if pe.family == "conditional":
        raise PosencTypeError(
            f"pe={type(pe).__name__} is conditional: it acts on the hidden states between "
            "two blocks, not inside attention (Encoder applies it after block after_block)"
        )
    if isinstance(pe, BiasEncoding) and pe.num_heads != num_heads:
        raise PosencValueError(
            f"pe={type(pe).__name__} has num_heads={pe.num_heads} but attention has "
            f"num_heads={num_heads}"
        )
    pe_head_dim = getattr(pe, "head_dim", None)
    if head_dim is not None and isinstance(pe_head_dim, int) and pe_head_dim != head_dim:
        raise PosencValueError(
            f"pe={type(pe).__name__} has head_dim={pe_head_dim} but attention has "
            f"head_dim={head_dim}"
        )
    heads = getattr(pe, "heads", None)
    if num_kv_heads is not None and isinstance(heads, RotaryHeads):
        heads.check_counts(num_heads, num_kv_heads)
    return pe


def check_reach_axes(pe: PositionalEncoding | None, config: object) -> None:
    """Refuse, when an attention is built, a ``window``, ``chunk`` or ``query_scale`` of
    ``config`` (an :class:`~posenc.AttentionConfig`) beside an encoding whose positions have
    several axes: each reads 1-D positions, and every forward would refuse the pair."""
    if pe is None or pe.axes == 1:
        return
    reads = [
        f"{name}={value!r}"
        for name in ("window", "chunk", "query_scale")
        if (value := getattr(config, name, None)) is not None
    ]
    if reads:
        raise PosencValueError(
            f"{' and '.join(reads)} {'needs' if len(reads) == 1 else 'need'} a scheme with "
            "1-D positions; "
            f"{pe.registry_name() or type(pe).__name__} takes {pe.axes}-D positions"
        )


def check_reach(
    window: object, chunk: object, query_scale: object
) -> tuple[int | None, int | None, QueryScale | None]:
    """``window`` and ``chunk`` (each a positive int or ``None``) and ``query_scale`` (a
    :class:`~posenc.QueryScale` or ``None``), checked."""
    for name, value in (("window", window), ("chunk", chunk)):
        if isinstance(value, (list, tuple)):
            raise PosencTypeError(
                f"{name} of one attention layer must be a positive int or None, got a list "
                f"{value!r} (per-layer lists go to Encoder)"
            )
    if query_scale is not None and not isinstance(query_scale, QueryScale):
        raise PosencTypeError(
            f"query_scale must be a posenc.QueryScale or None, got {type(query_scale).__name__}"
        )
    return per_layer("window", window, 1)[0], per_layer("chunk", chunk, 1)[0], query_scale
