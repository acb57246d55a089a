"""Training the causal language models of ``posenc extrapolate`` with lengthgen's trainer.

- The model is :class:`posenc.TransformerModel` with ``causal=True`` over the corpus's
  vocabulary, the same for every encoding (:func:`build_model`); its
  :attr:`~posenc.TransformerModel.trained_length` is the training length ``L``.
- Step ``s`` trains on :meth:`Corpus.batch(s, batch_size, L, seed)
  <posenc.extrapolate.corpus.Corpus.batch>`: the same windows in the same order for every
  encoding with the same seed, and a resumed run draws what it would have drawn.
- :class:`~posenc.lengthgen.loop.Trainer` does the rest: AdamW with warm-up and decay,
  atomic checkpoints, resume after SIGKILL with nothing lost, ``torchrun`` DDP (every rank
  draws the global batch and trains on its slice), the progress bar.
- :func:`finetune` continues a trained RoPE model at a longer length with a context
  extension (position interpolation, YaRN), as Chen et al. 2023 and Peng et al. 2023 do,
  resumable in the same way.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..encodings.rope_scaling import ROPE_TYPES
from ..errors import PosencValueError
from ..lengthgen.checkpoint import RESULT, prepare_run_dir, write_json
from ..lengthgen.config import transformer_for
from ..lengthgen.distributed import all_reduce_sum, check_divisible, global_mean, world
from ..lengthgen.loop import Trainer, make_optimizer, optimizer_for, optimizer_step, seed_everything
from ..lengthgen.progress import Bar
from .config import ExtrapolateConfig
from .corpus import Corpus

#: Fields that may differ between a run and its resumption (they do not change the numbers).
RESUME_FREE = frozenset({"checkpoint_every"})


def build_model(config: ExtrapolateConfig, vocab_size: int) -> nn.Module:
    """The causal ``TransformerModel`` of a run, its ``trained_length`` set to ``train_len``."""
    model = transformer_for(config, vocab_size, causal=True)
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
) -> tuple[float, float]:
    """One optimiser step of next-token prediction on this rank's slice of the global batch
    ``corpus.batch(step, batch_size, length, seed)``. Returns the global mean loss per token
    (nats) and this slice's token accuracy."""
    windows = torch.from_numpy(corpus.batch(step, batch_size, length, seed))  # (b, n + 1)
    per_rank = batch_size // world_size
    mine = windows[rank * per_rank : (rank + 1) * per_rank]
    logits = model(mine[:, :-1])  # (b / world, n, V)
    targets = mine[:, 1:].reshape(-1)
    loss_sum = F.cross_entropy(logits.reshape(targets.numel(), -1), targets, reduction="sum")
    optimizer_step(
        model,
        optimizer,
        scheduler,
        global_mean(loss_sum, batch_size * length, world_size),
        grad_clip,
    )
    total = all_reduce_sum(loss_sum.detach(), world_size)
    accuracy = (logits.reshape(targets.numel(), -1).argmax(-1) == targets).float().mean()
    return float(total) / (batch_size * length), float(accuracy)


def train_model(
    config: ExtrapolateConfig,
    corpus: Corpus,
    run_dir: Path | str | None = None,
    *,
    resume: bool = False,
    progress: bool = False,
    console: Any = None,
    probe_length: int = 0,
) -> tuple[nn.Module, dict[str, Any]]:
    """Train one model (or, with ``resume``, continue or reopen it); return the model and
    the training record (``steps``, ``losses``, ``train_seconds``, ``parameters``).
    With ``probe_length``, the untrained model first runs once on a window of that length,
    so an encoding that cannot reach it fails before training.

    Under ``torchrun`` every rank calls this and gets the trained model; rank 0 writes.
    """
    config.validate()
    rank, world_size = world()
    check_divisible(config.batch_size, world_size)
    path = prepare_run_dir(run_dir, resume=resume, rank=rank)
    seed_everything(config.seed)
    model = build_model(config, corpus.vocab_size)
    if probe_length:
        _probe(model, config.pe, probe_length)
    optimizer, scheduler = optimizer_for(model, config)
    record = _run(
        model,
        optimizer,
        scheduler,
        {**config.to_dict(), "corpus": corpus.key},
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
    tokens as a training batch), drawn from the steps after the training run's last.

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
        "base": config.to_dict(),
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
    """Restore or train with :class:`~posenc.lengthgen.loop.Trainer` (step ``s`` trains on
    the corpus's batch number ``first + s``); write the record."""
    rank, world_size = world()
    trainer = Trainer(
        model,
        optimizer,
        scheduler,
        config=run_config,
        path=path,
        resume_free=RESUME_FREE,
        extra={"trained_length": config.train_len},
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
        )

    trainer.fit(steps, step, checkpoint_every=config.checkpoint_every, bar=bar)
    record = {
        "steps": trainer.step,
        "losses": trainer.losses,
        "final_loss": trainer.losses[-1] if trainer.losses else None,
        "train_seconds": round(trainer.elapsed, 3),
        "parameters": sum(p.numel() for p in model.parameters()),
        "world_size": world_size,
    }
    trainer.finish(record)
    if path is not None and rank == 0:
        write_json(path.with_name(RESULT), record)
    return record


def _probe(model: nn.Module, pe: str, length: int) -> None:
    """Run the untrained model once on a window of ``length`` (in eval mode: no dropout)."""
    tokens = torch.zeros(1, length, dtype=torch.long)
    model.eval()
    try:
        with torch.no_grad():
            model(tokens)
    except (ValueError, IndexError, RuntimeError) as exc:
        raise PosencValueError(f"encoding {pe!r} cannot handle windows of {length}: {exc}") from exc
    finally:
        model.train()
