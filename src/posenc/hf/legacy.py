"""posenc's own rules for a ``config.json`` dict read without transformers' config class
(transformers missing, the route switched off, or a ``model_type`` it does not know).

They derive what transformers' config classes derive from the legacy spellings that most
``config.json`` files on the Hub carry (checked against transformers 5.24 in
``tests/hf/test_differential.py``), and refuse, naming the field, anything else that would
change a layer: never a silent default.

==============================  ============================================================
legacy field                    derived as transformers' config classes derive it
==============================  ============================================================
``sliding_window_pattern`` p    ``layer_types``: layer ``i`` slides unless ``(i + 1) % p == 0``
                                (Gemma 3, Cohere 2; Gemma 2 is ``p = 2`` without the field)
``use_sliding_window``,         ``layer_types``: layer ``i`` slides when the window is on and
``max_window_layers`` m         ``i >= m`` (Qwen 2 and its kin); off, no layer has a window
``no_rope_layer_interval`` k    ``no_rope_layers`` (missing or empty): layer ``i`` is NoPE when
                                ``(i + 1) % k == 0`` (SmolLM3, Llama 4)
``attention_chunk_size``        ``layer_types``: the RoPE layers are chunked (Llama 4)
``rope_local_base_freq``        RoPE nested by layer type: sliding layers turn with that θ, the
                                full ones with ``rope_theta`` and ``rope_scaling`` (Gemma 3)
``rope_theta``, ``rope_scaling``  read by :mod:`.config` as they are
==============================  ============================================================

Families with rules of their own (:data:`FAMILY_RULES`: the defaults their config class uses
where a field is absent, and how it places sliding layers) are read exactly; the other families
whose config class derives a schedule (:data:`DERIVING_MODEL_TYPES`) are refused unless the
dict states ``layer_types`` (and ``no_rope_layers`` where the family has it), and the other
families transformers knows are refused when they state a legacy layer field without
``layer_types``, since each places layers by its own formula. The generic rules above serve
model types transformers does not know. A field that changes layers in ways the rules do not
read (:data:`UNREAD_LAYER_FIELDS`) is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import PosencTypeError, PosencValueError
from .model_types import KNOWN_MODEL_TYPES

__all__ = ["DERIVING_MODEL_TYPES", "FAMILY_RULES", "UNREAD_LAYER_FIELDS", "derive"]

SLIDING, FULL, CHUNKED = "sliding_attention", "full_attention", "chunked_attention"

Place = Callable[[dict[str, Any], int], list[str]]


def _by_pattern(raw: dict[str, Any], depth: int) -> list[str]:
    """Gemma 2/3, Cohere 2: every ``sliding_window_pattern``-th layer is full."""
    p = _count(raw, "sliding_window_pattern")
    return [SLIDING if (i + 1) % p else FULL for i in range(depth)]


def _by_max_window_layers(raw: dict[str, Any], depth: int) -> list[str]:
    """Qwen 2: layers from ``max_window_layers`` on slide, when the window is on."""
    on = raw.get("use_sliding_window") and raw.get("sliding_window") is not None
    first = _count(raw, "max_window_layers") if on else depth
    return [SLIDING if on and i >= first else FULL for i in range(depth)]


def _chunked_rope_layers(raw: dict[str, Any], depth: int) -> list[str]:
    """Llama 4: the RoPE layers are chunked (when a chunk size is set)."""
    chunked = raw.get("attention_chunk_size") is not None
    return [CHUNKED if rope and chunked else FULL for rope in raw["no_rope_layers"][:depth]]


def _sliding_nope_layers(raw: dict[str, Any], depth: int) -> list[str]:
    """SmolLM3: with the window on, the NoPE layers slide."""
    on = raw.get("use_sliding_window") and raw.get("sliding_window") is not None
    return [SLIDING if on and not rope else FULL for rope in raw["no_rope_layers"][:depth]]


def _global_every_n(raw: dict[str, Any], depth: int) -> list[str]:
    """ModernBERT: layer ``i`` is global when ``i % global_attn_every_n_layers == 0``."""
    n = _count(raw, "global_attn_every_n_layers")
    return [SLIDING if i % n else FULL for i in range(depth)]


#: model_type -> (the defaults its config class fills where a field is absent, how it places
#: sliding/chunked layers). Checked field by field against the config classes.
FAMILY_RULES: dict[str, tuple[dict[str, Any], Place | None]] = {
    "gemma2": ({"sliding_window": 4096, "sliding_window_pattern": 2}, _by_pattern),
    "gemma3_text": (
        {
            "sliding_window": 4096,
            "sliding_window_pattern": 6,
            "rope_theta": 1e6,
            "rope_local_base_freq": 1e4,
        },
        _by_pattern,
    ),
    "cohere2": ({"sliding_window": 4096, "sliding_window_pattern": 4}, _by_pattern),
    "qwen2": (
        {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28},
        _by_max_window_layers,
    ),
    "qwen3": (
        {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28},
        _by_max_window_layers,
    ),
    "llama4_text": (
        {"no_rope_layer_interval": 4, "attention_chunk_size": 8192, "rope_theta": 5e5},
        _chunked_rope_layers,
    ),
    "smollm3": (
        {"no_rope_layer_interval": 4, "use_sliding_window": False, "rope_theta": 2e6},
        _sliding_nope_layers,
    ),
    "mistral": ({"sliding_window": 4096, "rope_theta": 1e4}, None),
    "modernbert": (
        {
            "global_attn_every_n_layers": 3,
            "local_attention": 128,
            "global_rope_theta": 160000.0,
            "local_rope_theta": 10000.0,
        },
        _global_every_n,
    ),
}

#: Families whose config class derives ``layer_types`` or ``no_rope_layers`` (or per-layer
#: RoPE) from fields and defaults of its own, not covered by :data:`FAMILY_RULES`: without
#: transformers their dict must state these fields (model_type -> the fields).
DERIVING_MODEL_TYPES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        (
            "afmoe",
            "cwm",
            "dory",
            "dots1",
            "exaone4",
            "exaone_moe",
            "flint",
            "gpt_oss",
            "kolibri1",
            "laguna",
            "lfm2",
            "mellum",
            "mimo_v2_flash",
            "minimax_m3_vl_text",
            "ministral",
            "modernbert-decoder",
            "muse_glimmer_assistant",
            "neomme",
            "olmo3",
            "step3p5",
            "t5_gemma_module",
            "t5gemma2_decoder",
            "t5gemma2_text",
            "ultrabert",
            "vaultgemma",
        ),
        ("layer_types",),
    ),
    **dict.fromkeys(("muse_glimmer_text", "muse_spark_text"), ("layer_types", "layer_rope_theta")),
}

#: Fields that change which layers slide, rotate or with which θ, read only by the families of
#: :data:`FAMILY_RULES` that have them: elsewhere they are refused by name, unless the dict
#: states the field they would derive (field -> that field).
UNREAD_LAYER_FIELDS = {
    "global_attn_every_n_layers": "layer_types",
    "sliding_window_layers": "layer_types",
    "full_attention_interval": "layer_types",
    "layers_block_type": "layer_types",
    "local_attention": "sliding_window",
    "global_rope_theta": "rope_parameters",
    "local_rope_theta": "rope_parameters",
}

#: Fields whose stated ``null`` the config classes keep, switching the windows (chunks) off:
#: their default applies only where the field is absent (Mistral 7B v0.2 publishes
#: ``"sliding_window": null``).
NULL_SWITCHES_OFF = ("sliding_window", "attention_chunk_size")

#: The attention fields of the families whose softmax scale or soft-capping a config field sets
#: (:mod:`.scores`), by the defaults their config class fills where the field is absent
#: (a stated ``null`` is kept: no capping). ``"head_dim"``: the class derives it from the
#: head size (Step 3.5: ``query_pre_attn_scalar = head_dim``; HyperCLOVA X:
#: ``attention_multiplier = head_dim ** -0.5``), also from a stated ``null``.
SCORE_DEFAULTS: dict[str, dict[str, Any]] = {
    **{
        model_type: {"query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0}
        for model_type in ("gemma2", "vaultgemma", "t5_gemma_module")
    },
    **{
        model_type: {"query_pre_attn_scalar": 256}
        for model_type in ("gemma3_text", "t5gemma2_text", "t5gemma2_decoder")
    },
    **{
        model_type: {"attention_multiplier": 1.0}
        for model_type in ("granite", "granite4_vision_text", "granitemoe", "granitemoeshared")
    },
    "granite_docling_text": {"attention_multiplier": 0.015625},
    "hyperclovax": {"attention_multiplier": "head_dim"},
    "muse_glimmer_text": {"qk_scale_factor": 3.87},
    "muse_spark_text": {"qk_scale_factor": 5.4730064863875},
    "step3p5": {"query_pre_attn_scalar": "head_dim"},
}

#: The legacy fields the generic rules read (any model_type).
_GENERIC = ("sliding_window_pattern", "max_window_layers", "no_rope_layer_interval")


def _count(raw: Mapping[str, Any], key: str) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PosencValueError(f"config {key} must be a positive int, got {value!r}")
    return value


def _depth(raw: Mapping[str, Any], field: str) -> int:
    if raw.get("num_hidden_layers") is None:
        raise PosencValueError(
            f"config has {field} but no num_hidden_layers, from which posenc's own rules "
            "derive the layers (transformers' config class would take its default)"
        )
    return _count(raw, "num_hidden_layers")


def _nested_rope(raw: dict[str, Any], local: Any, global_: Any, both: bool) -> None:
    """RoPE parameters nested by layer type from legacy fields: sliding layers turn with
    ``local``, full ones with ``global_``; ``rope_scaling`` on the full layers (Gemma 3) or on
    both (``both``: ModernBERT)."""
    scaling = raw.pop("rope_scaling", None) or {}
    if not isinstance(scaling, Mapping):
        raise PosencTypeError(f"config rope_scaling must be a dict, got {scaling!r}")
    full = {"rope_type": "default", **scaling, "rope_theta": global_}
    sliding = {"rope_type": "default", **(scaling if both else {}), "rope_theta": local}
    raw["rope_parameters"] = {SLIDING: sliding, FULL: full}
    raw.pop("rope_theta", None)


def derive(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (a ``config.json`` dict) with the fields transformers' config class would
    derive, derived by posenc's own rules (see the module docstring); a composite config's
    ``text_config`` likewise. Raises :class:`~posenc.errors.PosencValueError` naming the field
    where a layer would depend on something these rules do not read."""
    raw = dict(config)
    if isinstance(raw.get("text_config"), Mapping):
        raw["text_config"] = derive(raw["text_config"])
    model_type = str(raw.get("model_type") or "")
    defaults, place = FAMILY_RULES.get(model_type, ({}, None))
    stated = {key for key, value in raw.items() if value is not None}
    nulls = [k for k in defaults if k in raw and raw[k] is None and k not in NULL_SWITCHES_OFF]
    if nulls:  # transformers' class keeps a stated null: a default here would be a guess
        raise PosencValueError(
            f"config of model_type {model_type!r} states {', '.join(nulls)} as null, which "
            "posenc's own rules (used without transformers) do not read as a default; state "
            "a value, or install transformers"
        )
    for key, value in defaults.items():
        if key not in raw:
            raw[key] = value
    _score_defaults(raw, model_type)
    needed = DERIVING_MODEL_TYPES.get(model_type, ())
    missing = [key for key in needed if raw.get(key) is None]
    if missing:
        raise PosencValueError(
            f"config of model_type {model_type!r} has no {', '.join(missing)}: its transformers "
            "config class derives it from defaults of its own, which posenc's rules (used "
            "without transformers) do not know; state it, or install transformers"
        )
    unread = [
        key
        for key, needs in UNREAD_LAYER_FIELDS.items()
        if key in stated and key not in defaults and raw.get(needs) is None
    ]
    if unread:
        raise PosencValueError(
            f"config of model_type {model_type!r} has {', '.join(unread)}, which changes its "
            "layers in a way posenc's own rules (used without transformers) do not read; "
            "state layer_types and rope_parameters, or install transformers"
        )
    if model_type in KNOWN_MODEL_TYPES and model_type not in FAMILY_RULES:
        _refuse_family_pattern(raw, model_type)
    if "local_attention" in defaults and raw.get("sliding_window") is None:
        raw["sliding_window"] = _count(raw, "local_attention") // 2  # ModernBERT's property
    if not raw.get("no_rope_layers") and raw.get("no_rope_layer_interval") is not None:
        k = _count(raw, "no_rope_layer_interval")
        depth = _depth(raw, "no_rope_layer_interval")
        raw["no_rope_layers"] = [int((i + 1) % k != 0) for i in range(depth)]
    if raw.get("layer_types") is None:
        if place is None:
            generic = next((key for key in _GENERIC if raw.get(key) is not None), None)
            place = {
                "sliding_window_pattern": _by_pattern,
                "max_window_layers": _by_max_window_layers,
            }.get(generic or "")
            if place is None and raw.get("attention_chunk_size") and raw.get("no_rope_layers"):
                place = _chunked_rope_layers
        if place is not None:
            raw["layer_types"] = place(raw, _depth(raw, "a layer pattern"))
    if "global_rope_theta" in defaults and not raw.get("rope_parameters"):
        _nested_rope(raw, raw["local_rope_theta"], raw["global_rope_theta"], both=True)
    elif raw.get("rope_local_base_freq") is not None and not _nested(raw):
        theta = raw.get("rope_theta", (raw.get("rope_parameters") or {}).get("rope_theta"))
        if theta is None:
            raise PosencValueError(
                "config has rope_local_base_freq but no rope_theta for its full layers"
            )
        if raw.get("rope_parameters") and not raw.get("rope_scaling"):
            raw["rope_scaling"] = raw.pop("rope_parameters")
        _nested_rope(raw, raw["rope_local_base_freq"], theta, both=False)
    return raw


