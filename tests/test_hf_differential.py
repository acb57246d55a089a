"""Differential tests: a model's position schedule is the same however its config arrives, and
it is the schedule transformers' own config class describes (issue #34).

The families are found, not listed: every config class of the installed transformers
(``CONFIG_MAPPING``), made with small sizes (:data:`SMALL`; its defaults where it refuses them
or where posenc reads the small config but not its own), and read by
``posenc.hf_models.read_schedule`` on the ``meta`` device. For each family posenc builds from:

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
(d) ``tests/hf_configs/`` holds config.json files of released models with their published
    fields and legacy spellings: each reads as its config class reads it, and as the model
    card describes it, with the route on and off.

posenc's deliberate refusals (:data:`DELIBERATE`) stay refusals, whichever way the config
comes. The whole file takes ~10 s (``-n 0``): no weight is made.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

import posenc  # noqa: E402
from posenc import cli  # noqa: E402
from posenc.encodings.hf.legacy import FAMILY_RULES  # noqa: E402
from posenc.encodings.hf.route import ENV  # noqa: E402
from posenc.errors import PosencError  # noqa: E402
from posenc.hf_models import BIDIRECTIONAL_MODEL_TYPES, ModelSchedule, read_schedule  # noqa: E402

FIXTURES = Path(__file__).parent / "hf_configs"
#: Small sizes (a class that refuses them, or whose small config posenc refuses while it reads
#: the defaults, is read with its defaults).
SMALL = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 64,
    "num_hidden_layers": 8,
}
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


def _quiet_config(cls: type, **kwargs: Any) -> Any:
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls(**kwargs)
    finally:
        logging.set_verbosity(level)


def _read(config: Any) -> ModelSchedule:
    with torch.device("meta"):
        return read_schedule(config)


def _sweep_read(config: Any) -> ModelSchedule:
    """:func:`_read` without the warning posenc gives, once per model type, for a rotary
    family it has not checked (``KNOWN_MODEL_TYPES``; the schedule is what is compared here)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "config model_type .* is not one of the model types")
        return _read(config)


def signature(schedule: ModelSchedule) -> tuple:
    """Everything a schedule says, comparable with ``==``."""

    def encoding(pe: Any) -> Any:
        if pe is None:
            return None
        return (
            type(pe).__name__,
            pe.head_dim,
            pe.rotary_dim,
            pe.base,
            pe.interleaved,
            getattr(pe, "clockwise", False),
            tuple(sorted((dict(pe.scaling or {})).items(), key=lambda kv: kv[0])).__repr__(),
            tuple(getattr(pe, "mrope_section", None) or ()),
        )

    layers = tuple(
        (layer.kind, layer.window, layer.chunk, layer.query_scale, encoding(layer.pe))
        for layer in schedule.layers
    )
    sizes = (schedule.hidden_size, schedule.num_heads, schedule.num_kv_heads, schedule.head_dim)
    return (schedule.model_type, schedule.causal, sizes, schedule.intermediate_size, layers)


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
                config = _quiet_config(cls, **kwargs)
            except Exception:
                continue
            try:
                best = Family(model_type, config, _sweep_read(config))
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
                got = signature(_sweep_read(config))
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
        config = _quiet_config(type(families()[model_type].config))  # its defaults
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
                _read(families()[model_type].config.to_dict())


# --------------------------------------------------------------------------- (d)


def _fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def _class_of(config: dict[str, Any]) -> Any:
    from transformers import CONFIG_MAPPING

    return _quiet_config(CONFIG_MAPPING[config["model_type"]], **config)


def _layers(schedule: ModelSchedule) -> list[tuple]:
    """(kind, window or chunk, θ or None for NoPE, rope type, factor, temperature?) per layer."""
    rows = []
    for layer in schedule.layers:
        pe = layer.pe
        scaling = dict(pe.scaling or {}) if pe is not None else {}
        rows.append(
            (
                layer.kind,
                layer.window if layer.window is not None else layer.chunk,
                None if pe is None else pe.base,
                scaling.get("rope_type", "default") if pe is not None else None,
                scaling.get("factor"),
                layer.query_scale is not None,
            )
        )
    return rows


