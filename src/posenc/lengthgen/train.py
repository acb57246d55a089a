"""Training one tiny model per (task, encoding, seed), resumably and reproducibly.

- The model is :class:`posenc.TransformerModel` (causal for decoder tasks), built from a
  registry name, so every encoding registered with posenc can be trained.
- AdamW with linear warm-up then cosine (or linear, or no) decay, and global gradient-norm
  clipping (:mod:`~posenc.runs.trainer`).
- Every ``checkpoint_every`` steps an atomic checkpoint (temp file, fsync, ``os.replace``)
  holds the model, optimiser, scheduler, the data generator and every RNG state (Python,
  NumPy, torch). A run killed at any moment, even by SIGKILL, and restarted with
  ``resume=True`` finishes with exactly the numbers of an uninterrupted run (same thread
  count assumed: CPU kernels may sum in another order with another thread count).
- Distributed data parallel (``torchrun``: NCCL on GPUs, gloo on CPUs): every rank draws
  the same global batch from the same generator and trains on its slice; the loss is the
  sum over the slice divided by the global number of scored tokens, times the world size,
  so the averaged gradient equals the single-process gradient of the same global batch.
- Any device (``device``: ``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps``): the model is
  built on the CPU from the seed (the same weights everywhere), then moved; the batches
  follow it. ``precision="bf16"`` runs forward and loss (training and evaluation) under
  bfloat16 autocast, parameters and optimiser in float32. The record says where the run
  was trained and evaluated (``device``, ``trained_on``) and in what precision.
- Evaluation draws from generators of its own, so evaluating (or not) never changes
  training.

The settings are in :mod:`~posenc.lengthgen.config`; the training kit both experiments share
(the trainer, the step's tail, the probe, checkpoints, processes, the sweep runner, the bar)
in :mod:`posenc.runs`.
"""

from __future__ import annotations

import functools
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..encodings.absolute.abacus import Abacus
from ..runs import checkpoint, pool
from ..runs import config as run_config
from ..runs.device import model_device, placement
from ..runs.distributed import check_divisible, torch_threads, world
from ..runs.probe import probe
from ..runs.progress import Bar
from ..runs.step import scored_step
from ..runs.sweep import run_each
from ..runs.trainer import Trainer, lr_multiplier, optimizer_for, seed_everything
from .abacus import AbacusModel, check_digit_tokens
from .config import InDistributionWarning, TrainConfig
from .data import Vocab, collate, longest_model_length, model_length, sample_batch
from .evaluate import FINAL_SALT, PERIODIC_SALT, evaluate_lengths, mean_of, run_record
from .tasks import Task

__all__ = [
    "build_model",
    "lr_factor",
    "run_dir_for",
    "run_sweep",
    "train",
]


#: Fields that may differ between a run and its resumption (they do not change the numbers).
_RESUME_FREE = frozenset({"eval_every", "eval_samples", "checkpoint_every"})


def build_model(config: TrainConfig, task: Task) -> nn.Module:
    """The model for a run: ``posenc.TransformerModel`` over the task's tokens plus the
    harness's special tokens, causal for decoder tasks, inside an
    :class:`~posenc.lengthgen.abacus.AbacusModel` with Abacus positions. A tempered NoPE
    entry's floor is the longest training sequence (``random_max`` with randomized
    positions)."""
    vocab = Vocab(task.vocab_size).size
    trained = (
        config.random_max
        if config.random_positions
        else longest_model_length(
            task, [config.train_max_length], np.random.default_rng([config.seed, 99])
        )
    )
    model = run_config.transformer_for(
        config, vocab, causal=task.kind == "decoder", trained_length=trained
    )
    if not config.abacus:
        return model
    abacus = Abacus(config.dim, max_len=config.abacus_rows(task), max_offset=config.abacus_offset)
    return AbacusModel(model, abacus, check_digit_tokens(task))


def lr_factor(config: TrainConfig, step: int) -> float:
    """Learning-rate multiplier after ``step`` scheduler steps: linear warm-up over
    ``warmup * steps`` steps, then cosine/linear decay to 0 or constant."""
    return lr_multiplier(step, steps=config.steps, warmup=config.warmup, decay=config.decay)


# --------------------------------------------------------------------------- training


