"""The attention-field sweep: every config field that changes a family's attention scores is
read (the schedule, and the model built from it, carries it) or refused by name, for every
family posenc builds (issue #41).

What is swept is found from transformers' source, not from a list: every config class of the
installed transformers (the sweep of ``tests/hf/test_differential.py``: the families
``read_schedule`` builds, and those it refuses), and for each the attention classes of its
modeling files (a class that calls an attention function or sets ``self.scaling``, built from
that config class; where none is annotated with it, those of its folder annotated with no config
class). From each attention class's source:

* ``self.sinks = nn.Parameter`` (learned sinks), ``sink_proj`` (data-dependent sinks),
  ``softcap=`` (soft-capping) and ``self.scaling = ...`` (the softmax scale);
* every config field it reads (``config.X``), each of which must be classified here: read by
  :mod:`posenc.hf.scores` (:data:`READ`), refused there, read elsewhere (positions,
  windows, sizes) or not touching the scores given q and k (:data:`NOT_SCORES`, with why). A new
  family or field that is none of these fails the sweep.

Then each family's attention module is built from its config, layer by layer, and what it does
(its sinks, the soft-cap its forward passes, its effective scale) is compared with the layer
schedule posenc reads; a family posenc refuses must name the field.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import math
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.hf import scores  # noqa: E402
from tests.hf.test_differential import Family, families  # noqa: E402

#: Config fields an attention class reads that do not change its scores given q and k (-> why).
NOT_SCORES: dict[str, str] = {
    **dict.fromkeys(
        (
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "kv_channels",
            "num_hidden_layers",
            "cross_hidden_size",
            "cross_num_attention_heads",
            "cross_num_key_value_heads",
            "cross_head_dim",
            "cross_attention_hidden_size",
            "intermediate_size",
            "hidden_act",
            "mlp_bias",
            "num_experts_per_tok",
            "num_local_experts",
            "shared_expert_intermediate_size",
            "moe_intermediate_size",
            "moe_hidden_size",
            "n_shared_experts",
            "moe_routed_scaling_factor",
            "block_ffn_dim_multiplier",
            "block_multiple_of",
            "block_auto_adjust_ff_dim",
            "num_codebooks",
            "d_model",
            "n_heads",
            "attn_config.kv_n_heads",
            "bias",
        ),
        "a size (read by read_schedule), a projection's bias or a part outside attention",
    ),
    **dict.fromkeys(
        ("multi_query", "new_decoder_architecture", "num_kv_heads"),
        "Falcon's key/value heads: read by read_schedule (scores.falcon_kv_heads)",
    ),
    "attn_config": "DBRX's attention sub-config: its fields are classified one by one",
    **dict.fromkeys(
        (
            "attention_dropout",
            "dropout",
            "residual_dropout",
            "attn_pdrop",
            "resid_pdrop",
            "attention_probs_dropout_prob",
            "hidden_dropout",
            "attn_config.attn_pdrop",
        ),
        "dropout: training only",
    ),
    **dict.fromkeys(
        (
            "attention_bias",
            "use_bias",
            "query_bias",
            "key_bias",
            "value_bias",
            "proj_bias",
            "qkv_bias",
            "use_qkv_bias",
            "attention_out_bias",
            "gating",
        ),
        "a projection (its bias, or an output gate): posenc's layers have their own",
    ),
    **dict.fromkeys(
        (
            "rms_norm_eps",
            "layer_norm_eps",
            "norm_eps",
            "use_qk_norm",
            "qk_layernorm",
            "qk_norm_type",
        ),
        "a norm of q or k: part of the projections, which posenc's layers replace with their "
        "own (the scores given q and k are unchanged)",
    ),
    **dict.fromkeys(
        (
            "_attn_implementation",
            "deterministic_flash_attn",
            "pad_head_dim_to_multiple_of",
            "initializer_range",
            "is_decoder",
            "model_parallel_size",
            "update",
        ),
        "implementation (kernel choice, zero padding, initialisation)",
    ),
    **dict.fromkeys(
        (
            "max_position_embeddings",
            "max_seq_len",
            "attn_config.rope_theta",
            "rope_parameters",
            "rope_theta",
            "partial_rotary_factor",
            "rotary_dim",
            "sliding_window",
            "sliding_window_pattern",
            "layer_types",
            "no_rope_layers",
            "use_sliding_window",
            "use_bidirectional_attention",
            "attn_scale",
            "floor_scale",
            "attn_temperature_tuning",
            "per_layer_config",
            "num_attention_heads_per_layer",
            "num_key_value_heads_per_layer",
            "pos_embed_jitter",
            "pos_embed_shift",
            "pos_embed_rescale",
            "image_size",
            "patch_size",
        ),
        "positions, windows, temperatures or per-layer heads: read by read_schedule",
    ),
    **dict.fromkeys(
        (
            "audio_token_id",
            "image_token_id",
            "video_token_id",
            "vision_start_token_id",
            "audio_start_token_id",
            "position_id_per_seconds",
            "seconds_per_chunk",
            "audio_config",
            "video_config",
            "vision_config",
        ),
        "multimodal position ids (read with the multimodal rotation)",
    ),
}

#: Config fields that change the scores and that posenc reads (-> the table of ``scores``).
READ = {
    "attn_logit_softcapping": "SOFTCAP_MODEL_TYPES",
    "query_pre_attn_scalar": "SCALE_FIELDS",
    "attention_multiplier": "SCALE_FIELDS",
    "qk_scale_factor": "SCALE_FIELDS",
}

_CLASS = re.compile(r"^class (\w+)\(", re.M)
_ATTENTION = re.compile(r"attention_interface|eager_attention_forward|self\.scaling\b")
_FIELD = re.compile(r"\bconfig\.(\w+)")
_TOP_LEVEL = re.compile(r"^\S", re.M)


def _annotation(cls: type) -> Any:
    """The config class ``cls.__init__``'s first argument is annotated with, or ``None``."""
    from transformers import PretrainedConfig

    try:
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:2]
    except (TypeError, ValueError):
        return None
    annotation = parameters[0].annotation if parameters else None
    is_config = isinstance(annotation, type) and issubclass(annotation, PretrainedConfig)
    return annotation if is_config else None


