"""The training loop that ``posenc lengthgen`` and ``posenc extrapolate`` share.

A run hands :class:`Trainer` its model (already on its device), optimiser and scheduler, and
a *step function* that performs one optimiser step (draw the batch, this rank's slice,
forward, loss, :func:`optimizer_step`; :func:`~posenc.runs.step.scored_step` does the tail)
and returns the global mean loss and one more metric. The trainer owns the rest:

- resuming: :meth:`Trainer.restore` reads the checkpoint, refuses a changed configuration,
  and reloads the model, optimiser, scheduler, step, losses and every random state, onto
  the model's device whatever device wrote them;
- the loop: :meth:`Trainer.fit` wraps the model in ``DistributedDataParallel`` under
  ``torchrun``, calls the step function, updates the progress bar, runs a periodic callback
  on rank 0, and writes an atomic checkpoint every ``checkpoint_every`` steps;
- finishing: :meth:`Trainer.finish` writes the last checkpoint with the run's record, which
  a later ``restore`` returns without training.

A run killed at any moment, even by SIGKILL, and restarted finishes with exactly the numbers
of an uninterrupted run, provided its step function draws its data from the step number or
from the generator given to the trainer (same device and thread count assumed: kernels may
sum in another order with another thread count, and differ between devices).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .checkpoint import (
    CHECKPOINT_VERSION,
    check_resumable,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from .device import model_device
from .distributed import barrier
from .distributed import world as _world
from .progress import Bar

DECAYS = ("cosine", "linear", "constant")

#: One optimiser step on the (possibly DDP-wrapped) model: returns the global mean loss per
#: scored token and one more metric (token accuracy, say) for the progress bar.
StepFunction = Callable[[nn.Module], tuple[float, float]]
#: Rank 0's periodic callback: ``(step, loss) -> (entry for the history, line to log)``.
PeriodicFunction = Callable[[int, float], tuple[dict[str, Any], str]]


def lr_multiplier(step: int, *, steps: int, warmup: float, decay: str) -> float:
    """Learning-rate multiplier after ``step`` scheduler steps: linear warm-up over
    ``warmup * steps`` steps, then cosine/linear decay to 0 over the rest, or constant."""
    warm = int(warmup * steps)
    if step < warm:
        return (step + 1) / warm
    if decay == "constant":
        return 1.0
    progress = (step - warm) / max(1, steps - warm)
    progress = min(progress, 1.0)
    if decay == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(
    model: nn.Module, *, lr: float, weight_decay: float, steps: int, warmup: float, decay: str
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (decoupled weight decay) with the schedule of :func:`lr_multiplier`."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_multiplier(s, steps=steps, warmup=warmup, decay=decay)
    )
    return optimizer, scheduler


def optimizer_for(model: nn.Module, config: Any) -> tuple[torch.optim.Optimizer, Any]:
    """:func:`make_optimizer` with a run config's ``lr``, ``weight_decay``, ``steps``,
    ``warmup`` and ``decay``."""
    return make_optimizer(
        model,
        lr=config.lr,
        weight_decay=config.weight_decay,
        steps=config.steps,
        warmup=config.warmup,
        decay=config.decay,
    )


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (model init draws from them;
    ``torch.manual_seed`` seeds every GPU's generator too)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def optimizer_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    loss: Tensor,
    grad_clip: float,
) -> None:
    """Backward, clip the global gradient norm to ``grad_clip`` (0: no clipping), step the
    optimiser and the scheduler."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    scheduler.step()