def _score_defaults(raw: dict[str, Any], model_type: str) -> None:
    """Fill :data:`SCORE_DEFAULTS` as the family's config class does (an absent field its
    default; a ``"head_dim"`` default from the stated ``head_dim``, refused by name without
    one)."""
    for key, value in SCORE_DEFAULTS.get(model_type, {}).items():
        if value == "head_dim":
            if raw.get(key) is not None:
                continue
            if raw.get("head_dim") is not None:
                head_dim = _count(raw, "head_dim")
            elif raw.get("hidden_size") is not None and raw.get("num_attention_heads"):
                head_dim = _count(raw, "hidden_size") // _count(raw, "num_attention_heads")
            else:
                raise PosencValueError(
                    f"config of model_type {model_type!r} has no {key} and no head_dim, from "
                    "which its transformers config class derives it; state it, or install "
                    "transformers"
                )
            raw[key] = head_dim**-0.5 if key == "attention_multiplier" else head_dim
        elif key not in raw:
            raw[key] = value


def _refuse_family_pattern(raw: Mapping[str, Any], model_type: str) -> None:
    """A family transformers knows (:data:`~.model_types.KNOWN_MODEL_TYPES`) without rules
    here places its layers by a formula of its own (Qwen2-MoE windows every other layer below
    ``max_window_layers``, Qwen 2 those from it on): a legacy layer field it states is refused
    by name rather than read by another family's formula."""
    if raw.get("layer_types") is None:
        placing = [key for key in _GENERIC if raw.get(key) is not None]
        placing = [key for key in placing if key != "max_window_layers"]
        if raw.get("use_sliding_window"):
            placing.append("use_sliding_window")
        if raw.get("attention_chunk_size") is not None:
            placing.append("attention_chunk_size")
    else:
        placing = []
    if raw.get("no_rope_layers") is None and raw.get("no_rope_layer_interval") is not None:
        placing.append("no_rope_layer_interval")
    if placing:
        raise PosencValueError(
            f"config of model_type {model_type!r} has {', '.join(sorted(set(placing)))} but no "
            "layer_types/no_rope_layers: its transformers config class places the layers by a "
            "formula posenc's own rules (used without transformers) do not know; state "
            "layer_types (and no_rope_layers), or install transformers"
        )


def _nested(raw: Mapping[str, Any]) -> bool:
    params = raw.get("rope_parameters")
    return isinstance(params, Mapping) and SLIDING in params and FULL in params
