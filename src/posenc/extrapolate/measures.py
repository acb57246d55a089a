"""The measures of one run beside bits per byte by length: context gain (``by_context``,
:mod:`~posenc.extrapolate.context_gain`) and, when asked, retrieval at length
(``retrieval``, :mod:`~posenc.extrapolate.retrieval`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from .config import EvalSettings, ExtrapolateConfig
from .context_gain import context_gain
from .corpus import Corpus
from .retrieval import retrieval
from .windows import token_alphabet

Measure = Callable[..., dict[str, Any]]


def run_measures(
    corpus: Corpus,
    config: ExtrapolateConfig,
    settings: EvalSettings,
    lengths: Sequence[int],
    *,
    max_window: int | None = None,
) -> Measure:
    """A function ``measure(model, scaling=None)`` that returns the run's extra entries of
    ``results.json``: ``{"by_context": {...}}`` (unless ``settings.context_blocks`` is 0)
    and ``{"retrieval": [...]}`` (if ``settings.retrieval``) for ``model`` as it is
    (``scaling`` ``None``) or with a zero-shot RoPE ``scaling`` at each window's length.

    ``lengths`` are the evaluation lengths the model can take (retrieval runs at each);
    the contexts reach the sweep's longest length, leaving out windows past ``max_window``
    (a learned table's rows). The needles' alphabet is read once, here."""
    train_len = config.train_len
    longest = max(settings.lengths(train_len))
    alphabet = token_alphabet(corpus.train, corpus.vocab_size) if settings.retrieval else None

    def measure(model: nn.Module, scaling: dict[str, Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if settings.context_blocks:
            out["by_context"] = context_gain(
                model,
                corpus,
                train_len=train_len,
                longest=longest,
                blocks=settings.context_blocks,
                batch_tokens=settings.batch_tokens,
                scaling=scaling,
                max_window=max_window,
            )
        if alphabet is not None and lengths:
            out["retrieval"] = retrieval(
                model,
                corpus,
                lengths,
                train_len=train_len,
                needle_len=config.needle_len,
                trials=settings.retrieval_trials,
                alphabet=alphabet,
                batch_tokens=settings.batch_tokens,
                scaling=scaling,
            )
        return out

    return measure
