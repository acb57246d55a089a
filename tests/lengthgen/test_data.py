"""Examples to tensors (``posenc.lengthgen.data``): the decoder and encoder layouts, padding,
randomized positions (Ruoss et al. 2023) and coupled positions (Cho et al. 2024)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc.lengthgen.data import (
    Vocab,
    collate,
    coupled_positions,
    encode,
    example_positions,
    model_length,
    random_positions,
    sample_batch,
)
from posenc.lengthgen.tasks import get_task
from tests.misuse import MISSING, Misuse, check


def test_decoder_layout() -> None:
    v = Vocab(16)
    tokens, targets, scored = encode("decoder", ([3, 4, 5], [5, 4, 3]), v)
    assert tokens == [v.bos, 3, 4, 5, v.sep, 5, 4, 3]
    assert targets == [3, 4, 5, v.sep, 5, 4, 3, v.eos]
    # the loss covers the answer and EOS: predictions made at SEP and after
    assert scored == [False, False, False, False, True, True, True, True]
    assert len(tokens) == model_length("decoder", 3, 3)


def test_encoder_layout_and_padding() -> None:
    v = Vocab(5)
    batch = collate("encoder", [([1, 2], [2, 1]), ([0, 4, 3], [0])], v)
    assert batch.tokens.tolist() == [[1, 2, v.blank, v.blank], [0, 4, 3, v.blank]]
    assert batch.targets.tolist() == [[v.pad, v.pad, 2, 1], [v.pad, v.pad, v.pad, 0]]
    assert batch.loss_mask.tolist() == [[False, False, True, True], [False, False, False, True]]
    assert batch.key_padding_mask is None  # both are 4 tokens long: nothing padded
    batch = collate("encoder", [([1], [2]), ([0, 4, 3], [0])], v)
    assert batch.key_padding_mask.tolist() == [[False, False, True, True], [False] * 4]
    assert batch.tokens[0, 2:].tolist() == [v.pad, v.pad]


def test_decoder_batch_is_right_padded_without_mask() -> None:
    v = Vocab(16)
    batch = collate("decoder", [([1], [1]), ([2, 3], [2, 3])], v, pad_to=9)
    assert batch.tokens.shape == (2, 9)
    assert batch.key_padding_mask is None
    assert batch.tokens[0].tolist() == [v.bos, 1, v.sep, 1] + [v.pad] * 5
    assert batch.loss_mask[0].tolist() == [False, False, True, True] + [False] * 5
    check(
        Misuse(
            "pad-to-short",
            lambda: collate("decoder", [([2, 3], [2, 3])], v, pad_to=3),
            ValueError,
            "pad_to",
            3,
        )
    )


def test_random_positions() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 5, 40, 64):
        pos = random_positions(n, 64, rng)
        assert pos.shape == (n,)
        assert len(set(pos.tolist())) == n
        assert np.all(np.diff(pos) > 0) and pos.min() >= 0 and pos.max() < 64
    assert random_positions(64, 64, rng).tolist() == list(range(64))
    check(
        Misuse(
            "too-few-positions",
            lambda: random_positions(65, 64, rng),
            ValueError,
            "max_positions",
            64,
        )
    )
    # they are resampled: two draws differ
    assert random_positions(10, 1000, rng).tolist() != random_positions(10, 1000, rng).tolist()


def test_batch_positions_follow_tokens() -> None:
    task = get_task("copy-v3")
    examples, positions = sample_batch(task, 6, 1, 8, np.random.default_rng(3), random_max=100)
    batch = collate("decoder", examples, Vocab(16), positions=positions)
    assert batch.positions is not None and batch.positions.shape == batch.tokens.shape
    for i, (x, y) in enumerate(examples):
        n = model_length("decoder", len(x), len(y))
        row = batch.positions[i]
        assert torch.equal(row[:n], torch.from_numpy(positions[i]))
        assert torch.all(row[n:] == row[n - 1])


@pytest.mark.parametrize("name", ["copy-v1", "copy-v2", "copy-v3", "reverse-v1"])
@pytest.mark.parametrize("length", [1, 2, 7, 40])
def test_coupled_positions_make_every_answer_step_the_same(name: str, length: int) -> None:
    """Position coupling (Cho et al. 2024): the token that predicts answer token j sits one
    step before that token's source, and the last answer token one step before BOS, so every
    prediction sees the same offsets whatever the length."""
    task = get_task(name)
    x, y = task.sample(length, np.random.default_rng(length))
    sources = task.answer_sources(length)  # type: ignore[attr-defined]
    assert len(sources) == len(y)
    if name != "copy-v2":  # copy-v2 maps each token to its partner; the others copy it
        assert [x[s] for s in sources] == y
    pos = coupled_positions(sources, length)
    assert pos.shape == (model_length("decoder", length, len(y)),) and pos.min() == 0
    bos, inputs, sep, answer = pos[0], pos[1 : length + 1], pos[length + 1], pos[length + 2 :]
    step = -1 if name.startswith("reverse") and length > 1 else 1  # one token: forwards
    assert list(inputs) == [inputs[0] + i for i in range(length)]
    predictors = [sep, *answer[:-1]]  # the token read when answer token j is predicted
    assert [int(inputs[s] - p) for s, p in zip(sources, predictors, strict=True)] == [step] * length
    assert bos - answer[-1] == step  # after the last answer token comes EOS
    assert list(answer) == [inputs[s] for s in sources]


def test_coupled_positions_are_refused_where_they_cannot_apply() -> None:
    rng = np.random.default_rng(0)
    sort = get_task("bucket-sort")
    example = sort.sample(3, rng)
    for case in [
        Misuse("encoder-task",
               lambda: example_positions(sort, example, rng, random_max=None, coupled=True),
               ValueError, "task", "bucket-sort"),
        Misuse("source-outside", lambda: coupled_positions([0, 3], 3), ValueError,
               "answer_sources", [0, 3]),
        Misuse("no-answer", lambda: coupled_positions([], 3), ValueError, "answer", MISSING),
    ]:  # fmt: skip
        check(case)


@pytest.mark.parametrize("name", ["copy-v1", "reverse-v1"])
def test_random_and_coupled_positions_combine(name: str) -> None:
    """``+random+coupled``: the coupled positions mapped through sorted random draws, so
    answer tokens keep their source's position and the order is kept, with varied gaps."""
    task = get_task(name)
    gaps = set()
    for seed in range(20):
        rng = np.random.default_rng(seed)
        x, y = task.sample(12, rng)
        got = example_positions(task, (x, y), rng, random_max=64, coupled=True)
        coupled = coupled_positions(task.answer_sources(12), 12)  # type: ignore[attr-defined]
        assert got is not None and got.shape == coupled.shape and got.max() < 64
        # the same ties and the same order as the coupled positions
        assert (
            np.sign(got[:, None] - got[None, :]) == np.sign(coupled[:, None] - coupled[None, :])
        ).all()
        gaps |= set(np.diff(np.unique(got)).tolist())
    assert len(gaps) > 5  # distances vary, as under randomized positions