def train(
    config: TrainConfig,
    run_dir: Path | str | None = None,
    *,
    resume: bool = False,
    progress: bool = False,
    threads: int = 0,
    console: Any = None,
    device: str | torch.device = "auto",
) -> dict[str, Any]:
    """Train and evaluate one run; return its record (see :func:`evaluate.run_record`).

    Args:
        config: the run.
        run_dir: where ``checkpoint.pt`` and ``result.json`` go (``None``: nothing is saved).
        resume: continue from ``run_dir/checkpoint.pt`` if it exists (a finished run just
            returns its record). Without it, an existing checkpoint is an error. The device
            may differ from the one that wrote the checkpoint; the precision may not.
        progress: show a progress bar with loss, accuracy and ETA.
        threads: torch threads for this run (0: leave as is).
        console: a ``rich.console.Console`` for the bar and log lines.
        device: where to train and evaluate (see :func:`posenc.runs.device.resolve_device`).

    Under ``torchrun`` every rank calls this; rank 0 evaluates and writes, and returns the
    record (other ranks return ``{}``).
    """
    task = config.validate()
    place = placement(device, [config.precision])
    rank, world_size = world()
    check_divisible(config.batch_size, world_size)
    path = checkpoint.prepare_run_dir(run_dir, resume=resume, rank=rank)
    with torch_threads(threads):
        record = _train(
            config, task, path, rank, world_size, place, progress=progress, console=console
        )
    if path is not None and rank == 0:
        checkpoint.write_json(path.with_name(checkpoint.RESULT), record)
    return record if rank == 0 else {}


def _train(
    config: TrainConfig,
    task: Task,
    path: Path | None,
    rank: int,
    world_size: int,
    device: torch.device,
    *,
    progress: bool,
    console: Any,
) -> dict[str, Any]:
    seed_everything(config.seed)
    model = build_model(config, task).to(device)  # built on the CPU: the same init anywhere
    optimizer, scheduler = optimizer_for(model, config)
    data_rng = np.random.default_rng([config.seed, 0])
    random_max = config.random_max if config.random_positions else None
    vocab = Vocab(task.vocab_size)
    trainer = Trainer(
        model,
        optimizer,
        scheduler,
        config=config.to_dict(),
        path=path,
        data_rng=data_rng,
        resume_free=_RESUME_FREE,
    )
    finished = trainer.restore()
    if finished is not None:
        return finished
    if not trainer.resumed:
        _probe(model, task, config, random_max)

    # the trainer calls step(model): the model is _step's last argument
    step = functools.partial(
        _step, optimizer, scheduler, task, vocab, config, data_rng, random_max, rank, world_size
    )

    def periodic(at: int, loss: float) -> tuple[dict[str, Any], str]:
        entry = _periodic_eval(model, task, config, at, loss, random_max)
        text = (
            f"step {entry['step']}: loss {entry['loss']:.4f}, exact match "
            f"in-dist {100 * entry['id_exact']:.1f}%, test {100 * entry['test_exact']:.1f}%"
        )
        return entry, text

    bar = Bar(
        progress and rank == 0,
        f"{config.task} {config.label} seed {config.seed}",
        config.steps,
        console,
        start=trainer.step,
    )
    trainer.fit(
        config.steps,
        step,
        checkpoint_every=config.checkpoint_every,
        bar=bar,
        every=config.eval_every,
        periodic=periodic,
    )
    if rank != 0:
        trainer.finish(None)
        return {}
    eval_started = time.perf_counter()
    rows = _evaluate(model, task, config, config.test_samples, FINAL_SALT, random_max)
    losses = trainer.losses
    record = run_record(
        config=config.to_dict(),
        task_name=task.name,
        label=config.label,
        in_distribution=rows["in_distribution"],
        test=rows["test"],
        valid_threshold=config.valid_threshold,
        steps=trainer.step,
        final_loss=losses[-1] if losses else None,
        losses=losses,
        history=trainer.history,
        parameters=sum(p.numel() for p in model.parameters()),
        train_seconds=round(trainer.elapsed, 3),
        eval_seconds=round(time.perf_counter() - eval_started, 3),
        world_size=world_size,
        device=str(device),
        trained_on=trainer.trained_on,
        precision=config.precision,
    )
    trainer.finish(record)
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
    probe(
        model,
        torch.full((1, longest), Vocab(task.vocab_size).bos, dtype=torch.long),
        positions=positions,
        precision=config.precision,
        failure=f"encoding {config.label!r} cannot handle the test sequences ({longest} tokens"
        + (f", positions up to {random_max - 1}" if random_max else "")
        + ")",
    )