# the published schedules, written from the model cards (independent of any config class)
EXPECTED = {
    "gemma-2-9b": (
        True,
        [
            ("sliding_attention", 4096, 1e4, "default", None, False)
            if i % 2 == 0
            else ("full_attention", None, 1e4, "default", None, False)
            for i in range(42)
        ],
    ),
    "gemma-3-1b-it": (
        True,
        [
            ("full_attention", None, 1e6, "default", None, False)
            if (i + 1) % 6 == 0
            else ("sliding_attention", 512, 1e4, "default", None, False)
            for i in range(26)
        ],
    ),
    "gemma-3-4b-it": (
        True,
        [
            ("full_attention", None, 1e6, "linear", 8.0, False)
            if (i + 1) % 6 == 0
            else ("sliding_attention", 1024, 1e4, "default", None, False)
            for i in range(34)
        ],
    ),
    "qwen2.5-7b-instruct": (True, [("full_attention", None, 1e6, "default", None, False)] * 28),
    "llama-4-scout-17b-16e-instruct": (
        True,
        [
            ("full_attention", None, None, None, None, True)
            if (i + 1) % 4 == 0
            else ("chunked_attention", 8192, 5e5, "llama3", 16.0, False)
            for i in range(48)
        ],
    ),
    "smollm3-3b": (
        True,
        [
            ("full_attention", None, None, None, None, False)
            if (i + 1) % 4 == 0
            else ("full_attention", None, 5e6, "default", None, False)
            for i in range(36)
        ],
    ),
    "c4ai-command-r7b-12-2024": (
        True,
        [
            ("full_attention", None, None, None, None, False)
            if (i + 1) % 4 == 0
            else ("sliding_attention", 4096, 5e4, "default", None, False)
            for i in range(32)
        ],
    ),
    "mistral-7b-v0.1": (True, [("full_attention", 4096, 1e4, "default", None, False)] * 32),
    "modernbert-base": (
        False,
        [
            ("full_attention", None, 160000.0, "default", None, False)
            if i % 3 == 0
            else ("sliding_attention", 65, 1e4, "default", None, False)
            for i in range(22)
        ],
    ),
}
#: Fixtures posenc's own rules refuse (-> the field they name): the file leaves sizes to
#: its config class's defaults.
OWN_RULES_REFUSE = {"gemma-3-4b-it": "num_attention_heads"}


