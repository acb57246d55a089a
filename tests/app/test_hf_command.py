"""``posenc hf CONFIG.json``: the schedule table, the tables docs/schedules.md shows (they must
stay the command's output), and bad configs as one line with status 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from posenc.app import cli

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "docs" / "configs").glob("*.json"))
GEMMA2 = ROOT / "tests" / "hf" / "configs" / "gemma-2-9b.json"


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_the_documented_tables_are_the_commands_output(path: Path, capsys) -> None:
    assert cli.main(["hf", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.strip() in (ROOT / "docs" / "schedules.md").read_text()


def test_the_table_reads_each_layer(tmp_path: Path, capsys) -> None:
    config = {
        "model_type": "smollm3",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "no_rope_layers": [1, 1, 1, 0],
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "use_sliding_window": True,
        "sliding_window": 16,
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert cli.main(["hf", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "smollm3: 4 layers, hidden 64, 4 heads (2 key/value) of 16"
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[5:]]
    assert rows[0] == [
        "0",
        "sliding_attention",
        "window 16",
        "linear",
        "50000",
        "2",
        "16/16",
        "half",
        "-",
        "-",
        "-",
        "1/√16",
    ]
    assert rows[3][:4] == ["3", "full_attention", "-", "none (NoPE)"]


@pytest.mark.parametrize(
    ("config", "rope", "factor", "layout"),
    [
        # Qwen2-VL's published config.json: flat, multimodal RoPE in rope_scaling
        (
            {"model_type": "qwen2_vl", "rope_theta": 1e6,
             "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
            "default", "-", "half, M-RoPE blocked [2, 3, 3]",
        ),
        # HunYuan's checkpoints: dynamic with alpha is NTK-alpha, its alpha in the factor column
        (
            {"model_type": "hunyuan_v1_dense", "head_dim": 16, "rope_theta": 1e4,
             "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0}},
            "ntk_alpha", "α 1000", "half",
        ),
    ],
)  # fmt: skip
def test_the_table_shows_multimodal_sections_and_ntk_alpha(
    tmp_path: Path, capsys, config: dict, rope: str, factor: str, layout: str
) -> None:
    sizes = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
             "num_key_value_heads": 2}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**sizes, **config}))
    assert cli.main(["hf", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = [cell.strip() for cell in lines[5].strip("|").split("|")]
    assert (row[3], row[5], row[7]) == (rope, factor, layout)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "is not JSON"),
        ("[1, 2]", "must hold a JSON object"),
        ("{}", "no num_hidden_layers"),
        # refused by the encoder the table describes, not printed
        (
            '{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, '
            '"num_key_value_heads": 3, "rope_theta": 10000.0}',
            r"num_kv_heads \(3\) must divide num_heads \(4\)",
        ),
    ],
)
def test_bad_configs_are_one_line_and_status_2(tmp_path: Path, capsys, text: str, match: str):
    path = tmp_path / "config.json"
    path.write_text(text)
    assert cli.main(["hf", str(path)]) == 2
    err = capsys.readouterr().err
    assert re.search(match, err) and len(err.strip().splitlines()) == 1
    assert cli.main(["hf", str(tmp_path / "missing.json")]) == 2


@pytest.mark.parametrize("value", ["2", "offf", "flase", "disable"])
def test_a_bad_config_class_switch_is_refused_by_name(
    capsys, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """A typo in ``POSENC_HF_CONFIG_CLASS`` does not silently leave the route on."""
    monkeypatch.setenv("POSENC_HF_CONFIG_CLASS", value)
    assert cli.main(["hf", str(GEMMA2)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "POSENC_HF_CONFIG_CLASS must be one of" in err and repr(value) in err


@pytest.mark.parametrize(
    ("value", "via"),
    [
        ("", "transformers"),
        ("1", "transformers"),
        (" On ", "transformers"),
        ("true", "transformers"),
        ("0", "posenc's own rules"),
        ("OFF", "posenc's own rules"),
        ("no", "posenc's own rules"),
    ],
)
def test_the_config_class_switch_reads_its_spellings(
    capsys, monkeypatch: pytest.MonkeyPatch, value: str, via: str
) -> None:
    monkeypatch.setenv("POSENC_HF_CONFIG_CLASS", value)
    assert cli.main(["hf", str(GEMMA2)]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith(f"read through {via}")


def test_the_table_shows_sinks_softcap_and_scale(tmp_path: Path, capsys) -> None:
    """Gemma 2's published file: soft-cap 50 on every layer, its query_pre_attn_scalar 256
    over heads of 256 (the default scale, 1/√256); gpt-oss: a sink on every layer; Granite:
    its attention_multiplier as the scale."""
    assert cli.main(["hf", str(GEMMA2)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3].split("|")[-4:-1] == [" sinks ", " softcap ", " scale  "]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[5:]]
    assert {tuple(row[-3:]) for row in rows} == {("-", "50", "1/√256")}
    sizes = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "rope_theta": 1e4}  # fmt: skip
    for config, want in [
        ({"model_type": "gpt_oss", "head_dim": 16}, ("yes", "-", "1/√16")),
        ({"model_type": "granite", "attention_multiplier": 0.0078125}, ("-", "-", "0.0078125")),
    ]:
        path = tmp_path / "config.json"
        path.write_text(json.dumps({**sizes, **config}))
        assert cli.main(["hf", str(path)]) == 0
        rows = capsys.readouterr().out.splitlines()[5:]
        assert [tuple(c.strip() for c in row.strip("|").split("|"))[-3:] for row in rows] == [
            want
        ] * 2
