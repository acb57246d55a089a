"""What a family's attention does to its scores besides positions, as its transformers code
does it (5.24): learned sinks, logit soft-capping, the softmax scale, the key/value heads of
Falcon's fused projection; and, refused by name, what posenc's attention does not do.

No field states that a family has sinks, or which field its attention turns into its softmax
scale: these follow from the ``model_type``, like the pair layout of its rotation
(:mod:`~.model_types`). ``tests/hf/test_attention_fields.py`` finds, from every
modeling file of the families posenc builds, the attention classes' sinks
(``self.sinks = nn.Parameter``), soft-capping (``softcap=``), scale (``self.scaling = ...``
from a config field) and every other config field they read, and checks that each is read
here, refused here, or named there as not touching the scores (sizes, dropout, projection
biases, and the q/k norms: a norm of q or k is part of the projections, which posenc's layers
replace with their own, not a change of the scores given q and k).

==========================  ================================================================
what the attention does     how posenc reads it (per layer: :class:`LayerScores`)
==========================  ================================================================
sinks                       :data:`SINK_MODEL_TYPES`: a learned logit per head beside the
                            keys (gpt-oss's ``s_aux``), on every layer or on one layer type
soft-capping                :data:`SOFTCAP_MODEL_TYPES`: ``c · tanh(scores / c)`` with
                            ``c = attn_logit_softcapping`` (``None``: no capping)
softmax scale               :data:`SCALE_FIELDS`: ``query_pre_attn_scalar ** -0.5`` (Gemma),
                            ``attention_multiplier`` (Granite, HyperCLOVA X), ``qk_scale_factor
                            / sqrt(head_dim)`` (MuseGlimmer, MuseSpark); 1 (Dia,
                            :data:`FIXED_SCALES`); a YaRN
                            ``mscale_all_dim`` (DeepSeek) is the rotary module's
                            ``softmax_scale`` (:func:`mscale_softmax_scale`)
key/value heads             Falcon: ``num_kv_heads`` with ``new_decoder_architecture``, else
                            1 with ``multi_query``, else ``num_attention_heads``
                            (:func:`falcon_kv_heads`)
==========================  ================================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import PosencValueError
from .fields import Fields, number, positive_int

__all__ = [
    "ALWAYS_REFUSED",
    "FIXED_SCALES",
    "MSCALE_MODEL_TYPES",
    "REFUSED_SCORE_FIELDS",
    "SCALE_FIELDS",
    "SINK_MODEL_TYPES",
    "SOFTCAP_MODEL_TYPES",
    "LayerScores",
    "falcon_kv_heads",
    "layer_scores",
    "mscale_softmax_scale",
    "refuse_unread",
]

#: Families whose attention holds a learned sink logit per head (``self.sinks =
#: nn.Parameter``, passed as ``s_aux``) -> the layer type that has it (``None``: every layer).
SINK_MODEL_TYPES: dict[str, str | None] = {
    "flint": None,
    "gpt_oss": None,
    "openai_privacy_filter": None,
}

#: Families whose attention passes ``softcap=config.attn_logit_softcapping`` (``None`` in the
#: config: no capping). Gemma 3 and T5Gemma 2 keep the field but pass no ``softcap``: their
#: attention does not cap, whatever it holds, and neither does posenc's.
SOFTCAP_MODEL_TYPES = frozenset({"gemma2", "t5_gemma_module", "vaultgemma"})


def _pre_attn_scalar(value: float, head_dim: int) -> float:
    return value**-0.5


def _multiplier(value: float, head_dim: int) -> float:
    return value


def _times_default(value: float, head_dim: int) -> float:
    return value * head_dim**-0.5


#: Families whose softmax scale is a config field -> (the field, scale from (value, head_dim)).
SCALE_FIELDS: dict[str, tuple[str, Callable[[float, int], float]]] = {
    **dict.fromkeys(
        (
            "gemma2",
            "gemma3_text",
            "step3p5",
            "t5_gemma_module",
            "t5gemma2_decoder",
            "t5gemma2_text",
            "vaultgemma",
        ),
        ("query_pre_attn_scalar", _pre_attn_scalar),
    ),
    **dict.fromkeys(
        (
            "granite",
            "granite4_vision_text",
            "granite_docling_text",
            "granitemoe",
            "granitemoeshared",
            "hyperclovax",
        ),
        ("attention_multiplier", _multiplier),
    ),
    # q = qk_norm(q) * qk_scale_factor, then the usual 1/sqrt(head_dim)
    **dict.fromkeys(("muse_glimmer_text", "muse_spark_text"), ("qk_scale_factor", _times_default)),
}

#: Families whose attention has a fixed softmax scale of its own (-> the scale): Dia's
#: self-attention takes ``scaling = 1``, no ``1 / sqrt(head_dim)``.
FIXED_SCALES: dict[str, float] = {"dia_decoder": 1.0, "dia_encoder": 1.0}

_SINK_PROJ = "data-dependent sinks (a projection of each token gives its sink logits)"
_CLIP = "q, k and v are clamped to ±clip_qkv before the scores"

#: What posenc's attention does not do, by family -> {field: why}; refused by name where the
#: field is set (not ``None``), or for the families of :data:`ALWAYS_REFUSED` whatever it
#: holds.
REFUSED_SCORE_FIELDS: dict[str, dict[str, str]] = {
    "inkling2_text": {"sink_proj": _SINK_PROJ},
    "inkling2_loop_text": {"sink_proj": _SINK_PROJ},
    "mimo_v2_flash": {
        "attention_value_scale": "its sliding layers have twice the key/value heads and sinks, "
        "its values another head size (v_head_dim) and a scale (attention_value_scale)"
    },
    "doge": {
        "keep_window_size": "a dynamic mask (a learned bias per key from the values, its "
        "top keep_window_size kept) is added to the scores"
    },
    "diffllama": {
        "lambda_std_dev": "differential attention (two softmaxes subtracted, weighted by "
        "learned lambdas)"
    },
    "timesfm2_5": {"head_dim": "a learned scale per query dimension (self.scaling = nn.Parameter)"},
    "olmo": {"clip_qkv": _CLIP},
    "olmoe": {"clip_qkv": _CLIP},
    "dbrx": {"attn_config.clip_qkv": _CLIP},  # (DBRX's released config sets 8)
}
#: Of :data:`REFUSED_SCORE_FIELDS`, the families refused whatever the field holds (the field
#: names what their attention does; a config may not state it).
ALWAYS_REFUSED = frozenset(
    {"inkling2_text", "inkling2_loop_text", "mimo_v2_flash", "doge", "diffllama", "timesfm2_5"}
)

#: Per-layer head counts: refused unless every layer has the config's count.
PER_LAYER_HEADS = {
    "num_attention_heads_per_layer": "num_attention_heads",
    "num_key_value_heads_per_layer": "num_key_value_heads",
}


@dataclass(frozen=True)
class LayerScores:
    """What one layer's attention does to its scores: sinks, soft-capping, softmax scale
    (``None``: ``1 / sqrt(head_dim)``)."""

    sinks: bool = False
    softcap: float | None = None
    softmax_scale: float | None = None


def refuse_unread(raw: Fields, model_type: str, depth: int) -> None:
    """Refuse, by name, the fields of :data:`REFUSED_SCORE_FIELDS` a config sets and
    per-layer head counts that differ from the config's."""
    for field, why in REFUSED_SCORE_FIELDS.get(model_type, {}).items():
        value = _nested(raw, field)
        if model_type in ALWAYS_REFUSED or value is not None:
            stated = f"={value!r}" if value is not None else ""
            raise PosencValueError(
                f"config model_type={model_type!r} ({field}{stated}): {why}, which posenc's "
                "attention does not do; refused rather than built without it"
            )
    for field, whole in PER_LAYER_HEADS.items():
        counts = raw.get(field)
        if counts is None:
            continue
        if isinstance(counts, (list, tuple)) and set(counts[:depth]) <= {raw.get(whole)}:
            continue
        raise PosencValueError(
            f"config model_type={model_type!r} has {field}={counts!r}, which differs from "
            f"{whole}={raw.get(whole)!r}: posenc's Encoder has one head count for every layer"
        )


