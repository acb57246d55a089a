"""posenc.runs.trainer: the Trainer that lengthgen and extrapolate share, on a toy
regression (resume equals uninterrupted, also from a checkpoint written on a GPU, a changed
configuration is refused, a finished run returns its record, the periodic callback, the
devices a run trained on), and the learning-rate schedule.

The checkpoint helpers are tested in test_checkpoint.py, the progress bar in test_progress.py.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from posenc.runs.checkpoint import CHECKPOINT, load_checkpoint, save_checkpoint
from posenc.runs.progress import Bar
from posenc.runs.trainer import Trainer, lr_multiplier, make_optimizer, optimizer_step
from tests.runs.gpu_files import as_if_written_on_a_gpu

STEPS = 9


class Stop(Exception):
    """Raised by a step function to stand for a kill."""


def run(path: Path | None, *, stop_at: int | None = None, config: dict | None = None) -> Trainer:
    """Train a linear model on data drawn from the trainer's generator (and torch's global
    RNG, for noise), checkpointing every 2 steps; ``stop_at`` raises at that step."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    optimizer, scheduler = make_optimizer(
        model, lr=0.1, weight_decay=0.01, steps=STEPS, warmup=0.2, decay="cosine"
    )
    rng = np.random.default_rng(5)
    trainer = Trainer(
        model,
        optimizer,
        scheduler,
        config=config or {"lr": 0.1, "checkpoint_every": 2},
        path=path,
        data_rng=rng,
        resume_free={"checkpoint_every"},
    )
    finished = trainer.restore()
    if finished is not None:
        trainer.history.append({"finished": finished})
        return trainer

    def step(trained: nn.Module) -> tuple[float, float]:
        if stop_at is not None and trainer.step == stop_at:
            raise Stop
        x = torch.from_numpy(rng.normal(size=(8, 3))).float()
        y = x.sum(-1, keepdim=True) + 0.1 * torch.randn(8, 1)
        loss = ((trained(x) - y) ** 2).mean()
        optimizer_step(trained, optimizer, scheduler, loss, grad_clip=1.0)
        return float(loss.detach()), 0.0

    trainer.fit(STEPS, step, checkpoint_every=2, bar=Bar(False, "toy", STEPS, None, start=0))
    trainer.finish({"losses": trainer.losses})
    return trainer


def test_an_interrupted_run_resumes_to_the_same_numbers(tmp_path: Path) -> None:
    straight = run(tmp_path / "straight" / CHECKPOINT)
    with pytest.raises(Stop):
        run(tmp_path / "cut" / CHECKPOINT, stop_at=5)
    saved = load_checkpoint(tmp_path / "cut" / CHECKPOINT)
    assert saved["step"] == 4 and saved["record"] is None  # the last checkpoint before the stop
    resumed = run(tmp_path / "cut" / CHECKPOINT)
    assert resumed.resumed and resumed.losses == straight.losses
    assert resumed.trained_on == ["cpu"]  # one stretch: the same device again
    for name, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name
    # A finished run returns its record and its model without training.
    again = run(tmp_path / "cut" / CHECKPOINT, stop_at=0)
    assert again.history == [{"finished": {"losses": straight.losses}}]
    assert torch.equal(again.model.weight, straight.model.weight)


def test_a_run_written_on_a_gpu_resumes_on_the_cpu_to_the_same_numbers(tmp_path: Path) -> None:
    """The device is not part of the configuration: a checkpoint whose tensors were saved
    from ``cuda:0`` (with the GPU's generator) resumes here, finishes with the numbers of an
    uninterrupted run, and records both devices."""
    straight = run(tmp_path / "straight" / CHECKPOINT)
    assert straight.trained_on == ["cpu"]
    assert load_checkpoint(tmp_path / "straight" / CHECKPOINT)["trained_on"] == ["cpu"]
    cut = tmp_path / "cut" / CHECKPOINT
    with pytest.raises(Stop):
        run(cut, stop_at=5)
    saved = load_checkpoint(cut)
    saved["trained_on"] = ["cuda:0"]
    saved["rng"]["cuda"] = torch.zeros(16, dtype=torch.uint8)  # a GPU run saves its generator
    save_checkpoint(cut, saved)
    as_if_written_on_a_gpu(cut)
    resumed = run(cut)
    assert resumed.resumed and resumed.losses == straight.losses
    assert resumed.trained_on == ["cuda:0", "cpu"]
    for name, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name
    assert resumed.optimizer.state_dict()["state"][0]["step"].device == torch.device("cpu")


def test_a_changed_configuration_is_refused_but_free_fields_may_change(tmp_path: Path) -> None:
    with pytest.raises(Stop):
        run(tmp_path / CHECKPOINT, stop_at=3)
    with pytest.raises(ValueError, match=r"configuration changed \(lr: 0.1 -> 0.2\)"):
        run(tmp_path / CHECKPOINT, config={"lr": 0.2, "checkpoint_every": 2})
    resumed = run(tmp_path / CHECKPOINT, config={"lr": 0.1, "checkpoint_every": 5})
    assert len(resumed.losses) == STEPS


def test_without_a_path_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    trainer = run(None)
    assert len(trainer.losses) == STEPS and not trainer.resumed
    assert list(tmp_path.iterdir()) == []


def test_schedule_warm_up_then_decay() -> None:
    factors = [lr_multiplier(s, steps=100, warmup=0.1, decay="cosine") for s in range(100)]
    assert factors[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert factors[55] == pytest.approx(0.5, abs=1e-12)
    assert all(a >= b for a, b in itertools.pairwise(factors[10:]))
    assert lr_multiplier(50, steps=100, warmup=0.0, decay="linear") == 0.5
    assert lr_multiplier(99, steps=100, warmup=0.0, decay="constant") == 1.0


def test_periodic_callback_runs_between_steps_but_not_after_the_last() -> None:
    model = nn.Linear(1, 1)
    optimizer, scheduler = make_optimizer(
        model, lr=0.1, weight_decay=0.0, steps=6, warmup=0.0, decay="constant"
    )
    trainer = Trainer(model, optimizer, scheduler, config={}, path=None)
    calls: list[int] = []

    def periodic(step: int, loss: float) -> tuple[dict[str, Any], str]:
        calls.append(step)
        return {"step": step}, f"step {step}"

    def step(trained: nn.Module) -> tuple[float, float]:
        loss = trained(torch.ones(1, 1)).pow(2).sum()
        optimizer_step(trained, optimizer, scheduler, loss, 0.0)
        return float(loss.detach()), 1.0

    trainer.fit(
        6,
        step,
        checkpoint_every=0,
        bar=Bar(False, "", 6, None, start=0),
        every=2,
        periodic=periodic,
    )
    assert calls == [2, 4] and trainer.history == [{"step": 2}, {"step": 4}]
