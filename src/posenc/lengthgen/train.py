"""Training one tiny model per (task, encoding, seed), resumably and reproducibly.

- The model is :class:`posenc.TransformerModel` (causal for decoder tasks), built from a
  registry name, so every encoding registered with posenc can be trained.
- AdamW with linear warm-up then cosine (or linear, or no) decay, and global gradient-norm
  clipping.
- Every ``checkpoint_every`` steps an atomic checkpoint (temp file, fsync, ``os.replace``)
  holds the model, optimiser, scheduler, the data generator and every RNG state (Python,
  NumPy, torch). A run killed at any moment, even by SIGKILL, and restarted with
  ``resume=True`` finishes with exactly the numbers of an uninterrupted run (same thread
  count assumed: CPU kernels may sum in another order with another thread count).
- Distributed data parallel (``torchrun``, gloo on CPU): every rank draws the same global
  batch from the same generator and trains on its slice; the loss is the sum over the
  slice divided by the global number of scored tokens, times the world size, so the
  averaged gradient equals the single-process gradient of the same global batch.
- Evaluation draws from generators of its own, so evaluating (or not) never changes
  training.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import PosencError, PosencTypeError, PosencValueError, check_bytes
from .data import (
    Vocab,
    check_coupling,
    collate,
    longest_model_length,
    model_length,
    sample_batch,
)
from .evaluate import (
    FINAL_SALT,
    PERIODIC_SALT,
    VALID_THRESHOLD,
    evaluate_lengths,
    mean_of,
    run_record,
)
from .tasks import Task, get_task

CHECKPOINT = "checkpoint.pt"
RESULT = "result.json"
CHECKPOINT_VERSION = 1
DECAYS = ("cosine", "linear", "constant")
#: Longest input length a sweep may train or test on.
MAX_INPUT_LENGTH = 4096


@dataclass
class TrainConfig:
    """Everything that determines one run. The CLI and TOML files fill it field by field."""

    task: str = "copy-v1"  # registry name, or path/to/file.py:ClassName
    pe: str = "none"  # registry name of the positional encoding (posenc.available())
    random_positions: bool = False  # randomized positions (Ruoss et al. 2023)
    random_max: int = 256  # L: randomized positions are drawn from [0, L)
    coupled_positions: bool = False  # position coupling (Cho et al. 2024; task-aware)
    pe_options: dict[str, Any] = field(default_factory=dict)  # extra kwargs for the encoding
    seed: int = 0  # model init, data and evaluation all derive from it
    dim: int = 64  # model width
    depth: int = 2  # layers
    heads: int = 4  # attention heads
    ffn_dim: int = 0  # feed-forward width; 0 means 4 * dim
    dropout: float = 0.0
    steps: int = 1000  # optimiser steps
    batch_size: int = 64  # global batch (split across torchrun processes)
    lr: float = 1e-3  # peak learning rate
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    warmup: float = 0.1  # fraction of steps with linear warm-up from 0
    decay: str = "cosine"  # after warm-up: "cosine" or "linear" to 0, or "constant"
    grad_clip: float = 1.0  # clip the global gradient norm to this; 0 disables
    train_min_length: int = 1  # training input lengths are uniform in [min, max]
    train_max_length: int = 20
    test_min_length: int = 21  # every length in [min, max] is tested
    test_max_length: int = 40
    eval_every: int = 250  # periodic evaluation every N steps; 0 disables
    eval_samples: int = 16  # examples per length in periodic evaluation
    test_samples: int = 100  # examples per length in the final evaluation
    checkpoint_every: int = 100  # checkpoint every N steps (and at the end); 0 = only at the end
    valid_threshold: float = VALID_THRESHOLD  # in-distribution exact match needed to be valid
    greedy_eval: bool = False  # score decoder tasks by greedy decoding (slow; same exact match)

    @property
    def label(self) -> str:
        """How the encoding is named in tables: ``rope``, ``rope+random``, ``rope+coupled``
        or ``rope+random+coupled``."""
        return (
            self.pe
            + ("+random" if self.random_positions else "")
            + ("+coupled" if self.coupled_positions else "")
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Build from a mapping, rejecting unknown keys and values of the wrong type."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise PosencValueError(
                f"unknown training option(s) {', '.join(unknown)}; known: {', '.join(known)}"
            )
        defaults = cls()
        for name, value in values.items():
            _check_type(name, value, type(getattr(defaults, name)))
        return cls(**values)

    def step_bytes(self, length: int) -> int:
        """A generous estimate of one training step's or evaluation batch's memory at model
        sequence length ``length``: weights, gradients and two AdamW moments, plus the
        activations autograd keeps per token and layer (projections, feed-forward, and the
        ``heads x length`` attention scores, weights and their dropout)."""
        ffn = self.ffn_dim or 4 * self.dim
        params = self.depth * (4 * self.dim * self.dim + 2 * self.dim * ffn)
        batch = max(self.batch_size, self.eval_samples, self.test_samples)
        per_token = self.depth * (12 * self.dim + 3 * ffn + 4 * self.heads * length)
        return 4 * (4 * params + batch * length * per_token)

    def validate(self) -> Task:
        """Check every field (types, ranges, the task, the encoding, the randomized-position
        range) before any work; return the task."""
        for f in dataclasses.fields(self):
            _check_type(f.name, getattr(self, f.name), type(getattr(TrainConfig(), f.name)))
        positive = ("random_max", "dim", "depth", "heads", "steps", "batch_size")
        positive += ("train_min_length", "test_min_length", "eval_samples", "test_samples")
        for name in positive:
            if getattr(self, name) < 1:
                raise PosencValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("ffn_dim", "eval_every", "checkpoint_every", "seed"):
            if getattr(self, name) < 0:
                raise PosencValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.seed >= 2**32:  # numpy's legacy seeding takes 32 bits
            raise PosencValueError(f"seed must be < 2**32, got {self.seed}")
        if self.dim % self.heads:
            raise PosencValueError(f"heads ({self.heads}) must divide dim ({self.dim})")
        if not 0.0 <= self.dropout < 1.0:
            raise PosencValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise PosencValueError(f"lr must be a finite number > 0, got {self.lr}")
        for name in ("weight_decay", "grad_clip"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):  # NaN fails both comparisons
                raise PosencValueError(f"{name} must be a finite number >= 0, got {value}")
        if not 0.0 <= self.warmup < 1.0:
            raise PosencValueError(
                f"warmup is a fraction of the steps in [0, 1), got {self.warmup}"
            )
        if self.decay not in DECAYS:
            raise PosencValueError(f"decay must be one of {', '.join(DECAYS)}, got {self.decay!r}")
        if not 0.0 < self.valid_threshold <= 1.0:
            raise PosencValueError(f"valid_threshold must be in (0, 1], got {self.valid_threshold}")
        for low, high in (("train_min_length", "train_max_length"),):
            if getattr(self, high) < getattr(self, low):
                raise PosencValueError(
                    f"{high} ({getattr(self, high)}) < {low} ({getattr(self, low)})"
                )
        if self.test_max_length < self.test_min_length:
            raise PosencValueError(
                f"test_max_length ({self.test_max_length}) < test_min_length "
                f"({self.test_min_length})"
            )
        for name in ("train_max_length", "test_max_length"):
            if getattr(self, name) > MAX_INPUT_LENGTH:
                raise PosencValueError(
                    f"{name} must be <= {MAX_INPUT_LENGTH} (attention over a longer sequence "
                    f"would not fit a tiny-model sweep), got {getattr(self, name)}"
                )
        from posenc import entry

        axes = getattr(entry(self.pe).cls, "axes", 1)  # unknown names list the known ones
        if axes != 1:
            raise PosencValueError(
                f"pe {self.pe!r} encodes {axes}-D coordinates; lengthgen needs an encoding "
                "of sequence positions"
            )
        table = check_encoding(self.pe, self.dim, self.heads, self.pe_options)
        task = get_task(self.task)
        probe = np.random.default_rng([self.seed, 99])
        longest = longest_model_length(task, [self.train_max_length, self.test_max_length], probe)
        check_bytes(
            "batch_size x length x dim x depth",
            f"{self.batch_size} x {longest} x {self.dim} x {self.depth}",
            self.step_bytes(longest),
        )
        if table is not None:  # a learned table knows nothing past its rows
            needed, why = (
                (self.random_max, "random_max")
                if self.random_positions
                else (longest, "the longest sequence")
            )
            if needed > table:
                raise PosencValueError(
                    f"encoding {self.label!r} cannot handle the test sequences: its table holds "
                    f"max_len={table} positions, the runs need {needed} ({why}); raise "
                    f"pe_options.{self.pe}.max_len"
                )
        if self.random_positions and self.random_max < longest:
            raise PosencValueError(
                f"randomized positions need L (random_max={self.random_max}) at least as "
                f"large as the longest sequence the model sees: {longest} tokens for "
                f"{task.name} at input length {self.test_max_length}; "
                f"use random_max >= {longest}"
            )
        if self.coupled_positions:
            check_coupling(task)
        return task


def check_encoding(pe: str, dim: int, heads: int, options: dict[str, Any]) -> int | None:
    """Build the encoding alone (cheap: no model) so that bad ``pe_options`` or a size it
    cannot take fail before any run starts, naming the encoding and its options. Returns the
    number of rows of a learned table (positions past it have no embedding), else ``None``."""
    from posenc import LearnedPositionalEncoding, build_for_model

    try:
        module = build_for_model(pe, dim, heads, **options)
    except (TypeError, ValueError) as exc:
        if not isinstance(exc, PosencError) and not options:
            raise  # not the settings' fault: a bug, keep its traceback
        detail = f" with options {options}" if options else f" at dim={dim}, heads={heads}"
        kind = PosencTypeError if isinstance(exc, TypeError) else PosencValueError
        raise kind(f"pe {pe!r}{detail}: {exc}") from None
    return module.max_len if isinstance(module, LearnedPositionalEncoding) else None


def _check_type(name: str, value: object, expected: type) -> None:
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return  # ints are fine where floats are expected
    if expected is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise PosencTypeError(f"{name} must be a table of options, got {value!r}")
        return
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise PosencTypeError(
            f"{name} must be {expected.__name__}, got {type(value).__name__} {value!r}"
        )


# --------------------------------------------------------------------------- pieces


def build_model(config: TrainConfig, task: Task) -> nn.Module:
    """The model for a run: ``posenc.TransformerModel`` over the task's tokens plus the
    harness's special tokens, causal for decoder tasks."""
    from posenc import TransformerModel

    try:
        return TransformerModel(
            Vocab(task.vocab_size).size,
            config.dim,
            config.depth,
            config.heads,
            pe=config.pe,
            causal=task.kind == "decoder",
            ffn_dim=config.ffn_dim or None,
            dropout=config.dropout,
            pe_kwargs=dict(config.pe_options) or None,
        )
    except TypeError as exc:
        if config.pe_options:
            raise PosencTypeError(
                f"pe {config.pe!r} with options {config.pe_options}: {exc}"
            ) from exc
        raise