def _nested(raw: Fields, field: str) -> Any:
    """``raw``'s ``field``, a dotted name reaching into a sub-config (``attn_config.clip_qkv``:
    an object's attribute or a dict's key), or ``None``."""
    outer, _, inner = field.partition(".")
    value = raw.get(outer)
    if not inner or value is None:
        return value
    return Fields(value).get(inner)


def layer_scores(
    raw: Fields, model_type: str, kinds: list[str], head_dim: int
) -> list[LayerScores]:
    """Each layer's :class:`LayerScores` as the family's attention does it (see the module
    docstring; :func:`refuse_unread` first); a config field that holds something its
    attention could not run is refused by name."""
    softcap = None
    if model_type in SOFTCAP_MODEL_TYPES and raw.get("attn_logit_softcapping") is not None:
        softcap = number("attn_logit_softcapping", raw.get("attn_logit_softcapping"))
        if softcap <= 0:
            raise PosencValueError(f"config attn_logit_softcapping must be > 0, got {softcap!r}")
    scale = None
    if model_type in SCALE_FIELDS:
        field, formula = SCALE_FIELDS[model_type]
        value = raw.get(field)
        if value is None:
            raise PosencValueError(
                f"config model_type={model_type!r} has no {field}, from which its attention "
                "takes its softmax scale"
            )
        value = number(field, value)
        if value <= 0:
            raise PosencValueError(f"config {field} must be > 0, got {value!r}")
        scale = _unless_default(formula(value, head_dim), head_dim)
    if model_type in FIXED_SCALES:
        scale = _unless_default(FIXED_SCALES[model_type], head_dim)
    sinks = SINK_MODEL_TYPES.get(model_type, False)
    return [
        LayerScores(
            sinks=model_type in SINK_MODEL_TYPES and (sinks is None or sinks == kind),
            softcap=softcap,
            softmax_scale=scale,
        )
        for kind in kinds
    ]