class Trainer:
    """Checkpointed, resumable, DDP-ready training of one run (see the module docstring).

    Args:
        model: the model (unwrapped: the trainer wraps it for DDP itself), on the device it
            trains on.
        optimizer, scheduler: stepped by the step function (:func:`optimizer_step`).
        config: the run's settings as plain data, saved in the checkpoint and compared on
            resume.
        path: the checkpoint file (``None``: nothing is saved).
        rank, world: this process and the number of processes (default: from
            ``torch.distributed``, or 0 and 1 outside ``torchrun``).
        data_rng: a NumPy generator the step function draws data from, saved and restored.
        resume_free: config fields that may change between a run and its resumption.
        extra: more plain data for every checkpoint (read back from :attr:`saved`).

    After :meth:`restore`, :attr:`step`, :attr:`elapsed` (training seconds),
    :attr:`losses` (one per step), :attr:`history` (periodic entries) and
    :attr:`trained_on` (the device of each stretch of training, a new entry when a resumed
    run moved) hold the run's progress. The device is not part of the configuration: a run
    may resume on another one.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        *,
        config: dict[str, Any],
        path: Path | None,
        rank: int | None = None,
        world: int | None = None,
        data_rng: np.random.Generator | None = None,
        resume_free: Iterable[str] = (),
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.config, self.path = config, path
        here, size = _world()
        self.rank = here if rank is None else rank
        self.world = size if world is None else world
        self.data_rng = data_rng
        self.resume_free = frozenset(resume_free)
        self.extra = dict(extra or {})
        self.device = model_device(model)
        self.step, self.elapsed = 0, 0.0
        self.history: list[dict[str, Any]] = []
        self.losses: list[float] = []
        self.trained_on: list[str] = []
        self.resumed = False
        self.saved: dict[str, Any] | None = None

    def restore(self) -> dict[str, Any] | None:
        """Continue from the checkpoint if there is one: check the configuration, load the
        model and, for an unfinished run, the optimiser, scheduler, random states and
        progress. Returns the record of a finished run (its model is loaded too), else
        ``None``; :attr:`resumed` says whether a checkpoint was read.

        The checkpoint is read onto the CPU and copied into the model and optimiser, which
        put each tensor on their own device (AdamW keeps its step counts on the CPU, as a
        fresh run does): a run written on a GPU resumes on a CPU and the reverse."""
        if self.path is None or not self.path.exists():
            return None
        saved = load_checkpoint(self.path, map_location="cpu")
        check_resumable(saved["config"], self.config, self.path, self.resume_free)
        self.saved, self.resumed = saved, True
        self.model.load_state_dict(saved["model"])
        self.trained_on = list(saved.get("trained_on", []))
        if saved.get("record") is not None:
            return saved["record"]
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        set_rng_state(saved["rng"], self.data_rng, self.device)
        self.step, self.elapsed = saved["step"], saved["elapsed"]
        self.history, self.losses = saved["history"], saved["losses"]
        return None

    def checkpoint(self, record: dict[str, Any] | None = None) -> None:
        """Write the checkpoint now (rank 0, and only with a path)."""
        if self.path is None or self.rank != 0:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        save_checkpoint(
            self.path,
            {
                "version": CHECKPOINT_VERSION,
                "config": self.config,
                "step": self.step,
                "elapsed": self.elapsed,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "rng": rng_state(self.data_rng, self.device),
                "history": self.history,
                "losses": self.losses,
                "trained_on": self.trained_on,
                "record": record,
                **self.extra,
            },
        )

    def fit(
        self,
        steps: int,
        step_fn: StepFunction,
        *,
        checkpoint_every: int,
        bar: Bar,
        every: int = 0,
        periodic: PeriodicFunction | None = None,
    ) -> None:
        """Train from :attr:`step` to ``steps``: ``step_fn`` once per step, ``periodic`` on
        rank 0 every ``every`` steps (not after the last), a checkpoint every
        ``checkpoint_every`` steps (not after the last: :meth:`finish` writes that one)."""
        if self.step < steps and self.trained_on[-1:] != [str(self.device)]:
            self.trained_on.append(str(self.device))
        trained = self.model
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device] if self.device.type == "cuda" else None
            trained = DistributedDataParallel(self.model, device_ids=ids)
        self.model.train()
        started = time.perf_counter()
        with bar:
            while self.step < steps:
                loss, metric = step_fn(trained)
                self.step += 1
                self.losses.append(loss)
                bar.update(self.step, loss, metric)
                if periodic is not None and every and self.step % every == 0 and self.step < steps:
                    if self.rank == 0:
                        entry, text = periodic(self.step, loss)
                        self.history.append(entry)
                        bar.log(text)
                    barrier(self.world)
                due = checkpoint_every and self.step % checkpoint_every == 0
                if due and self.step < steps:
                    self.elapsed += time.perf_counter() - started
                    started = time.perf_counter()
                    self.checkpoint()
                    barrier(self.world)
        self.elapsed += time.perf_counter() - started

    def finish(self, record: dict[str, Any] | None) -> None:
        """Rank 0 writes the final checkpoint holding ``record``; every rank waits for it."""
        if self.rank == 0 and record is not None:
            self.checkpoint(record)
        barrier(self.world)
