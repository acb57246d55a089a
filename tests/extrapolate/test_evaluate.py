"""posenc.extrapolate.evaluate: bits per byte, by position, sliding windows and zero-shot RoPE
scaling, each equal to a computation by hand (one window at a time, float64 log-softmax)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from posenc import TransformerModel
from posenc.extrapolate.corpus import Corpus
from posenc.extrapolate.evaluate import (
    evaluate_length,
    evaluate_model,
    position_buckets,
    rope_scalable,
    scaled_variants,
    scaling_at,
    sliding_losses,
    tail_scores,
    token_losses,
)
from tests.extrapolate.toys import toy_corpus

V = 12


def tiny_model(pe: str = "rope", **kwargs: Any) -> TransformerModel:
    torch.manual_seed(0)
    model = TransformerModel(V, 16, 2, 2, pe=pe, causal=True, **kwargs)
    with torch.no_grad():  # a less uniform model than at initialisation
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    model.trained_length = 8
    return model


def losses_by_hand(model: torch.nn.Module, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """``-log p(target)`` of each target of ONE window, in float64."""
    with torch.no_grad():
        logits = model.eval()(torch.as_tensor(inputs[None], dtype=torch.long))[0].double()
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return -logp[torch.arange(len(targets)), torch.as_tensor(targets)].numpy()


@pytest.fixture
def toy() -> tuple[Corpus, np.ndarray]:
    rng = np.random.default_rng(3)
    valid = rng.integers(0, V, size=200).astype(np.uint16)
    token_bytes = rng.integers(1, 5, size=V)  # tokens of 1 to 4 bytes
    return toy_corpus(valid, token_bytes), token_bytes


@pytest.mark.parametrize("length", [8, 16, 32])
def test_bits_per_byte_and_buckets_equal_a_computation_by_hand(
    toy: tuple[Corpus, np.ndarray], length: int
) -> None:
    corpus, token_bytes = toy
    model = tiny_model()
    num_tokens = 96
    row = evaluate_length(model, corpus, length, num_tokens, train_len=8, batch_tokens=40)
    losses, nbytes = [], []
    for start in range(0, num_tokens, length):  # non-overlapping windows, one at a time
        tokens = np.asarray(corpus.valid[start : start + length + 1], dtype=np.int64)
        losses.append(losses_by_hand(model, tokens[:-1], tokens[1:]))
        nbytes.append(token_bytes[tokens[1:]])
    loss, nb = np.stack(losses), np.stack(nbytes)  # (w, n)
    assert row["length"] == length
    assert row["bpb"] == pytest.approx(loss.sum() / math.log(2) / nb.sum(), rel=1e-6)
    edges = {8: [(0, 8)], 16: [(0, 8), (8, 16)], 32: [(0, 8), (8, 16), (16, 32)]}[length]
    assert list(row["by_position"]) == [f"{a}-{b}" for a, b in edges]
    for (a, b), value in zip(edges, row["by_position"].values(), strict=True):
        want = loss[:, a:b].sum() / math.log(2) / nb[:, a:b].sum()
        assert value == pytest.approx(want, rel=1e-6)
    # The buckets split the same loss and bytes as the whole.
    total_bytes = nb.sum()
    weights = [nb[:, a:b].sum() / total_bytes for a, b in edges]
    assert sum(w * v for w, v in zip(weights, row["by_position"].values(), strict=True)) == (
        pytest.approx(row["bpb"], rel=1e-9)
    )


def test_every_length_scores_the_same_targets(toy: tuple[Corpus, np.ndarray]) -> None:
    """With a model that ignores its context (NoPE, one layer, zero attention output), every
    length gives the same bits per byte: the lengths differ only in context."""
    corpus, _ = toy
    model = tiny_model("none")
    with torch.no_grad():
        for layer in model.encoder.layers:
            layer.attn.out.weight.zero_()  # no information from other positions
            layer.attn.out.bias.zero_()
    rows = evaluate_model(model, corpus, [8, 16, 32], 96, train_len=8)
    assert [r["factor"] for r in rows] == [None, None, None]
    assert rows[0]["bpb"] == pytest.approx(rows[1]["bpb"], rel=1e-6)
    assert rows[0]["bpb"] == pytest.approx(rows[2]["bpb"], rel=1e-6)


def test_sliding_windows_score_each_target_once_with_their_context(
    toy: tuple[Corpus, np.ndarray],
) -> None:
    corpus, token_bytes = toy
    model = tiny_model()
    length, stride, num_tokens = 16, 4, 64
    got = sliding_losses(
        model, corpus.valid, length, num_tokens, stride, batch_tokens=50, vocab_size=V
    )
    tokens = np.asarray(corpus.valid, dtype=np.int64)
    want = list(losses_by_hand(model, tokens[:length], tokens[1 : length + 1]))
    for end in range(length + stride, num_tokens + 1, stride):  # targets end-stride+1 .. end
        window = tokens[end - length : end + 1]
        want.extend(losses_by_hand(model, window[:-1], window[1:])[-stride:])
    np.testing.assert_allclose(got, np.array(want), rtol=1e-5, atol=1e-6)
    row = evaluate_length(model, corpus, length, num_tokens, train_len=8, sliding=stride)
    targets = tokens[1 : num_tokens + 1]
    assert row["sliding_bpb"] == pytest.approx(
        np.sum(want) / math.log(2) / token_bytes[targets].sum(), rel=1e-5
    )
    with pytest.raises(ValueError, match="stride"):
        sliding_losses(model, corpus.valid, 16, 64, 5, batch_tokens=50, vocab_size=V)


def test_zero_shot_scaling_uses_the_factor_each_length_needs(
    toy: tuple[Corpus, np.ndarray],
) -> None:
    corpus, _ = toy
    model = tiny_model()
    assert rope_scalable(model) and not rope_scalable(tiny_model("alibi"))
    linear, dynamic, yarn = scaled_variants(["linear", "dynamic", "yarn"], 8)
    rows = evaluate_model(model, corpus, [8, 32], 64, train_len=8, scaling=yarn)
    assert [r["factor"] for r in rows] == [1.0, 4.0]
    by_hand = model.with_rope_scaling(
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    )
    want = evaluate_length(by_hand, corpus, 32, 64, train_len=8)
    assert rows[1]["bpb"] == want["bpb"] and rows[1]["by_position"] == want["by_position"]
    # factor 1 (length L) is the model as trained, for every scaling
    plain = evaluate_length(model, corpus, 8, 64, train_len=8)["bpb"]
    for scaling in (linear, dynamic, yarn):
        at_l = evaluate_model(model, corpus, [8], 64, train_len=8, scaling=scaling)[0]["bpb"]
        assert at_l == pytest.approx(plain, rel=1e-6)
    assert scaling_at(dynamic, 32, 8) == (dynamic, 4.0)
    assert scaling_at(linear, 32, 8) == ({"rope_type": "linear", "factor": 4.0}, 4.0)
    # A fine-tuned model is evaluated as it is, with its factor recorded.
    tuned = evaluate_model(model, corpus, [8], 64, train_len=8, factor=4.0)
    assert tuned[0]["factor"] == 4.0 and tuned[0]["bpb"] == pytest.approx(plain, rel=1e-9)


def test_position_buckets() -> None:
    assert position_buckets(64, 64) == [(0, 64)]
    assert position_buckets(1024, 64)[-2:] == [(256, 512), (512, 1024)]
    assert position_buckets(32, 64) == [(0, 32)]


def test_tail_scores_are_the_last_targets_of_each_window(toy: tuple[Corpus, np.ndarray]) -> None:
    corpus, _ = toy
    model = tiny_model()
    windows = np.asarray(corpus.eval_windows(16, 96), dtype=np.int64)  # (6, 17)
    losses, hits = tail_scores(model, windows, 5, batch_tokens=40, vocab_size=V)
    assert losses.shape == hits.shape == (6, 5) and hits.dtype == bool
    for row, window in enumerate(windows):
        want = losses_by_hand(model, window[:-1], window[1:])
        np.testing.assert_allclose(losses[row], want[-5:], rtol=1e-5, atol=1e-6)
        with torch.no_grad():
            top = model(torch.as_tensor(window[None, :-1]))[0].argmax(-1).numpy()
        np.testing.assert_array_equal(hits[row], top[-5:] == window[-5:])
    assert 0 < hits.sum() < hits.size  # some right, some wrong: the comparison is exercised
    full = token_losses(model, windows, batch_tokens=40, vocab_size=V)
    np.testing.assert_array_equal(full[:, -5:], losses)
    with pytest.raises(ValueError, match="tail"):
        tail_scores(model, windows, 17, batch_tokens=40, vocab_size=V)
