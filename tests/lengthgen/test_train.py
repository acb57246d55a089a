"""posenc lengthgen across processes: a run killed with SIGKILL resumes to exactly the
numbers of an uninterrupted run; torchrun with 2 processes equals 1 process with the same
global batch; ``--jobs 2`` equals ``--jobs 1``."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from posenc.lengthgen import cli as lg_cli
from posenc.lengthgen.evaluate import read_jsonl

pytestmark = pytest.mark.slow

TINY = [
    "--dim", "16", "--depth", "1", "--heads", "2", "--batch-size", "8",
    "--train-lengths", "1-6", "--test-lengths", "7-8", "--test-samples", "4",
    "--eval-every", "0", "--threads", "1", "--no-progress", "--no-plot",
]  # fmt: skip


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    lg_cli.add_subcommand(parser.add_subparsers())
    args = parser.parse_args(["lengthgen", *argv])
    return args.func(args)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _strip(record: dict) -> dict:
    """A record without its wall-clock time."""
    return {k: v for k, v in record.items() if k not in ("train_seconds", "eval_seconds")}


def test_sigkill_then_resume_equals_uninterrupted(tmp_path: Path) -> None:
    argv = ["--task", "copy-v3", "--pe", "sinusoidal", "--steps", "80",
            "--checkpoint-every", "1", *TINY]  # fmt: skip
    killed = tmp_path / "killed"
    checkpoint = killed / "copy-v3" / "sinusoidal" / "seed0" / "checkpoint.pt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "posenc.lengthgen", *argv, "--out", str(killed)],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not checkpoint.exists():
            assert proc.poll() is None, "training ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.01)
        time.sleep(0.05)  # land somewhere in the middle of a later step or write
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["record"] is None and 1 <= saved["step"] < 80

    assert run_cli([*argv, "--out", str(killed), "--resume"]) == 0
    assert run_cli([*argv, "--out", str(tmp_path / "straight")]) == 0
    (resumed,) = read_jsonl(killed / "results.jsonl")
    (straight,) = read_jsonl(tmp_path / "straight" / "results.jsonl")
    assert _strip(resumed) == _strip(straight)  # every loss and every accuracy, exactly
    a = torch.load(checkpoint, weights_only=True)
    b = torch.load(
        tmp_path / "straight" / "copy-v3" / "sinusoidal" / "seed0" / "checkpoint.pt",
        weights_only=True,
    )
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    for key, state in a["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][key][name]), (key, name)
    # a kill during a write leaves only a temp file, which the resumed run cleared away
    assert not [p.name for p in checkpoint.parent.iterdir() if p.name.endswith(".tmp")]


def test_torchrun_two_processes_equal_one(tmp_path: Path) -> None:
    """Both a decoder task and an encoder task (padding mask), with randomized positions."""
    argv = ["--task", "copy-v3,bucket-sort", "--pe", "sinusoidal+random", "--random-max", "64",
            "--steps", "8", *TINY]  # fmt: skip
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "posenc.lengthgen",
            *argv,
            "--out",
            str(tmp_path / "ddp"),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert run_cli([*argv, "--out", str(tmp_path / "single")]) == 0
    ddp = read_jsonl(tmp_path / "ddp" / "results.jsonl")
    single = read_jsonl(tmp_path / "single" / "results.jsonl")
    assert [r["world_size"] for r in ddp] == [2, 2]
    assert [r["world_size"] for r in single] == [1, 1]
    for run in ("copy-v3", "bucket-sort"):
        path = Path(run) / "sinusoidal+random" / "seed0" / "checkpoint.pt"
        a = torch.load(tmp_path / "ddp" / path, weights_only=True)
        b = torch.load(tmp_path / "single" / path, weights_only=True)
        torch.testing.assert_close(
            torch.tensor(a["losses"]), torch.tensor(b["losses"]), rtol=1e-6, atol=0
        )
        for key in a["model"]:
            x, y = a["model"][key], b["model"][key]
            if key.endswith("attn.qkv.bias"):
                # The key bias shifts every logit of a row equally, so its true gradient is
                # exactly 0; AdamW turns the ~1e-10 rounding noise left in it into steps of
                # ±lr whose sign depends on summation order. Compare the q and v parts.
                third = x.shape[0] // 3
                x = torch.cat([x[:third], x[2 * third :]])
                y = torch.cat([y[:third], y[2 * third :]])
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=f"{run}: {key}")


def test_jobs_equal_serial(tmp_path: Path) -> None:
    argv = ["--task", "reverse-string", "--pe", "none,learned", "--steps", "5", *TINY]
    assert run_cli([*argv, "--jobs", "2", "--out", str(tmp_path / "par")]) == 0
    assert run_cli([*argv, "--out", str(tmp_path / "ser")]) == 0
    par = [_strip(r) for r in read_jsonl(tmp_path / "par" / "results.jsonl")]
    ser = [_strip(r) for r in read_jsonl(tmp_path / "ser" / "results.jsonl")]
    assert [r["label"] for r in par] == ["none", "learned"]
    assert par == ser