def lr_factor(config: TrainConfig, step: int) -> float:
    """Learning-rate multiplier after ``step`` scheduler steps: linear warm-up over
    ``warmup * steps`` steps, then cosine/linear decay to 0 or constant."""
    warm = int(config.warmup * config.steps)
    if step < warm:
        return (step + 1) / warm
    if config.decay == "constant":
        return 1.0
    progress = (step - warm) / max(1, config.steps - warm)
    progress = min(progress, 1.0)
    if config.decay == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def _rng_state(data_rng: np.random.Generator) -> dict[str, Any]:
    legacy = np.random.get_state(legacy=False)
    return {
        "python": random.getstate(),
        "numpy_global": {
            **legacy,
            "state": {**legacy["state"], "key": legacy["state"]["key"].tolist()},
        },
        "numpy_data": data_rng.bit_generator.state,
        "torch": torch.get_rng_state(),
    }


def _set_rng_state(state: dict[str, Any], data_rng: np.random.Generator) -> None:
    random.setstate(state["python"])
    legacy = state["numpy_global"]
    key = np.asarray(legacy["state"]["key"], dtype=np.uint32)
    np.random.set_state({**legacy, "state": {**legacy["state"], "key": key}})
    data_rng.bit_generator.state = state["numpy_data"]
    torch.set_rng_state(state["torch"])


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically: a temp file in the same folder, flushed and
    fsynced, then ``os.replace`` (a reader sees the old file or the new one, never half)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        torch.save(payload, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    with contextlib.suppress(OSError):  # make the rename itself durable where possible
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (safe unpickler)."""
    return torch.load(path, map_location="cpu", weights_only=True)


@contextlib.contextmanager
def _threads(count: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    if count > 0:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


#: Fields that may differ between a run and its resumption (they do not change the numbers).
_RESUME_FREE = frozenset({"eval_every", "eval_samples", "checkpoint_every"})


def _check_resumable(saved: dict[str, Any], config: TrainConfig, path: Path) -> None:
    now = config.to_dict()
    differ = [k for k in now if k not in _RESUME_FREE and saved.get(k) != now[k]]
    if differ:
        detail = ", ".join(f"{k}: {saved.get(k)!r} -> {now[k]!r}" for k in differ)
        raise PosencValueError(f"cannot resume {path}: the configuration changed ({detail})")


# --------------------------------------------------------------------------- training


def train(
    config: TrainConfig,
    run_dir: Path | str | None = None,
    *,
    resume: bool = False,
    progress: bool = False,
    threads: int = 0,
    console: Any = None,
) -> dict[str, Any]:
    """Train and evaluate one run; return its record (see :func:`evaluate.run_record`).

    Args:
        config: the run.
        run_dir: where ``checkpoint.pt`` and ``result.json`` go (``None``: nothing is saved).
        resume: continue from ``run_dir/checkpoint.pt`` if it exists (a finished run just
            returns its record). Without it, an existing checkpoint is an error.
        progress: show a progress bar with loss, accuracy and ETA.
        threads: torch threads for this run (0: leave as is).
        console: a ``rich.console.Console`` for the bar and log lines.

    Under ``torchrun`` every rank calls this; rank 0 evaluates and writes, and returns the
    record (other ranks return ``{}``).
    """
    task = config.validate()
    rank, world = _world()
    if config.batch_size % world:
        raise PosencValueError(
            f"batch_size ({config.batch_size}) must be divisible by the number of processes "
            f"({world})"
        )
    path = None if run_dir is None else Path(run_dir) / CHECKPOINT
    if path is not None and path.exists() and not resume:
        raise PosencValueError(f"{path} exists: pass resume=True (--resume) to continue that run")
    if path is not None and rank == 0 and path.parent.is_dir():
        for stale in path.parent.glob(f".{CHECKPOINT}.*.tmp"):  # left by a kill mid-write
            stale.unlink(missing_ok=True)
    with _threads(threads):
        record = _train(config, task, path, rank, world, progress=progress, console=console)
    if path is not None and rank == 0:
        import json

        tmp = path.with_name(f".{RESULT}.tmp")
        tmp.write_text(json.dumps(record, sort_keys=True, indent=1), encoding="utf-8")
        os.replace(tmp, path.with_name(RESULT))
    return record if rank == 0 else {}


def _train(
    config: TrainConfig,
    task: Task,
    path: Path | None,
    rank: int,
    world: int,
    *,
    progress: bool,
    console: Any,
) -> dict[str, Any]:
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    model = build_model(config, task)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(config, s))
    data_rng = np.random.default_rng([config.seed, 0])
    random_max = config.random_max if config.random_positions else None
    vocab = Vocab(task.vocab_size)
    step, elapsed, history, losses = 0, 0.0, [], []

    if path is not None and path.exists():
        saved = load_checkpoint(path)
        _check_resumable(saved["config"], config, path)
        if saved.get("record") is not None:
            return saved["record"]
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        _set_rng_state(saved["rng"], data_rng)
        step, elapsed = saved["step"], saved["elapsed"]
        history, losses = saved["history"], saved["losses"]
    else:
        _probe(model, task, config, random_max)

    def checkpoint(record: dict[str, Any] | None = None) -> None:
        if path is None or rank != 0:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        save_checkpoint(
            path,
            {
                "version": CHECKPOINT_VERSION,
                "config": config.to_dict(),
                "step": step,
                "elapsed": elapsed,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": _rng_state(data_rng),
                "history": history,
                "losses": losses,
                "record": record,
            },
        )

    trained = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        trained = DistributedDataParallel(model)
    model.train()
    bar = _Bar(progress and rank == 0, config, console, start=step)
    started = time.perf_counter()
    with bar:
        while step < config.steps:
            loss, accuracy = _step(
                trained,
                optimizer,
                scheduler,
                task,
                vocab,
                config,
                data_rng,
                random_max,
                rank,
                world,
            )
            step += 1
            losses.append(loss)
            bar.update(step, loss, accuracy)
            if config.eval_every and step % config.eval_every == 0 and step < config.steps:
                if rank == 0:
                    history.append(_periodic_eval(model, task, config, step, loss, random_max))
                    bar.log(history[-1])
                _barrier(world)
            due = config.checkpoint_every and step % config.checkpoint_every == 0
            if due and step < config.steps:  # the last step's checkpoint comes with the record
                elapsed += time.perf_counter() - started
                started = time.perf_counter()
                checkpoint()
                _barrier(world)

    elapsed += time.perf_counter() - started
    if rank != 0:
        _barrier(world)
        return {}
    eval_started = time.perf_counter()
    train_lengths = range(config.train_min_length, config.train_max_length + 1)
    test_lengths = range(config.test_min_length, config.test_max_length + 1)
    in_dist = evaluate_lengths(
        model,
        task,
        train_lengths,
        config.test_samples,
        seed=config.seed,
        salt=FINAL_SALT,
        random_max=random_max,
        coupled=config.coupled_positions,
        greedy=config.greedy_eval,
    )
    test = evaluate_lengths(
        model,
        task,
        test_lengths,
        config.test_samples,
        seed=config.seed,
        salt=FINAL_SALT,
        random_max=random_max,
        coupled=config.coupled_positions,
        greedy=config.greedy_eval,
    )
    record = run_record(
        config=config.to_dict(),
        task_name=task.name,
        label=config.label,
        in_distribution=in_dist,
        test=test,
        valid_threshold=config.valid_threshold,
        steps=step,
        final_loss=losses[-1] if losses else None,
        losses=losses,
        history=history,
        parameters=sum(p.numel() for p in model.parameters()),
        train_seconds=round(elapsed, 3),
        eval_seconds=round(time.perf_counter() - eval_started, 3),
        world_size=world,
    )
    checkpoint(record)
    _barrier(world)
    return record


def _probe(model: nn.Module, task: Task, config: TrainConfig, random_max: int | None) -> None:
    """Run the untrained model once at the longest test sequence (and the largest randomized
    position), so an encoding that cannot reach it fails now, not after training."""
    longest = longest_model_length(
        task, [config.test_max_length], np.random.default_rng([config.seed, 98]), probes=2
    )
    if random_max is not None:
        positions = torch.arange(random_max - longest, random_max).unsqueeze(0)
    else:
        positions = None
    tokens = torch.full((1, longest), Vocab(task.vocab_size).bos, dtype=torch.long)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(tokens, positions=positions)
    except (ValueError, IndexError, RuntimeError) as exc:
        raise PosencValueError(
            f"encoding {config.label!r} cannot handle the test sequences ({longest} tokens"
            + (f", positions up to {random_max - 1}" if random_max else "")
            + f"): {exc}"
        ) from exc
    finally:
        model.train(was_training)


def _step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    task: Task,
    vocab: Vocab,
    config: TrainConfig,
    rng: np.random.Generator,
    random_max: int | None,
    rank: int,
    world: int,
) -> tuple[float, float]:
    """One optimiser step on this rank's slice of the global batch. Returns the global mean
    loss per scored token and this slice's token accuracy (teacher-forced)."""
    examples, positions = sample_batch(
        task,
        config.batch_size,
        config.train_min_length,
        config.train_max_length,
        rng,
        random_max=random_max,
        coupled=config.coupled_positions,
    )
    pad_to = max(model_length(task.kind, len(x), len(y)) for x, y in examples)
    scored_total = sum(len(y) + (task.kind == "decoder") for _, y in examples)
    per_rank = config.batch_size // world
    lo, hi = rank * per_rank, (rank + 1) * per_rank
    batch = collate(
        task.kind,
        examples[lo:hi],
        vocab,
        pad_to=pad_to,
        positions=None if positions is None else positions[lo:hi],
    )
    logits = model(batch.tokens, positions=batch.positions, key_padding_mask=batch.key_padding_mask)
    scored_logits = logits[batch.loss_mask]  # (tokens, V)
    scored_targets = batch.targets[batch.loss_mask]
    loss_sum = F.cross_entropy(scored_logits, scored_targets, reduction="sum")
    # DDP averages gradients over ranks; scaling by world makes that the global-batch mean.
    loss = loss_sum * (world / scored_total)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if config.grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    scheduler.step()
    total = loss_sum.detach()
    if world > 1:
        import torch.distributed as dist

        dist.all_reduce(total)
    accuracy = (scored_logits.argmax(-1) == scored_targets).float().mean()
    return float(total) / scored_total, float(accuracy)


def _periodic_eval(
    model: nn.Module,
    task: Task,
    config: TrainConfig,
    step: int,
    loss: float,
    random_max: int | None,
) -> dict[str, Any]:
    lengths = {
        "id": range(config.train_min_length, config.train_max_length + 1),
        "test": range(config.test_min_length, config.test_max_length + 1),
    }
    out: dict[str, Any] = {"step": step, "loss": loss}
    for split, ls in lengths.items():
        rows = evaluate_lengths(
            model,
            task,
            ls,
            config.eval_samples,
            seed=config.seed,
            salt=PERIODIC_SALT,
            random_max=random_max,
            coupled=config.coupled_positions,
            greedy=config.greedy_eval,
        )
        out[f"{split}_exact"] = mean_of(rows, "exact")
        out[f"{split}_token"] = mean_of(rows, "token")
    return out


class _Bar:
    """A rich progress bar (loss, accuracy, ETA) that does nothing when disabled."""

    def __init__(self, enabled: bool, config: TrainConfig, console: Any, *, start: int) -> None:
        self.enabled = enabled
        self.progress: Any = None
        self.console = console  # log lines still go here when the bar is off
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        if console is None:
            from rich.console import Console

            console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.4f}  acc {task.fields[acc]:.3f}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
        )
        self.task_id = self.progress.add_task(
            f"{config.task} {config.label} seed {config.seed}",
            total=config.steps,
            completed=start,
            loss=float("nan"),
            acc=float("nan"),
        )

    def __enter__(self) -> _Bar:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def update(self, step: int, loss: float, accuracy: float) -> None:
        if self.progress is not None:
            self.progress.update(self.task_id, completed=step, loss=loss, acc=accuracy)

    def log(self, entry: dict[str, Any]) -> None:
        console = self.progress.console if self.progress is not None else self.console
        if console is not None:
            console.log(
                f"step {entry['step']}: loss {entry['loss']:.4f}, exact match "
                f"in-dist {100 * entry['id_exact']:.1f}%, test {100 * entry['test_exact']:.1f}%"
            )