def _contains(composite: type, config_class: type) -> bool:
    """Whether ``config_class`` is one of ``composite``'s sub-configs, at any depth."""
    subs = [
        s for s in (getattr(composite, "sub_configs", None) or {}).values() if isinstance(s, type)
    ]
    return any(issubclass(config_class, s) or _contains(s, config_class) for s in subs)


@functools.cache
def _classes(folder: str) -> list[tuple[type, str]]:
    """Every attention class of a folder's modeling files, with its source."""
    models = Path(transformers.__file__).parent / "models"
    found = []
    for path in sorted((models / folder).glob("modeling_*.py")):
        source = path.read_text()
        try:
            module = importlib.import_module(f"transformers.models.{folder}.{path.stem}")
        except ImportError:  # an optional dependency (torchaudio): no attention found there,
            continue  # which the sweep reports for a family posenc builds
        for match in _CLASS.finditer(source):
            end = _TOP_LEVEL.search(source, source.index("\n", match.start()))
            body = source[match.start() : end.start() if end else len(source)]
            cls = getattr(module, match.group(1), None)
            if "Cross" in match.group(1) or not isinstance(cls, type):
                continue  # (posenc builds self-attention stacks)
            named = match.group(1).endswith("Attention")  # (Falcon's calls SDPA itself)
            if (named or _ATTENTION.search(body)) and hasattr(cls, "forward"):
                found.append((cls, body))
    return found


#: Config classes whose attention class is annotated with another config class (-> its name).
ATTENTION_OF = {
    "T5Gemma2DecoderConfig": "T5Gemma2MergedAttention",
    "GlmAsrEncoderConfig": "GlmAsrAttention",  # (annotated GlmAsrConfig)
    "Nemotron3_5TranscribeWordTimestampConfig": "Nemotron3_5TranscribeAttention",
}


