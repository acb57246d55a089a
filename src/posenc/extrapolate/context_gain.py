"""Context gain: bits per byte on the SAME target tokens given more and more context.

Bits per byte at length ``n`` and by position bucket cannot tell a model that survives
past its training length ``L`` from one that uses the context past ``L``: a token at
position ``p`` of a window has ``p`` tokens of context *and* the position index ``p``. This
measure holds the targets fixed and varies only the context in front of them:

- **targets**: ``K`` blocks (``K`` = ``EvalSettings.context_blocks``) of ``T`` validation
  tokens, ``T = min(32, L // 2)`` (at least 1, :func:`block_len`), whose starts are spread
  evenly over the validation split (:func:`block_starts`; no randomness);
- **contexts**: ``c`` in ``0, 16, L/4, L/2, L, 2L, 4L, ...`` up to the longest evaluation
  length (:func:`context_lengths`);
- block ``k`` with context ``c`` is the window ``valid[s_k - c : s_k + T + 1]`` (``c + T``
  inputs); its last ``T`` targets, ``valid[s_k + 1 : s_k + T + 1]``, are scored in one
  forward. Target ``j`` of a block (``j = 0 .. T - 1``) thus sees ``c + j + 1`` tokens;
  ``c = 0`` scores the block alone, as a window of ``T`` (its first target sees only the
  token before it). The window is ``c + T`` long: at ``c = L`` the targets sit at positions
  ``L .. L + T - 1``, just past the training length; ``c = L - T`` is the longest context
  whose targets all sit inside it.

``by_context[c]`` is the summed loss over the ``K T`` targets divided by ``ln 2`` and by
the bytes they stand for: bits per byte, over the same bytes for every ``c``. A model that
uses context past ``L`` keeps falling past ``c = L``; one that merely survives there stays
flat; one that breaks there rises. The cost is bounded and known in advance:
``K * sum(c + T)`` tokens forwarded (``K = 128``, ``L = 64``, longest length 1024: contexts
0, 16, 32, 64, ..., 1024, about 293k tokens, about twice the cost of one
``eval_tokens = 32768`` evaluation at the five lengths). Windows longer than a learned
position table are left out; so are contexts the validation split cannot hold.

Dimension legend: ``K`` blocks, ``T`` targets per block, ``c`` context length.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from torch import nn

from ..errors import check_bytes
from .corpus import Corpus
from .evaluate import check_forward_bytes, model_at, tail_scores
from .windows import check_int

#: The most targets per block, and the short context every list holds besides L's fractions.
MAX_BLOCK = 32
SHORT_CONTEXT = 16


def block_len(train_len: int) -> int:
    """``T``, the targets per block: ``min(32, L // 2)``, at least 1 (short against ``L``, so
    that the targets' own in-block context stays small beside the context given).

    >>> block_len(64), block_len(256), block_len(8)
    (32, 32, 4)
    """
    return max(1, min(MAX_BLOCK, check_int("train_len", train_len, 1) // 2))


def context_lengths(train_len: int, longest: int) -> list[int]:
    """``0, 16, L/4, L/2, L, 2L, 4L, ...``, the ones up to ``longest``, distinct and sorted
    (``L/4`` and ``L/2`` rounded down, left out when 0).

    >>> context_lengths(64, 1024)
    [0, 16, 32, 64, 128, 256, 512, 1024]
    >>> context_lengths(256, 4096)
    [0, 16, 64, 128, 256, 512, 1024, 2048, 4096]
    """
    train_len = check_int("train_len", train_len, 1)
    longest = check_int("longest", longest, 1)
    values = {0, SHORT_CONTEXT, train_len // 4, train_len // 2}
    values |= {train_len << k for k in range(longest.bit_length())}
    return sorted(v for v in values if v <= longest)


def block_starts(available: int, context: int, block: int, count: int) -> np.ndarray:
    """The starts ``s_k`` (int64, increasing) of at most ``count`` blocks in a split of
    ``available`` tokens, each with ``context`` tokens before it and ``block + 1`` from it
    on: spread evenly over ``[context, available - block - 1]``, ``floor(k * span / K)``
    apart. Empty when the split is too short for one.

    >>> block_starts(100, 10, 4, 3).tolist()
    [10, 38, 67]
    """
    last = available - block - 1
    span = last - context + 1  # the starts there are
    if span <= 0:
        return np.zeros(0, dtype=np.int64)
    count = min(check_int("count", count, 1), span)
    return context + np.arange(count, dtype=np.int64) * span // count


def context_gain(
    model: nn.Module,
    corpus: Corpus,
    *,
    train_len: int,
    longest: int,
    blocks: int,
    batch_tokens: int = 4096,
    scaling: dict[str, Any] | None = None,
    max_window: int | None = None,
) -> dict[str, float]:
    """``{"c": bits per byte}`` (keys the context lengths as strings, in increasing order)
    of ``model`` on ``blocks`` target blocks of the validation split, given ``c`` tokens of
    context for each ``c`` of :func:`context_lengths` (see the module docstring).

    Args:
        train_len: ``L``, which sets ``T`` and the context lengths.
        longest: the longest context (the sweep's longest evaluation length).
        blocks: ``K``, the most target blocks (fewer if the split is short).
        scaling: a zero-shot RoPE scaling, applied at each window's length ``c + T`` as
            :func:`~posenc.extrapolate.evaluate.model_at` does; ``None``: the model as is.
        max_window: leave out contexts whose window ``c + T`` is longer (a learned table).
    """
    block = block_len(train_len)
    check_int("blocks", blocks, 1)
    held = [c for c in context_lengths(train_len, longest) if c + block + 1 <= len(corpus.valid)]
    contexts = [c for c in held if max_window is None or c + block <= max_window]
    if not contexts:
        return {}
    # the starts leave room for the longest context the split holds, whatever this model can
    # take: every run of a sweep scores the same targets (a learned table only drops contexts)
    starts = block_starts(len(corpus.valid), max(held), block, blocks)  # (K,)
    valid = corpus.valid
    targets = np.asarray(valid[starts[:, None] + np.arange(1, block + 1)])  # (K, T)
    nbytes = int(corpus.token_bytes[targets].sum(dtype=np.int64))
    out: dict[str, float] = {}
    for c in contexts:
        window = c + block
        check_bytes(
            "context_blocks x window", f"{len(starts)} x {window}", starts.size * window * 16
        )
        check_forward_bytes("context length", c, model, corpus.vocab_size, batch_tokens, window)
        windows = np.asarray(valid[starts[:, None] - c + np.arange(window + 1)])  # (K, c + T + 1)
        scored, _ = model_at(model, scaling, window, train_len)
        losses, _ = tail_scores(
            scored, windows, block, batch_tokens=batch_tokens, vocab_size=corpus.vocab_size
        )  # (K, T)
        out[str(c)] = float(losses.sum() / math.log(2) / nbytes)
    return out
