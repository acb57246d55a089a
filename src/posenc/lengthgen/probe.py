"""A trained ``posenc lengthgen`` model reopened for the depth probe (:mod:`posenc.probe`,
``posenc probe``): the model rebuilt from its checkpoint, and examples of its task at the
longest trained input length to run it on."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import PosencValueError
from ..runs.trainer import seed_everything
from .config import InDistributionWarning, TrainConfig
from .data import Vocab, collate, sample_batch
from .train import build_model


def is_lengthgen_run(saved: dict[str, Any]) -> bool:
    """Whether a checkpoint is a trained ``posenc lengthgen`` model."""
    return "task" in saved.get("config", {})


def model_from_checkpoint(
    saved: dict[str, Any], *, trained: bool = True
) -> tuple[nn.Module, TrainConfig]:
    """The model a checkpoint holds (its weights loaded, on the CPU) and its configuration;
    with ``trained=False``, the model its training started from instead (built from the
    config after seeding every generator with the run's seed, as training builds it)."""
    config = TrainConfig.from_dict(saved["config"])
    with warnings.catch_warnings():  # its sweep warned when it was trained
        warnings.simplefilter("ignore", InDistributionWarning)
        task = config.validate()
    seed_everything(config.seed)
    model = build_model(config, task)
    if trained:
        model.load_state_dict(saved["model"])
    return model, config


def probe_windows(config: TrainConfig, windows: int, seed: int = 0) -> torch.Tensor:
    """``(windows, n)`` token ids: ``windows`` examples of the run's task with inputs of the
    longest trained length, as the model reads them (decoder tasks: BOS, input, SEP,
    answer), cut to the shortest of them so that no row holds padding."""
    task = config.validate()
    vocab = Vocab(task.vocab_size)
    rng = np.random.default_rng([seed, 97])
    length = config.train_max_length
    examples, _ = sample_batch(task, windows, length, length, rng)
    tokens = collate(task.kind, examples, vocab).tokens  # (windows, longest)
    shortest = int((tokens != vocab.pad).sum(dim=1).min())
    if shortest < 2:
        raise PosencValueError(f"task {config.task!r} gives sequences of {shortest} token(s)")
    return tokens[:, :shortest]