# --------------------------------------------------------------------------- sweeps


def slug(text: str) -> str:
    """A folder-safe version of a task or encoding name."""
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text) or "_"


def run_dir_for(out: Path, task_name: str, config: TrainConfig) -> Path:
    """``out/<task>/<encoding>/seed<k>``."""
    return Path(out) / slug(task_name) / slug(config.label) / f"seed{config.seed}"


def _exit_with_parent() -> None:
    """In a worker: end this process as soon as the parent is gone (killed, say), so no
    orphan keeps writing checkpoints that a later ``--resume`` would race with."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _train_job(config: dict[str, Any], run_dir: str, resume: bool, threads: int) -> dict[str, Any]:
    """Entry point of a ``--jobs`` worker process (spawned: a fresh interpreter)."""
    return train(TrainConfig.from_dict(config), run_dir, resume=resume, threads=threads)


def run_sweep(
    configs: list[TrainConfig],
    out: Path | str,
    *,
    jobs: int = 1,
    resume: bool = False,
    progress: bool = False,
    threads: int = 0,
    console: Any = None,
) -> list[dict[str, Any]]:
    """Train every config (``jobs`` at a time in separate processes), each in its own folder
    under ``out``; return the records in the order of ``configs``.

    With ``jobs > 1`` each process gets ``threads`` torch threads (default: the cores
    divided by ``jobs``, at least 1). Under ``torchrun`` runs go one after another, each
    spread over all ranks.
    """
    tasks = [c.validate() for c in configs]  # every mistake surfaces before any training
    dirs = [run_dir_for(Path(out), t.name, c) for t, c in zip(tasks, configs, strict=True)]
    seen: dict[Path, int] = {}
    for i, d in enumerate(dirs):
        if d in seen:
            raise PosencValueError(f"runs {seen[d]} and {i} would share the folder {d}")
        seen[d] = i
    if not resume:
        existing = [str(d / CHECKPOINT) for d in dirs if (d / CHECKPOINT).exists()]
        if existing:
            raise PosencValueError(
                f"{existing[0]} exists ({len(existing)} run(s) already started in {out}): "
                "pass --resume to continue them, or choose another --out"
            )
    _, world = _world()
    if jobs > 1 and world > 1:
        raise PosencValueError("--jobs must be 1 under torchrun (each run already uses every rank)")
    if jobs <= 1 or len(configs) == 1:
        records = []
        for c, d in zip(configs, dirs, strict=True):
            rec = train(c, d, resume=resume, progress=progress, threads=threads, console=console)
            records.append(rec)
            _log_done(console, c, rec)
        return records
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    per_job = threads or max(1, (os.cpu_count() or 1) // jobs)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=jobs, mp_context=context, initializer=_exit_with_parent
    ) as pool:
        futures = [
            pool.submit(_train_job, c.to_dict(), str(d), resume, per_job)
            for c, d in zip(configs, dirs, strict=True)
        ]
        records = []
        for c, fut in zip(configs, futures, strict=True):
            rec = fut.result()
            records.append(rec)
            _log_done(console, c, rec)
    return records


def _log_done(console: Any, config: TrainConfig, rec: dict[str, Any]) -> None:
    if console is None or not rec:  # not rank 0
        return
    console.log(
        f"done: {rec['task']} {config.label} seed {config.seed}: test exact "
        f"{100 * rec['test']['exact']:.1f}%, in-dist {100 * rec['in_distribution']['exact']:.1f}%"
        f"{'' if rec['valid'] else ' (invalid)'}; train {rec['train_seconds']:.0f} s, "
        f"eval {rec.get('eval_seconds', 0):.0f} s"
    )
