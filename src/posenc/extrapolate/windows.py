"""Windows of ``posenc extrapolate``: training batches drawn from the step number (with, if
asked, a needle and its repeat in a share of them), and evaluation windows that score the
same validation tokens at every length.

Dimension legend: ``b`` batch, ``n`` window length, ``w`` windows, ``m`` needle length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import PosencTypeError, PosencValueError, check_bytes


def check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PosencTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise PosencValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_lengths(name: str, lengths: Sequence[int]) -> list[int]:
    if isinstance(lengths, (int, np.integer)) or not isinstance(lengths, Sequence):
        raise PosencTypeError(f"{name} must be a sequence of ints, got {type(lengths).__name__}")
    if not lengths:
        raise PosencValueError(f"{name} must name at least one length, got {list(lengths)}")
    return [check_int(name, length, 1) for length in lengths]


def train_batch(
    tokens: np.ndarray, step: int, batch_size: int, length: int, seed: int
) -> np.ndarray:
    """``batch_size`` windows of ``length + 1`` consecutive tokens at random starts, as int64
    ``(b, n + 1)``: inputs ``[:, :-1]``, targets ``[:, 1:]``.

    The starts are uniform over every window that fits and come from
    ``numpy.random.default_rng([seed, step])``, so the batch depends on its arguments only:
    a run resumed at ``step`` draws what it would have drawn (on the same numpy version).
    """
    step = check_int("step", step, 0)
    batch_size = check_int("batch_size", batch_size, 1)
    length = check_int("length", length, 1)
    seed = check_int("seed", seed, 0)
    if len(tokens) < length + 1:
        raise PosencValueError(
            f"length={length} needs at least {length + 1} tokens, the split has {len(tokens)}"
        )
    check_bytes("batch_size", batch_size, batch_size * (length + 1) * 8 * 2)
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(tokens) - length, size=batch_size)  # (b,)
    index = starts[:, None] + np.arange(length + 1)  # (b, n + 1)
    return np.asarray(tokens[index], dtype=np.int64)


#: The needles' own random stream (``default_rng([seed, step, NEEDLE_STREAM])``), apart from
#: the windows' (``default_rng([seed, step])``): adding needles moves no window.
NEEDLE_STREAM = 0x6E656564


def token_alphabet(tokens: np.ndarray, vocab_size: int, *, block: int = 1 << 22) -> np.ndarray:
    """The token ids that occur in ``tokens`` (int64, sorted), counted ``block`` tokens at a
    time so that a memory-mapped split is never copied whole.

    >>> token_alphabet(np.array([5, 1, 5, 3]), 8).tolist()
    [1, 3, 5]
    """
    vocab_size = check_int("vocab_size", vocab_size, 1)
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, len(tokens), block):
        counts += np.bincount(np.asarray(tokens[start : start + block]), minlength=vocab_size)
    return np.flatnonzero(counts)


@dataclass(frozen=True, eq=False)
class Needles:
    """Training needles: in a share ``share`` of the windows, a random string of ``length``
    tokens drawn uniformly from ``alphabet`` (the ids the training split holds), then the
    same string again later in the same window, so that copying it lowers the loss."""

    share: float  # P in [0, 1]: the share of windows that carry a needle
    length: int  # m: tokens per needle
    alphabet: np.ndarray  # (ids,) the token ids a needle is drawn from


def needle_rows(step: int, batch_size: int, share: float) -> int:
    """How many windows of step ``step`` carry a needle: ``floor(P b (s + 1)) - floor(P b s)``
    in exact arithmetic on ``P`` as its decimal form reads (0.3 is 3/10), so that the first
    ``S`` steps hold ``floor(P b S)`` of them: the share ``P`` up to one window.

    >>> [needle_rows(step, 4, 0.3) for step in range(5)]
    [1, 1, 1, 1, 2]
    """
    share_q = Fraction(repr(float(share))) * batch_size
    return math.floor(share_q * (step + 1)) - math.floor(share_q * step)


def add_needles(windows: np.ndarray, step: int, seed: int, needles: Needles) -> np.ndarray:
    """A copy of the training ``windows`` ``(b, n + 1)`` of step ``step`` where
    :func:`needle_rows` of them (chosen at random) carry a needle at a random start ``a``
    and its repeat at a random start ``r >= a + m`` with ``r + m <= n + 1``: the repeat's
    tokens are targets, each predictable from the first occurrence. Every draw comes from
    ``numpy.random.default_rng([seed, step, NEEDLE_STREAM])``: the result depends on the
    arguments only, as :func:`train_batch`'s does."""
    b, width = windows.shape
    m = needles.length
    if 2 * m > width:
        raise PosencValueError(
            f"needle_len ({m}) twice over does not fit windows of {width - 1} tokens"
        )
    out = np.array(windows, dtype=np.int64)  # (b, n + 1), a copy
    rng = np.random.default_rng([seed, step, NEEDLE_STREAM])
    rows = np.sort(rng.choice(b, size=needle_rows(step, b, needles.share), replace=False))
    for row in rows.tolist():
        needle = rng.choice(needles.alphabet, size=m)  # (m,)
        first = int(rng.integers(0, width - 2 * m + 1))
        repeat = int(rng.integers(first + m, width - m + 1))
        out[row, first : first + m] = needle
        out[row, repeat : repeat + m] = needle
    return out


