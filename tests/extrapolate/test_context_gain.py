"""posenc.extrapolate.context_gain: bits per byte on the same target blocks given c tokens of
context, equal to scoring each block by hand on [context; targets] (one window at a time,
float64 log-softmax) and dividing by the targets' bytes; c = 0 is the block scored alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from posenc.extrapolate.config import EvalSettings, ExtrapolateConfig
from posenc.extrapolate.context_gain import (
    block_len,
    block_starts,
    context_gain,
    context_lengths,
)
from posenc.extrapolate.measures import run_measures
from tests.extrapolate.toys import tiny_model, toy_corpus, window_scores

V = 12
L = 8  # training length: T = 4 targets per block, contexts 0, 2, 4, 8, 16, 32


@pytest.fixture
def toy() -> tuple:
    rng = np.random.default_rng(5)
    valid = rng.integers(0, V, size=300).astype(np.uint16)
    token_bytes = rng.integers(1, 5, size=V)  # tokens of 1 to 4 bytes
    return toy_corpus(valid, token_bytes), token_bytes


def by_hand(model, valid, token_bytes, c, starts, block) -> float:
    """Each block's window ``valid[s - c : s + T + 1]`` scored alone; its last T targets."""
    loss, nbytes = 0.0, 0
    for s in starts:
        window = np.asarray(valid[s - c : s + block + 1], dtype=np.int64)
        loss += window_scores(model, window)[0][-block:].sum()
        nbytes += int(token_bytes[window[-block:]].sum())
    return loss / math.log(2) / nbytes


def test_context_gain_equals_scoring_each_block_by_hand(toy: tuple) -> None:
    corpus, token_bytes = toy
    model = tiny_model(V)
    got = context_gain(model, corpus, train_len=L, longest=32, blocks=10, batch_tokens=50)
    assert list(got) == ["0", "2", "4", "8", "16", "32"]
    block = 4
    span = (len(corpus.valid) - block - 1) - 32 + 1  # the starts that leave room for c = 32
    starts = [32 + k * span // 10 for k in range(10)]
    for c in (0, 2, 4, 8, 16, 32):
        want = by_hand(model, corpus.valid, token_bytes, c, starts, block)
        assert got[str(c)] == pytest.approx(want, rel=1e-6), c
    # c = 0: the targets scored alone, as windows of T (inputs valid[s : s + T]).
    alone = sum(window_scores(model, corpus.valid[s : s + block + 1])[0].sum() for s in starts)
    targets = np.concatenate([corpus.valid[s + 1 : s + block + 1] for s in starts])
    assert got["0"] == pytest.approx(alone / math.log(2) / token_bytes[targets].sum(), rel=1e-6)
    assert len(set(got.values())) == len(got)  # context changes this model's predictions


def test_a_model_that_ignores_context_gains_nothing(toy: tuple) -> None:
    corpus, _ = toy
    model = tiny_model(V, "none")
    with torch.no_grad():
        for layer in model.encoder.layers:
            layer.attn.out.weight.zero_()  # no information from other positions
            layer.attn.out.bias.zero_()
    got = context_gain(model, corpus, train_len=L, longest=32, blocks=16)
    assert max(got.values()) == pytest.approx(min(got.values()), rel=1e-6)


def test_a_zero_shot_scaling_is_applied_at_each_window_length(toy: tuple) -> None:
    corpus, token_bytes = toy
    model = tiny_model(V)
    yarn = {"rope_type": "yarn", "original_max_position_embeddings": L}
    got = context_gain(model, corpus, train_len=L, longest=32, blocks=6, scaling=yarn)
    span = (len(corpus.valid) - 5) - 32 + 1
    starts = [32 + k * span // 6 for k in range(6)]
    for c in (2, 16):  # windows of 6 (factor 1: the model as it is) and 20 (factor 2.5)
        factor = max(1.0, (c + 4) / L)
        scaled = model.with_rope_scaling({**yarn, "factor": factor})
        want = by_hand(scaled, corpus.valid, token_bytes, c, starts, 4)
        assert got[str(c)] == pytest.approx(want, rel=1e-6)
    plain = context_gain(model, corpus, train_len=L, longest=32, blocks=6)
    assert got["2"] == pytest.approx(plain["2"], rel=1e-9)
    assert got["16"] != pytest.approx(plain["16"], rel=1e-4)


def test_contexts_blocks_and_what_is_left_out(toy: tuple) -> None:
    assert context_lengths(64, 1024) == [0, 16, 32, 64, 128, 256, 512, 1024]
    assert context_lengths(256, 4096) == [0, 16, 64, 128, 256, 512, 1024, 2048, 4096]
    assert context_lengths(8, 32) == [0, 2, 4, 8, 16, 32]
    assert context_lengths(64, 64) == [0, 16, 32, 64]
    assert context_lengths(3, 10) == [0, 1, 3, 6]  # L/4 = 0 joins c = 0; 16 > the longest
    assert [block_len(n) for n in (1, 2, 8, 64, 65, 4096)] == [1, 1, 4, 32, 32, 32]
    starts = block_starts(1000, 100, 32, 50)
    assert len(set(starts.tolist())) == 50 and starts[0] == 100 and starts[-1] <= 1000 - 33
    np.testing.assert_array_equal(block_starts(40, 30, 4, 9), [30, 31, 32, 33, 34, 35])
    assert block_starts(30, 30, 4, 9).size == 0
    corpus, _ = toy
    model = tiny_model(V, "learned", pe_kwargs={"max_len": 12})
    got = context_gain(model, corpus, train_len=L, longest=32, blocks=4, max_window=12)
    assert list(got) == ["0", "2", "4", "8"]  # 16 + 4 > 12
    # a shorter window drops contexts, not targets: the same blocks as every other run's
    rope = tiny_model(V)
    capped = context_gain(rope, corpus, train_len=L, longest=32, blocks=4, max_window=12)
    full = context_gain(rope, corpus, train_len=L, longest=32, blocks=4)
    assert capped == {c: full[c] for c in capped}
    short = toy_corpus(corpus.valid[:30], corpus.token_bytes)
    assert list(context_gain(tiny_model(V), short, train_len=L, longest=32, blocks=4)) == [
        "0",
        "2",
        "4",
        "8",
        "16",
    ]  # fmt: skip  (32 + 4 + 1 > 30 tokens)


def test_run_measures_gives_by_context_and_retrieval_when_asked(toy: tuple) -> None:
    corpus, _ = toy
    config = ExtrapolateConfig(pe="rope", train_len=L, needle_len=4)
    model = tiny_model(V)
    settings = EvalSettings(eval_lens=[8, 16], context_blocks=5)
    got = run_measures(corpus, config, settings, [8, 16])(model)
    assert set(got) == {"by_context"} and list(got["by_context"]) == ["0", "2", "4", "8", "16"]
    assert got["by_context"] == context_gain(model, corpus, train_len=L, longest=16, blocks=5)
    settings = EvalSettings(eval_lens=[8, 16], context_blocks=0, retrieval=True, retrieval_trials=2)
    got = run_measures(corpus, config, settings, [8, 16])(model)
    assert set(got) == {"retrieval"} and len(got["retrieval"]) == 2 * 5
