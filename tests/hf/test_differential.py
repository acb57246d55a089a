"""Differential tests: a model's position schedule is the same however its config arrives, and
it is the schedule transformers' own config class describes (issue #34).

The families are found, not listed: every config class of the installed transformers
(``CONFIG_MAPPING``), made with small sizes (:data:`SMALL`; its defaults where it refuses them
or where posenc reads the small config but not its own), and read by
``posenc.hf.schedule.read_schedule`` on the ``meta`` device. For each family posenc builds from:

(a) the schedule (per layer: attention kind, window, chunk, NoPE, θ and rope type, query
    temperature; causal or not) agrees with the config object's own attributes
    (``layer_types``, ``sliding_window``, ``no_rope_layers``, ``layer_rope_theta``,
    ``attention_chunk_size``, ``rope_parameters``, ...);
(b) the schedule read from the object equals the one read from its ``to_dict()`` and from
    its ``to_json_string(use_diff=True)`` without the derived ``layer_types`` and
    ``no_rope_layers`` (a ``config.json`` as most checkpoints have it);
(c) the same with the transformers route switched off (``POSENC_HF_CONFIG_CLASS=0``): the
    families of posenc's own rules (``hf.legacy.FAMILY_RULES``) agree, the rest agree or are
    refused naming a field;
(d) released config.json files: ``tests/hf/test_released_configs.py``.

posenc's deliberate refusals (:data:`DELIBERATE`) stay refusals, whichever way the config
comes. The sweep takes ~8 s of CPU once per process (the whole file ~10 s with ``-n 0``):
no weight is made.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")

import posenc  # noqa: E402
from posenc.errors import PosencError  # noqa: E402
from posenc.hf.legacy import FAMILY_RULES  # noqa: E402
from posenc.hf.route import ENV  # noqa: E402
from posenc.hf.schedule import BIDIRECTIONAL_MODEL_TYPES, ModelSchedule  # noqa: E402
from tests.hf.schedules import SMALL, quiet_config, read, signature, sweep_read  # noqa: E402

DERIVED = ("layer_types", "no_rope_layers")

#: posenc's deliberate refusals (the words of the refusal -> why), each still a refusal from
#: the object and from its config.json.
DELIBERATE = {
    "decided by its model's forward": "the model decides per layer whether to rotate",
    "multi-head latent attention": "posenc's attention has no latent projections",
    "per layer (per_layer_config)": "posenc's encoder has one head size for every layer",
}
#: Families whose ``to_dict()`` is not the config less its derived fields (-> why): compared
#: from the object and the full dict only.
NO_DIFF_DICT = {
    "dory": "to_dict() interleaves 'mlp' blocks into layer_types and doubles "
    "num_hidden_layers to match: without layer_types, the doubled count is a different model",
}
#: Families whose own ``to_dict()`` posenc's rules cannot read without transformers, refused
#: naming the field (-> why).
NO_OWN_RULES_FULL = {
    "dbrx": "its sizes are nested (attn_config, n_layers): refused naming num_hidden_layers",
    "dory": "layer_types interleaves 'mlp' blocks: refused naming them",
}


@dataclass
class Family:
    model_type: str
    config: Any  # the config object
    schedule: ModelSchedule | None  # None: refused
    refusal: str = ""


@functools.cache
def families() -> dict[str, Family]:
    """Every config class of the installed transformers, read from its object: the ones posenc
    builds from and the ones it refuses (composite configs are read through their
    ``text_config``, whose class is swept itself)."""
    from transformers import CONFIG_MAPPING

    found = {}
    for model_type in sorted(CONFIG_MAPPING.keys()):
        cls = CONFIG_MAPPING[model_type]
        if "text_config" in (getattr(cls, "sub_configs", None) or {}):
            continue
        best = None
        for kwargs in (SMALL, {}):
            try:
                config = quiet_config(cls, **kwargs)
            except Exception:
                continue
            try:
                best = Family(model_type, config, sweep_read(config))
                break
            except PosencError as error:
                best = best or Family(model_type, config, None, str(error))
        if best is not None:
            found[model_type] = best
    return found


def built() -> list[Family]:
    return [family for family in families().values() if family.schedule is not None]


def _as_list(value: Any, depth: int) -> list[Any] | None:
    return None if value is None else list(value)[:depth]


def _expected_layer(config: Any, schedule: ModelSchedule, i: int) -> dict[str, Any]:
    """What the config object's own attributes say of layer ``i``."""
    depth = len(schedule.layers)
    kinds = _as_list(getattr(config, "layer_types", None), depth)
    kind = kinds[i] if kinds else "full_attention"
    if "sliding_window" in (getattr(config, "per_layer_attributes", None) or ()):
        sliding = config.per_layer_config[i].sliding_window  # NeoMME: per layer
    else:
        sliding = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", None) is False:
        sliding = None
    if sliding is not None and schedule.model_type in BIDIRECTIONAL_MODEL_TYPES:
        sliding += 1  # |i - j| <= sliding_window
    window = sliding if (kind == "sliding_attention" or kinds is None) else None
    chunk = getattr(config, "attention_chunk_size", None) if kind == "chunked_attention" else None
    nope = None
    for field in ("no_rope_layers", "layer_rope_theta"):
        flags = _as_list(getattr(config, field, None), depth)
        if flags:
            nope = not flags[i]
            break
    return {"kind": kind, "window": window, "chunk": chunk, "nope": nope}


