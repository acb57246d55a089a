"""Retrieval at length: can the model still find a string it read far back?

A needle-in-a-haystack test (after Kamradt 2023's "needle in a haystack"; the repeat of a
random string is the induction-head probe of Olsson et al. 2022) at every evaluation
length ``n``:

- **text**: ``trials`` windows of ``n + 1`` validation tokens (inputs ``[:-1]``, targets
  ``[1:]``, as in the other evaluations), their starts spread evenly over the split;
- **needle**: a random string of ``m`` tokens (``ExtrapolateConfig.needle_len``), drawn
  uniformly from the token ids of the training split from
  ``numpy.random.default_rng([RETRIEVAL_STREAM, n, trial])`` (the same needles for every
  model and depth), written over the text at ``d = round(depth * (n + 1 - 2m))`` for each
  depth of :data:`DEPTHS` (depth 0: the window's first token; 1: just before the repeat);
- **repeat**: the same needle again over the window's last ``m`` tokens. Its first
  ``m // 4`` tokens (:func:`cue_len`, at least 1) are the cue; the other ``m - m // 4`` are
  scored;
- **fresh**: the same window with a second random needle of the same stream in place of
  the repeat: what those positions cost when there is nothing to copy.

Per (length, depth): ``copy_accuracy``, the share of scored repeat tokens whose greedy
prediction (argmax) is right, and ``bits_saved``, the mean over the scored tokens of
(loss on the fresh needle - loss on the repeat) in bits: bits per needle token that the
first occurrence saves (0 for a model that does not look back; ``log2`` of the alphabet
size and more for a perfect copier). The distance the model must reach back is
``n + 1 - m - d`` tokens: about ``0.9 n`` at depth 0.1. The cost: ``2 * trials *
len(DEPTHS)`` windows per length.

Dimension legend: ``t`` trials, ``n`` window length, ``m`` needle length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch import nn

from ..errors import PosencValueError, check_bytes
from .corpus import Corpus
from .evaluate import check_forward_bytes, model_at, tail_scores
from .windows import check_int

#: Where the needle starts, as a share of the room before the repeat.
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
#: The stream of the evaluation's needles ("niah"), apart from the training needles'.
RETRIEVAL_STREAM = 0x6E696168
#: The shortest needle: a cue of one token and three scored.
MIN_NEEDLE = 4


def cue_len(needle_len: int) -> int:
    """The repeat's first tokens that are not scored: ``m // 4``, at least 1.

    >>> cue_len(16), cue_len(4), cue_len(6)
    (4, 1, 1)
    """
    return max(1, needle_len // 4)


def needle_start(depth: float, length: int, needle_len: int) -> int:
    """``d = round(depth * (n + 1 - 2m))``, the needle's first index in a window of
    ``n + 1`` tokens whose last ``m`` hold the repeat.

    >>> needle_start(0.0, 64, 16), needle_start(0.5, 64, 16), needle_start(1.0, 64, 16)
    (0, 16, 33)
    """
    return round(depth * (length + 1 - 2 * needle_len))


def check_retrieval(needle_len: int, lengths: Sequence[int]) -> None:
    """Raise :class:`~posenc.errors.PosencValueError` unless a needle and its repeat fit the
    shortest of ``lengths`` (``2m <= n``) and the needle is at least 4 tokens."""
    needle_len = check_int("needle_len", needle_len, MIN_NEEDLE)
    shortest = min(lengths)
    if 2 * needle_len > shortest:
        raise PosencValueError(
            f"retrieval needs a needle and its repeat in every window: needle_len "
            f"({needle_len}) must be at most half the shortest evaluation length ({shortest})"
        )


def needle_windows(
    valid: np.ndarray,
    alphabet: np.ndarray,
    length: int,
    depth: float,
    needle_len: int,
    trials: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``(repeat, fresh)`` windows of one (length, depth), each int64 ``(t, n + 1)``
    (see the module docstring): row ``i`` is ``valid[a_i : a_i + n + 1]`` with
    ``a_i = floor(i * (len(valid) - n) / t)``, the needle at :func:`needle_start` and, over
    the last ``m`` tokens, the needle again (``repeat``) or a second one (``fresh``)."""
    n, m = check_int("length", length, 1), check_int("needle_len", needle_len, 1)
    trials = check_int("trials", trials, 1)
    if 2 * m > n or len(valid) < n + 1:
        raise PosencValueError(
            f"a needle of {m} and its repeat need a window of at least {2 * m} tokens and "
            f"the split {n + 1} tokens; got length {n} and {len(valid)} tokens"
        )
    d = needle_start(depth, n, m)
    starts = np.arange(trials, dtype=np.int64) * (len(valid) - n) // trials  # (t,)
    repeat = np.asarray(valid[starts[:, None] + np.arange(n + 1)], dtype=np.int64)  # (t, n + 1)
    fresh = np.empty_like(repeat)
    for i in range(trials):
        rng = np.random.default_rng([RETRIEVAL_STREAM, n, i])
        needle, other = rng.choice(alphabet, size=(2, m))  # (m,) each
        repeat[i, d : d + m] = needle
        repeat[i, n + 1 - m :] = needle
        fresh[i] = repeat[i]
        fresh[i, n + 1 - m :] = other
    return repeat, fresh


def retrieval(
    model: nn.Module,
    corpus: Corpus,
    lengths: Sequence[int],
    *,
    train_len: int,
    needle_len: int,
    trials: int,
    alphabet: np.ndarray,
    depths: Sequence[float] = DEPTHS,
    batch_tokens: int = 4096,
    scaling: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """``[{"length", "depth", "copy_accuracy", "bits_saved"}, ...]``, by length then depth,
    of ``model`` (with the zero-shot ``scaling`` at each length, as
    :func:`~posenc.extrapolate.evaluate.model_at` applies it; ``None``: as it is), over
    ``trials`` windows per (length, depth) with needles from ``alphabet``."""
    check_retrieval(needle_len, lengths)
    trials = check_int("trials", trials, 1)
    scored_len = needle_len - cue_len(needle_len)
    rows = []
    for n in lengths:
        count = 2 * trials * len(depths)
        check_bytes("retrieval_trials x length", f"{trials} x {n}", count * (n + 1) * 16)
        check_forward_bytes("retrieval length", n, model, corpus.vocab_size, batch_tokens, n)
        pairs = [needle_windows(corpus.valid, alphabet, n, d, needle_len, trials) for d in depths]
        windows = np.concatenate([w for pair in pairs for w in pair])  # (2 D t, n + 1)
        scored, _ = model_at(model, scaling, n, train_len)
        losses, hits = tail_scores(
            scored, windows, scored_len, batch_tokens=batch_tokens, vocab_size=corpus.vocab_size
        )  # (2 D t, m - cue) each
        for j, depth in enumerate(depths):
            repeat = slice(2 * j * trials, (2 * j + 1) * trials)
            fresh = slice((2 * j + 1) * trials, (2 * j + 2) * trials)
            rows.append(
                {
                    "length": n,
                    "depth": depth,
                    "copy_accuracy": float(hits[repeat].mean()),
                    "bits_saved": float((losses[fresh] - losses[repeat]).mean() / math.log(2)),
                }
            )
    return rows
