"""The training loop that ``posenc lengthgen`` and ``posenc extrapolate`` share.

A run hands :class:`Trainer` its model (already on its device), optimiser and scheduler, and
a *step function* that performs one optimiser step (draw the batch, this rank's slice,
forward, loss, :func:`optimizer_step`; :func:`~posenc.runs.step.scored_step` does the tail)
and returns the global mean loss and one more metric. The trainer owns the rest:

- resuming: :meth:`Trainer.restore` reads the checkpoint, refuses a changed configuration,
  and reloads the model, optimiser, scheduler, step, losses and every random state, onto
  the model's device whatever device wrote them;
- the loop: :meth:`Trainer.fit` wraps the model in ``DistributedDataParallel`` under
  ``torchrun`` (and in ``torch.compile`` when asked), calls the step function, updates the
  progress bar, runs a periodic callback on rank 0, and writes an atomic checkpoint every
  ``checkpoint_every`` steps and every ``checkpoint_seconds`` of wall time (read from the
  trainer's ``clock``, which tests replace). The step function's numbers stay on the
  device: the host reads them every :data:`READ_EVERY` steps (and before a checkpoint, a
  periodic callback and the end), so it never waits for the device once per step;
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
#: Steps whose losses the host reads at once (one wait for the device per this many steps).
READ_EVERY = 50

#: One optimiser step on the (possibly DDP-wrapped) model: returns the global mean loss per
#: scored token and one more metric (token accuracy, say) for the progress bar, as numbers
#: or as 0-d tensors not yet read (the trainer reads them in bulk).
StepFunction = Callable[[nn.Module], tuple[Tensor | float, Tensor | float]]
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
        clock: seconds as a float (default ``time.perf_counter``), for the training time and
            the wall-time checkpoints; tests pass a clock of their own.
        compile: run the step's forward and backward through ``torch.compile`` (compiled
            once per run, when :meth:`fit` starts; checkpoints hold the plain model's
            weights).

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
        clock: Callable[[], float] = time.perf_counter,
        compile: bool = False,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.config, self.path = config, path
        here, size = _world()
        self.rank = here if rank is None else rank
        self.world = size if world is None else world
        self.data_rng = data_rng
        self.resume_free = frozenset(resume_free)
        self.extra = dict(extra or {})
        self.clock, self.compile = clock, compile
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
        checkpoint_seconds: float = 0.0,
        every: int = 0,
        periodic: PeriodicFunction | None = None,
    ) -> None:
        """Train from :attr:`step` to ``steps``: ``step_fn`` once per step, ``periodic`` on
        rank 0 every ``every`` steps (not after the last), a checkpoint every
        ``checkpoint_every`` steps and whenever ``checkpoint_seconds`` (0: never) have passed
        on :attr:`clock` since the last one (not after the last step: :meth:`finish` writes
        that one). Under ``torchrun`` a wall-time checkpoint is rank 0's alone (the ranks'
        clocks differ, so none waits for it), a step-count one is waited for by all."""
        if self.step < steps and self.trained_on[-1:] != [str(self.device)]:
            self.trained_on.append(str(self.device))
        trained = self.model
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device] if self.device.type == "cuda" else None
            trained = DistributedDataParallel(self.model, device_ids=ids)
        if self.compile:
            trained = torch.compile(trained)
        self.model.train()
        started = saved_at = self.clock()
        unread: list[tuple[Tensor | float, Tensor | float]] = []
        with bar:
            while self.step < steps:
                unread.append(step_fn(trained))
                self.step += 1
                last = self.step == steps
                due_periodic = periodic is not None and every and self.step % every == 0
                due_periodic = bool(due_periodic) and not last
                by_count = bool(checkpoint_every) and self.step % checkpoint_every == 0
                by_time = checkpoint_seconds > 0 and self.clock() - saved_at >= checkpoint_seconds
                save = (by_count or by_time) and not last
                if save or due_periodic or last or len(unread) >= READ_EVERY:
                    self._read(unread, bar)
                    unread = []
                if due_periodic:
                    if self.rank == 0:
                        entry, text = periodic(self.step, self.losses[-1])  # type: ignore[misc]
                        self.history.append(entry)
                        bar.log(text)
                    barrier(self.world)
                if save:
                    now = self.clock()
                    self.elapsed += now - started
                    started = now
                    self.checkpoint()
                    saved_at = self.clock()
                    if by_count:
                        barrier(self.world)
        self.elapsed += self.clock() - started

    def _read(self, unread: list[tuple[Tensor | float, Tensor | float]], bar: Bar) -> None:
        """Read the losses and metrics of the steps in ``unread`` (one wait for the device),
        keep the losses and show the last step's numbers."""
        if not unread:
            return
        losses = _numbers([loss for loss, _ in unread])
        metrics = _numbers([metric for _, metric in unread])
        self.losses.extend(losses)
        bar.update(self.step, losses[-1], metrics[-1])

    def finish(self, record: dict[str, Any] | None) -> None:
        """Rank 0 writes the final checkpoint holding ``record``; every rank waits for it."""
        if self.rank == 0 and record is not None:
            self.checkpoint(record)
        barrier(self.world)


def _numbers(values: list[Tensor | float]) -> list[float]:
    """Python floats of ``values`` (0-d tensors of one dtype and device, read in one copy, or
    numbers)."""
    if all(isinstance(v, Tensor) for v in values):
        return [float(v) for v in torch.stack(values).tolist()]  # type: ignore[arg-type]
    return [float(v) for v in values]