def _rope_parameters(config: Any, kind: str) -> dict[str, Any] | None:
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict):
        return None
    if all(isinstance(v, dict) or v is None for v in params.values()) and params:
        return params.get(kind)
    return params


# --------------------------------------------------------------------------- (a)


@pytest.mark.slow  # the sweep: ~8 s of CPU once per process
def test_every_family_reads_as_its_config_class_attributes_say() -> None:
    """(a): per layer, the kind, window, chunk, NoPE, θ, rope type and query temperature are
    the config object's own, and the model is causal unless its model attends both ways."""
    problems = []
    assert len(built()) > 150, f"only {len(built())} families built: the sweep broke"
    for family in built():
        config, schedule = family.config, family.schedule
        for i, layer in enumerate(schedule.layers):
            want = _expected_layer(config, schedule, i)
            got = {"kind": layer.kind, "window": layer.window, "chunk": layer.chunk}
            got["nope"] = layer.pe is None if want["nope"] is not None else None
            if got != want:
                problems.append(f"{family.model_type} layer {i}: {got} != attributes {want}")
                break
            params = _rope_parameters(config, layer.kind)
            pe = layer.pe
            theta = (params or {}).get("rope_theta") if pe is not None else None
            if theta is not None and pe.base != float(theta):
                problems.append(f"{family.model_type} layer {i}: θ {pe.base} != {params}")
                break
            if getattr(config, "attn_temperature_tuning", False) and pe is None:
                scale = posenc.QueryScale.llama4(config.attn_scale, config.floor_scale)
                if layer.query_scale != scale:
                    problems.append(f"{family.model_type} layer {i}: {layer.query_scale}")
        if schedule.causal != (family.model_type not in BIDIRECTIONAL_MODEL_TYPES):
            problems.append(f"{family.model_type}: causal={schedule.causal}")
    assert not problems, "\n".join(problems)


def _attends_both_ways(model_type: str) -> bool:
    """Whether the modeling file of ``model_type``'s folder builds only bidirectional masks."""
    from transformers import CONFIG_MAPPING

    folder = Path(transformers.__file__).parent / "models"
    folder /= CONFIG_MAPPING[model_type].__module__.split(".")[2]
    source = "".join(path.read_text() for path in folder.glob("modeling_*.py"))
    both = "create_bidirectional_mask" in source or "create_bidirectional_sliding" in source
    causal = re.search(r"create_(sliding_window_)?causal_mask\b[^,]", source) is not None
    return both and not causal


@pytest.mark.slow  # the sweep: ~8 s of CPU once per process
def test_the_bidirectional_list_is_transformers_own() -> None:
    """Every family posenc builds whose modeling code makes only bidirectional masks is on
    BIDIRECTIONAL_MODEL_TYPES (built causal=False); every entry masks both ways (encoders
    beside a decoder in one file, T5Gemma 2's and Dia's, are checked by their attention)."""
    found = {f.model_type for f in built() if _attends_both_ways(f.model_type)}
    assert found <= BIDIRECTIONAL_MODEL_TYPES, sorted(found - BIDIRECTIONAL_MODEL_TYPES)
    beside_a_decoder = {
        "dia_encoder": ("dia", "DiaEncoderLayer", "is_causal=False"),
        "t5gemma2_encoder": ("t5gemma2", "T5Gemma2SelfAttention", "is_causal = False"),
        "nemotron3_5_transcribe_asr_audio": ("nemotron3_5_transcribe", "", "is_causal = False"),
        "nemotron3_5_transcribe_word_timestamp": ("nemotron3_5_transcribe", "", "is_causal"),
        "glmasr_encoder": ("glmasr", "", "is_causal = False"),
    }
    models = Path(transformers.__file__).parent / "models"
    for model_type in sorted(BIDIRECTIONAL_MODEL_TYPES):
        if _attends_both_ways(model_type):
            continue
        assert model_type in beside_a_decoder, f"{model_type} does not mask both ways"
        folder, _, words = beside_a_decoder[model_type]
        source = "".join(p.read_text() for p in (models / folder).glob("modeling_*.py"))
        assert words in source, model_type


