"""Toy corpora and models for the context-gain and retrieval tests: a corpus over a given
validation stream, a tiny causal model made less uniform than at initialisation, losses of
one window computed by hand in float64, and :class:`Copier`, a hand-built exact copier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from posenc import TransformerModel
from posenc.extrapolate.corpus import Corpus


def toy_corpus(
    valid: np.ndarray, token_bytes: np.ndarray, train: np.ndarray | None = None
) -> Corpus:
    """A corpus whose validation split is ``valid`` (and training split ``train``, default
    ``valid``), with ``token_bytes[t]`` bytes per token id ``t``."""
    train = valid if train is None else train
    return Corpus(
        name="toy",
        sha256="0" * 64,
        tokenizer=f"bpe:{len(token_bytes)}",
        vocab_size=len(token_bytes),
        train=train,  # type: ignore[arg-type]
        valid=valid,  # type: ignore[arg-type]
        train_bytes=int(token_bytes[train].sum()),
        valid_bytes=int(token_bytes[valid].sum()),
        documents=1,
        skipped=0,
        chunk_bytes=1024,
        valid_fraction=0.5,
        path=Path("/nonexistent"),
        token_bytes=token_bytes,
    )


def tiny_model(
    vocab_size: int, pe: str = "rope", *, seed: int = 0, **kwargs: Any
) -> TransformerModel:
    torch.manual_seed(seed)
    model = TransformerModel(vocab_size, 16, 2, 2, pe=pe, causal=True, **kwargs)
    with torch.no_grad():  # a less uniform model than at initialisation
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    model.trained_length = 8
    return model


def window_scores(model: nn.Module, window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``-ln p(target)`` (float64) and the argmax of every target of ONE window of ``n + 1``
    tokens (inputs ``[:-1]``, targets ``[1:]``), by a float64 log-softmax of the logits."""
    inputs = torch.as_tensor(np.asarray(window[:-1], dtype=np.int64))[None]
    with torch.no_grad():
        logits = model.eval()(inputs)[0].double()  # (n, V)
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    targets = torch.as_tensor(np.asarray(window[1:], dtype=np.int64))
    return -logp[torch.arange(len(targets)), targets].numpy(), logits.argmax(-1).numpy()


class Copier(nn.Module):
    """An exact copier (an induction head written by hand): at input position ``p`` it
    looks for the latest ``j < p`` whose last ``k`` tokens equal the ``k`` tokens ending at
    ``p`` and puts logit ``confidence`` on the token after ``j`` (0 on every other token);
    with no such ``j`` every logit is 0. A negative ``confidence`` makes it avoid the
    copied token instead."""

    def __init__(self, vocab_size: int, k: int, confidence: float = 5.0) -> None:
        super().__init__()
        self.vocab_size, self.k, self.confidence = vocab_size, k, confidence

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, n = tokens.shape
        logits = torch.zeros(b, n, self.vocab_size)
        rows = tokens.tolist()
        for r, row in enumerate(rows):
            for p in range(self.k - 1, n):
                suffix = row[p - self.k + 1 : p + 1]
                for j in range(p - 1, self.k - 2, -1):
                    if row[j - self.k + 1 : j + 1] == suffix:
                        logits[r, p, row[j + 1]] = self.confidence
                        break
        return logits
