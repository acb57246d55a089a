"""``posenc probe``: on a briefly trained ``posenc extrapolate`` run and a ``posenc lengthgen``
run it prints a table per model by depth and writes the figure and the JSON; every mistake is
one line on stderr and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from posenc.app.cli import main
from posenc.extrapolate.config import ExtrapolateConfig
from posenc.extrapolate.corpus import prepare_corpus
from posenc.extrapolate.train import train_model
from posenc.lengthgen.config import TrainConfig
from posenc.lengthgen.train import train
from tests.extrapolate.corpora import many_small, own_cache
from tests.lengthgen import tiny

TINY = {"dim": 16, "depth": 2, "heads": 2, "train_len": 16, "batch_size": 4, "steps": 2}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An extrapolate sweep folder with two trained models and a fine-tune's checkpoint
    (which the probe leaves out), and its corpus in its own cache."""
    root = tmp_path_factory.mktemp("probe")
    with pytest.MonkeyPatch.context() as patch:
        own_cache(root, patch)
        many_small(root / "text", 40)
        corpus = prepare_corpus(root / "text")
        for pe in ("rope", "sinusoidal"):
            config = ExtrapolateConfig(pe=pe, **TINY)
            train_model(config, corpus, root / "out" / pe / "seed0")
        finetune = root / "out" / "rope" / "seed0" / "finetune-yarn-64"
        finetune.mkdir()
        (finetune / "checkpoint.pt").write_bytes(b"not read")
    return root


@pytest.fixture
def cache(sweep: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own_cache(sweep, monkeypatch)


def test_a_sweep_gives_a_table_per_model_and_a_figure(
    sweep: Path, cache: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    figure, record = tmp_path / "probe.png", tmp_path / "probe.json"
    argv = ["probe", str(sweep / "out"), "--windows", "8", "-o", str(figure)]
    assert main([*argv, "--json", str(record)]) == 0
    out = capsys.readouterr().out
    for label in ("rope seed 0 (trained at 16)", "sinusoidal seed 0 (trained at 16)"):
        assert label in out
    assert out.count("| 0 (embedding) |") == 2 and out.count("| 2 (block 2) |") == 2
    assert figure.stat().st_size > 0
    rows = json.loads(record.read_text())
    assert sorted(rows) == ["rope seed 0", "sinusoidal seed 0"]
    assert [r["depth"] for r in rows["rope seed 0"]["rows"]] == [0, 1, 2]
    assert rows["rope seed 0"]["fit_windows"] == 4 and rows["rope seed 0"]["length"] == 16


def test_one_run_folder_at_another_length(
    sweep: Path, cache: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = sweep / "out" / "rope" / "seed0"
    argv = ["probe", str(run), "--windows", "6", "--length", "24", "-o", str(tmp_path / "p.svg")]
    assert main(argv) == 0
    assert "3 windows fit, 3 held out, 24 tokens each" in capsys.readouterr().out


def test_a_lengthgen_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = TrainConfig(**{**tiny.TINY, "steps": 2}, task="copy-v3", pe="alibi")
    train(config, tmp_path / "run")
    assert main(["probe", str(tmp_path / "run"), "-o", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "copy-v3 alibi seed 0 (trained on inputs up to 5)" in out
    assert "| 1 (block 1) |" in out


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["missing"], ["RUN", "missing", "no such file"]),
        (["{empty}"], ["RUN", "no checkpoint.pt"]),
        (["{junk}"], ["RUN", "not a posenc checkpoint"]),
        (["{run}", "--windows", "1"], ["--windows", "1"]),
        (["{run}", "--length", "1"], ["--length", "1"]),
        (["{run}", "--fit", "1.5"], ["--fit", "1.5"]),
        (["{run}", "-o", "p.txt"], ["--output", "p.txt"]),
        (["{run}", "--windows", "100000"], ["--windows 100000", "validation tokens"]),
        (["{run}/finetune-yarn-64/checkpoint.pt"], ["not a posenc checkpoint"]),
    ],
)
def test_mistakes_are_one_line_and_exit_2(
    argv: list[str],
    fragments: list[str],
    sweep: Path,
    cache: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk").write_text("not a checkpoint")
    places = {"empty": tmp_path / "empty", "junk": tmp_path / "junk"}
    places["run"] = sweep / "out" / "rope" / "seed0"
    argv = [a.format(**places) for a in argv]
    assert main(["probe", *argv, *(["-o", str(tmp_path / "p.png")] * ("-o" not in argv))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for fragment in fragments:
        assert fragment in err[0], err[0]


def test_a_corpus_missing_from_the_cache_is_named(
    sweep: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    own_cache(tmp_path, monkeypatch)  # an empty cache
    assert main(["probe", str(sweep / "out" / "rope"), "-o", str(tmp_path / "p.png")]) == 2
    assert "not in the cache" in capsys.readouterr().err


def test_untrained_adds_each_model_as_its_training_started(
    sweep: Path, cache: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = sweep / "out" / "rope" / "seed0"
    record = tmp_path / "probe.json"
    argv = ["probe", str(run), "--windows", "6", "--untrained", "--json", str(record)]
    assert main([*argv, "-o", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "rope seed 0 untrained (as initialised; the run was trained at 16)" in out
    rows = json.loads(record.read_text())
    assert [rows[k]["extra"]["trained"] for k in rows] == [True, False]
    assert rows["rope seed 0"]["rows"] != rows["rope seed 0 untrained"]["rows"]


def test_the_untrained_model_is_the_one_training_started_from(sweep: Path) -> None:
    """Training from the same seed and config rebuilds the untrained model exactly: one step
    of training at learning rate ~0 leaves weights equal to it to float32 precision."""
    from posenc.extrapolate import probe as extrapolate_probe
    from posenc.runs.checkpoint import load_checkpoint

    saved = load_checkpoint(sweep / "out" / "rope" / "seed0" / "checkpoint.pt")
    untrained, config = extrapolate_probe.model_from_checkpoint(saved, trained=False)
    trained, _ = extrapolate_probe.model_from_checkpoint(saved)
    with pytest.MonkeyPatch.context() as patch:
        own_cache(sweep, patch)
        corpus = prepare_corpus(sweep / "text")
        config.steps, config.lr = 1, 1e-12
        again, _ = train_model(config, corpus)
    for name, value in untrained.state_dict().items():
        torch.testing.assert_close(value, again.state_dict()[name], rtol=0, atol=1e-9)
    assert any(
        not torch.equal(value, trained.state_dict()[name])
        for name, value in untrained.state_dict().items()
    )