def _step(
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    task: Task,
    vocab: Vocab,
    config: TrainConfig,
    rng: np.random.Generator,
    random_max: int | None,
    rank: int,
    world_size: int,
    model: nn.Module,
) -> tuple[float, float]:
    """One optimiser step on this rank's slice of the global batch (on the model's device).
    Returns the global mean loss per scored token and this slice's token accuracy
    (teacher-forced)."""
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
    per_rank = config.batch_size // world_size
    lo, hi = rank * per_rank, (rank + 1) * per_rank
    batch = collate(
        task.kind,
        examples[lo:hi],
        vocab,
        pad_to=pad_to,
        positions=None if positions is None else positions[lo:hi],
    ).to(model_device(model))

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        logits = model(
            batch.tokens, positions=batch.positions, key_padding_mask=batch.key_padding_mask
        )  # (b, n, V)
        return logits[batch.loss_mask], batch.targets[batch.loss_mask]  # (t, V), (t,)

    return scored_step(
        model,
        optimizer,
        scheduler,
        forward,
        total=scored_total,
        grad_clip=config.grad_clip,
        world_size=world_size,
        precision=config.precision,
    )


def _evaluate(
    model: nn.Module,
    task: Task,
    config: TrainConfig,
    samples: int,
    salt: int,
    random_max: int | None,
) -> dict[str, list[dict[str, Any]]]:
    """Rows of :func:`~posenc.lengthgen.evaluate.evaluate_lengths` for the in-distribution
    and the test lengths, ``samples`` examples per length from the generator ``salt``."""
    lengths = {
        "in_distribution": range(config.train_min_length, config.train_max_length + 1),
        "test": range(config.test_min_length, config.test_max_length + 1),
    }
    return {
        split: evaluate_lengths(
            model,
            task,
            span,
            samples,
            seed=config.seed,
            salt=salt,
            random_max=random_max,
            coupled=config.coupled_positions,
            greedy=config.greedy_eval,
            precision=config.precision,
        )
        for split, span in lengths.items()
    }


def _periodic_eval(
    model: nn.Module,
    task: Task,
    config: TrainConfig,
    step: int,
    loss: float,
    random_max: int | None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"step": step, "loss": loss}
    rows = _evaluate(model, task, config, config.eval_samples, PERIODIC_SALT, random_max)
    for split, key in (("in_distribution", "id"), ("test", "test")):
        out[f"{key}_exact"] = mean_of(rows[split], "exact")
        out[f"{key}_token"] = mean_of(rows[split], "token")
    return out


# --------------------------------------------------------------------------- sweeps


def run_dir_for(out: Path, task_name: str, config: TrainConfig) -> Path:
    """``out/<task>/<encoding>/seed<k>``."""
    return Path(out) / pool.slug(task_name) / pool.slug(config.label) / f"seed{config.seed}"


def _train_job(
    config: dict[str, Any], run_dir: str, resume: bool, device: str, threads: int
) -> dict[str, Any]:
    """Entry point of a ``--jobs`` worker process (spawned: a fresh interpreter)."""
    with warnings.catch_warnings():  # run_sweep warned in the parent
        warnings.simplefilter("ignore", InDistributionWarning)
        return train(
            TrainConfig.from_dict(config), run_dir, resume=resume, threads=threads, device=device
        )


def run_sweep(
    configs: list[TrainConfig],
    out: Path | str,
    *,
    jobs: int = 1,
    resume: bool = False,
    progress: bool = False,
    threads: int = 0,
    console: Any = None,
    device: str | torch.device = "auto",
) -> list[dict[str, Any]]:
    """Train every config (``jobs`` at a time in separate processes), each in its own folder
    under ``out``, on ``device``; return the records in the order of ``configs``.

    With ``jobs > 1`` each process gets ``threads`` torch threads (default: the cores
    divided by ``jobs``, at least 1). Under ``torchrun`` runs go one after another, each
    spread over all ranks.
    """
    tasks = [c.validate() for c in configs]  # every mistake surfaces before any training
    place = placement(device, [c.precision for c in configs])
    dirs = [run_dir_for(Path(out), t.name, c) for t, c in zip(tasks, configs, strict=True)]

    def here(i: int) -> dict[str, Any]:
        return train(
            configs[i], dirs[i], resume=resume, progress=progress, console=console, device=place
        )

    def job_args(i: int, each: int) -> tuple[Any, ...]:
        return (configs[i].to_dict(), str(dirs[i]), resume, str(place), each)

    return run_each(
        dirs,
        out,
        here,
        _train_job,
        job_args,
        jobs=jobs,
        resume=resume,
        threads=threads,
        on_done=lambda i, rec: _log_done(console, configs[i], rec),
    )


def _log_done(console: Any, config: TrainConfig, rec: dict[str, Any]) -> None:
    if console is None or not rec:  # not rank 0
        return
    console.log(
        f"done: {rec['task']} {config.label} seed {config.seed}: test exact "
        f"{100 * rec['test']['exact']:.1f}%, in-dist {100 * rec['in_distribution']['exact']:.1f}%"
        f"{'' if rec['valid'] else ' (invalid)'}; train {rec['train_seconds']:.0f} s, "
        f"eval {rec.get('eval_seconds', 0):.0f} s"
    )
