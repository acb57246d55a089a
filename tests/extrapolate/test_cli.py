"""posenc extrapolate's command line: every bad input is one line on stderr and exit status 2,
before any training; the settings layer defaults, the preset and the flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from posenc.app.cli import main
from posenc.extrapolate import cli as ex_cli
from posenc.extrapolate.config import PRESETS, EvalSettings, ExtrapolateConfig


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def text(tmp_path: Path) -> Path:
    root = tmp_path / "text"
    root.mkdir()
    for i in range(30):
        (root / f"{i:02d}.txt").write_text(f"line {i} of some text\n" * 60)
    return root


def fails(argv: list[str], capsys: pytest.CaptureFixture[str], *fragments: str) -> None:
    """The command exits 2 with one line on stderr that contains every fragment."""
    assert main(["extrapolate", *argv]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["--pe", "ropee"], ["ropee"]),
        (["--pe", "rope+random"], ["registry names and schedules only", "rope+random"]),
        (["--pe", "rope2d"], ["rope2d", "sequence positions"]),
        (["--seeds", "0"], ["seeds", "0"]),
        (["--steps", "0"], ["steps", "0"]),
        (["--steps", "ten"], ["--steps", "ten"]),
        (["--train-len", "0"], ["train_len", "0"]),
        (["--eval-lens", "64,abc"], ["--eval-lens", "64,abc"]),
        (["--eval-lens", "64,64"], ["eval_lens", "repeat"]),
        (["--eval-lens", "64,100000"], ["eval_lens", "100000"]),
        (["--scalings", "yarn,ntk"], ["--scalings", "yarn,ntk"]),
        (["--sliding", "48"], ["sliding", "48"]),
        (["--finetune-len", "32"], ["finetune_len", "32"]),
        (["--lr", "nan"], ["lr", "nan"]),
        (["--pe-option", "alibi.bogus=1"], ["alibi", "bogus"]),
        (["--pe-option", "t5.max_distance=1"], ["t5", "max_distance"]),
        (["--pe", "learned", "--pe-option", "learned.max_len=8"], ["max_len=8", "train_len=64"]),
        (["--pe", "rope", "--pe-option", "alibi.max_bias=4"], ["alibi", "not in the pe list"]),
        (["--tokenizer", "words"], ["tokenizer", "words"]),
        (["--jobs", "0"], ["jobs", "0"]),
        (["--threads", "-1"], ["--threads", "-1"]),
        (["--preset", "pres"], ["--preset", "pres"]),
        (["--batch-size", "10", "--dim", "1000000"], ["dim", "1000000"]),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(
    argv: list[str], fragments: list[str], capsys: pytest.CaptureFixture[str], text: Path
) -> None:
    fails([*argv, "--text", str(text)], capsys, *fragments)


def test_bad_text_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: Path
) -> None:
    fails(["--text", str(tmp_path / "missing")], capsys, "missing")
    (tmp_path / "binary").mkdir()
    (tmp_path / "binary" / "a.bin").write_bytes(b"\0\1\2\3")
    fails(["--text", str(tmp_path / "binary")], capsys, "no usable UTF-8 text", "1 are not text")
    # A corpus too small for the lengths asked for says what it needs.
    fails(["--text", str(text), "--eval-lens", "64,4096"], capsys, "too small", "4097")


def test_an_existing_run_needs_resume(text: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (Path("extrapolate-results") / "rope" / "seed0").mkdir(parents=True)
    (Path("extrapolate-results") / "rope" / "seed0" / "checkpoint.pt").write_bytes(b"x")
    fails(["--text", str(text), "--pe", "rope", "--eval-lens", "64"], capsys, "--resume")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    ex_cli.add_subcommand(parser.add_subparsers())
    return parser.parse_args(["extrapolate", *argv])


def test_settings_layer_defaults_preset_and_flags() -> None:
    configs, evaluation = ex_cli.build_configs(ex_cli.resolve_settings(parse([])))
    assert [c.pe for c in configs] == ["sinusoidal", "learned", "rope", "alibi", "t5", "none"]
    assert configs[0] == ExtrapolateConfig(pe="sinusoidal")
    assert (configs[0].dim, configs[0].depth, configs[0].heads) == (128, 3, 4)
    assert evaluation == EvalSettings() and evaluation.lengths(64) == [64, 128, 256, 512, 1024]

    settings = ex_cli.resolve_settings(parse(["--preset", "press", "--steps", "50"]))
    configs, evaluation = ex_cli.build_configs(settings)
    assert settings["out"] == "extrapolate-results-press" and settings["jobs"] == "auto"
    assert [c.steps for c in configs] == [50] * 6  # the flag wins over the preset
    assert configs[4].pe_options == PRESETS["press"]["pe_options"]["t5"]
    assert evaluation.scalings == ["linear", "dynamic", "yarn"]
    # Naming fewer encodings drops the preset's options for the others.
    settings = ex_cli.resolve_settings(parse(["--preset", "press", "--pe", "rope"]))
    assert settings["pe_options"] == {} and len(ex_cli.build_configs(settings)[0]) == 1

    settings = ex_cli.resolve_settings(
        parse(
            [
                "--pe",
                "rope",
                "--seeds",
                "0,4",
                "--scalings",
                "none",
                "--eval-lens",
                "64,256",
                "--pe-option",
                "rope.base=500",
            ]
        )
    )
    configs, evaluation = ex_cli.build_configs(settings)
    assert [(c.pe, c.seed, c.pe_options) for c in configs] == [
        ("rope", 0, {"base": 500}),
        ("rope", 4, {"base": 500}),
    ]
    assert evaluation.scalings == [] and evaluation.lengths(64) == [64, 256]
    assert ex_cli.command_line(parse(["--pe", "rope", "--steps", "5"])) == (
        "posenc extrapolate --pe rope --steps 5"
    )


class Stop(Exception):
    """Raised where a stand-in has seen what it needed."""


def machine(monkeypatch: pytest.MonkeyPatch, gpus: int) -> None:
    """This machine as one with ``gpus`` CUDA devices and no MPS, whatever it has."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.mark.parametrize(
    ("gpus", "argv", "fragments"),
    [
        (0, ["--device", "cuda"], ["device 'cuda'", "CUDA is not available"]),
        (1, ["--device", "cuda:7"], ["device 'cuda:7'", "only 1 CUDA device"]),
        (0, ["--device", "mps"], ["device 'mps'", "not available"]),
        (0, ["--device", "gpu"], ["device must be one of", "'gpu'"]),
        (0, ["--precision", "fp16"], ["precision", "'fp16'"]),
    ],
)
def test_a_device_or_precision_this_machine_lacks_is_one_line_before_any_work(
    gpus: int,
    argv: list[str],
    fragments: list[str],
    capsys: pytest.CaptureFixture[str],
    text: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import posenc.extrapolate.corpus as corpus_module

    machine(monkeypatch, gpus)

    def no_corpus(*args: object, **kwargs: object) -> None:
        raise AssertionError("the corpus was read before the device was checked")

    monkeypatch.setattr(corpus_module, "prepare_corpus", no_corpus)
    fails([*argv, "--text", str(text), "--pe", "rope"], capsys, *fragments)
    assert not Path(ex_cli.DEFAULT_OUT).exists() and not (tmp_path / "cache").exists()


def test_device_and_precision_reach_the_sweep(
    capsys: pytest.CaptureFixture[str], text: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    import posenc.extrapolate.sweep as sweep_module

    seen: dict = {}

    def fake_sweep(configs: list, corpus: object, settings: object, out: Path, **kw: object):  # type: ignore[no-untyped-def]
        seen.update(configs=configs, **kw)
        raise Stop

    machine(monkeypatch, 0)
    monkeypatch.setattr(sweep_module, "run_sweep", fake_sweep)
    argv = ["extrapolate", "--text", str(text), "--pe", "rope,alibi", "--eval-lens", "64"]
    with pytest.raises(Stop):
        main([*argv, "--precision", "bf16", "--device", "cpu"])
    assert [c.precision for c in seen["configs"]] == ["bf16", "bf16"]
    assert seen["device"] == torch.device("cpu")
    with pytest.raises(Stop):
        main(argv)  # auto, and no GPU: the CPU; fp32
    assert seen["device"] == torch.device("cpu")
    assert [c.precision for c in seen["configs"]] == ["fp32", "fp32"]
    assert ex_cli.command_line(parse(["--device", "cuda", "--precision", "bf16"])) == (
        "posenc extrapolate --precision bf16 --device cuda"
    )