# --------------------------------------------------------------------------- (b), (c)


def _dicts(family: Family) -> dict[str, dict[str, Any]]:
    full = family.config.to_dict()
    ways = {"to_dict()": full}
    if family.model_type not in NO_DIFF_DICT:
        diff = json.loads(family.config.to_json_string(use_diff=True))
        ways["use_diff without derived fields"] = {
            "model_type": family.model_type,
            **{k: v for k, v in diff.items() if k not in DERIVED},
        }
    return ways


def _compare(route: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv(ENV, route)
    problems = []
    for family in built():
        want = signature(family.schedule)
        for way, config in _dicts(family).items():
            try:
                got = signature(sweep_read(config))
            except PosencError as error:
                named = any(key in str(error) for key in (*config, *DERIVED))
                own = route == "0" and family.model_type not in FAMILY_RULES
                if own and named and (way != "to_dict()" or family.model_type in NO_OWN_RULES_FULL):
                    continue  # refused, naming the field
                problems.append(f"{family.model_type} from {way}: refused: {error}")
                continue
            if got != want:
                problems.append(f"{family.model_type} from {way}: another schedule")
    return problems


@pytest.mark.slow  # the sweep: ~8 s of CPU once per process
def test_the_object_its_dict_and_its_legacy_dict_give_one_schedule(monkeypatch) -> None:
    """(b): read through the config class, the object, its to_dict() and its config.json
    without derived fields are one schedule, for every family."""
    problems = _compare("1", monkeypatch)
    assert not problems, "\n".join(problems)


@pytest.mark.slow  # the sweep: ~8 s of CPU once per process
def test_without_transformers_posenc_rules_agree_or_refuse_by_name(monkeypatch) -> None:
    """(c): with the route off, posenc's own rules give the same schedule (always for the
    families they cover, FAMILY_RULES) or refuse naming a field: never another schedule."""
    problems = _compare("0", monkeypatch)
    assert not problems, "\n".join(problems)
    for model_type in FAMILY_RULES:  # each family of the rules is swept, its defaults its own
        assert model_type in families() and families()[model_type].schedule is not None
        config = quiet_config(type(families()[model_type].config))  # its defaults
        for field, value in FAMILY_RULES[model_type][0].items():
            assert _class_default(config, field) == value, (model_type, field)


#: Where a config class keeps a legacy θ once built (layer type of its nested parameters).
_THETAS = {
    "rope_theta": "full_attention",
    "global_rope_theta": "full_attention",
    "rope_local_base_freq": "sliding_attention",
    "local_rope_theta": "sliding_attention",
}


def _class_default(config: Any, field: str) -> Any:
    """The default a config class gives ``field``, read from what it builds: θs from its
    rope_parameters, layer patterns from its layer_types (Gemma 2 fixes its pattern, Cohere 2
    and ModernBERT keep none), the rest from the attribute."""
    if field in _THETAS:
        params = config.rope_parameters
        return params.get(_THETAS[field], params)["rope_theta"]
    if field == "sliding_window_pattern":  # layer i is full when (i + 1) % p == 0
        return config.layer_types.index("full_attention") + 1
    if field == "global_attn_every_n_layers":  # layer i is full when i % n == 0
        return config.layer_types.index("full_attention", 1)
    declared = getattr(type(config), "__dataclass_fields__", {}).get(field)
    if declared is not None and not isinstance(declared.default, type(MISSING)):
        return declared.default  # (Qwen 2 declares 4096, then clears it: the window is off)
    return getattr(config, field)


@pytest.mark.slow  # the sweep: ~8 s of CPU once per process
def test_deliberate_refusals_stay_refusals_whichever_way_the_config_comes(monkeypatch) -> None:
    refused = {
        f.model_type: words
        for f in families().values()
        for words in DELIBERATE
        if f.schedule is None and words in f.refusal
    }
    assert len(refused) >= 30, refused  # latent attention alone is ~20 families
    for route in ("1", "0"):
        monkeypatch.setenv(ENV, route)
        for model_type, words in refused.items():
            with pytest.raises(posenc.PosencValueError, match=re.escape(words)):
                read(families()[model_type].config.to_dict())
