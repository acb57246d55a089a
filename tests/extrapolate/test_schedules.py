"""``posenc extrapolate`` with per-layer schedules, end to end in a tiny run (the README test
command runs it): ``--pe rope/rope/rope/none`` and its tempered form train and are evaluated,
RoPE's zero-shot scalings reach a schedule's rotary layers, results name schedules as
written; ``results.json``/``results.md`` are rewritten after every model, so a sweep stopped
after its first model keeps that model's numbers, and ``--resume`` completes it with exactly
the numbers of an uninterrupted sweep. Lengthgen takes the same schedules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from posenc import NoPE, RotaryEmbedding
from posenc.app.cli import main
from posenc.extrapolate import sweep
from posenc.extrapolate.config import PRESETS, SCHEDULES, ExtrapolateConfig
from posenc.extrapolate.train import build_model
from posenc.lengthgen.config import TrainConfig
from posenc.lengthgen.evaluate import read_jsonl
from posenc.lengthgen.tasks import get_task
from posenc.lengthgen.train import build_model as lengthgen_model
from posenc.runs.schedules import query_temperature
from tests.extrapolate.corpora import own_cache, word_files
from tests.lengthgen.tiny import TINY_CLI, run_cli

SCHEDULED = "rope,rope/rope/rope/none,rope/none:temp"
TINY = ["--dim", "16", "--depth", "4", "--heads", "2", "--batch-size", "4", "--train-len", "16",
        "--eval-lens", "16,32,64", "--steps", "3", "--threads", "1", "--no-progress", "--no-plot",
        "--retrieval", "--needle-len", "4", "--retrieval-trials", "2",
        "--context-blocks", "4"]  # fmt: skip


class Stop(Exception):
    """The injected failure that stops a sweep after its first model."""


@pytest.fixture
def text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    own_cache(tmp_path, monkeypatch)
    return word_files(tmp_path / "text")


def results(out: Path) -> dict[str, Any]:
    return json.loads((out / "results.json").read_text())


def labels(document: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(r["pe"], (r["scaling"] or {}).get("rope_type")) for r in document["runs"]]


def test_schedules_train_and_evaluate(tmp_path: Path, text: Path) -> None:
    out = tmp_path / "out"
    assert main(["extrapolate", "--text", str(text), "--pe", SCHEDULED, *TINY,
                 "--out", str(out)]) == 0  # fmt: skip
    document = results(out)
    scalings = [None, "linear", "dynamic", "yarn"]
    assert labels(document) == [(pe, s) for pe in SCHEDULED.split(",") for s in scalings]
    assert document["config"]["pe"] == SCHEDULED.split(",")
    assert document["config"]["pending"] == []
    for run in document["runs"]:
        assert [row["length"] for row in run["eval"]] == [16, 32, 64]
        assert {row["length"] for row in run["retrieval"]} == {16, 32, 64}
        assert run["by_context"]
    # a scaling changes the numbers of a schedule's rotary layers past L (so it reached them)
    by = {(r["pe"], (r["scaling"] or {}).get("rope_type")): r["eval"] for r in document["runs"]}
    for pe in SCHEDULED.split(",")[1:]:
        assert by[pe, "yarn"][-1]["bpb"] != by[pe, None][-1]["bpb"]
    markdown = (out / "results.md").read_text()
    assert "| rope/rope/rope/none | " in markdown and "| rope/none:temp+yarn | " in markdown
    assert "Partial" not in markdown
    assert (out / "rope_rope_rope_none" / "seed0" / "checkpoint.pt").is_file()


def test_the_model_of_a_schedule_has_its_layers() -> None:
    config = ExtrapolateConfig(pe="rope/rope/rope/none:temp", dim=16, depth=8, heads=2,
                               train_len=32)  # fmt: skip
    model = build_model(config, 256)
    encoder = model.encoder
    layers = encoder.layers
    kinds = [type(pe) for pe in encoder.pes]
    assert kinds == [RotaryEmbedding] * 3 + [NoPE] + [RotaryEmbedding] * 3 + [NoPE]
    scales = [layer.attn.query_scale for layer in layers]
    assert scales == [None] * 3 + [query_temperature(32)] + [None] * 3 + [query_temperature(32)]
    # a zero-shot scaling reaches the rotary layers and leaves the NoPE ones as they were
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    scaled = model.with_rope_scaling(yarn).encoder
    assert [type(pe) for pe in scaled.pes] == kinds
    rotary = [pe for pe in scaled.pes if isinstance(pe, RotaryEmbedding)]
    assert len(rotary) == 6 and all(pe.scaling["rope_type"] == "yarn" for pe in rotary)
    assert [layer.attn.query_scale for layer in scaled.layers] == scales
    assert encoder.pes[0].scaling["rope_type"] == "default"  # the model itself is unchanged


def test_results_are_written_after_each_model_and_resume_completes_them(
    tmp_path: Path, text: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["extrapolate", "--text", str(text), "--pe", "rope/none,alibi", *TINY]
    real = sweep.run_one

    def fail_second(config: ExtrapolateConfig, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if config.pe == "alibi":
            raise Stop
        return real(config, *args, **kwargs)

    stopped = tmp_path / "stopped"
    monkeypatch.setattr(sweep, "run_one", fail_second)
    with pytest.raises(Stop):
        main([*argv, "--out", str(stopped)])
    partial = results(stopped)
    assert {r["pe"] for r in partial["runs"]} == {"rope/none"}
    assert partial["config"]["pending"] == ["alibi seed 0"]
    assert (
        "**Partial**: 1 model(s) still to run (alibi seed 0)"
        in (stopped / "results.md").read_text()
    )

    monkeypatch.setattr(sweep, "run_one", real)
    trained: list[str] = []
    real_train = sweep.train_model

    def counted(config: ExtrapolateConfig, *args: Any, **kwargs: Any) -> Any:
        trained.append(config.pe)
        return real_train(config, *args, **kwargs)

    monkeypatch.setattr(sweep, "train_model", counted)
    assert main([*argv, "--out", str(stopped), "--resume"]) == 0
    assert trained == ["alibi"]  # the finished model's stored evaluation is reused
    monkeypatch.setattr(sweep, "train_model", real_train)
    straight = tmp_path / "straight"
    assert main([*argv, "--out", str(straight)]) == 0
    resumed = results(stopped)
    assert resumed["config"]["pending"] == []
    assert resumed["runs"] == results(straight)["runs"]  # every number, exactly
    assert resumed["runs"][: len(partial["runs"])] == partial["runs"]


def test_a_sweep_stopped_while_drawing_keeps_both_tables(
    tmp_path: Path, text: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tables are written before the figures, each whole: a sweep killed while its first
    figure is drawn (seconds on a CPU) leaves a ``results.md`` that matches ``results.json``."""
    from posenc.extrapolate import plots

    def killed(*args: Any, **kwargs: Any) -> None:
        raise Stop

    monkeypatch.setattr(plots, "plot_extrapolation", killed)
    out = tmp_path / "out"
    argv = [a for a in TINY if a != "--no-plot"]
    with pytest.raises(Stop):
        main(["extrapolate", "--text", str(text), "--pe", "rope/none,alibi", *argv,
              "--scalings", "none", "--out", str(out)])  # fmt: skip
    assert [r["pe"] for r in results(out)["runs"]] == ["rope/none"]
    markdown = (out / "results.md").read_text()
    assert "| rope/none | " in markdown and "(alibi seed 0)" in markdown
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == ["results.json", "results.md"]


