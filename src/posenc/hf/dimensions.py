"""Where a transformers config states three of RoPE's facts: the head dimension
(:func:`head_dim_of`), the rotated dimension (:func:`rotary_dim_of`) and the base
(:func:`base_of`), each spelling read as :mod:`~.config`'s docstring tabulates, or refused with a
:class:`~posenc.errors.PosencValueError` naming the field and its value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..encodings.rope_types.registry import ROPE_TYPES
from ..errors import PosencValueError
from .fields import Fields, number, positive_int
from .model_types import (
    FIXED_BASE_MODEL_TYPES,
    NTK_ALPHA_MODEL_TYPES,
    PARTIAL_MODEL_TYPES,
    ROTARY_DIM_IGNORED_MODEL_TYPES,
)

__all__ = ["base_of", "head_dim_of", "rotary_dim_of", "spans_head"]


def head_dim_of(cfg: Fields) -> int:
    head_dim = cfg.get("head_dim")
    if head_dim:  # transformers reads ``config.head_dim or hidden_size // heads``: 0 is unset
        return positive_int("head_dim", head_dim)
    rope_head_dim = cfg.get("qk_rope_head_dim")
    if rope_head_dim:  # DeepSeek's config.json: its config class sets head_dim to it
        return positive_int("qk_rope_head_dim", rope_head_dim)
    hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    if hidden is None or heads is None:
        raise PosencValueError(
            "config names neither head_dim nor hidden_size and num_attention_heads, got "
            f"hidden_size={hidden!r}, num_attention_heads={heads!r}"
        )
    hidden = positive_int("hidden_size", hidden)
    heads = positive_int("num_attention_heads", heads)
    return positive_int("hidden_size // num_attention_heads", hidden // heads)


def _agreeing(values: dict[str, Any], what: str) -> Any:
    """The one value several fields give for ``what``; raise naming them when they differ."""
    if len(set(values.values())) > 1:
        listed = ", ".join(f"{name}={value!r}" for name, value in values.items())
        raise PosencValueError(f"config fields for the {what} contradict each other: {listed}")
    return next(iter(values.values()), None)


def base_of(cfg: Fields, field: str, params: dict[str, Any], model_type: str) -> float:
    if model_type in FIXED_BASE_MODEL_TYPES:
        stated = {
            name: value
            for name in ("rope_theta", "rotary_emb_base", "rope_parameters", "rope_scaling")
            if (value := cfg.get(name)) is not None and value != {}
        }
        if stated:
            name, value = next(iter(stated.items()))
            raise PosencValueError(
                f"config of model_type {model_type!r} sets {name}={value!r}, but transformers' "
                f"{model_type} code ignores it (base 10000, no scaling); remove it or pass "
                "base=/scaling= explicitly"
            )
        return 10000.0
    legacy = {
        name: number(name, value)
        for name in ("rope_theta", "rotary_emb_base")
        if (value := cfg.get(name)) is not None
    }
    top = _agreeing(legacy, "RoPE base")
    if params.get("rope_theta") is not None:
        return number(f"{field}['rope_theta']", params["rope_theta"])
    if top is not None:
        return top
    default = cfg.get("default_theta")  # a class attribute of transformers 5 configs
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        return float(default)
    return 10000.0


def _factor(field: str, value: Any) -> float:
    factor = number(field, value)
    if not 0.0 < factor <= 1.0:
        raise PosencValueError(f"config {field} must be in (0, 1], got {value!r}")
    return factor


def spans_head(params: Mapping[str, Any]) -> bool:
    """Whether ``params`` names a rope type whose rotation spans the head (its
    ``partial_rotary_factor`` belongs to its frequencies, not to the rotary dimension)."""
    kind = ROPE_TYPES.get(str(params.get("rope_type", params.get("type", "default"))))
    return kind is not None and kind.spans_head


def rotary_dim_of(
    cfg: Fields, field: str, params: dict[str, Any], head_dim: int, model_type: str
) -> int:
    """``r`` from the fraction fields and ``rotary_dim``, checked even and ``<= head_dim``
    (a rope type that spans the head, proportional RoPE, reads its fraction itself)."""
    if spans_head(params):
        return head_dim
    factor_field, factor = None, None
    if params.get("partial_rotary_factor") is not None:
        factor_field = f"{field}['partial_rotary_factor']"
        factor = _factor(factor_field, params["partial_rotary_factor"])
    else:
        legacy = {
            name: _factor(name, value)
            for name in ("partial_rotary_factor", "rotary_pct")
            if (value := cfg.get(name)) is not None
        }
        factor = _agreeing(legacy, "rotated fraction")
        factor_field = next(iter(legacy), None)
    absolute = None if model_type in ROTARY_DIM_IGNORED_MODEL_TYPES else cfg.get("rotary_dim")
    if absolute is not None:
        absolute = positive_int("rotary_dim", absolute)
        if factor is not None and int(head_dim * factor) != absolute:
            raise PosencValueError(
                f"config fields for the rotary dimension contradict each other: "
                f"rotary_dim={absolute} but {factor_field}={factor!r} gives "
                f"int({head_dim} * {factor!r}) = {int(head_dim * factor)} (head_dim={head_dim})"
            )
        source, r = "rotary_dim", absolute
    elif factor is not None:
        source, r = f"{factor_field}={factor!r} of head_dim={head_dim}", int(head_dim * factor)
    elif model_type in PARTIAL_MODEL_TYPES:
        raise PosencValueError(
            f"config of model_type {model_type!r} names no partial_rotary_factor or rotary_pct "
            "(its transformers code rotates only part of each head by default); "
            "set the field or pass rotary_dim= explicitly"
        )
    else:
        source, r = "head_dim", head_dim
    if r > head_dim:
        raise PosencValueError(
            f"config rotary_dim ({r}, from {source}) must be <= head_dim ({head_dim})"
        )
    if r < 2 or r % 2:
        raise PosencValueError(
            f"config rotary dimension {r} (from {source}) must be even and >= 2; transformers "
            "rounds an odd one up with frequencies posenc does not represent"
        )
    if model_type in NTK_ALPHA_MODEL_TYPES and r != head_dim:
        raise PosencValueError(
            f"config of model_type {model_type!r} rotates {r} of {head_dim} channels (from "
            f"{source}), but its code rotates the whole head whatever the fraction says (its "
            "default and NTK-alpha frequencies ignore it; with other types its apply fails)"
        )
    return r