def _unless_default(scale: float, head_dim: int) -> float | None:
    """``scale``, or ``None`` where it is ``1 / sqrt(head_dim)`` (to rounding)."""
    return None if math.isclose(scale, head_dim**-0.5, rel_tol=1e-12) else scale


#: Families whose attention multiplies its softmax scale by ``yarn_get_mscale(factor,
#: mscale_all_dim) ** 2`` when the RoPE dictionary names a rope type and ``mscale_all_dim``
#: (``yarn_apply_mscale``; their scale is over ``qk_head_dim``, the whole latent head).
MSCALE_MODEL_TYPES = frozenset(
    {
        "axk1",
        "axk2",
        "bailing_hybrid",
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "glm4_moe_lite",
        "glm_moe_dsa",
        "hy_v4",
        "hy_v4_vl_text",
        "longcat_flash",
        "minicpm3",
        "mistral4",
        "mistral_large4_text",
        "sarvam_mla",
        "youtu",
    }
)


def mscale_softmax_scale(cfg: Fields, params: Mapping[str, Any], model_type: str) -> float | None:
    """The softmax scale of a :data:`MSCALE_MODEL_TYPES` family whose RoPE dictionary
    ``params`` changes it (``qk_head_dim ** -0.5 · mscale²``, ``mscale = 0.1 · mscale_all_dim
    · ln(factor) + 1`` for ``factor > 1``, as transformers' ``yarn_apply_mscale``), else
    ``None`` (the attention's own ``1 / sqrt`` of its head size)."""
    if model_type not in MSCALE_MODEL_TYPES:
        return None
    if params.get("rope_type", params.get("type", "default")) == "default":
        return None
    mscale_all_dim = params.get("mscale_all_dim") or 0
    if not mscale_all_dim:
        return None
    factor = number("rope_parameters['factor']", params.get("factor"))
    mscale = 1.0 if factor <= 1 else 0.1 * float(mscale_all_dim) * math.log(factor) + 1.0
    qk_head_dim = cfg.get("qk_head_dim")
    if qk_head_dim is None:
        nope, rope = cfg.get("qk_nope_head_dim"), cfg.get("qk_rope_head_dim")
        if nope is None or rope is None:
            raise PosencValueError(
                f"config of model_type {model_type!r} has no qk_head_dim (nor qk_nope_head_dim "
                "and qk_rope_head_dim), over which its attention's softmax scale is taken"
            )
        qk_head_dim = positive_int("qk_nope_head_dim", nope) + positive_int(
            "qk_rope_head_dim", rope
        )
    return positive_int("qk_head_dim", qk_head_dim) ** -0.5 * mscale * mscale


def falcon_kv_heads(raw: Fields, heads: int) -> int:
    """Falcon's key/value heads, as ``FalconAttention`` takes them: ``num_kv_heads`` (default
    ``num_attention_heads``) with ``new_decoder_architecture``, else 1 with ``multi_query``
    (the config class defaults: false, true), else ``num_attention_heads``."""
    new = raw.get("new_decoder_architecture")
    multi_query = raw.get("multi_query")
    multi_query = True if multi_query is None else multi_query
    if new:
        stated = raw.get("num_kv_heads")
        return heads if stated is None else positive_int("num_kv_heads", stated)
    return 1 if multi_query else heads