def test_the_fixtures_are_the_released_files() -> None:
    assert sorted(p.stem for p in FIXTURES.glob("*.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_released_config_json_reads_as_published(name: str, monkeypatch, capsys) -> None:
    """(d): the file reads as its config class reads it (the class built from it by the test),
    as its model card describes it, through Encoder.from_hf_config too, without a word from
    transformers' logging; and without transformers the same, or refused naming the field."""
    raw = _fixture(name)
    causal, rows = EXPECTED[name]
    schedule = _read(raw)
    assert raw == _fixture(name)  # the caller's dict is left as it was (transformers edits)
    assert signature(schedule) == signature(_read(_class_of(raw)))
    assert _layers(schedule) == rows
    assert schedule.causal is causal
    encoder = posenc.Encoder.from_hf_config(raw, device="meta")
    assert all(layer.attn.causal is causal for layer in encoder.layers)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(ENV, "0")
    if name in OWN_RULES_REFUSE:
        with pytest.raises(posenc.PosencValueError, match=OWN_RULES_REFUSE[name]):
            _read(raw)
    else:
        assert signature(_read(raw)) == signature(schedule)


@pytest.mark.parametrize(
    ("name", "change", "layer", "expected"),
    [
        # Qwen 2.5 with its window on: only the layers from max_window_layers on slide
        (
            "qwen2.5-7b-instruct",
            {"use_sliding_window": True, "max_window_layers": 24, "sliding_window": 4096},
            slice(22, 26),
            [("full_attention", None)] * 2 + [("sliding_attention", 4096)] * 2,
        ),
        # Mistral without rope_theta: θ = 10000, as transformers defaults it
        ("mistral-7b-v0.1", {"rope_theta": None}, slice(0, 1), [("full_attention", 4096)]),
        # SmolLM3 with its NoPE layers stated, and a window: the NoPE layers slide
        (
            "smollm3-3b",
            {"use_sliding_window": True, "sliding_window": 128},
            slice(2, 5),
            [("full_attention", None), ("sliding_attention", 128), ("full_attention", None)],
        ),
    ],
)
def test_legacy_variants_read_as_their_class_reads_them(
    name: str, change: dict, layer: slice, expected: list, monkeypatch
) -> None:
    raw = {k: v for k, v in {**_fixture(name), **change}.items() if v is not None}
    for route in ("1", "0"):
        monkeypatch.setenv(ENV, route)
        schedule = _read(raw)
        got = [(x.kind, x.window) for x in schedule.layers[layer]]
        assert got == expected, route
        assert signature(schedule) == signature(_read(_class_of(raw)))
        assert schedule.layers[0].pe.base == float(raw.get("rope_theta", 1e4))


def test_rotary_embedding_from_a_legacy_gemma3_file_takes_each_layer_types_theta(
    monkeypatch,
) -> None:
    raw = _fixture("gemma-3-1b-it")
    for route in ("1", "0"):
        monkeypatch.setenv(ENV, route)
        local = posenc.RotaryEmbedding.from_hf_config(raw, layer_type="sliding_attention")
        full = posenc.RotaryEmbedding.from_hf_config(raw, layer_type="full_attention")
        assert (local.base, full.base) == (1e4, 1e6), route


def test_own_rules_refuse_a_known_familys_layer_field_by_name(monkeypatch) -> None:
    """Without transformers, a family whose config class places its layers by a formula of
    its own (Qwen2-MoE: every other layer below max_window_layers) is not read by another's."""
    monkeypatch.setenv(ENV, "0")
    raw = {**SMALL, "model_type": "qwen2_moe", "rope_theta": 1e4, "use_sliding_window": True}
    with pytest.raises(posenc.PosencValueError, match="has use_sliding_window but no layer_types"):
        _read(raw)
    raw = {**SMALL, "model_type": "afmoe", "rope_theta": 1e4}
    with pytest.raises(posenc.PosencValueError, match="'afmoe' has no layer_types"):
        _read(raw)
    raw = {**SMALL, "model_type": "new_model", "rope_theta": 1e4, "local_attention": 8}
    with pytest.raises(posenc.PosencValueError, match="has local_attention, which changes"):
        _read(raw)
    # a model type no one knows: the generic rules read the legacy fields
    raw = {**SMALL, "model_type": "new_model", "rope_theta": 1e4, "sliding_window": 4,
           "sliding_window_pattern": 4, "no_rope_layer_interval": 4}  # fmt: skip
    with pytest.warns(UserWarning, match="not one of the model types checked"):
        schedule = _read(raw)
    assert [(x.kind, x.pe is None) for x in schedule.layers[2:4]] == [
        ("sliding_attention", False),
        ("full_attention", True),
    ]


def test_a_file_its_config_class_refuses_is_read_for_its_rotation_only(tmp_path, capsys) -> None:
    """A dict transformers' class refuses (here a field posenc does not read) falls back to
    posenc's own rules: its rotation is read, its schedule refused naming the per-layer field
    the class would have derived (Gemma 2's layer_types), never the all-full default."""
    raw = {**_fixture("gemma-2-9b"), "attn_logit_softcapping": "fifty"}
    rope = posenc.RotaryEmbedding.from_hf_config(raw)
    hunyuan = {"model_type": "hunyuan_vl_text", **SMALL, "rope_parameters": {
        "rope_theta": 1e4, "mrope_section": [2] * 4, "xdrope_section": [1, 3, 2, 2]}}  # fmt: skip
    with pytest.raises(posenc.PosencValueError, match="xdrope_section"):  # its class edits
        posenc.RotaryEmbedding.from_hf_config(hunyuan)  # the dict before it refuses it
    assert (rope.head_dim, rope.base) == (256, 1e4)
    with pytest.raises(posenc.PosencValueError, match="config has no layer_types") as info:
        _read(raw)
    assert "Gemma2Config refuses it" in str(info.value)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    assert cli.main(["hf", str(path)]) == 2
    assert "config has no layer_types" in capsys.readouterr().err


@pytest.mark.parametrize("route", ["1", "0"])
def test_posenc_hf_says_how_it_read_the_file(route: str, monkeypatch, capsys) -> None:
    monkeypatch.setenv(ENV, route)
    assert cli.main(["hf", str(FIXTURES / "mistral-7b-v0.1.json")]) == 0
    second = capsys.readouterr().out.splitlines()[1]
    if route == "1":
        version = transformers.__version__
        assert (
            second
            == f"read through transformers {version} MistralConfig; its defaults give head_dim"
        )
    else:
        assert second == f"read through posenc's own rules ({ENV}=0)"
    monkeypatch.setenv(ENV, "1")
    assert cli.main(["hf", str(FIXTURES / "modernbert-base.json")]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("of 64, bidirectional")