def test_bad_schedules_are_one_line_and_exit_2(
    text: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["extrapolate", "--text", str(text)], ["lengthgen"]):
        assert main([*command, "--pe", "rope,rope/none:tmp"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "entry 2 ('none:tmp')" in lines[0], lines
    assert main(["extrapolate", "--text", str(text), "--pe", "rope/none+random"]) == 2
    assert "+random" in capsys.readouterr().err


def test_the_scale_preset_adds_the_schedules() -> None:
    assert SCHEDULES == ("rope/rope/rope/none", "rope/rope/rope/none:temp")
    assert PRESETS["scale"]["pe"][-2:] == list(SCHEDULES)


def test_lengthgen_takes_the_same_schedules(tmp_path: Path) -> None:
    """A tiny lengthgen run of a schedule with randomized positions, and its model."""
    out = tmp_path / "lengthgen"
    argv = [*TINY_CLI, "--pe", "rope/none:temp+random", "--random-max", "32",
            "--pe-option", "rope.base=100.0", "--out", str(out)]  # fmt: skip
    argv[argv.index("--depth") + 1] = "4"
    assert run_cli(argv) == 0
    (record,) = read_jsonl(out / "results.jsonl")
    assert (record["label"], record["random_positions"]) == ("rope/none:temp+random", True)
    assert record["config"]["pe_options"] == {"rope": {"base": 100.0}}
    config = TrainConfig.from_dict(record["config"])
    encoder = lengthgen_model(config, get_task(config.task)).encoder
    layers = encoder.layers
    assert [type(pe) for pe in encoder.pes] == [RotaryEmbedding, NoPE] * 2
    assert encoder.pes[0].base == 100.0
    assert layers[1].attn.query_scale == query_temperature(32)  # random_max: the trained range
