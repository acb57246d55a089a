"""Training the causal language models of ``posenc extrapolate`` with :mod:`posenc.runs`.

- The model is :class:`posenc.TransformerModel` with ``causal=True`` over the corpus's
  vocabulary, the same for every encoding (:func:`build_model`); its
  :attr:`~posenc.TransformerModel.trained_length` is the training length ``L``.
- Step ``s`` trains on :meth:`Corpus.batch(s, batch_size, L, seed)
  <posenc.extrapolate.corpus.Corpus.batch>`: the same windows in the same order for every
  encoding with the same seed, and a resumed run draws what it would have drawn.
- :class:`~posenc.runs.trainer.Trainer` does the rest: AdamW with warm-up and decay,
  atomic checkpoints, resume after SIGKILL with nothing lost (on another device too),
  ``torchrun`` DDP (every rank draws the global batch and trains on its slice), the
  progress bar; :func:`~posenc.runs.step.scored_step` the loss and the optimiser step, in
  the config's precision (``bf16``: bfloat16 autocast, float32 parameters).
- Any device: the model is built on the CPU from the seed, then moved to ``device``; the
  windows follow it.
- :func:`finetune` continues a trained RoPE model at a longer length with a context
  extension (position interpolation, YaRN), as Chen et al. 2023 and Peng et al. 2023 do,
  resumable in the same way.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..encodings.rope_types.registry import ROPE_TYPES
from ..errors import PosencValueError
from ..model.generation import ids_checked
from ..runs.checkpoint import RESULT, prepare_run_dir, write_json
from ..runs.config import transformer_for
from ..runs.device import model_device, placement
from ..runs.distributed import check_divisible, world
from ..runs.probe import probe
from ..runs.progress import Bar
from ..runs.step import scored_step, to_device
from ..runs.trainer import Trainer, make_optimizer, optimizer_for, seed_everything
from .config import ExtrapolateConfig
from .corpus import Corpus
from .windows import Needles, add_needles, token_alphabet

#: Fields that may differ between a run and its resumption (they do not change the numbers).
RESUME_FREE = frozenset({"checkpoint_every", "checkpoint_minutes", "compile"})


def build_model(config: ExtrapolateConfig, vocab_size: int) -> nn.Module:
    """The causal ``TransformerModel`` of a run, its ``trained_length`` set to ``train_len``."""
    model = transformer_for(config, vocab_size, causal=True, trained_length=config.train_len)
    model.trained_length = config.train_len
    return model


def lm_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    corpus: Corpus,
    step: int,
    *,
    batch_size: int,
    length: int,
    seed: int,
    grad_clip: float,
    rank: int = 0,
    world_size: int = 1,
    needles: Needles | None = None,
    precision: str = "fp32",
) -> tuple[float, float]:
    """One optimiser step of next-token prediction on this rank's slice of the global batch
    ``corpus.batch(step, batch_size, length, seed)`` (with ``needles``, passed through
    :func:`~posenc.extrapolate.windows.add_needles`), on the model's device, in
    ``precision``. Returns the global mean loss per token (nats) and this slice's token
    accuracy."""
    batch = corpus.batch(step, batch_size, length, seed)
    if needles is not None:
        batch = add_needles(batch, step, seed, needles)
    if batch.min() < 0 or batch.max() >= corpus.vocab_size:  # here, on the host: see forward
        raise PosencValueError(
            f"corpus {corpus.name!r} holds token ids outside [0, {corpus.vocab_size})"
        )
    windows = torch.from_numpy(batch)  # (b, n + 1)
    per_rank = batch_size // world_size
    mine = to_device(windows[rank * per_rank : (rank + 1) * per_rank], model_device(model))

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        with ids_checked():  # (above: no wait for the device to read their range)
            logits = model(mine[:, :-1])  # (b / world, n, V)
        targets = mine[:, 1:].reshape(-1)  # (t,)
        return logits.reshape(targets.numel(), -1), targets  # (t, V)

    return scored_step(
        model,
        optimizer,
        scheduler,
        forward,
        total=batch_size * length,
        grad_clip=grad_clip,
        world_size=world_size,
        precision=precision,
    )


def train_model(
    config: ExtrapolateConfig,
    corpus: Corpus,
    run_dir: Path | str | None = None,
    *,
    resume: bool = False,
    progress: bool = False,
    console: Any = None,
    probe_length: int = 0,
    device: str | torch.device = "auto",
) -> tuple[nn.Module, dict[str, Any]]:
    """Train one model on ``device`` (or, with ``resume``, continue or reopen it, on this
    device or another); return the model and the training record (``steps``, ``losses``,
    ``train_seconds``, ``parameters``, ``trained_on``). With ``probe_length``, the untrained
    model first runs once on a window of that length, so an encoding that cannot reach it
    fails before training.

    Under ``torchrun`` every rank calls this and gets the trained model; rank 0 writes.
    """
    config.validate()
    place = placement(device, [config.precision])
    rank, world_size = world()
    check_divisible(config.batch_size, world_size)
    path = prepare_run_dir(run_dir, resume=resume, rank=rank)
    seed_everything(config.seed)
    model = build_model(config, corpus.vocab_size).to(place)  # the same init on any device
    if probe_length:
        _probe(model, config, probe_length)
    optimizer, scheduler = optimizer_for(model, config)
    record = _run(
        model,
        optimizer,
        scheduler,
        {**_recorded(config), "corpus": corpus.key},
        path,
        corpus,
        config,
        first=0,
        batch_size=config.batch_size,
        length=config.train_len,
        steps=config.steps,
        bar_text=f"{corpus.name} {config.pe} seed {config.seed}",
        progress=progress,
        console=console,
    )
    return model, record


def finetune(
    model: nn.Module,
    config: ExtrapolateConfig,
    corpus: Corpus,
    rope_type: str,
    *,
    length: int,
    steps: int,
    lr: float,
    run_dir: Path | str | None = None,
    resume: bool = False,
    progress: bool = False,
    console: Any = None,
) -> tuple[nn.Module, dict[str, Any], dict[str, Any]]:
    """Fine-tune a copy of a trained RoPE ``model`` at windows of ``length`` with the
    context extension ``rope_type`` (``"linear"``: position interpolation; ``"yarn"``) at
    ``factor = length / L``, for ``steps`` steps of AdamW at peak ``lr`` (10% warm-up, cosine
    decay). Each batch holds ``max(1, batch_size * L // length)`` windows (about as many
    tokens as a training batch), drawn from the steps after the training run's last. The
    copy trains where ``model`` is, in the config's precision.

    Returns the fine-tuned model (``model`` is left as it is), the scaling it uses and the
    training record.
    """
    rank, world_size = world()
    factor = length / config.train_len
    scaling: dict[str, Any] = {"rope_type": rope_type, "factor": factor}
    if ROPE_TYPES[rope_type].needs_original:  # (YaRN)
        scaling["original_max_position_embeddings"] = config.train_len
    tuned = copy.deepcopy(model.with_rope_scaling(scaling))  # type: ignore[operator]
    batch_size = max(world_size, config.batch_size * config.train_len // length)
    batch_size -= batch_size % world_size
    path = prepare_run_dir(run_dir, resume=resume, rank=rank)
    optimizer, scheduler = make_optimizer(
        tuned, lr=lr, weight_decay=config.weight_decay, steps=steps, warmup=0.1, decay="cosine"
    )
    run_config = {
        "base": _recorded(config),
        "corpus": corpus.key,
        "scaling": scaling,
        "length": length,
        "steps": steps,
        "lr": lr,
        "batch_size": batch_size,
    }
    record = _run(
        tuned,
        optimizer,
        scheduler,
        run_config,
        path,
        corpus,
        config,
        first=config.steps,  # the windows after the training run's
        batch_size=batch_size,
        length=length,
        steps=steps,
        bar_text=f"{corpus.name} {config.pe}+{rope_type} fine-tune at {length}",
        progress=progress,
        console=console,
    )
    return tuned, scaling, record


def _run(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    run_config: dict[str, Any],
    path: Path | None,
    corpus: Corpus,
    config: ExtrapolateConfig,
    *,
    first: int,
    batch_size: int,
    length: int,
    steps: int,
    bar_text: str,
    progress: bool,
    console: Any,
) -> dict[str, Any]:
    """Restore or train with :class:`~posenc.runs.trainer.Trainer` (step ``s`` trains on
    the corpus's batch number ``first + s``); write the record."""
    rank, world_size = world()
    needles = None
    if config.needle_share:
        alphabet = token_alphabet(corpus.train, corpus.vocab_size)
        needles = Needles(config.needle_share, config.needle_len, alphabet)
    trainer = Trainer(
        model,
        optimizer,
        scheduler,
        config=run_config,
        path=path,
        resume_free=RESUME_FREE,
        extra={"trained_length": config.train_len},
        compile=config.compile,
    )
    finished = trainer.restore()
    if finished is not None:
        return finished
    bar = Bar(progress and rank == 0, bar_text, steps, console, start=trainer.step)

    def step(trained: nn.Module) -> tuple[float, float]:
        return lm_step(
            trained,
            optimizer,
            scheduler,
            corpus,
            first + trainer.step,
            batch_size=batch_size,
            length=length,
            seed=config.seed,
            grad_clip=config.grad_clip,
            rank=rank,
            world_size=world_size,
            needles=needles,
            precision=config.precision,
        )

    trainer.fit(
        steps,
        step,
        checkpoint_every=config.checkpoint_every,
        checkpoint_seconds=60.0 * config.checkpoint_minutes,
        bar=bar,
    )
    record = {
        "steps": trainer.step,
        "losses": trainer.losses,
        "final_loss": trainer.losses[-1] if trainer.losses else None,
        "train_seconds": round(trainer.elapsed, 3),
        "parameters": sum(p.numel() for p in model.parameters()),
        "world_size": world_size,
        "trained_on": trainer.trained_on,
    }
    trainer.finish(record)
    if path is not None and rank == 0:
        write_json(path.with_name(RESULT), record)
    return record


def _recorded(config: ExtrapolateConfig) -> dict[str, Any]:
    """The config a checkpoint records; without needles, their fields change nothing and
    are left out (so runs from before they existed resume)."""
    recorded = config.to_dict()
    if not config.needle_share:
        del recorded["needle_share"], recorded["needle_len"]
    return recorded


def _probe(model: nn.Module, config: ExtrapolateConfig, length: int) -> None:
    """Run the untrained model once on a window of ``length`` (in eval mode: no dropout)."""
    probe(
        model,
        torch.zeros(1, length, dtype=torch.long),
        precision=config.precision,
        failure=f"encoding {config.pe!r} cannot handle windows of {length}",
    )
