"""Released ``config.json`` files, in their published fields and legacy spellings (Gemma 2,
Gemma 3, Qwen 2.5, Llama 4, SmolLM3, Cohere 2, Mistral 7B, ModernBERT; ``tests/hf/configs/``,
written from the files as published), read as their transformers config class reads them and
as their model cards describe them, with the transformers route on and off (issue #34, part d
of the differential tests of ``tests/hf/test_differential.py``)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")

import posenc  # noqa: E402
from posenc.app import cli  # noqa: E402
from posenc.hf.route import ENV  # noqa: E402
from posenc.hf.schedule import ModelSchedule  # noqa: E402
from tests.hf.schedules import SMALL, quiet_config, read, signature  # noqa: E402

FIXTURES = Path(__file__).parent / "configs"


def _fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def _class_of(config: dict[str, Any]) -> Any:
    from transformers import CONFIG_MAPPING

    return quiet_config(CONFIG_MAPPING[config["model_type"]], **config)


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
    schedule = read(raw)
    assert raw == _fixture(name)  # the caller's dict is left as it was (transformers edits)
    assert signature(schedule) == signature(read(_class_of(raw)))
    assert _layers(schedule) == rows
    assert schedule.causal is causal
    encoder = posenc.Encoder.from_hf_config(raw, device="meta")
    assert all(layer.attn.causal is causal for layer in encoder.layers)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(ENV, "0")
    if name in OWN_RULES_REFUSE:
        with pytest.raises(posenc.PosencValueError, match=OWN_RULES_REFUSE[name]):
            read(raw)
    else:
        assert signature(read(raw)) == signature(schedule)


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
        schedule = read(raw)
        got = [(x.kind, x.window) for x in schedule.layers[layer]]
        assert got == expected, route
        assert signature(schedule) == signature(read(_class_of(raw)))
        assert schedule.layers[0].pe.base == float(raw.get("rope_theta", 1e4))


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("mistral-7b-v0.1", "sliding_window"),  # as Mistral 7B v0.2 and later publish it
        ("gemma-2-9b", "sliding_window"),
        ("gemma-3-1b-it", "sliding_window"),
        ("c4ai-command-r7b-12-2024", "sliding_window"),
        ("qwen2.5-7b-instruct", "sliding_window"),
        ("llama-4-scout-17b-16e-instruct", "attention_chunk_size"),
    ],
)
def test_a_stated_null_window_or_chunk_is_none_not_the_class_default(
    name: str, field: str, monkeypatch
) -> None:
    """``"sliding_window": null`` (or ``"attention_chunk_size": null``) in a config.json
    switches the windows (chunks) off: the config class keeps the null, its default applies
    only to an absent field. Own rules and transformers' class agree, layer by layer."""
    raw = _fixture(name)
    if name == "qwen2.5-7b-instruct":
        raw.update(use_sliding_window=True, max_window_layers=4)
    text = raw.get("text_config", raw)
    text[field] = None
    want = signature(read(_class_of(raw)))
    assert all(x.window is None and x.chunk is None for x in read(_class_of(raw)).layers)
    for route in ("1", "0"):
        monkeypatch.setenv(ENV, route)
        assert signature(read(raw)) == want, route


@pytest.mark.parametrize(
    ("name", "field", "change"),
    [
        ("mistral-7b-v0.1", "rope_theta", {}),
        ("smollm3-3b", "rope_theta", {}),
        ("qwen2.5-7b-instruct", "max_window_layers", {"use_sliding_window": True}),
    ],
)
def test_own_rules_refuse_a_stated_null_they_would_have_to_guess(
    name: str, field: str, change: dict, monkeypatch
) -> None:
    """A field stated as null that posenc's own rules would fill with a family default (the
    class keeps the null, and only an absent field takes its default) is refused by name
    without transformers, never filled."""
    raw = {**_fixture(name), **change, field: None}
    monkeypatch.setenv(ENV, "0")
    with pytest.raises(posenc.PosencValueError, match=f"states {field} as null"):
        read(raw)


@pytest.mark.parametrize(
    ("name", "typo", "field"),
    [
        ("mistral-7b-v0.1", "slidng_window", "sliding_window"),
        ("mistral-7b-v0.1", "rope_theat", "rope_theta"),
        ("gemma-3-1b-it", "sliding_window_patern", "sliding_window_pattern"),
        ("smollm3-3b", "no_rope_layer", "no_rope_layers"),
        ("llama-4-scout-17b-16e-instruct", "attention_chunk", "attention_chunk_size"),
    ],
)
def test_a_misspelt_layer_field_is_named_in_a_warning(
    name: str, typo: str, field: str, monkeypatch
) -> None:
    """transformers keeps a misspelt key as an attribute of its own and reads the default in
    its place; posenc reads the same schedule but says so, naming both spellings."""
    raw = _fixture(name)
    text = raw.get("text_config", raw)
    text[typo] = text.pop(field, 4)
    want = signature(read(_class_of(raw)))
    for route in ("1", "0"):
        monkeypatch.setenv(ENV, route)
        with pytest.warns(UserWarning, match=rf"'{typo}'.*did you mean '{field}'\?"):
            assert signature(read(raw)) == want, route


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_released_files_give_no_misspelling_warning(name: str, monkeypatch) -> None:
    for route in ("1", "0"):
        monkeypatch.setenv(ENV, route)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", "config field", UserWarning)
            if route == "0" and name in OWN_RULES_REFUSE:  # (refused after the check)
                with pytest.raises(posenc.PosencValueError, match=OWN_RULES_REFUSE[name]):
                    read(_fixture(name))
            else:
                read(_fixture(name))


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
        read(raw)
    raw = {**SMALL, "model_type": "afmoe", "rope_theta": 1e4}
    with pytest.raises(posenc.PosencValueError, match="'afmoe' has no layer_types"):
        read(raw)
    raw = {**SMALL, "model_type": "new_model", "rope_theta": 1e4, "local_attention": 8}
    with pytest.raises(posenc.PosencValueError, match="has local_attention, which changes"):
        read(raw)
    # a model type no one knows: the generic rules read the legacy fields
    raw = {**SMALL, "model_type": "new_model", "rope_theta": 1e4, "sliding_window": 4,
           "sliding_window_pattern": 4, "no_rope_layer_interval": 4}  # fmt: skip
    with pytest.warns(UserWarning, match="not one of the model types checked"):
        schedule = read(raw)
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
        read(raw)
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
