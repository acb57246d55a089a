"""A transformers model's whole position schedule read from its config: widths, heads, key/value
heads, head size, and per layer its encoding (RoPE with the layer type's θ and scaling, or
none), its sliding window or chunk, its query temperature, and its attention's sinks, soft-cap
and softmax scale; causal or not.

A ``config.json`` dict is read as transformers reads it: built into the config class of its
``model_type`` and read through the object's attributes, properties included
(:mod:`~posenc.hf.route`; without transformers, posenc's own rules,
:mod:`~posenc.hf.legacy`). What each family does, as its modeling file says
(transformers 5.24):

* ``layer_types`` names each layer (``full_attention``, ``sliding_attention``,
  ``chunked_attention``); a sliding layer reads ``sliding_window`` keys (unless
  ``use_sliding_window`` is false, SmolLM3), a chunked one ``attention_chunk_size``.
  A config without ``layer_types`` but with a ``sliding_window`` (Mistral) windows every layer.
* ``no_rope_layers`` (SmolLM3, Llama 4): 1 = RoPE, 0 = NoPE; ``layer_rope_theta`` (MuseGlimmer,
  MuseSpark): 0 = NoPE, else the config's rotation. Cohere 2, Flint and AFMoE rotate only
  their sliding layers, EXAONE 4 too when it has a window (:data:`ROPE_IF_LAYER_WINDOW` and
  its neighbours); families whose model decides per layer are refused
  (:data:`ROTATION_DECIDED_BY_THE_MODEL`), as are configs made bidirectional by a flag
  (``use_bidirectional_attention``). Llama 4 scales the queries of its NoPE layers
  (``attn_temperature_tuning``); Ministral 3 those of every layer (``llama_4_scaling_beta``,
  read by :func:`~posenc.hf.config.query_scale_from_hf_config`).
* Encoders, whose models attend both ways (:data:`BIDIRECTIONAL_MODEL_TYPES`: ModernBERT,
  UltraBERT, EuroBERT, ...), are built with ``causal=False``; their sliding windows keep
  ``|i - j| <= sliding_window`` as transformers' bidirectional masks do.
* Refused by name: multi-head latent attention (``qk_rope_head_dim`` / ``kv_lora_rank``:
  DeepSeek-V2/V3/V4, Mistral 4, dots3, ...), which posenc's attention has no latent
  projections for, and configs that size layers differently (``per_layer_config``: the Gemma 4
  family's wider full-attention heads), since posenc's encoder has one head size.
* RoPE parameters nested by layer type (Gemma 3, OLMo 3) give each type its own module; one
  set of parameters gives every RoPE layer the same module.

* What each layer's attention does to its scores (:mod:`~posenc.hf.scores`): learned
  sinks (gpt-oss), soft-capping (Gemma 2's ``attn_logit_softcapping``) and the softmax scale
  (``query_pre_attn_scalar``, ``attention_multiplier``, DeepSeek's YaRN ``mscale_all_dim`` read
  by the rotary module); what posenc's attention does not do (Inkling's ``sink_proj``, OLMo's
  and DBRX's ``clip_qkv``, ...) is refused by name. Falcon's key/value heads are read as
  ``FalconAttention`` takes them.

posenc's layers keep their own norms (q/k norms included) and feed-forward; what is read here
is where positions enter and what the attention does to its scores, which is where ports go
wrong. Weights are random: posenc loads no checkpoints.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..attention.query_scale import QueryScale
from ..encodings.base import PositionalEncoding
from ..encodings.rotary.rope import RotaryEmbedding
from ..errors import PosencTypeError, PosencValueError
from .config import query_scale_from_hf_config
from .fields import Fields
from .route import as_config
from .scores import falcon_kv_heads, layer_scores, refuse_unread

__all__ = [
    "LayerSchedule",
    "ModelSchedule",
    "build_from_hf_config",
    "build_from_schedule",
    "read_schedule",
]

#: Families that rotate only some layers, by the condition their attention module tests
#: (transformers 5.24): the layer's own window is set (Cohere 2, Flint: a config without a
#: ``sliding_window`` rotates nothing), or the layer is a sliding one (AFMoE), or the config
#: has no window or the layer is a sliding one (EXAONE 4 and its kin).
ROPE_IF_LAYER_WINDOW = frozenset({"cohere2", "flint"})
ROPE_IF_SLIDING = frozenset({"afmoe"})
ROPE_IF_NO_WINDOW_OR_SLIDING = frozenset({"exaone4", "exaone4_5", "exaone_moe", "kolibri1"})
#: Families whose model decides per layer whether to rotate (it passes the rotary tables to
#: some layers only, or tests a flag of its own): refused, named, rather than guessed.
ROTATION_DECIDED_BY_THE_MODEL = frozenset(
    {
        "beam",
        "cohere2_moe",
        "cohere_compass",
        "granite_swa",
        "granitemoe_swa",
        "granitemoehybrid",
        "lara_mini",
        "olmo_hybrid",
        "zamba2",
    }
)
#: Families whose model attends both ways (encoders: their attention modules set
#: ``is_causal = False`` and their masks are ``create_bidirectional_mask``, sliding ones
#: ``create_bidirectional_sliding_window_mask``; transformers 5.24): built with
#: ``causal=False``, a sliding window of ``sliding_window`` keys either side.
BIDIRECTIONAL_MODEL_TYPES = frozenset(
    {
        "dia_encoder",
        "esmc",
        "eurobert",
        "glmasr_encoder",
        "gte",
        "jina_embeddings_v3",
        "lasr_encoder",
        "modernbert",
        "muse_glimmer_assistant",
        "nemotron3_5_transcribe_asr_audio",
        "nemotron3_5_transcribe_word_timestamp",
        "nemotron3_diarization_audio",
        "neomme",
        "nomic_bert",
        "openai_privacy_filter",
        "pe_audio_encoder",
        "pe_audio_video_encoder",
        "pe_video_encoder",
        "t5gemma2_encoder",
        "ultrabert",
    }
)
#: Fields of multi-head latent attention (refused: posenc's attention has no latent projections).
LATENT_ATTENTION_FIELDS = ("qk_rope_head_dim", "kv_lora_rank")
#: The layer types whose attention posenc builds.
LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")
#: The size overrides :func:`read_schedule` takes, by their transformers names (and aliases).
OVERRIDES = {
    "num_layers": "num_hidden_layers",
    "num_hidden_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "vocab_size": "vocab_size",
}


@dataclass(frozen=True)
class LayerSchedule:
    """One layer: its type, its encoding (``None``: NoPE), window, chunk and query scale, and
    what its attention does to the scores (:mod:`~posenc.hf.scores`): sinks,
    soft-capping, softmax scale (``None``: ``1 / sqrt(head_dim)``)."""

    kind: str
    pe: PositionalEncoding | None
    window: int | None
    chunk: int | None
    query_scale: QueryScale | None
    sinks: bool = False
    softcap: float | None = None
    softmax_scale: float | None = None


@dataclass(frozen=True)
class ModelSchedule:
    """The sizes of a model and its layers' schedules, as a config describes them."""

    model_type: str
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int | None
    vocab_size: int | None
    layers: tuple[LayerSchedule, ...]
    #: False for the encoders whose model attends both ways (:data:`BIDIRECTIONAL_MODEL_TYPES`)
    causal: bool = True
    #: how the config was read: the transformers config class and version, or posenc's rules
    via: str = ""
    #: size fields the config did not state, filled by its config class's defaults
    defaulted: tuple[str, ...] = ()

    def encoder_kwargs(self) -> dict[str, Any]:
        """The arguments of :class:`~posenc.Encoder` after ``dim, depth, num_heads``."""
        scales = {layer.softmax_scale for layer in self.layers}
        if len(scales) > 1:  # (no family of transformers 5.24 does this)
            raise PosencValueError(
                f"config model_type={self.model_type!r} gives its layers different softmax "
                f"scales {sorted(scales, key=str)}: posenc's Encoder takes one for every layer"
            )
        return {
            "pe": [layer.pe for layer in self.layers],
            "ffn_dim": self.intermediate_size,
            "causal": self.causal,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "window": [layer.window for layer in self.layers],
            "chunk": [layer.chunk for layer in self.layers],
            "query_scale": [layer.query_scale for layer in self.layers],
            "sinks": [layer.sinks for layer in self.layers],
            "softcap": [layer.softcap for layer in self.layers],
            "softmax_scale": next(iter(scales), None),
        }


