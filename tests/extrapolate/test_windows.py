"""posenc.extrapolate.windows: training batches drawn from the step number, evaluation windows
that score the same tokens at every length, the length checks and bits per byte.

Every test works in ``tmp_path``; the cache is pointed there through ``POSENC_CACHE_DIR``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from posenc.errors import PosencTypeError, PosencValueError
from posenc.extrapolate.corpus import prepare_corpus
from posenc.extrapolate.windows import (
    bits_per_byte,
    check_lengths,
    eval_budget,
    eval_windows,
    needle_rows,
    token_alphabet,
    train_batch,
)
from tests.extrapolate.corpora import many_small, own_cache


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's cache is its own folder; the real ~/.cache is never touched."""
    return own_cache(tmp_path, monkeypatch)


def test_batches_depend_only_on_step_and_seed() -> None:
    tokens = np.arange(1000)
    batch = train_batch(tokens, step=3, batch_size=8, length=16, seed=1)
    assert batch.shape == (8, 17) and batch.dtype == np.int64
    np.testing.assert_array_equal(batch, train_batch(tokens, 3, 8, 16, 1))
    assert not np.array_equal(batch, train_batch(tokens, 4, 8, 16, 1))
    assert not np.array_equal(batch, train_batch(tokens, 3, 8, 16, 2))
    # Each row is a window of consecutive tokens inside the array.
    np.testing.assert_array_equal(batch - batch[:, :1], np.broadcast_to(np.arange(17), (8, 17)))
    assert batch.min() >= 0 and batch.max() <= 999


def test_batches_reach_every_window_and_no_further() -> None:
    tokens = np.arange(18)  # windows of 17 can start at 0 or 1 only
    starts = {
        int(train_batch(tokens, step, 4, 16, 0)[row, 0]) for step in range(20) for row in range(4)
    }
    assert starts == {0, 1}
    np.testing.assert_array_equal(train_batch(tokens[:17], 0, 2, 16, 0), [tokens[:17]] * 2)


def test_a_corpus_batch_is_windows_of_its_training_tokens(tmp_path: Path) -> None:
    many_small(tmp_path / "text", 100)
    corpus = prepare_corpus(tmp_path / "text")
    batch = corpus.batch(step=0, batch_size=4, length=32, seed=0)
    train = corpus.train.tobytes()
    for row in batch:
        assert bytes(row.astype(np.uint8)) in train


def test_batch_arguments_are_checked() -> None:
    tokens = np.arange(10)
    with pytest.raises(
        PosencValueError, match="length=10 needs at least 11 tokens, the split has 10"
    ):
        train_batch(tokens, 0, 1, 10, 0)
    with pytest.raises(PosencValueError, match="step"):
        train_batch(tokens, -1, 1, 4, 0)
    with pytest.raises(PosencValueError, match="batch_size"):
        train_batch(tokens, 0, 0, 4, 0)
    with pytest.raises(PosencTypeError, match="seed"):
        train_batch(tokens, 0, 1, 4, True)


@pytest.mark.parametrize("lengths", [[16, 32, 64, 128], [3, 4], [5]])
def test_every_length_scores_the_same_tokens(lengths: list[int]) -> None:
    tokens = np.arange(2000)
    budget = eval_budget(lengths, len(tokens), max_tokens=1000)
    assert budget <= 1000 and all(budget % length == 0 for length in lengths)
    assert budget + math.lcm(*lengths) > 1000  # the largest that fits
    for length in lengths:
        windows = eval_windows(tokens, length, budget)  # (w, n + 1)
        assert windows.shape == (budget // length, length + 1)
        np.testing.assert_array_equal(windows[:, 1:].ravel(), tokens[1 : budget + 1])
        np.testing.assert_array_equal(windows[:, :-1].ravel(), tokens[:budget])
        assert np.shares_memory(windows, tokens)  # a view, nothing copied


def test_eval_windows_on_the_validation_memmap(tmp_path: Path) -> None:
    many_small(tmp_path / "text", 300)
    corpus = prepare_corpus(tmp_path / "text")
    budget = eval_budget([64, 128, 256], len(corpus.valid))
    windows = corpus.eval_windows(128, budget)
    assert windows.shape == (budget // 128, 129) and np.shares_memory(windows, corpus.valid)
    assert corpus.count_bytes(windows[:, 1:]) == budget  # bytes: one byte per token


def test_eval_budget_and_windows_check_their_arguments() -> None:
    with pytest.raises(PosencValueError, match=r"multiples of 12 tokens.*needs 13 tokens"):
        eval_budget([3, 4], available=12)
    with pytest.raises(PosencValueError, match="lengths"):
        eval_budget([], available=100)
    with pytest.raises(PosencValueError, match="multiple of length"):
        eval_windows(np.arange(100), 8, 50)
    with pytest.raises(PosencValueError, match="needs 65 tokens, the split has 64"):
        eval_windows(np.arange(64), 8, 64)


def test_check_lengths_says_what_is_needed_and_what_there_is(tmp_path: Path) -> None:
    many_small(tmp_path / "text", 100)
    corpus = prepare_corpus(tmp_path / "text")
    check_lengths(corpus, 64, [64, 128, 256])
    have = len(corpus.valid)
    with pytest.raises(
        PosencValueError, match=f"needs 65537 validation tokens, the validation split has {have}"
    ):
        check_lengths(corpus, 64, [64 << k for k in range(11)])
    with pytest.raises(
        PosencValueError,
        match=f"needs 1000001 training tokens, the training split has {len(corpus.train)}",
    ):
        check_lengths(corpus, 1_000_000, [64])
    with pytest.raises(PosencValueError, match="needs 3001 validation"):  # 3 windows of 1000
        check_lengths(corpus, 64, [500, 1000], min_eval_windows=3)


def test_bits_per_byte() -> None:
    assert bits_per_byte(math.log(2), 10, 10) == pytest.approx(1.0)
    assert bits_per_byte(2.0, num_tokens=100, num_bytes=350) == pytest.approx(
        2.0 / math.log(2) / 3.5
    )
    with pytest.raises(PosencValueError, match="num_bytes"):
        bits_per_byte(1.0, 1, 0)


def test_the_alphabet_and_the_needle_count() -> None:
    tokens = np.array([7, 3, 3, 250, 7, 0], dtype=np.uint8)
    np.testing.assert_array_equal(token_alphabet(tokens, 256), [0, 3, 7, 250])
    np.testing.assert_array_equal(token_alphabet(tokens, 256, block=4), [0, 3, 7, 250])
    assert token_alphabet(tokens, 256).dtype == np.int64
    # floor(P b (s + 1)) - floor(P b s), on P as written: 0.1 * 32 = 3.2 windows a step
    counts = [needle_rows(step, 32, 0.1) for step in range(10)]
    assert counts == [3, 3, 3, 3, 4, 3, 3, 3, 3, 4] and sum(counts) == 32  # 3.2, 6.4, ...
    assert [needle_rows(s, 8, 0.0) for s in range(3)] == [0, 0, 0]
    assert [needle_rows(s, 8, 1.0) for s in range(3)] == [8, 8, 8]