def eval_budget(lengths: Sequence[int], available: int, *, max_tokens: int | None = None) -> int:
    """``T``, the number of validation tokens every length scores: the largest multiple of
    all ``lengths`` (of their least common multiple) with ``T + 1 <= available`` and, if
    given, ``T <= max_tokens``.

    >>> eval_budget([64, 128, 256], available=1000)
    768
    """
    lengths = _check_lengths("lengths", lengths)
    available = check_int("available", available, 0)
    common = math.lcm(*lengths)
    limit = available - 1
    if max_tokens is not None:
        limit = min(limit, check_int("max_tokens", max_tokens, 1))
    budget = max(limit, 0) // common * common
    if budget == 0:
        raise PosencValueError(
            f"lengths {lengths} share windows only in multiples of {common} tokens; "
            f"available={available} and max_tokens={max_tokens} leave room for none "
            f"(one needs {common + 1} tokens)"
        )
    return budget


def eval_windows(tokens: np.ndarray, length: int, num_tokens: int) -> np.ndarray:
    """The first ``num_tokens`` targets cut into non-overlapping windows of ``length``:
    ``(w, n + 1)`` with ``w = num_tokens / length``, row ``i`` = ``tokens[i*n : i*n + n + 1]``
    (inputs ``[:, :-1]``, targets ``[:, 1:]``).

    The targets of all rows together are ``tokens[1 : num_tokens + 1]`` for every length,
    so with ``num_tokens`` from :func:`eval_budget` every length scores the same tokens.
    Neighbouring rows share one token; the result is a read-only view (nothing is copied).
    """
    length = check_int("length", length, 1)
    num_tokens = check_int("num_tokens", num_tokens, 1)
    if num_tokens % length:
        raise PosencValueError(f"num_tokens ({num_tokens}) must be a multiple of length ({length})")
    if len(tokens) < num_tokens + 1:
        raise PosencValueError(
            f"num_tokens={num_tokens} needs {num_tokens + 1} tokens, the split has {len(tokens)}"
        )
    every_start = np.lib.stride_tricks.sliding_window_view(
        tokens[: num_tokens + 1], length + 1
    )  # (num_tokens - length + 1, n + 1), one row per start
    return every_start[::length]  # (w, n + 1), starts 0, n, 2n, ...


def check_lengths(
    corpus: Any, train_len: int, eval_lens: Sequence[int], *, min_eval_windows: int = 1
) -> None:
    """``corpus`` is a :class:`~posenc.extrapolate.corpus.Corpus` (read through its ``train``,
    ``valid``, ``name`` and ``tokenizer``; not imported, since the corpus module imports this
    one). Raise :class:`~posenc.errors.PosencValueError` if ``corpus`` cannot train windows of
    ``train_len`` or score ``eval_lens`` on common tokens with at least ``min_eval_windows``
    windows of the longest length; the message says how many tokens are needed and how
    many there are."""
    train_len = check_int("train_len", train_len, 1)
    eval_lens = _check_lengths("eval_lens", eval_lens)
    min_eval_windows = check_int("min_eval_windows", min_eval_windows, 1)
    common = math.lcm(*eval_lens)
    scored = -(-min_eval_windows * max(eval_lens) // common) * common
    problems = []
    if len(corpus.train) < train_len + 1:
        problems.append(
            f"training at length {train_len} needs {train_len + 1} training tokens, "
            f"the training split has {len(corpus.train)}"
        )
    if len(corpus.valid) < scored + 1:
        problems.append(
            f"evaluating lengths {eval_lens} on the same {scored} tokens needs "
            f"{scored + 1} validation tokens, the validation split has {len(corpus.valid)}"
        )
    if problems:
        raise PosencValueError(
            f"corpus {corpus.name!r} ({corpus.tokenizer}) is too small: "
            + "; ".join(problems)
            + " (use more text, shorter lengths or a larger valid_fraction)"
        )


def bits_per_byte(loss_nats_per_token: float, num_tokens: int, num_bytes: int) -> float:
    """Convert a mean loss in nats per token over ``num_tokens`` tokens that stand for
    ``num_bytes`` bytes (:meth:`Corpus.count_bytes`) to bits per byte.

    >>> round(bits_per_byte(math.log(2), num_tokens=10, num_bytes=10), 6)
    1.0
    """
    if num_bytes <= 0:
        raise PosencValueError(f"num_bytes must be > 0, got {num_bytes}")
    return loss_nats_per_token / math.log(2) * num_tokens / num_bytes