def _text_model(config: Any) -> Any:
    """The config (object or dict) posenc reads: a ``config.json`` dict built into its
    transformers config class where it can be (:func:`~posenc.hf.route.as_config`),
    and of a multimodal config its language model (``text_config``)."""
    if not isinstance(config, Mapping) and not hasattr(config, "to_dict"):
        raise PosencTypeError(
            f"config must be a transformers config or a config.json dict, got "
            f"{type(config).__name__}"
        )
    read = as_config(config)
    fields = Fields(read.config)
    text = fields.get("text_config")
    if text is not None and fields.get("num_hidden_layers") is None:
        return read, text  # a multimodal config: its language model
    return read, read.config


class _Sized:
    """A config object read through its attributes (properties included, as transformers'
    modeling code reads them), with size overrides on top."""

    def __init__(self, config: Any, overrides: Mapping[str, Any]) -> None:
        self._config, self._overrides = config, dict(overrides)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._config, name)


def _int(raw: Fields | Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = raw.get(key)
    value = default if value is None else value
    if value is None:
        raise PosencValueError(f"config has no {key}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PosencValueError(f"config {key} must be a positive int, got {value!r}")
    return value


def read_schedule(config: Any, **overrides: Any) -> ModelSchedule:
    """The schedule of the model ``config`` describes (a transformers config or a
    ``config.json`` dict, read as transformers' config class for its ``model_type`` reads it:
    :mod:`~posenc.hf.route`), with size ``overrides`` (``num_layers=``,
    ``hidden_size=``, ``num_attention_heads=``, ...; see :data:`OVERRIDES`) applied first: a
    smaller model of the same schedule (its first ``num_layers`` layers)."""
    sizes = {}
    for name, value in overrides.items():
        if name not in OVERRIDES:
            raise PosencTypeError(
                f"unknown override {name}=; expected one of {', '.join(sorted(OVERRIDES))}"
            )
        sizes[OVERRIDES[name]] = value
    if isinstance(config, Mapping):  # what posenc refuses whatever the reading derives
        stated = config.get("text_config")
        _refuse_deliberately(Fields(stated if isinstance(stated, Mapping) else config))
    read, model = _text_model(config)
    if read.underived:
        raise PosencValueError(
            f"config has no {', '.join(read.underived)}, which its transformers config class "
            "would derive by a formula posenc's own rules do not know (state them); read "
            f"through {read.via}"
        )
    if isinstance(model, Mapping):
        model = {**model, **sizes}
    elif sizes:
        model = _Sized(model, sizes)
    raw = Fields(model)
    model_type = _refuse_deliberately(raw)
    if raw.get("use_bidirectional_attention") or raw.get("is_causal") is False:
        raise PosencValueError(
            f"config model_type={model_type!r} is bidirectional (use_bidirectional_attention "
            "or is_causal=False; transformers also halves its window): posenc reads causal "
            "schedules only"
        )
    causal = model_type not in BIDIRECTIONAL_MODEL_TYPES
    depth = _int(raw, "num_hidden_layers")
    refuse_unread(raw, model_type, depth)  # what posenc's attention does not do, by name
    hidden = _int(raw, "hidden_size")
    heads = _int(raw, "num_attention_heads")
    if model_type == "falcon":  # FalconAttention's own rule (multi_query: one head)
        kv_heads = falcon_kv_heads(raw, heads)
    else:
        kv_heads = _int(raw, "num_key_value_heads", heads)
    head_dim = raw.get("head_dim") or (hidden // heads if hidden % heads == 0 else None)
    if head_dim is None:
        raise PosencValueError(
            f"config has no head_dim and num_attention_heads={heads} does not divide "
            f"hidden_size={hidden}"
        )
    kinds = _per_layer_list(raw, "layer_types", depth) or ["full_attention"] * depth
    unknown = sorted(set(kinds) - set(LAYER_TYPES))
    if unknown:
        raise PosencValueError(
            f"config layer_types holds {unknown}; posenc builds {', '.join(LAYER_TYPES)}"
        )
    # (a window switched off: Qwen 2 keeps None, Qwen2-MoE 0)
    off = raw.get("use_sliding_window") is False
    windows = [None] * depth if off else _windows(model, raw, depth)
    if not causal:
        # transformers' bidirectional window keeps |i - j| <= sliding_window; posenc's < window
        windows = [None if w is None else w + 1 for w in windows]
    chunk_size = _optional_int(raw, "attention_chunk_size")
    if "chunked_attention" in kinds and chunk_size is None:
        raise PosencValueError(
            "config layer_types has chunked_attention but no attention_chunk_size"
        )
    intermediate = raw.get("intermediate_size")
    if intermediate is not None:
        intermediate = _int(raw, "intermediate_size")
    rotates = _rotating_layers(raw, model_type, kinds, depth)
    modules: dict[str, RotaryEmbedding] = {}  # one per layer type (or one for all)
    nested = _nested_by_layer_type(raw)
    tuning = raw.get("attn_temperature_tuning")
    every_layer = query_scale_from_hf_config(model)  # Ministral 3
    scores = layer_scores(raw, model_type, kinds, int(head_dim))
    beside = None if every_layer is None else QueryScale.ministral3(*every_layer)
    layers = []
    for i, kind in enumerate(kinds):
        pe: PositionalEncoding | None = None
        if rotates[i]:
            key = kind if nested else ""
            if key not in modules:
                modules[key] = RotaryEmbedding.from_hf_config(
                    model, layer_type=kind if nested else None
                )
            pe = modules[key]
        slides = kind == "sliding_attention" or raw.get("layer_types") is None
        window = windows[i] if slides else None
        chunk = chunk_size if kind == "chunked_attention" else None
        scale = beside
        if tuning and not rotates[i]:
            attn_scale, floor = raw.get("attn_scale"), raw.get("floor_scale")
            scale = QueryScale.llama4(
                0.1 if attn_scale is None else attn_scale, 8192 if floor is None else floor
            )
        softmax_scale = scores[i].softmax_scale
        rope_scale = getattr(pe, "softmax_scale", None)  # DeepSeek's YaRN mscale
        if rope_scale is not None:
            softmax_scale = rope_scale
        layers.append(
            LayerSchedule(
                kind,
                pe,
                window,
                chunk,
                scale,
                sinks=scores[i].sinks,
                softcap=scores[i].softcap,
                softmax_scale=softmax_scale,
            )
        )
    return ModelSchedule(
        model_type=model_type,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(head_dim),
        intermediate_size=intermediate,
        vocab_size=raw.get("vocab_size"),
        layers=tuple(layers),
        causal=causal,
        via=read.via,
        defaulted=read.defaulted,
    )


def _refuse_deliberately(raw: Fields) -> str:
    """Refuse, naming why, the configs posenc does not build by design (rotations the model
    decides per layer, latent attention, sizes per layer); else give the ``model_type``."""
    model_type = str(raw.get("model_type") or "")
    if model_type in ROTATION_DECIDED_BY_THE_MODEL:
        raise PosencValueError(
            f"config model_type={model_type!r}: which of its layers rotate is decided by its "
            "model's forward, which posenc does not read; refused rather than guessed"
        )
    latent = [key for key in LATENT_ATTENTION_FIELDS if raw.get(key) is not None]
    if latent:
        raise PosencValueError(
            f"config model_type={model_type!r} has {', '.join(latent)}: multi-head latent "
            "attention, which posenc's attention (no latent projections) does not build; "
            "RotaryEmbedding.from_hf_config reads its rotation"
        )
    per_layer = raw.per_layer
    if per_layer:
        raise PosencValueError(
            f"config model_type={model_type!r} sets {sorted(per_layer)} per layer "
            "(per_layer_config): "
            "posenc's Encoder has one head size and head count for every layer; "
            "RotaryEmbedding.from_hf_config(config, layer_type=...) reads each layer type's "
            "rotation"
        )
    return model_type


def _per_layer_list(raw: Fields, key: str, depth: int) -> list[Any] | None:
    """``raw[key]``, a list with an entry per layer (longer lists are cut to ``depth``, as a
    ``num_layers`` override asks), or ``None`` when absent."""
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) < depth:
        raise PosencValueError(
            f"config {key} must list at least num_hidden_layers={depth} entries, got {value!r}"
        )
    return list(value[:depth])


def _rotating_layers(raw: Fields, model_type: str, kinds: list[str], depth: int) -> list[bool]:
    """Whether each layer applies RoPE."""
    no_rope = _per_layer_list(raw, "no_rope_layers", depth)
    if no_rope is not None:  # SmolLM3, Llama 4: 1 = RoPE, 0 = NoPE
        return [bool(flag) for flag in no_rope]
    thetas = _per_layer_list(raw, "layer_rope_theta", depth)
    if thetas is not None:  # MuseGlimmer, MuseSpark: 0 = NoPE; else the config's rotation
        return [bool(theta) for theta in thetas]
    sliding = [kind == "sliding_attention" for kind in kinds]
    if model_type in ROPE_IF_LAYER_WINDOW:
        return [is_sliding and raw.get("sliding_window") is not None for is_sliding in sliding]
    if model_type in ROPE_IF_SLIDING:
        return sliding
    if model_type in ROPE_IF_NO_WINDOW_OR_SLIDING:
        return [raw.get("sliding_window") is None or is_sliding for is_sliding in sliding]
    return [True] * depth


def _windows(model: Any, raw: Fields, depth: int) -> list[int | None]:
    """Each layer's ``sliding_window``: the config's, or where it sets the field per layer
    (NeoMME's ``per_layer_config``: 256 on some sliding layers, 1024 on others) the layer's."""
    if isinstance(model, Mapping):
        found = model.get("per_layer_config") or {}
        layers = {int(k): v for k, v in found.items() if str(k).isdigit()}  # "01": {...}
        layers = {i: v for i, v in layers.items() if isinstance(v, Mapping)}
        if not any("sliding_window" in values for values in layers.values()):
            return [_optional_int(raw, "sliding_window")] * depth
        default = model.get("sliding_window")
        own = [layers.get(i, {}).get("sliding_window", default) for i in range(depth)]
    elif getattr(model, "is_heterogeneous", False) is True and "sliding_window" in (
        getattr(model, "per_layer_attributes", None) or ()
    ):
        own = [model.per_layer_config[i].sliding_window for i in range(depth)]
    else:
        return [_optional_int(raw, "sliding_window")] * depth
    return [_optional_int({"sliding_window": w}, "sliding_window") for w in own]


def _optional_int(raw: Fields | Mapping[str, Any], key: str) -> int | None:
    """``raw[key]``, a positive int, or ``None`` when absent."""
    return None if raw.get(key) is None else _int(raw, key)


def _nested_by_layer_type(raw: Fields) -> bool:
    """Whether the RoPE parameters are given per layer type (Gemma 3, OLMo 3)."""
    for field in ("rope_parameters", "rope_scaling"):
        params = raw.get(field)
        if isinstance(params, Mapping) and params:
            return all(isinstance(v, Mapping) or v is None for v in params.values())
    return False


def build_from_hf_config(
    cls: Any,
    config: Any,
    *,
    device: Any = None,
    overrides: Mapping[str, Any],
    vocab: bool = False,
) -> Any:
    """``cls`` (:class:`~posenc.Encoder`, or with ``vocab`` :class:`~posenc.TransformerModel`)
    built with the schedule of ``config``, on ``device``, its layer types recorded."""
    return build_from_schedule(cls, read_schedule(config, **overrides), device=device, vocab=vocab)


def build_from_schedule(
    cls: Any, schedule: ModelSchedule, *, device: Any = None, vocab: bool = False
) -> Any:
    """``cls`` built with ``schedule`` on ``device`` (``"meta"``: nothing allocated), as
    :func:`build_from_hf_config` builds it."""
    sizes: tuple[int, ...] = (schedule.hidden_size, len(schedule.layers), schedule.num_heads)
    if vocab:
        if schedule.vocab_size is None:
            raise PosencValueError("config has no vocab_size")
        sizes = (schedule.vocab_size, *sizes)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = cls(*sizes, **schedule.encoder_kwargs())
    encoder = model.encoder if vocab else model
    encoder.layer_types = [layer.kind for layer in schedule.layers]
    return model