def attention_classes(config_class: type) -> list[tuple[type, str]]:
    """The attention classes built from ``config_class``: annotated with it (or a parent of
    it), or named in :data:`ATTENTION_OF`; else annotated with a composite config holding it
    (BLT, Emu3, Qwen2.5-Omni: their text attention takes the whole config's annotation); else
    those of its folder without a config annotation. A folder without modeling code (EXAONE,
    InternLM3: transformers builds them as Llama) lends the attention of the model class
    transformers maps its ``model_type`` to."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    folder = config_class.__module__.split(".")[2]
    classes = _classes(folder)
    if not classes and config_class.model_type in MODEL_MAPPING_NAMES:
        model = getattr(transformers, MODEL_MAPPING_NAMES[config_class.model_type])
        return _classes(model.__module__.split(".")[2])
    if config_class.__name__ in ATTENTION_OF:
        return [(c, s) for c, s in classes if c.__name__ == ATTENTION_OF[config_class.__name__]]
    for fits in (
        lambda a: a is not None and issubclass(config_class, a),
        lambda a: a is not None and _contains(a, config_class),
        lambda a: a is None,
    ):
        found = [(c, s) for c, s in classes if fits(_annotation(c))]
        if found:
            return found
    return []


def fields_read(body: str) -> set[str]:
    """The config fields ``body`` reads: ``config.X``, and ``attn_config.X`` of the sub-config
    it takes (DBRX) as ``attn_config.X``."""
    nested = {f"attn_config.{name}" for name in re.findall(r"\battn_config\.(\w+)", body)}
    return set(_FIELD.findall(body)) | nested


def _build(cls: type, config: Any, layer: int) -> Any:
    """``cls`` built for layer ``layer`` of ``config`` (its signature's usual shapes), or
    ``None`` where it cannot be."""
    for args in ((config, layer), (config,)):
        try:
            with warnings.catch_warnings(), torch.device("meta"):  # (nothing allocated)
                warnings.simplefilter("ignore")
                return cls(*args)
        except Exception:
            continue
    return None


def _softcap(module: Any, body: str) -> Any:
    found = re.search(r"softcap=(self(?:\.\w+)+)", body)
    if found is None:
        return None
    value = module
    for name in found.group(1).split(".")[1:]:
        value = getattr(value, name)
    return value


def _attribute(module: Any, name: str) -> float | None:
    value = getattr(module, name, None)
    return float(value) if isinstance(value, (int, float)) else None


def _scale(module: Any, body: str) -> float | None:
    """The effective softmax scale of ``module``: the ``scaling=`` its forward passes (a
    number, or ``self.X``) times the attributes it multiplies q and k by
    (``query_states = ... * self.X``: OpenAI's privacy filter scales both by
    ``head_dim ** -0.25``, MuseGlimmer q by ``qk_scale_factor``); ``None`` where that is not a
    number (TimesFM 2.5's learned scale per dimension)."""
    passed = re.search(r"\bscaling=([^,\n]+),", body)
    if passed is None:
        return None
    try:  # (an expression of the module's attributes, as its forward evaluates it)
        scale = eval(passed.group(1), {"math": math}, {"self": module})
    except Exception:
        return None
    scale = float(scale) if isinstance(scale, (int, float)) else None
    for states in ("query_states", "key_states"):
        own = rf"^\s*{states} = (?:{states}|self\.\w+\({states}\)) \* self\.(\w+)\s*$"
        for name in re.findall(own, body, re.M):
            factor = _attribute(module, name)
            scale = None if scale is None or factor is None else scale * factor
    return scale


def _named(family: Family, field: str) -> bool:
    return family.schedule is None and field in family.refusal


def _score_refusal(family: Family) -> bool:
    return family.schedule is None and "posenc's attention does not do" in family.refusal


@pytest.mark.slow  # the differential sweep (~8 s, once per process), ~130 modeling modules
def test_every_attention_field_of_every_built_family_is_read_or_refused() -> None:
    problems = []
    swept = 0
    for family in families().values():
        if family.schedule is None and not _score_refusal(family):
            continue  # refused before its attention is read (latent attention, ...)
        whole = family.model_type in scores.ALWAYS_REFUSED
        found = attention_classes(type(family.config))
        if not found:
            problems.append(f"{family.model_type}: no attention class found in its source")
        for cls, body in found:
            swept += 1
            where = f"{family.model_type} ({cls.__name__})"
            if not whole:  # (a family refused whole needs none of its fields read)
                problems += _fields(family, body, where)
            problems += _features(family, cls, body, where)
    assert swept > 120, f"only {swept} attention classes swept: the discovery broke"
    assert not problems, "\n".join(problems)


def _fields(family: Family, body: str, where: str) -> list[str]:
    """Each config field the attention ``body`` reads: classified as not touching the scores,
    read by ``scores`` for this family, or refused naming it; else a problem."""
    problems = []
    for field in sorted(fields_read(body)):
        refused = field in scores.REFUSED_SCORE_FIELDS.get(family.model_type, {})
        if field in NOT_SCORES:
            continue
        if field == "attn_logit_softcapping" and "softcap=" not in body:
            if family.model_type in scores.SOFTCAP_MODEL_TYPES:  # (Gemma 3 keeps, never passes)
                problems.append(f"{where}: passes no softcap=, yet in SOFTCAP_MODEL_TYPES")
        elif field in READ:
            if family.model_type not in getattr(scores, READ[field]):
                problems.append(f"{where}: reads {field}, not in scores.{READ[field]}")
        elif refused:
            if family.schedule is None and not _named(family, field):
                problems.append(f"{where}: {field} refused without being named")
        else:
            problems.append(
                f"{where}: reads config.{field}, which is neither read, refused nor classified "
                "(NOT_SCORES)"
            )
    return problems


def _features(family: Family, cls: type, body: str, where: str) -> list[str]:
    """Sinks, data-dependent sinks, soft-capping and scale of ``cls``, layer by layer, against
    the schedule (or the refusal)."""
    problems = []
    if "sink_proj" in body:
        if not _named(family, "sink_proj"):
            problems.append(f"{where}: data-dependent sinks (sink_proj) not refused by name")
        return problems
    if family.schedule is None:
        return problems
    has_sinks = re.search(r"self\.sinks = nn\.Parameter", body) is not None
    if has_sinks and family.model_type not in scores.SINK_MODEL_TYPES:
        problems.append(f"{where}: self.sinks = nn.Parameter, not in SINK_MODEL_TYPES")
    if "softcap=" in body and family.model_type not in scores.SOFTCAP_MODEL_TYPES:
        problems.append(f"{where}: passes softcap=, not in SOFTCAP_MODEL_TYPES")
    head_dim = family.schedule.head_dim
    kinds = [layer.kind for layer in family.schedule.layers]
    for i, layer in enumerate(family.schedule.layers):
        if kinds.index(layer.kind) != i:
            continue  # (one layer of each type: they are built alike)
        module = _build(cls, family.config, i)
        if module is None:
            if has_sinks or "softcap=" in body:
                problems.append(f"{where}: cannot be built to compare layer {i}")
            break
        sinks = getattr(module, "sinks", None) is not None
        if sinks != layer.sinks:
            problems.append(f"{where} layer {i}: sinks {sinks}, schedule {layer.sinks}")
        cap = _softcap(module, body)
        if (None if cap is None else float(cap)) != layer.softcap:
            problems.append(f"{where} layer {i}: softcap {cap}, schedule {layer.softcap}")
        scale = _scale(module, body)
        read = layer.softmax_scale if layer.softmax_scale is not None else head_dim**-0.5
        if scale is not None and not math.isclose(scale, read, rel_tol=1e-6):
            problems.append(f"{where} layer {i}: scale {scale}, schedule {read}")
    return problems


@pytest.mark.parametrize(
    ("model_type", "field"),
    [(model_type, field) for model_type, f in scores.REFUSED_SCORE_FIELDS.items() for field in f],
)
def test_each_refused_field_is_the_familys_and_refused_by_name(model_type: str, field: str) -> None:
    """Every refusal names something the family's attention reads or holds (a config field
    its attention source reads, or ``sink_proj``), and a config that sets it (every config,
    for the families refused whole) is refused naming it, whichever way it comes."""
    from transformers import CONFIG_MAPPING

    import posenc
    from tests.hf.schedules import quiet_config, read

    cls = CONFIG_MAPPING[model_type]
    bodies = "".join(body for _, body in attention_classes(cls))
    config = quiet_config(cls)
    assert field.split(".")[-1] in bodies or hasattr(config, field), (model_type, field)
    if model_type not in scores.ALWAYS_REFUSED:
        owner, _, name = field.rpartition(".")
        setattr(getattr(config, owner) if owner else config, name, 8.0)
    for given in (config, config.to_dict()):
        with pytest.raises(posenc.PosencValueError, match=rf"\b{re.escape(field)}\b") as info:
            read(given)
        assert repr(model_type) in str(info.value)


@pytest.mark.slow  # the differential sweep (~8 s, once per process)
def test_the_sweep_names_an_unclassified_field_and_a_dropped_softcap() -> None:
    """The checks can fail: Gemma 2's attention passes, with a field no table knows it is
    named, and a schedule without its soft-capping is caught layer by layer."""
    family = families()["gemma2"]
    cls, body = next((c, b) for c, b in attention_classes(type(family.config)) if "softcap=" in b)
    assert _fields(family, body, "gemma2") == [] and _features(family, cls, body, "gemma2") == []
    unread = _fields(family, body + "\n        x = config.logit_temperature\n", "gemma2")
    assert len(unread) == 1 and "config.logit_temperature" in unread[0]
    layers = tuple(dataclasses.replace(x, softcap=None) for x in family.schedule.layers)
    schedule = dataclasses.replace(family.schedule, layers=layers)
    dropped = dataclasses.replace(family, schedule=schedule)
    assert any("softcap 50.0, schedule None" in p for p in _features(dropped, cls, body, "gemma2"))


@pytest.mark.slow  # the differential sweep (~8 s, once per process)
def test_every_family_with_sinks_or_capping_is_read_or_refused() -> None:
    """Across every config class (not only those built): a family whose attention holds
    sinks, sink projections or passes ``softcap=`` is read as having them, or refused (for
    that, or for another reason it names: latent attention, rotations its model decides)."""
    found = {}
    for family in families().values():
        bodies = "".join(b for _, b in attention_classes(type(family.config)))
        if re.search(r"self\.sinks = nn\.Parameter|sink_proj|softcap=", bodies):
            found[family.model_type] = family
    assert {"gpt_oss", "flint", "openai_privacy_filter", "gemma2"} <= set(found), sorted(found)
    read = scores.SINK_MODEL_TYPES.keys() | scores.SOFTCAP_MODEL_TYPES
    unread = [t for t, f in found.items() if f.schedule is not None and t not in read]
    assert not unread, unread


YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
}


@pytest.mark.slow  # the differential sweep (~8 s, once per process)
def test_every_rotary_softmax_scale_is_the_attentions() -> None:
    """Every family whose attention takes its scale through ``yarn_apply_mscale`` is in
    ``scores.MSCALE_MODEL_TYPES``, and with DeepSeek's YaRN (factor 40, mscale_all_dim 0.707)
    ``RotaryEmbedding.from_hf_config(config).softmax_scale`` is its attention module's own
    ``scaling`` (built on the meta device), as with the class's defaults (``None``: the
    module's ``qk_head_dim ** -0.5``)."""
    import posenc
    from tests.hf.schedules import quiet_config

    problems, checked = [], 0
    for family in families().values():
        found = [
            (c, b) for c, b in attention_classes(type(family.config)) if "yarn_apply_mscale" in b
        ]
        if not found:
            continue
        if family.model_type not in scores.MSCALE_MODEL_TYPES:
            problems.append(f"{family.model_type}: yarn_apply_mscale, not in MSCALE_MODEL_TYPES")
            continue
        for fields in ({"rope_parameters": dict(YARN)}, {}):  # DeepSeek's YaRN; the defaults
            config = quiet_config(type(family.config), **fields)
            module = _build(found[0][0], config, 0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rope = posenc.RotaryEmbedding.from_hf_config(config, device="meta")
            head = getattr(module, "qk_head_dim", None) or module.head_dim
            got = rope.softmax_scale if rope.softmax_scale is not None else head**-0.5
            if not math.isclose(got, module.scaling, rel_tol=1e-9):
                problems.append(f"{family.model_type} {fields}: {got} != {module.scaling}")
        checked += 1
    assert checked >= 15 and not problems, (checked, problems)
