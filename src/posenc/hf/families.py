"""The RoPE dictionaries some transformers families read their own way, as
:func:`family_scaling` rewrites them for the generic reading of :mod:`~.config`, and the
slice of each head that latent attention rotates (:func:`rope_slice`). Each is checked against
the family's own code (transformers 5.24) in ``tests/hf/test_config.py``.

* **HunYuan** (:data:`~.model_types.NTK_ALPHA_MODEL_TYPES`): its checkpoints say
  ``{"type": "dynamic", "alpha": 1000.0, "factor": 1.0, "beta_fast": 32, ...}``; its rotary
  module turns ``dynamic`` with a non-zero ``alpha`` into NTK-alpha, which reads ``alpha``
  and ``rope_theta`` and nothing else.
* **PhiMoE** (:data:`~.model_types.LONGROPE_MSCALE_MODEL_TYPES`): LongRoPE whose attention
  factor is ``short_mscale`` up to the original context and ``long_mscale`` past it, and
  whose frequencies, recomputed on every call without the length, are the short factors at
  every length (transformers 5.24; vLLM's LongRoPE switches to the long factors there).
* **Ministral 3, Mistral 4** (:data:`~.model_types.QUERY_SCALE_MODEL_TYPES`): their RoPE
  dictionary carries ``llama_4_scaling_beta`` (a query scale applied by their attention,
  read by :func:`~.config.query_scale_from_hf_config`) and a ``max_position_embeddings``
  that no rotary function reads: neither is part of the rotation.
"""

from __future__ import annotations

from typing import Any

from ..encodings.rope_types.registry import ntk_alpha_scaling
from ..errors import PosencValueError
from .fields import Fields, positive_int
from .model_types import (
    LONGROPE_MSCALE_MODEL_TYPES,
    NTK_ALPHA_MODEL_TYPES,
    QUERY_SCALE_MODEL_TYPES,
)

__all__ = ["NOT_ROTATION_KEYS", "family_scaling", "rope_slice"]

#: Keys of a Ministral 3 / Mistral 4 RoPE dictionary that are not part of the rotation.
NOT_ROTATION_KEYS = ("llama_4_scaling_beta", "max_position_embeddings")


def family_scaling(model_type: str, scaling: dict[str, Any], field: str) -> dict[str, Any]:
    """The RoPE dictionary ``scaling`` (read from ``field``) as ``model_type``'s rotary code
    reads it (see the module docstring); other families' dictionaries are returned as they
    are."""
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if model_type in NTK_ALPHA_MODEL_TYPES:
        scaling = ntk_alpha_scaling(scaling)
        if scaling.get("rope_type") == "ntk_alpha":
            return scaling
    elif rope_type == "dynamic" and "alpha" in scaling:
        # posenc reads a given dictionary's alpha as NTK-alpha (vLLM's spelling), but this
        # family's transformers code runs dynamic NTK and never reads it
        raise PosencValueError(
            f"config {field} of model_type {model_type!r} has rope_type 'dynamic' with "
            f"alpha={scaling['alpha']!r}: its transformers code runs dynamic NTK without "
            "reading alpha; refused rather than read two ways"
        )
    if model_type in LONGROPE_MSCALE_MODEL_TYPES and rope_type not in (None, "default"):
        missing = [key for key in ("short_mscale", "long_mscale") if scaling.get(key) is None]
        if missing:
            raise PosencValueError(
                f"config {field} of model_type {model_type!r} has rope_type={rope_type!r} but "
                f"no {' or '.join(missing)}: its rotary code reads both"
            )
        scaling = {key: value for key, value in scaling.items() if key != "attention_factor"}
        if rope_type == "longrope" and "short_factor" in scaling:
            scaling["long_factor"] = scaling["short_factor"]  # its frequencies never switch
    if model_type in QUERY_SCALE_MODEL_TYPES:
        scaling = {key: value for key, value in scaling.items() if key not in NOT_ROTATION_KEYS}
    return scaling


def rope_slice(cfg: Fields, head_dim: int, rotary_dim: int) -> tuple[int, int]:
    """``(head_dim, rotary_dim)`` of the rotation: for latent attention (a
    ``qk_rope_head_dim``), that slice of each head alone, all of it turned (DeepSeek-V4,
    Mistral 4 and dots3 rotate the trailing ``qk_rope_head_dim`` channels of a larger head);
    the family's rotary tables (``rotary_dim`` as read over ``head_dim``) must be that wide,
    or its attention fails. Otherwise as read."""
    rope_head_dim = cfg.get("qk_rope_head_dim")
    if not rope_head_dim:
        return head_dim, rotary_dim
    rope_head_dim = positive_int("qk_rope_head_dim", rope_head_dim)
    if rotary_dim != rope_head_dim:
        raise PosencValueError(
            f"config has qk_rope_head_dim={rope_head_dim} (head_dim={head_dim}), but its "
            f"rotary tables would have {rotary_dim} channels: the attention rotates the "
            f"qk_rope_head_dim slice of each head with them, so they must have {rope_head_dim} "
            f"(partial_rotary_factor {rope_head_dim}/{head_dim})"
        )
    return rope_head_dim, rope_head_dim
