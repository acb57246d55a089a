"""posenc extrapolate across processes: a sweep killed with SIGKILL and resumed ends with
exactly the numbers of an uninterrupted one; torchrun with 2 processes equals 1 process with
the same global batch; ``--jobs 2`` equals ``--jobs 1``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from posenc.app.cli import main
from tests.commands import SUBPROCESS_ENV, kill_after_first_checkpoint, torchrun_two
from tests.extrapolate.corpora import word_files

pytestmark = pytest.mark.slow

TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--batch-size", "4", "--train-len", "8",
        "--eval-lens", "8,16,32", "--threads", "1", "--no-progress", "--no-plot"]  # fmt: skip


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of a child process: this tree's sources, a cache of its own."""
    return {**SUBPROCESS_ENV, "POSENC_CACHE_DIR": str(tmp_path / "cache")}


@pytest.fixture
def text(tmp_path: Path) -> Path:
    return word_files(tmp_path / "text")


def in_process(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setenv("POSENC_CACHE_DIR", env["POSENC_CACHE_DIR"])
    return main(["extrapolate", *argv])


def runs(out: Path) -> list[dict]:
    return json.loads((out / "results.json").read_text())["runs"]


def test_sigkill_then_resume_equals_uninterrupted(
    tmp_path: Path, env: dict[str, str], text: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["--text", str(text), "--pe", "rope", "--steps", "60", "--checkpoint-every", "1",
            "--finetune-steps", "3", *TINY]  # fmt: skip
    killed = tmp_path / "killed"
    checkpoint = killed / "rope" / "seed0" / "checkpoint.pt"
    kill_after_first_checkpoint(
        "posenc.extrapolate", [*argv, "--out", str(killed)], checkpoint, env
    )
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["record"] is None and 1 <= saved["step"] < 60
    assert saved["trained_length"] == 8

    assert in_process([*argv, "--out", str(killed), "--resume"], env, monkeypatch) == 0
    assert in_process([*argv, "--out", str(tmp_path / "straight")], env, monkeypatch) == 0
    assert runs(killed) == runs(tmp_path / "straight")  # every bits-per-byte number, exactly
    for folder in ("rope/seed0", "rope/seed0/finetune-yarn-32"):
        a = torch.load(killed / folder / "checkpoint.pt", weights_only=True)
        b = torch.load(tmp_path / "straight" / folder / "checkpoint.pt", weights_only=True)
        assert a["losses"] == b["losses"]
        for key in a["model"]:
            assert torch.equal(a["model"][key], b["model"][key]), (folder, key)
    assert not [p.name for p in checkpoint.parent.iterdir() if p.name.endswith(".tmp")]


def test_torchrun_two_processes_equal_one(
    tmp_path: Path, env: dict[str, str], text: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["--text", str(text), "--pe", "alibi", "--steps", "6", *TINY]
    torchrun_two("posenc.extrapolate", [*argv, "--out", str(tmp_path / "ddp")], env)
    assert in_process([*argv, "--out", str(tmp_path / "single")], env, monkeypatch) == 0
    path = Path("alibi") / "seed0"
    a = json.loads((tmp_path / "ddp" / path / "result.json").read_text())
    b = json.loads((tmp_path / "single" / path / "result.json").read_text())
    assert (a["world_size"], b["world_size"]) == (2, 1)
    torch.testing.assert_close(
        torch.tensor(a["losses"]), torch.tensor(b["losses"]), rtol=1e-6, atol=0
    )
    for x, y in zip(runs(tmp_path / "ddp"), runs(tmp_path / "single"), strict=True):
        for row_x, row_y in zip(x["eval"], y["eval"], strict=True):
            assert row_x["bpb"] == pytest.approx(row_y["bpb"], rel=1e-5)


def test_jobs_equal_serial(
    tmp_path: Path, env: dict[str, str], text: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["--text", str(text), "--pe", "none,learned", "--steps", "4", *TINY]
    assert in_process([*argv, "--jobs", "2", "--out", str(tmp_path / "par")], env, monkeypatch) == 0
    assert in_process([*argv, "--out", str(tmp_path / "ser")], env, monkeypatch) == 0
    assert runs(tmp_path / "par") == runs(tmp_path / "ser")
