"""Scoring (``posenc.lengthgen.evaluate``): exact and per-token accuracy by greedy decoding and
in one pass, against oracle models; the positions the model is given; the aggregate over
seeds, its tables and plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from torch import Tensor, nn

from posenc.lengthgen.config import TrainConfig
from posenc.lengthgen.data import (
    Vocab,
    coupled_positions,
)
from posenc.lengthgen.evaluate import (
    aggregate,
    evaluate_length,
    evaluate_lengths,
    markdown_report,
    markdown_table,
    wide_table,
)
from posenc.lengthgen.plots import plot_accuracy_vs_length
from posenc.lengthgen.tasks import get_task
from posenc.lengthgen.train import build_model, train
from tests.lengthgen.tiny import TINY


class OracleDecoder(nn.Module):
    """Answers copy tasks perfectly from the tokens it sees, except that it can be told to
    get the last answer token wrong; returns one-hot logits."""

    def __init__(self, vocab: Vocab, *, reverse: bool = False, spoil_last: bool = False) -> None:
        super().__init__()
        self.vocab, self.reverse, self.spoil_last = vocab, reverse, spoil_last
        self.seen_positions: list[Tensor | None] = []

    def forward(self, tokens: Tensor, *, positions: Tensor | None = None, **_: Any) -> Tensor:
        self.seen_positions.append(positions)
        v = self.vocab
        logits = torch.zeros(*tokens.shape, v.size)
        for b, row in enumerate(tokens.tolist()):
            sep = row.index(v.sep)
            inp = row[1:sep]
            answer = (inp[::-1] if self.reverse else inp) + [v.eos]
            if self.spoil_last:
                answer[len(inp) - 1] = (answer[len(inp) - 1] + 1) % v.task_size
            for j in range(sep, len(row)):
                logits[b, j, answer[min(j - sep, len(answer) - 1)]] = 1.0
        return logits


@pytest.mark.parametrize("greedy", [True, False])
def test_exact_and_token_accuracy_of_decoding(greedy: bool) -> None:
    task = get_task("reverse-v1")
    vocab = Vocab(task.vocab_size)
    perfect = OracleDecoder(vocab, reverse=True)
    result = evaluate_length(perfect, task, 6, 10, np.random.default_rng(0), greedy=greedy)
    assert result == {"length": 6, "exact": 1.0, "token": 1.0, "n": 10}
    # wrong on one of the 6 answer tokens + EOS = 7 scored tokens
    spoiled = OracleDecoder(vocab, reverse=True, spoil_last=True)
    result = evaluate_length(spoiled, task, 6, 10, np.random.default_rng(0), greedy=greedy)
    assert result["exact"] == 0.0
    assert result["token"] == pytest.approx(6 / 7, abs=1e-12)
    # greedy decoding runs one forward per new token (6 + EOS); scoring is one forward
    assert len(spoiled.seen_positions) == (7 if greedy else 1)


def test_randomized_positions_reach_the_model_in_evaluation() -> None:
    task = get_task("copy-v3")
    greedy, one_pass = OracleDecoder(Vocab(16)), OracleDecoder(Vocab(16))
    evaluate_length(greedy, task, 5, 3, np.random.default_rng(0), random_max=50, greedy=True)
    evaluate_length(one_pass, task, 5, 3, np.random.default_rng(0), random_max=50)
    last = greedy.seen_positions[-1]
    assert last is not None and last.shape == (3, 12)  # BOS + 5 + SEP + 5 answer tokens
    assert torch.all(last[:, 1:] > last[:, :-1]) and int(last.max()) < 50
    # a prefix of the same sorted draw at every step, and the same draw in one-pass scoring
    assert torch.equal(greedy.seen_positions[0], last[:, :7])
    assert torch.equal(one_pass.seen_positions[0], last)


def test_coupled_positions_reach_the_model_in_evaluation() -> None:
    task = get_task("reverse-v1")
    greedy, one_pass = (
        OracleDecoder(Vocab(16), reverse=True),
        OracleDecoder(Vocab(16), reverse=True),
    )
    a = evaluate_length(greedy, task, 5, 3, np.random.default_rng(0), coupled=True, greedy=True)
    b = evaluate_length(one_pass, task, 5, 3, np.random.default_rng(0), coupled=True)
    assert a == b == {"length": 5, "exact": 1.0, "token": 1.0, "n": 3}
    want = torch.from_numpy(coupled_positions([4, 3, 2, 1, 0], 5)).expand(3, -1)
    assert torch.equal(one_pass.seen_positions[0], want)
    assert torch.equal(greedy.seen_positions[-1], want)
    assert torch.equal(greedy.seen_positions[0], want[:, :7])


@pytest.mark.slow
def test_greedy_decoding_and_one_pass_scoring_agree_on_exact_match(tmp_path: Path) -> None:
    """Greedy decoding reproduces the answer exactly when every teacher-forced argmax is
    right: the two scorings must give the same exact match on a real (half-trained) model."""
    cfg = TrainConfig(
        **{**TINY, "dim": 32, "batch_size": 16, "steps": 80, "lr": 3e-3},
        task="reverse-v1",
        pe="sinusoidal",
    )
    cfg.train_max_length, cfg.test_min_length, cfg.test_max_length = 3, 4, 5
    train(cfg, tmp_path, threads=1)
    task = get_task("reverse-v1")
    model = build_model(cfg, task)
    model.load_state_dict(torch.load(tmp_path / "checkpoint.pt", weights_only=True)["model"])
    greedy = evaluate_lengths(model, task, range(1, 6), 60, seed=0, greedy=True)
    one_pass = evaluate_lengths(model, task, range(1, 6), 60, seed=0)
    assert [r["exact"] for r in greedy] == [r["exact"] for r in one_pass]
    assert any(r["exact"] > 0 for r in greedy)  # not trivially all wrong
    assert any(r["exact"] < 1 for r in greedy)  # nor all right


class OracleEncoder(nn.Module):
    """Reverse String at the blanks; one-hot logits."""

    def __init__(self, vocab: Vocab) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(
        self, tokens: Tensor, *, key_padding_mask: Tensor | None = None, **_: Any
    ) -> Tensor:
        v = self.vocab
        logits = torch.zeros(*tokens.shape, v.size)
        for b, row in enumerate(tokens.tolist()):
            inp = [t for t in row if t < v.task_size]
            for j, t in enumerate(inp[::-1]):
                logits[b, len(inp) + j, t] = 1.0
        return logits


def test_encoder_scoring() -> None:
    task = get_task("reverse-string")
    result = evaluate_length(OracleEncoder(Vocab(2)), task, 9, 12, np.random.default_rng(0))
    assert result == {"length": 9, "exact": 1.0, "token": 1.0, "n": 12}


def _record(task: str, label: str, seed: int, exact: float, valid: bool) -> dict[str, Any]:
    return {
        "task": task,
        "label": label,
        "seed": seed,
        "valid": valid,
        "in_distribution": {"exact": 1.0 if valid else 0.5, "token": 1.0},
        "test": {"exact": exact, "token": exact},
        "lengths": [
            {"length": 3, "exact": 1.0, "token": 1.0, "split": "train", "n": 4},
            {"length": 4, "exact": exact, "token": exact, "split": "test", "n": 4},
        ],
        "config": {"train_max_length": 3},
    }


def test_aggregate_excludes_invalid_runs() -> None:
    records = [
        _record("copy-v1", "none", 0, 0.9, True),
        _record("copy-v1", "none", 1, 0.7, True),
        _record("copy-v1", "none", 2, 0.0, False),
        _record("copy-v1", "rope", 0, 0.1, False),
    ]
    none, rope = aggregate(records)
    assert (none["runs"], none["valid"]) == (3, 2)
    assert none["test_exact_mean"] == pytest.approx(0.8)
    assert none["test_exact_std"] == pytest.approx(np.std([0.9, 0.7], ddof=1))
    assert none["lengths"][1] == pytest.approx(
        {
            "length": 4,
            "split": "test",
            "exact": 0.8,
            "exact_min": 0.7,
            "exact_max": 0.9,
            "token": 0.8,
        }
    )
    assert (rope["valid"], rope["test_exact_mean"], rope["test_exact_std"]) == (0, None, None)
    table = markdown_table([none, rope])
    assert "| copy-v1 | none | 2/3 | 83.3 | 80.0 ± 14.1 | 80.0 ± 14.1 |" in table
    assert "| copy-v1 | rope | 0/1 | 50.0 | – | – |" in table
    assert "| copy-v1 | 80.0 (2/3 valid) | – (0/1 valid) |" in wide_table([none, rope])
    assert "Length generalization" in markdown_report(records)
    fig = plot_accuracy_vs_length(records)
    assert isinstance(fig, Figure)
    assert "none (2/3 valid)" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
