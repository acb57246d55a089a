"""Reading a transformers model config into :class:`~posenc.RotaryEmbedding` arguments.

Model families state the same four RoPE facts (head dimension, rotated dimension, base, pair
layout) plus the context-extension dictionary in different fields. This module reads every
spelling found in transformers' configs and modeling code (checked against transformers 5.24,
``tests/hf/test_config.py``) and refuses, with a
:class:`~posenc.errors.PosencValueError` naming the field and its value, any config it cannot
map exactly. The head dimension, rotated dimension and base are read by
:mod:`~.dimensions`, the rest here.

No field states the pair layout or the sense of rotation: they follow from the ``model_type``,
so only the types in :data:`KNOWN_MODEL_TYPES` (``hf/model_types.py``: each checked against its
own transformers code, version :data:`CHECKED_TRANSFORMERS_VERSION`) and the multimodal-RoPE
types (:data:`MROPE_MODEL_TYPES`, each with its layout in :mod:`~.mrope_layouts`) are read
silently. Any other
non-empty ``model_type`` is read from the generic fields below with a one-time ``UserWarning``,
or refused with ``strict=True``; a ``config.json`` dict without one is read without a warning.

==================  =========================================================================
fact                where transformers keeps it (first match wins unless stated)
==================  =========================================================================
head dim ``d``      ``head_dim`` (Gemma, Qwen3, Mistral-Nemo); else ``qk_rope_head_dim``
                    (DeepSeek's ``config.json``: its config class sets ``head_dim`` to it);
                    else ``hidden_size // num_attention_heads`` (GPT-J: ``n_embd // n_head``).
                    Set per layer (``per_layer_config``: Gemma 4's ``global_head_dim``), it
                    needs ``layer_type=`` and is read from that layer type's view.
                    Latent attention with ``qk_rope_head_dim != head_dim`` (DeepSeek-V4,
                    Mistral 4, dots3) rotates a ``qk_rope_head_dim`` slice of each head:
                    ``d = r = qk_rope_head_dim``, which ``int(head_dim * fraction)`` (the
                    width of the family's rotary tables) must equal
rotated dim ``r``   ``rope_parameters["partial_rotary_factor"]``, else top-level
                    ``partial_rotary_factor`` (Phi, StableLM, Persimmon, GLM) or ``rotary_pct``
                    (GPT-NeoX), as ``int(d * factor)``; ``rotary_dim`` (GPT-J, CodeGen,
                    MiniMax-M2) as an absolute count, except for
                    :data:`ROTARY_DIM_IGNORED_MODEL_TYPES` (MiniMax-M3-VL), whose code ignores
                    it; else ``d``. Every field present must give the same ``r``, except that
                    the dictionary wins over top-level factors, as transformers 5 standardises
                    it.
base θ              ``rope_parameters["rope_theta"]``, else top-level ``rope_theta`` or
                    ``rotary_emb_base`` (GPT-NeoX; the two must agree), else the config class's
                    ``default_theta``, else 10000. GPT-J and CodeGen fix 10000.
layout              interleaved pairs ``(2i, 2i+1)`` for the model types in
                    :data:`INTERLEAVED_MODEL_TYPES`; the same rotation written de-interleaved
                    (transformers' ``apply_rotary_pos_emb_interleave``) where
                    ``rope_interleave`` is true (DeepSeek-V3 family; unset, its config
                    class's default, ``ROPE_INTERLEAVE_DEFAULT_MODEL_TYPES``) and for
                    :data:`DEINTERLEAVED_MODEL_TYPES`; the half layout for the rest of
                    :data:`KNOWN_MODEL_TYPES`, and (unchecked, with a warning) for any other
                    ``model_type``
sense               each pair turns by ``-angle`` (``clockwise=True``) for
                    :data:`CLOCKWISE_MODEL_TYPES` (NanoChat), by ``+angle`` everywhere else
scaling             ``rope_parameters`` (transformers 5) or ``rope_scaling`` (4.x), legacy
                    ``"type"`` key included; nested by layer type (Gemma 3, ModernBERT) it needs
                    ``layer_type=``; a top-level ``original_max_position_embeddings`` (Phi-3)
                    takes priority for the types that need the original context
                    (``llama3``/``yarn``/``longrope``), as in transformers; ``dynamic`` takes
                    it from ``max_position_embeddings`` only (``RopeType.hf_ignores_original``).
                    Families that read the dictionary their own way (HunYuan's ``dynamic``
                    with ``alpha``: ``ntk_alpha``; PhiMoE's mscales; Ministral 3's
                    ``llama_4_scaling_beta``, a query scale: :func:`query_scale_from_hf_config`)
                    are read as their code reads it (``hf/families.py``)
==================  =========================================================================

A config may be a ``PretrainedConfig`` of either major version of transformers, any object with
those attributes, or a plain ``dict`` (a ``config.json`` as loaded, GPT-J's ``n_embd``-style
names included).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from ..encodings.checks import check_bool
from ..encodings.rope_types.builtin import ORIGINAL
from ..encodings.rope_types.registry import ROPE_TYPES, validate_rope_scaling
from ..errors import PosencError, PosencTypeError, PosencValueError
from .dimensions import base_of, head_dim_of, rotary_dim_of, spans_head
from .families import family_scaling, rope_slice
from .fields import Fields, for_layer_type, number, positive_int
from .model_types import (
    CHECKED_TRANSFORMERS_VERSION,
    CLOCKWISE_MODEL_TYPES,
    DEINTERLEAVED_MODEL_TYPES,
    FIXED_BASE_MODEL_TYPES,
    INTERLEAVED_MODEL_TYPES,
    KNOWN_MODEL_TYPES,
    MROPE_MODEL_TYPES,
    NOT_TOKEN_ROTATION_MODEL_TYPES,
    POSITION_TYPE_MODEL_TYPES,
    QUERY_SCALE_MODEL_TYPES,
    ROPE_INTERLEAVE_DEFAULT_MODEL_TYPES,
    ROPE_TYPE_ALIASES,
    ROTATES_ONLY_WITH,
)
from .mrope_layouts import read_multimodal
from .route import as_config
from .scores import MSCALE_MODEL_TYPES, mscale_softmax_scale

__all__ = [
    "query_scale_from_hf_config",
    "rotary_arguments_from_hf_config",
    "softmax_scale_from_hf_config",
]

#: ``model_type``s not in :data:`KNOWN_MODEL_TYPES` already warned about in this process.
_WARNED_MODEL_TYPES: set[str] = set()

#: Top-level fields that say a config describes a rotary embedding.
_ROPE_FIELDS = (
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "rotary_emb_base",
    "partial_rotary_factor",
    "rotary_pct",
    "rotary_dim",
)


def _has_rope_fields(cfg: Fields) -> bool:
    return any(cfg.get(name) not in (None, {}) for name in _ROPE_FIELDS)


def _text_model(config: Any) -> Fields:
    """The fields of ``config``, or of its ``text_config`` where it has no RoPE fields itself."""
    cfg = Fields(config)
    text = cfg.get("text_config")
    return Fields(text) if text is not None and not _has_rope_fields(cfg) else cfg


def _rope_dict(cfg: Fields, layer_type: str | None) -> tuple[str, dict[str, Any]]:
    """The RoPE dictionary for this layer type, and the field it came from (for messages)."""
    found = {
        name: value
        for name in ("rope_parameters", "rope_scaling")
        if (value := cfg.get(name)) is not None and value != {}
    }
    if len(found) == 2 and found["rope_parameters"] != found["rope_scaling"]:
        raise PosencValueError(
            "config has both rope_parameters and rope_scaling and they differ: "
            f"rope_parameters={found['rope_parameters']!r}, rope_scaling={found['rope_scaling']!r}"
        )
    field, params = next(iter(found.items()), ("rope_parameters", {}))
    if not isinstance(params, Mapping):
        raise PosencTypeError(f"config {field} must be a dict, got {params!r}")
    # Nested by layer type: keyed by the config's layer types (as transformers decides), or
    # holding nothing but dictionaries (and None for NoPE layers).
    labels = cfg.get("_rope_type_labels") or cfg.get("layer_types") or ()
    nested = [key for key in params if key in labels]
    if params and all(v is None or isinstance(v, Mapping) for v in params.values()):
        nested = list(params)
    if layer_type is None:
        if nested:
            raise PosencValueError(
                f"config {field} is nested by layer type {sorted(nested)}; pass layer_type="
            )
        return field, dict(params)
    if not nested:
        raise PosencValueError(
            f"config has no per-layer RoPE parameters for layer_type={layer_type!r} "
            f"({field} is not nested by layer type)"
        )
    if layer_type not in nested:
        raise PosencValueError(
            f"config has no RoPE parameters for layer_type={layer_type!r}; "
            f"{field} has {sorted(nested)}"
        )
    if params[layer_type] is None:
        raise PosencValueError(
            f"config {field}[{layer_type!r}] is None: layer_type={layer_type!r} uses no RoPE "
            "(a NoPE layer)"
        )
    return f"{field}[{layer_type!r}]", dict(params[layer_type])


def _scaling(
    cfg: Fields, field: str, params: dict[str, Any], model_type: str, nested: bool
) -> dict[str, Any] | None:
    """The context-extension part of ``params`` as this family's config means it (its old
    ``rope_type`` names renamed, which fields win for the original context), or ``None`` for
    plain RoPE. Everything else, the legacy ``"type"`` key included, is normalised once, by
    :class:`~posenc.encodings.rotary.spec.RotarySpec` (through ``validate_rope_scaling``)."""
    dropped = ("rope_theta",) if spans_head(params) else ("rope_theta", "partial_rotary_factor")
    scaling = {k: v for k, v in params.items() if k not in dropped}
    aliases = ROPE_TYPE_ALIASES.get(model_type, {})
    for key in ("rope_type", "type"):  # the family's config class renames these on load
        if isinstance(scaling.get(key), str) and scaling[key] in aliases:
            scaling[key] = aliases[scaling[key]]
    scaling = family_scaling(model_type, scaling, field)
    if scaling.get("rope_type") is None and scaling.get("type") is None:
        scaling["rope_type"] = "default"
    rope_type = scaling.get("rope_type", scaling.get("type"))
    # (an unknown rope_type is named by validate_rope_scaling, in the constructor)
    spec = ROPE_TYPES.get(rope_type) if isinstance(rope_type, str) else None
    original = cfg.get("original_max_position_embeddings")
    if spec is not None and spec.needs_original:
        if spec.hf_ignores_original:
            # transformers takes dynamic NTK's original context from max_position_embeddings only
            scaling.pop("original_max_position_embeddings", None)
        elif not nested and original is not None:
            scaling["original_max_position_embeddings"] = original  # Phi-3: the top level wins
    if rope_type == "default" and set(scaling) <= {"rope_type", "type"}:
        return None
    return scaling


def _unchecked_model_type(model_type: str, strict: bool, read: dict[str, Any]) -> None:
    """Refuse (``strict``), or warn once per process, about a ``model_type`` outside
    :data:`KNOWN_MODEL_TYPES`, whose configs were ``read`` from the generic fields."""
    unchecked = (
        f"config model_type {model_type!r} is not one of the model types checked against "
        f"transformers {CHECKED_TRANSFORMERS_VERSION}: for it, the pair layout (half or "
        "interleaved), the sense of rotation and which fields hold the head and rotary "
        "dimensions, base and scaling were not checked"
    )
    if strict:
        raise PosencValueError(
            f"{unchecked}; pass strict=False to read it from the generic fields anyway, or "
            "build RotaryEmbedding(...) from its modeling code"
        )
    if model_type in _WARNED_MODEL_TYPES:
        return
    _WARNED_MODEL_TYPES.add(model_type)
    shown = ", ".join(f"{name}={read[name]!r}" for name in ("head_dim", "rotary_dim", "base"))
    layout = "interleaved" if read["interleaved"] else "half"
    warnings.warn(
        f"{unchecked}; read from the generic fields as {shown}, {layout} layout (check these "
        "against its modeling code, or pass strict=True to refuse such configs)",
        UserWarning,
        stacklevel=3,
    )


def rotary_arguments_from_hf_config(
    config: Any, *, layer_type: str | None = None, strict: bool = False
) -> dict[str, Any]:
    """The :class:`~posenc.RotaryEmbedding` keyword arguments a transformers config describes:
    ``head_dim``, ``rotary_dim``, ``base``, ``interleaved``, ``clockwise``, ``scaling``,
    ``max_position_embeddings``.

    ``config`` is a ``PretrainedConfig`` (transformers 4 or 5), an object with the same
    attributes, or a ``config.json`` dict; a composite config (vision-language) is read through
    its ``text_config``. ``layer_type`` picks one entry of per-layer RoPE parameters (Gemma 3:
    ``"sliding_attention"`` / ``"full_attention"``).

    The layout and sense come from the ``model_type`` (see the module docstring): one outside
    :data:`KNOWN_MODEL_TYPES` (transformers :data:`CHECKED_TRANSFORMERS_VERSION`) is read from
    the generic fields with a ``UserWarning``, once per ``model_type`` and process, or, with
    ``strict=True``, refused naming it. A config without a ``model_type`` gets no warning.
    A multimodal-RoPE config (:data:`MROPE_MODEL_TYPES`, read by :mod:`~.mrope_layouts`) also
    gives ``mrope_section`` and ``mrope_layout``, the arguments of
    :class:`~posenc.MultimodalRotaryEmbedding`.

    Raises :class:`~posenc.errors.PosencValueError` naming the field and value when the config
    describes no rotary embedding (GPT-2, BLOOM, MPT, Falcon with ``alibi=True``, Zamba2
    without ``use_mem_rope``), when its fields contradict each other, or when it asks for
    something posenc does not represent (an odd or oversized rotary dimension, an unknown
    ``rope_type`` or key, a rotation of one head or by head index:
    :data:`NOT_TOKEN_ROTATION_MODEL_TYPES`).
    """
    check_bool("strict", strict)
    if config is None or isinstance(config, (str, bytes, int, float, list, tuple)):
        raise PosencTypeError(  # (as Encoder.from_hf_config says; any other object is read)
            f"config must be a transformers config or a config.json dict, got "
            f"{type(config).__name__}"
        )
    if isinstance(config, Mapping):  # a config.json: read as its transformers class reads it
        config = as_config(config).config
    return _rotary_arguments(config, layer_type, strict)


def _rotary_arguments(config: Any, layer_type: str | None, strict: bool) -> dict[str, Any]:
    cfg = _text_model(config)
    model_type = cfg.get("model_type") or ""
    if not isinstance(model_type, str):
        raise PosencTypeError(f"config model_type must be a str, got {model_type!r}")
    if model_type not in MROPE_MODEL_TYPES and f"{model_type}_text" in MROPE_MODEL_TYPES:
        # a flat config.json of the composite model (Qwen2-VL's and Qwen2.5-VL's checkpoints):
        # its text model's fields at the top level, read as that text model's
        model_type = f"{model_type}_text"
    if model_type in MROPE_MODEL_TYPES:
        # multimodal RoPE (mrope_layouts.py): the family's own fields are read there (or the
        # config refused, naming why), the shared ones below, from a view without them
        view, complete = read_multimodal(cfg.raw, model_type, layer_type)
        return complete(_rotary_arguments(view, layer_type, strict=False))
    if model_type in NOT_TOKEN_ROTATION_MODEL_TYPES:
        raise PosencValueError(
            f"config of model_type {model_type!r}: {NOT_TOKEN_ROTATION_MODEL_TYPES[model_type]}; "
            "posenc's RotaryEmbedding turns every head of each token by its position"
        )
    if model_type in ROTATES_ONLY_WITH:
        switch, on = ROTATES_ONLY_WITH[model_type]
        if cfg.get(switch) != on:
            raise PosencValueError(
                f"config of model_type {model_type!r} has {switch}={cfg.get(switch)!r}: its "
                f"attention rotates only with {switch}={on!r}, so it describes no rotary "
                "embedding"
            )
    if cfg.get("alibi") is True:
        raise PosencValueError(
            f"config of model_type {model_type!r} has alibi=True: it uses ALiBi, not rotary "
            "embeddings (see posenc.ALiBi)"
        )
    position_type = cfg.get("position_embedding_type")
    reads_type = model_type not in KNOWN_MODEL_TYPES or model_type in POSITION_TYPE_MODEL_TYPES
    if reads_type and position_type is not None and position_type not in ("rotary", "rope"):
        raise PosencValueError(
            f"config has position_embedding_type={position_type!r}, not rotary embeddings"
        )
    if not _has_rope_fields(cfg) and model_type not in FIXED_BASE_MODEL_TYPES:
        raise PosencValueError(
            f"config of model_type {model_type!r} describes no rotary embedding: it has none of "
            f"the fields {', '.join(_ROPE_FIELDS)}"
        )
    if layer_type is not None:
        cfg = Fields(for_layer_type(cfg.raw, layer_type))
    head_dim = head_dim_of(cfg)
    field, params = _rope_dict(cfg, layer_type)
    base = base_of(cfg, field, params, model_type)
    rotary_dim = rotary_dim_of(cfg, field, params, head_dim, model_type)
    head_dim, rotary_dim = rope_slice(cfg, head_dim, rotary_dim)
    interleave_flag = cfg.get("rope_interleave")
    if interleave_flag is None:
        interleave_flag = model_type in ROPE_INTERLEAVE_DEFAULT_MODEL_TYPES
    if not isinstance(interleave_flag, bool):
        raise PosencTypeError(f"config rope_interleave must be a bool, got {interleave_flag!r}")
    max_len = cfg.get("max_position_embeddings")
    if max_len is not None:
        max_len = positive_int("max_position_embeddings", max_len)
    scaling = _scaling(cfg, field, params, model_type, nested=layer_type is not None)
    try:
        validate_rope_scaling(scaling, rotary_dim=rotary_dim, max_position_embeddings=max_len)
    except PosencError as error:
        raise type(error)(f"config {field}: {error}") from error
    arguments = {
        "head_dim": head_dim,
        "rotary_dim": rotary_dim,
        "base": base,
        "interleaved": (
            model_type in INTERLEAVED_MODEL_TYPES
            or model_type in DEINTERLEAVED_MODEL_TYPES
            or bool(interleave_flag)
        ),
        "clockwise": model_type in CLOCKWISE_MODEL_TYPES,
        "scaling": scaling,
        "max_position_embeddings": max_len,
    }
    if model_type and model_type not in KNOWN_MODEL_TYPES:
        _unchecked_model_type(model_type, strict, arguments)
    return arguments


def query_scale_from_hf_config(config: Any) -> tuple[float, int] | None:
    """``(beta, original)`` of the query scale that a config's attention applies beside the
    rotation, ``q * (1 + beta * log(1 + floor(p / original)))`` (:data:`QUERY_SCALE_MODEL_TYPES`:
    Ministral 3, Mistral 4; ``llama_4_scaling_beta`` in the RoPE dictionary, the original
    context as the rotation reads it: see ``posenc.QueryScale.ministral3``), or ``None`` for
    the families without one. Raises :class:`~posenc.errors.PosencValueError` where that
    attention could not run (no ``llama_4_scaling_beta``, no original context)."""
    cfg = _text_model(config)
    model_type = cfg.get("model_type")
    if model_type not in QUERY_SCALE_MODEL_TYPES:
        return None
    field, params = _rope_dict(cfg, None)
    beta = params.get("llama_4_scaling_beta")
    if beta is None:
        raise PosencValueError(
            f"config {field} of model_type {model_type!r} has no llama_4_scaling_beta, which "
            "its attention reads"
        )
    beta = number(f"{field}['llama_4_scaling_beta']", beta)
    scaling = rotary_arguments_from_hf_config(config, strict=True)["scaling"] or {}
    original = scaling.get(ORIGINAL, params.get(ORIGINAL))
    if original is None:
        raise PosencValueError(
            f"config {field} of model_type {model_type!r} has no "
            "original_max_position_embeddings, which its attention's query scale reads"
        )
    return beta, positive_int(f"{field}['{ORIGINAL}']", original)


def softmax_scale_from_hf_config(config: Any, *, layer_type: str | None = None) -> float | None:
    """The softmax scale of the attention whose rotation ``config`` describes, where its RoPE
    dictionary changes it (:data:`~.scores.MSCALE_MODEL_TYPES`, DeepSeek-V2/V3 and their kin:
    YaRN with ``mscale_all_dim``, :func:`~.scores.mscale_softmax_scale`), else ``None`` (the
    attention's ``1 / sqrt`` of its head size). ``config`` as
    :func:`rotary_arguments_from_hf_config` takes it."""
    if isinstance(config, Mapping):
        config = as_config(config).config
    cfg = _text_model(config)
    model_type = cfg.get("model_type") or ""
    if model_type not in MSCALE_MODEL_TYPES:
        return None
    if layer_type is not None:
        cfg = Fields(for_layer_type(cfg.raw, layer_type))
    _, params = _rope_dict(cfg, layer_type)
    return mscale_softmax_scale(cfg, params, model_type)
