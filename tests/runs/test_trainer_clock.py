"""posenc.runs.trainer's cheap training loop: checkpoints by wall time (driven here by a clock
of the test's own), the step's numbers read from the device in bulk rather than once per
step, and ``torch.compile`` of the step giving the eager numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from posenc.runs import trainer as trainer_module
from posenc.runs.checkpoint import CHECKPOINT, load_checkpoint
from posenc.runs.progress import Bar
from posenc.runs.trainer import READ_EVERY, Trainer, make_optimizer, optimizer_step


class Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def toy(path: Path | None, clock: Clock, *, compile: bool = False) -> Trainer:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    optimizer, scheduler = make_optimizer(
        model, lr=0.1, weight_decay=0.0, steps=200, warmup=0.0, decay="constant"
    )
    return Trainer(model, optimizer, scheduler, config={"lr": 0.1}, path=path,
                   data_rng=np.random.default_rng(5), clock=clock, compile=compile)  # fmt: skip


def step_fn(trainer: Trainer, clock: Clock, seconds: float = 0.0):  # type: ignore[no-untyped-def]
    """A step that takes ``seconds`` on the clock and returns its loss as a device tensor
    (not read), as :func:`posenc.runs.step.scored_step` does."""
    rng = trainer.data_rng

    def step(trained: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.from_numpy(rng.normal(size=(8, 3))).float()  # type: ignore[union-attr]
        loss = ((trained(x) - x.sum(-1, keepdim=True)) ** 2).mean()
        optimizer_step(trained, trainer.optimizer, trainer.scheduler, loss, grad_clip=0.0)
        clock.now += seconds
        return loss.detach().double(), torch.tensor(0.5)

    return step


def test_checkpoints_by_wall_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every 300 s of the clock (a step takes 70 s: after steps 5, 10, 15, ...) and not
    after the last step (``finish`` writes that one); the elapsed time is the clock's."""
    clock = Clock()
    trainer = toy(tmp_path / CHECKPOINT, clock)
    saved: list[int] = []
    real = trainer.checkpoint
    monkeypatch.setattr(trainer, "checkpoint", lambda record=None: (saved.append(trainer.step),
                                                                    real(record)))  # fmt: skip
    bar = Bar(False, "toy", 20, None, start=0)
    trainer.fit(20, step_fn(trainer, clock, 70.0), checkpoint_every=0, checkpoint_seconds=300.0,
                bar=bar)  # fmt: skip
    assert saved == [5, 10, 15]
    assert trainer.elapsed == 20 * 70.0
    on_disk = load_checkpoint(tmp_path / CHECKPOINT)
    assert on_disk["step"] == 15 and on_disk["losses"] == trainer.losses[:15]
    # a count interval still works beside it (the clock counts from the last checkpoint of
    # either kind), and 0 for both leaves only the end
    for every, seconds, want in (
        (4, 0.0, [4, 8, 12, 16]),
        (0, 0.0, []),
        (6, 300.0, [5, 6, 11, 12, 17, 18]),
    ):
        clock, saved[:] = Clock(), []
        trainer = toy(None, clock)
        monkeypatch.setattr(
            trainer, "checkpoint", lambda record=None, t=trainer: saved.append(t.step)
        )
        trainer.fit(20, step_fn(trainer, clock, 70.0), checkpoint_every=every,
                    checkpoint_seconds=seconds, bar=bar)  # fmt: skip
        assert saved == want, (every, seconds)


def test_the_steps_numbers_are_read_in_bulk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host reads the step function's tensors once per READ_EVERY steps (and at the
    end), not once per step; the losses kept are every step's, in order."""
    reads: list[int] = []
    real = trainer_module._numbers
    monkeypatch.setattr(trainer_module, "_numbers", lambda v: reads.append(len(v)) or real(v))
    clock = Clock()
    trainer = toy(None, clock)
    returned: list[float] = []
    inner = step_fn(trainer, clock)

    def step(trained: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        loss, metric = inner(trained)
        returned.append(float(loss))  # (the test reads it; the trainer does not)
        return loss, metric

    steps = 2 * READ_EVERY + 7
    trainer.fit(steps, step, checkpoint_every=0, bar=Bar(False, "toy", steps, None, start=0))
    assert reads == [READ_EVERY, READ_EVERY] * 2 + [7, 7]  # losses and metrics, per read
    assert trainer.losses == returned


@pytest.mark.slow  # compiling takes seconds on a shared CPU
def test_a_compiled_step_gives_the_eager_numbers() -> None:
    clock = Clock()
    eager, compiled = toy(None, clock), toy(None, clock, compile=True)
    for trainer in (eager, compiled):
        trainer.fit(6, step_fn(trainer, clock), checkpoint_every=0,
                    bar=Bar(False, "toy", 6, None, start=0))  # fmt: skip
    torch.testing.assert_close(torch.tensor(compiled.losses), torch.tensor(eager.losses),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    assert set(compiled.model.state_dict()) == {"weight", "bias"}  # the plain model's names
