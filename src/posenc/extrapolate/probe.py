"""A trained ``posenc extrapolate`` model reopened for the depth probe (:mod:`posenc.probe`,
``posenc probe``): the model rebuilt from its checkpoint, and windows of its corpus's
validation split to run it on."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import PosencValueError
from ..runs.trainer import seed_everything
from .config import ExtrapolateConfig
from .corpus import cache_dir, open_corpus
from .train import build_model


def is_extrapolate_run(saved: dict[str, Any]) -> bool:
    """Whether a checkpoint is a trained ``posenc extrapolate`` model (not a fine-tune)."""
    config = saved.get("config", {})
    return "corpus" in config and "train_len" in config


def model_from_checkpoint(
    saved: dict[str, Any], *, trained: bool = True
) -> tuple[nn.Module, ExtrapolateConfig]:
    """The model a checkpoint holds (its weights loaded, on the CPU) and its configuration;
    with ``trained=False``, the model its training started from instead (built from the
    config after seeding every generator with the run's seed, as
    :func:`~posenc.extrapolate.train.train_model` builds it). The vocabulary size is read from
    the saved embedding."""
    fields = {k: v for k, v in saved["config"].items() if k != "corpus"}
    config = ExtrapolateConfig.from_dict(fields)
    vocab_size = saved["model"]["embed.weight"].shape[0]
    seed_everything(config.seed)
    model = build_model(config, vocab_size)
    if trained:
        model.load_state_dict(saved["model"])
    model.trained_length = saved.get("trained_length", config.train_len)
    return model, config


def probe_windows(saved: dict[str, Any], windows: int, length: int) -> torch.Tensor:
    """``(windows, length)`` token ids from the validation split of the corpus the model was
    trained on, starting at ``windows`` evenly spaced places from its first token to its
    last window (so they come from many documents, in the split's order). The corpus is read
    from the cache (:func:`~posenc.extrapolate.corpus.cache_dir`)."""
    key = saved["config"]["corpus"]
    entry = cache_dir() / key
    if not entry.is_dir():
        raise PosencValueError(
            f"corpus {key[:12]}... of this run is not in the cache {cache_dir()}: prepare it "
            "again (posenc extrapolate with the run's --text and --tokenizer, or "
            "POSENC_CACHE_DIR pointing at the cache it was trained from)"
        )
    corpus = open_corpus(entry)
    valid = corpus.valid
    if len(valid) < windows * length:
        raise PosencValueError(
            f"--windows {windows} x --length {length} needs {windows * length} validation "
            f"tokens; corpus {corpus.name!r} holds {len(valid)}"
        )
    starts = np.linspace(0, len(valid) - length, windows).astype(np.int64)  # (windows,)
    rows = np.stack([valid[s : s + length] for s in starts]).astype(np.int64)
    return torch.from_numpy(rows)  # (windows, length)
