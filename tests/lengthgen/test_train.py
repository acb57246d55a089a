"""Training (``posenc.lengthgen.train``): the learning-rate schedule, the loss falls, seeded
runs repeat (in this process and across fresh processes), an interrupted run resumes to the
same numbers, every registered sequence encoding trains, coupled and randomized positions.

Across processes (slow): a run killed with SIGKILL resumes to exactly the numbers of an
uninterrupted run; torchrun with 2 processes equals 1 process with the same global batch;
``--jobs 2`` equals ``--jobs 1``; a command run twice with a seed writes the same records."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from posenc.lengthgen.config import TrainConfig
from posenc.lengthgen.evaluate import read_jsonl
from posenc.lengthgen.train import lr_factor, train
from tests.commands import kill_after_first_checkpoint, posenc_cli, torchrun_two
from tests.lengthgen import tiny
from tests.lengthgen.tiny import run_cli
from tests.misuse import Misuse, check
from tests.schemes import SEQUENCE

TINY = [
    "--dim", "16", "--depth", "1", "--heads", "2", "--batch-size", "8",
    "--train-lengths", "1-6", "--test-lengths", "7-8", "--test-samples", "4",
    "--eval-every", "0", "--threads", "1", "--no-progress", "--no-plot",
]  # fmt: skip


def _strip(record: dict) -> dict:
    """A record without its wall-clock time."""
    return {k: v for k, v in record.items() if k not in ("train_seconds", "eval_seconds")}


# --------------------------------------------------------------------------- in this process


def test_lr_schedule() -> None:
    cfg = TrainConfig(steps=100, warmup=0.1)
    factors = [lr_factor(cfg, s) for s in range(100)]
    assert factors[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert factors[10] == pytest.approx(1.0)
    assert factors[55] == pytest.approx(0.5, abs=1e-12)  # cosine half-way
    assert all(a >= b for a, b in itertools.pairwise(factors[10:]))
    assert lr_factor(TrainConfig(steps=100, warmup=0.0, decay="linear"), 50) == 0.5
    assert lr_factor(TrainConfig(steps=100, warmup=0.0, decay="constant"), 99) == 1.0


@pytest.mark.slow
def test_loss_falls_on_a_toy_task() -> None:
    cfg = TrainConfig(
        **{**tiny.TINY, "steps": 60, "dim": 32, "batch_size": 16, "lr": 3e-3},
        task="copy-v1",
        pe="none",
    )
    record = train(cfg, threads=1)
    losses = record["losses"]
    assert len(losses) == 60
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5]), losses


@pytest.mark.slow
def test_same_seed_same_result_different_seed_different() -> None:
    def run(seed: int) -> tuple[dict[str, Any], list[float]]:
        rec = train(
            TrainConfig(**tiny.TINY, task="bucket-sort", pe="sinusoidal", seed=seed), threads=1
        )
        return rec["lengths"], rec["losses"]

    assert run(0) == run(0)
    assert run(0)[1] != run(1)[1]


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = TrainConfig(
        **{**tiny.TINY, "checkpoint_every": 2, "steps": 7}, task="copy-v3", pe="learned"
    )
    full = train(cfg, tmp_path / "full", threads=1)

    import posenc.lengthgen.train as train_module

    real_step, calls = train_module._step, []

    def dying_step(*args: Any, **kwargs: Any) -> tuple[float, float]:
        calls.append(1)
        if len(calls) == 6:  # after the step-4 checkpoint and one more step
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)

    monkeypatch.setattr(train_module, "_step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "cut", threads=1)
    monkeypatch.setattr(train_module, "_step", real_step)
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 4 and saved["record"] is None
    resumed = train(cfg, tmp_path / "cut", resume=True, threads=1)
    assert resumed["losses"] == full["losses"]
    assert resumed["lengths"] == full["lengths"]
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    # A finished run resumed returns its record without training.
    assert train(cfg, tmp_path / "cut", resume=True, threads=1)["losses"] == full["losses"]
    with pytest.raises(ValueError, match="pass resume=True"):
        train(cfg, tmp_path / "cut", threads=1)
    changed = TrainConfig(
        **{**tiny.TINY, "checkpoint_every": 2, "steps": 7, "lr": 5e-4}, task="copy-v3", pe="learned"
    )
    with pytest.raises(ValueError, match=r"configuration changed \(lr: 0.001 -> 0.0005\)"):
        train(changed, tmp_path / "cut", resume=True, threads=1)


@pytest.mark.slow
def test_every_registered_sequence_encoding_trains() -> None:
    """The harness goes through the registry only: whatever is registered must train."""
    names = SEQUENCE  # every scheme of sequence positions (grids take coordinates)
    assert {"none", "sinusoidal", "learned"} <= set(names)
    for name in names:
        cfg = TrainConfig(**{**tiny.TINY, "steps": 2}, task="copy-v3", pe=name)
        record = train(cfg, threads=1)
        assert len(record["losses"]) == 2 and np.isfinite(record["losses"]).all(), name
    for name in {"rope", "alibi", "sinusoidal"} & set(names):
        cfg = TrainConfig(
            **{**tiny.TINY, "steps": 2},
            task="bucket-sort",
            pe=name,
            random_positions=True,
            random_max=40,
        )
        assert len(train(cfg, threads=1)["losses"]) == 2


@pytest.mark.parametrize(
    ("values", "argument", "value"),
    [
        ({"task": "bucket-sort", "pe": "rope"}, "task", "bucket-sort"),
        ({"task": "copy-v1", "pe": "rope", "random_positions": True, "random_max": 3},
         "random_max", 3),
    ],
)  # fmt: skip
def test_coupled_positions_are_refused_before_any_work(
    values: dict[str, Any], argument: str, value: object
) -> None:
    config = TrainConfig(**{**tiny.TINY, **values}, coupled_positions=True)
    check(Misuse(argument, config.validate, ValueError, argument, value))


def test_coupled_positions_train_and_are_recorded(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert (
        run_cli(["--task", "reverse-v1", "--pe", "rope+coupled", "--out", str(out), *tiny.TINY_CLI])
        == 0
    )
    (record,) = read_jsonl(out / "results.jsonl")
    assert record["label"] == "rope+coupled" and record["coupled_positions"] is True
    assert record["random_positions"] is False and np.isfinite(record["losses"]).all()


@pytest.mark.filterwarnings("error::DeprecationWarning")  # the harness uses no old name
def test_bf16_trains_close_to_fp32_and_says_so(tmp_path: Path) -> None:
    """``--precision bf16`` (autocast on the CPU here) reaches the trainer: finite losses
    that differ from fp32's, slightly; the record names the precision and the device; a
    resume in the other precision is refused by name."""
    argv = ["--task", "copy-v1", "--pe", "rope", "--steps", "4", "--device", "cpu",
            "--no-plot", *tiny.TINY_CLI]  # fmt: skip
    assert run_cli([*argv, "--out", str(tmp_path / "fp32")]) == 0
    assert run_cli([*argv, "--out", str(tmp_path / "bf16"), "--precision", "bf16"]) == 0
    (full,) = read_jsonl(tmp_path / "fp32" / "results.jsonl")
    (half,) = read_jsonl(tmp_path / "bf16" / "results.jsonl")
    assert np.isfinite(half["losses"]).all() and half["losses"] != full["losses"]
    np.testing.assert_allclose(half["losses"], full["losses"], rtol=5e-3)
    assert (half["precision"], half["config"]["precision"]) == ("bf16", "bf16")
    assert (full["precision"], half["device"], half["trained_on"]) == ("fp32", "cpu", ["cpu"])
    with pytest.raises(ValueError, match=r"configuration changed \(precision: 'fp32' -> 'bf16'"):
        run_cli([*argv, "--out", str(tmp_path / "fp32"), "--precision", "bf16", "--resume"])


# --------------------------------------------------------------------------- across processes


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted(tmp_path: Path) -> None:
    argv = ["--task", "copy-v3", "--pe", "sinusoidal", "--steps", "80",
            "--checkpoint-every", "1", *TINY]  # fmt: skip
    killed = tmp_path / "killed"
    checkpoint = killed / "copy-v3" / "sinusoidal" / "seed0" / "checkpoint.pt"
    kill_after_first_checkpoint("posenc.lengthgen", [*argv, "--out", str(killed)], checkpoint)
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


@pytest.mark.slow
def test_torchrun_two_processes_equal_one(tmp_path: Path) -> None:
    """Both a decoder task and an encoder task (padding mask), with randomized positions."""
    argv = ["--task", "copy-v3,bucket-sort", "--pe", "sinusoidal+random", "--random-max", "64",
            "--steps", "8", *TINY]  # fmt: skip
    torchrun_two("posenc.lengthgen", [*argv, "--out", str(tmp_path / "ddp")])
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


@pytest.mark.slow
def test_jobs_equal_serial(tmp_path: Path) -> None:
    argv = ["--task", "reverse-string", "--pe", "none,learned", "--steps", "5", *TINY]
    assert run_cli([*argv, "--jobs", "2", "--out", str(tmp_path / "par")]) == 0
    assert run_cli([*argv, "--out", str(tmp_path / "ser")]) == 0
    par = [_strip(r) for r in read_jsonl(tmp_path / "par" / "results.jsonl")]
    ser = [_strip(r) for r in read_jsonl(tmp_path / "ser" / "results.jsonl")]
    assert [r["label"] for r in par] == ["none", "learned"]
    assert par == ser


def _lengthgen(out: Path, seed: str, cwd: Path) -> list[dict]:
    done = posenc_cli(
        "lengthgen", "--task", "copy-v1", "--pe", "none,rope,alibi+random", "--seeds", seed,
        "--dim", "16", "--depth", "1", "--heads", "2", "--batch-size", "8", "--steps", "6",
        "--train-lengths", "1-5", "--test-lengths", "6-7", "--eval-every", "3",
        "--eval-samples", "2", "--test-samples", "3", "--random-max", "64",
        "--checkpoint-every", "0", "--no-progress", "--no-plot", "--out", str(out), cwd=cwd,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    for record in records:  # wall-clock times are the only thing allowed to differ
        for key in [k for k in record if k.endswith("_seconds")]:
            del record[key]
    return records


@pytest.mark.slow
def test_lengthgen_is_identical_across_runs_with_a_seed(tmp_path: Path) -> None:
    first = _lengthgen(tmp_path / "a", "0,1", tmp_path)
    second = _lengthgen(tmp_path / "b", "0,1", tmp_path)
    assert len(first) == 6
    assert first == second  # losses, per-length accuracies, histories: all equal
    other = _lengthgen(tmp_path / "c", "2,3", tmp_path)
    assert [r["losses"] for r in other] != [r["losses"] for r in first]
