"""posenc lengthgen: tasks, batching, metrics, training, CLI (fast, in-process tests).

The tests that start subprocesses (SIGKILL and resume, torchrun, --jobs) are in
test_lengthgen_processes.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from torch import Tensor, nn

import posenc
from posenc.lengthgen import cli as lg_cli
from posenc.lengthgen.data import (
    Vocab,
    checked_sample,
    collate,
    coupled_positions,
    encode,
    example_positions,
    model_length,
    random_positions,
    sample_batch,
)
from posenc.lengthgen.evaluate import (
    aggregate,
    evaluate_length,
    evaluate_lengths,
    markdown_report,
    markdown_table,
    read_jsonl,
    wide_table,
)
from posenc.lengthgen.plots import plot_accuracy_vs_length
from posenc.lengthgen.tasks import available_tasks, get_task, load_task_from_file
from posenc.lengthgen.train import TrainConfig, build_model, lr_factor, train

SHIPPED = [
    "bucket-sort",
    "copy-v1",
    "copy-v2",
    "copy-v3",
    "even-pairs",
    "missing-duplicate",
    "reverse-string",
    "reverse-v1",
]

# A tiny configuration: a few seconds per run on a shared 2-core CPU.
TINY: dict[str, Any] = dict(
    dim=16,
    depth=1,
    heads=2,
    batch_size=8,
    steps=6,
    train_min_length=1,
    train_max_length=5,
    test_min_length=6,
    test_max_length=7,
    test_samples=4,
    eval_samples=2,
    eval_every=0,
    checkpoint_every=0,
)


def run_cli(argv: list[str]) -> int:
    """Parse as `posenc lengthgen ...` would and run."""
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    lg_cli.add_subcommand(sub)
    args = parser.parse_args(["lengthgen", *argv])
    return args.func(args)


TINY_CLI = [
    "--dim",
    "16",
    "--depth",
    "1",
    "--heads",
    "2",
    "--batch-size",
    "8",
    "--steps",
    "6",
    "--train-lengths",
    "1-5",
    "--test-lengths",
    "6-7",
    "--test-samples",
    "4",
    "--eval-every",
    "0",
    "--threads",
    "1",
    "--no-progress",
]


# --------------------------------------------------------------------------- tasks


def test_registry_lists_the_eight_tasks() -> None:
    assert set(SHIPPED) <= set(available_tasks())
    kinds = {name: get_task(name).kind for name in SHIPPED}
    assert {n for n, k in kinds.items() if k == "decoder"} == {
        "copy-v1",
        "copy-v2",
        "copy-v3",
        "reverse-v1",
    }


def _missing_duplicate_oracle(inp: list[int]) -> int:
    """Independent solution: the hole's twin in the other half holds the answer."""
    body = inp[: len(inp) - len(inp) % 2]
    half = len(body) // 2
    hole = body.index(2)
    return body[hole + half] if hole < half else body[hole - half]


def _oracle(name: str, inp: list[int]) -> list[int]:
    """Independent transcription of each task's definition."""
    if name in ("copy-v1", "copy-v3"):
        return list(inp)
    if name == "copy-v2":
        return [t + 8 for t in inp]  # vocabulary 16 = two halves of 8
    if name in ("reverse-v1", "reverse-string"):
        return list(reversed(inp))
    if name == "bucket-sort":
        return sorted(inp)
    if name == "even-pairs":
        # The number of 01/10 boundaries is odd exactly when the ends differ.
        return [int(inp[0] != inp[-1])]
    if name == "missing-duplicate":
        return [1] if len(inp) == 1 else [_missing_duplicate_oracle(inp)]
    raise AssertionError(name)


@pytest.mark.parametrize("name", SHIPPED)
def test_generator_lengths_tokens_and_answers(name: str) -> None:
    task = get_task(name)
    rng = np.random.default_rng(123)
    for length in [*range(1, 25), 40, 57]:
        for _ in range(5):
            inp, ans = checked_sample(task, length, rng)
            assert len(inp) == length
            assert all(0 <= t < task.vocab_size for t in inp + ans)
            assert ans == _oracle(name, inp), (name, inp, ans)


@pytest.mark.parametrize(
    ("name", "length", "expected_answer_length"),
    [
        ("copy-v1", 7, 7),
        ("copy-v2", 7, 7),
        ("copy-v3", 7, 7),
        ("reverse-v1", 7, 7),
        ("bucket-sort", 7, 7),
        ("reverse-string", 7, 7),
        ("missing-duplicate", 7, 1),
        ("even-pairs", 7, 1),
    ],
)
def test_answer_lengths(name: str, length: int, expected_answer_length: int) -> None:
    _, ans = checked_sample(get_task(name), length, np.random.default_rng(0))
    assert len(ans) == expected_answer_length


def test_known_examples() -> None:
    # The reference implementation's documented examples (Delétang et al. 2023).
    assert _missing_duplicate_oracle([0, 1, 1, 0, 0, 2, 1, 0]) == 1
    assert _missing_duplicate_oracle([1, 0, 1, 1, 2, 1, 3]) == 0
    assert _oracle("even-pairs", [0, 0, 1, 1, 1, 0]) == [0]  # one 01 and one 10
    assert _oracle("even-pairs", [0, 1, 0, 1, 0, 0, 1]) == [1]  # 2 10s and 3 01s
    # Copy V1 is one symbol repeated; Copy V2 maps each token to its partner.
    inp, ans = get_task("copy-v1").sample(6, np.random.default_rng(4))
    assert len(set(inp)) == 1 and ans == inp
    inp, ans = get_task("copy-v2").sample(6, np.random.default_rng(4))
    assert all(t < 8 for t in inp) and ans == [t + 8 for t in inp]
    # Missing Duplicate: w w with one hole, an odd length ends on the filler 3.
    for length in (6, 9):
        inp, ans = get_task("missing-duplicate").sample(length, np.random.default_rng(5))
        assert inp.count(2) == 1
        assert (inp[-1] == 3) == (length % 2 == 1)
        body = [ans[0] if t == 2 else t for t in inp[: length - length % 2]]
        assert body[: length // 2] == body[length // 2 :]


def test_same_rng_same_examples() -> None:
    for name in SHIPPED:
        task = get_task(name)
        a = [task.sample(9, np.random.default_rng(7)) for _ in range(2)]
        assert a[0] == a[1]


USER_TASK = '''
import numpy as np

class Parity:
    """Decoder task: the parity of the number of ones."""
    name = "my-parity"
    vocab_size = 2
    kind = "decoder"

    def sample(self, length, rng):
        bits = [int(b) for b in rng.integers(0, 2, size=length)]
        return bits, [sum(bits) % 2]

class NoKind:
    name = "broken"
    vocab_size = 2

    def sample(self, length, rng):
        return [0] * length, [0]

class BadTokens:
    name = "bad-tokens"
    vocab_size = 2
    kind = "encoder"

    def sample(self, length, rng):
        return [5] * length, [0]
'''


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_tasks.py"
    path.write_text(USER_TASK)
    return path


def test_task_from_user_file(user_file: Path, tmp_path: Path) -> None:
    task = get_task(f"{user_file}:Parity")
    assert task.name == "my-parity" and task.kind == "decoder"
    inp, ans = task.sample(5, np.random.default_rng(0))
    assert ans == [sum(inp) % 2]
    out = tmp_path / "out"
    code = run_cli(["--task", f"{user_file}:Parity", "--pe", "none", "--out", str(out), *TINY_CLI])
    assert code == 0
    (record,) = read_jsonl(out / "results.jsonl")
    assert record["task"] == "my-parity"
    assert [r["length"] for r in record["lengths"]] == [1, 2, 3, 4, 5, 6, 7]
    assert (out / "my-parity" / "none" / "seed0" / "checkpoint.pt").exists()


def test_user_file_errors(user_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        get_task(str(tmp_path / "nope.py") + ":Parity")
    with pytest.raises(ValueError, match="defines no 'Missing'"):
        load_task_from_file(f"{user_file}:Missing")
    with pytest.raises(TypeError, match="lacks kind"):
        get_task(f"{user_file}:NoKind")
    with pytest.raises(ValueError, match=r"unknown task 'nope'.*copy-v1"):
        get_task("nope")
    bad = get_task(f"{user_file}:BadTokens")
    with pytest.raises(ValueError, match=r"input token 5 is outside \[0, vocab_size=2\)"):
        checked_sample(bad, 3, np.random.default_rng(0))


# --------------------------------------------------------------------------- data


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
    with pytest.raises(ValueError, match="pad_to=3"):
        collate("decoder", [([2, 3], [2, 3])], v, pad_to=3)


def test_random_positions() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 5, 40, 64):
        pos = random_positions(n, 64, rng)
        assert pos.shape == (n,)
        assert len(set(pos.tolist())) == n
        assert np.all(np.diff(pos) > 0) and pos.min() >= 0 and pos.max() < 64
    assert random_positions(64, 64, rng).tolist() == list(range(64))
    with pytest.raises(ValueError, match="needs max_positions >= 65"):
        random_positions(65, 64, rng)
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


# --------------------------------------------------------------------------- metrics


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
    with pytest.raises(ValueError, match="need a decoder task with answer_sources"):
        example_positions(sort, sort.sample(3, rng), rng, random_max=None, coupled=True)
    with pytest.raises(ValueError, match=r"answer_sources must index the input \(0..2\)"):
        coupled_positions([0, 3], 3)
    with pytest.raises(ValueError, match="at least one token"):
        coupled_positions([], 3)


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


# --------------------------------------------------------------------------- training


def test_lr_schedule() -> None:
    cfg = TrainConfig(steps=100, warmup=0.1)
    factors = [lr_factor(cfg, s) for s in range(100)]
    assert factors[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert factors[10] == pytest.approx(1.0)
    assert factors[55] == pytest.approx(0.5, abs=1e-12)  # cosine half-way
    assert all(a >= b for a, b in itertools.pairwise(factors[10:]))
    assert lr_factor(TrainConfig(steps=100, warmup=0.0, decay="linear"), 50) == 0.5
    assert lr_factor(TrainConfig(steps=100, warmup=0.0, decay="constant"), 99) == 1.0


@pytest.mark.slow
def test_loss_falls_on_a_toy_task() -> None:
    cfg = TrainConfig(
        **{**TINY, "steps": 60, "dim": 32, "batch_size": 16, "lr": 3e-3},
        task="copy-v1",
        pe="none",
    )
    record = train(cfg, threads=1)
    losses = record["losses"]
    assert len(losses) == 60
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5]), losses


@pytest.mark.slow
def test_same_seed_same_result_different_seed_different() -> None:
    def run(seed: int) -> tuple[dict[str, Any], list[float]]:
        rec = train(TrainConfig(**TINY, task="bucket-sort", pe="sinusoidal", seed=seed), threads=1)
        return rec["lengths"], rec["losses"]

    assert run(0) == run(0)
    assert run(0)[1] != run(1)[1]


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = TrainConfig(**{**TINY, "checkpoint_every": 2, "steps": 7}, task="copy-v3", pe="learned")
    full = train(cfg, tmp_path / "full", threads=1)

    import posenc.lengthgen.train as train_module

    real_step, calls = train_module._step, []

    def dying_step(*args: Any, **kwargs: Any) -> tuple[float, float]:
        calls.append(1)
        if len(calls) == 6:  # after the step-4 checkpoint and one more step
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)

    monkeypatch.setattr(train_module, "_step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "cut", threads=1)
    monkeypatch.setattr(train_module, "_step", real_step)
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 4 and saved["record"] is None
    resumed = train(cfg, tmp_path / "cut", resume=True, threads=1)
    assert resumed["losses"] == full["losses"]
    assert resumed["lengths"] == full["lengths"]
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    # A finished run resumed returns its record without training.
    assert train(cfg, tmp_path / "cut", resume=True, threads=1)["losses"] == full["losses"]
    with pytest.raises(ValueError, match="pass resume=True"):
        train(cfg, tmp_path / "cut", threads=1)
    changed = TrainConfig(
        **{**TINY, "checkpoint_every": 2, "steps": 7, "lr": 5e-4}, task="copy-v3", pe="learned"
    )
    with pytest.raises(ValueError, match=r"configuration changed \(lr: 0.001 -> 0.0005\)"):
        train(changed, tmp_path / "cut", resume=True, threads=1)


@pytest.mark.slow
def test_every_registered_sequence_encoding_trains() -> None:
    """The harness goes through the registry only: whatever is registered must train."""
    names = [
        n
        for n in posenc.available()
        if getattr(posenc.entry(n).cls, "axes", 1) == 1 and not n.endswith(("2d", "3d"))
    ]
    assert {"none", "sinusoidal", "learned"} <= set(names)
    for name in names:
        cfg = TrainConfig(**{**TINY, "steps": 2}, task="copy-v3", pe=name)
        record = train(cfg, threads=1)
        assert len(record["losses"]) == 2 and np.isfinite(record["losses"]).all(), name
    for name in {"rope", "alibi", "sinusoidal"} & set(names):
        cfg = TrainConfig(
            **{**TINY, "steps": 2},
            task="bucket-sort",
            pe=name,
            random_positions=True,
            random_max=40,
        )
        assert len(train(cfg, threads=1)["losses"]) == 2


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"task": "bucket-sort", "pe": "rope"}, r"coupled positions need a decoder task with "
         r"answer_sources\(\); task 'bucket-sort' \(encoder\) has none"),
        ({"task": "copy-v1", "pe": "rope", "random_positions": True, "random_max": 3},
         r"random_max=3\) at least as large as the longest sequence"),
    ],
)  # fmt: skip
def test_coupled_positions_are_refused_before_any_work(values: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TrainConfig(**{**TINY, **values}, coupled_positions=True).validate()


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


def test_coupled_positions_train_and_are_recorded(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert (
        run_cli(["--task", "reverse-v1", "--pe", "rope+coupled", "--out", str(out), *TINY_CLI]) == 0
    )
    (record,) = read_jsonl(out / "results.jsonl")
    assert record["label"] == "rope+coupled" and record["coupled_positions"] is True
    assert record["random_positions"] is False and np.isfinite(record["losses"]).all()


# --------------------------------------------------------------------------- CLI


def test_cli_sweep_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = run_cli(
        [
            "--task",
            "copy-v1,even-pairs",
            "--pe",
            "none,sinusoidal+random",
            "--seeds",
            "2",
            "--random-max",
            "32",
            "--out",
            str(out),
            *TINY_CLI,
        ]
    )
    assert code == 0
    records = read_jsonl(out / "results.jsonl")
    assert [(r["task"], r["label"], r["seed"]) for r in records] == [
        (t, p, s)
        for t in ("copy-v1", "even-pairs")
        for p in ("none", "sinusoidal+random")
        for s in (0, 1)
    ]
    rec = records[-1]
    assert rec["random_positions"] is True and rec["config"]["random_max"] == 32
    assert set(rec["in_distribution"]) == {"exact", "token"}
    assert [r["split"] for r in rec["lengths"]] == ["train"] * 5 + ["test"] * 2
    assert (out / "accuracy.png").stat().st_size > 0
    assert "| even-pairs |" in (out / "results.md").read_text()
    # the per-run record on disk is the same as the line in results.jsonl
    on_disk = json.loads(
        (out / "even-pairs" / "sinusoidal+random" / "seed1" / "result.json").read_text()
    )
    assert on_disk == rec
    # running again without --resume refuses; with --resume it reuses every finished run
    with pytest.raises(ValueError, match="pass --resume"):
        run_cli(["--task", "copy-v1", "--pe", "none", "--out", str(out), *TINY_CLI])
    assert (
        run_cli(
            [
                "--task",
                "copy-v1,even-pairs",
                "--pe",
                "none,sinusoidal+random",
                "--seeds",
                "2",
                "--random-max",
                "32",
                "--out",
                str(out),
                "--resume",
                *TINY_CLI,
            ]
        )
        == 0
    )
    assert read_jsonl(out / "results.jsonl") == records


def test_toml_config_and_precedence(tmp_path: Path) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text(
        'task = ["copy-v3"]\npe = "none,learned"\nseeds = [4, 7]\nsteps = 77\nlr = 0.002\n'
        "train_max_length = 9\n[pe_options.learned]\nmax_len = 512\n"
    )
    parser = argparse.ArgumentParser()
    lg_cli.add_subcommand(parser.add_subparsers())
    args = parser.parse_args(["lengthgen", "--config", str(path), "--lr", "0.003"])
    configs = lg_cli.build_configs(lg_cli.resolve_settings(args))
    assert [(c.pe, c.seed) for c in configs] == [
        ("none", 4),
        ("none", 7),
        ("learned", 4),
        ("learned", 7),
    ]
    assert {c.steps for c in configs} == {77} and {c.train_max_length for c in configs} == {9}
    assert {c.lr for c in configs} == {0.003}  # the command line wins over the file
    assert configs[2].pe_options == {"max_len": 512} and configs[0].pe_options == {}


def test_preset_kazemnejad() -> None:
    parser = argparse.ArgumentParser()
    lg_cli.add_subcommand(parser.add_subparsers())
    args = parser.parse_args(["lengthgen", "--preset", "kazemnejad", "--task", "copy-v1"])
    settings = lg_cli.resolve_settings(args)
    needed = {"none", "t5", "alibi", "rope", "sinusoidal"}
    missing = needed - set(posenc.available())
    if missing:
        with pytest.raises(ValueError, match="unknown positional encoding"):
            lg_cli.build_configs(settings)
        return
    configs = lg_cli.build_configs(settings)
    assert len(configs) == 18 and {c.task for c in configs} == {"copy-v1"}
    assert [c.label for c in configs[::3]] == [
        "none",
        "t5",
        "alibi",
        "rope",
        "sinusoidal",
        "learned",
    ]
    c = configs[0]
    assert (c.dim, c.depth, c.heads, c.steps, c.batch_size, c.lr) == (64, 2, 4, 1000, 64, 1e-3)
    assert (c.train_max_length, c.test_min_length, c.test_max_length) == (20, 21, 40)
    assert next(c.pe_options for c in configs if c.pe == "rope") == {"rotary_dim": 4}
    assert next(c.pe_options for c in configs if c.pe == "t5") == {"bidirectional": False}
    for c in configs[::3]:  # every encoding of the preset builds and reaches the test lengths
        c.validate()
        build_model(c, get_task(c.task))


def test_preset_options_follow_the_pe_list() -> None:
    """A preset's options for encodings the pe list leaves out are dropped; the user's own
    options for such encodings are still an error (a typo)."""
    parser = argparse.ArgumentParser()
    lg_cli.add_subcommand(parser.add_subparsers())
    argv = ["lengthgen", "--preset", "kazemnejad", "--pe", "rope+coupled"]
    settings = lg_cli.resolve_settings(parser.parse_args([*argv, "--pe-option", "rope.base=500"]))
    configs = lg_cli.build_configs(settings)
    assert {c.label for c in configs} == {"rope+coupled"} and len(configs) == 12
    assert configs[0].pe_options == {"rotary_dim": 4, "base": 500}
    settings = lg_cli.resolve_settings(parser.parse_args([*argv, "--pe-option", "alibi.x=1"]))
    with pytest.raises(ValueError, match="pe_options for alibi, which is not in the pe list"):
        lg_cli.build_configs(settings)
    argv = ["lengthgen", "--task", "copy-v1", "--pe", "rope+random+coupled,rope+random"]
    configs = lg_cli.build_configs(lg_cli.resolve_settings(parser.parse_args(argv)))
    assert [(c.label, c.random_positions, c.coupled_positions) for c in configs] == [
        ("rope+random+coupled", True, True),
        ("rope+random", True, False),
    ]


@pytest.mark.parametrize(
    ("argv", "error", "match"),
    [
        (["--task", "nope"], ValueError, "unknown task 'nope'"),
        (["--pe", "nope"], ValueError, "unknown positional encoding 'nope'"),
        (["--pe", "none+noise"], ValueError, "only suffixes are '\\+random', '\\+coupled'"),
        (["--pe", "none,,learned"], ValueError, "empty entry"),
        (["--pe", "none,none"], ValueError, "twice"),
        (["--seeds", "0"], ValueError, "seeds must be a count >= 1"),
        (["--seeds", "x"], ValueError, "seeds must be a count or a comma list"),
        (["--jobs", "0"], ValueError, "jobs must be an int >= 1"),
        (["--train-lengths", "20"], ValueError, "--train-lengths must look like A-B"),
        (["--test-lengths", "9-3"], ValueError, "1 <= A <= B"),
        (["--steps", "0"], ValueError, "steps must be >= 1"),
        (["--heads", "3"], ValueError, "heads \\(3\\) must divide dim \\(16\\)"),
        (["--warmup", "1.5"], ValueError, "warmup is a fraction"),
        (
            ["--pe", "none+random", "--random-max", "10"],
            ValueError,
            "random_max=10.*16 tokens for copy-v1 at input length 7",
        ),
        (["--pe-option", "rope"], ValueError, "NAME.KEY=VALUE"),
        (["--pe", "none", "--pe-option", "learned.max_len=4"], ValueError, "not in the pe list"),
        (
            ["--pe", "learned", "--pe-option", "learned.max_len=4"],
            ValueError,
            "cannot handle the test sequences",
        ),
        (["--pe", "learned", "--pe-option", "learned.bogus=1"], TypeError, "bogus"),
        (["--config", "missing.toml"], ValueError, "is not a file"),
    ],
)
def test_bad_input(argv: list[str], error: type, match: str, tmp_path: Path) -> None:
    full = ["--task", "copy-v1", "--pe", "none", "--out", str(tmp_path / "o"), *TINY_CLI]
    with pytest.raises(error, match=match):
        run_cli(full + argv)
    assert not (tmp_path / "o" / "copy-v1").exists() or "cannot handle" in match


def test_bad_toml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("stepz = 3\n")
    with pytest.raises(ValueError, match="unknown training option\\(s\\) stepz"):
        run_cli(["--config", str(bad), "--out", str(tmp_path / "o")])
    bad.write_text("steps = 'many'\n")
    with pytest.raises(TypeError, match="steps must be int, got str"):
        run_cli(["--config", str(bad), "--out", str(tmp_path / "o")])
    bad.write_text("steps = [\n")
    with pytest.raises(ValueError, match="invalid TOML"):
        run_cli(["--config", str(bad), "--out", str(tmp_path / "o")])
    bad.write_text("seed = 3\n")
    with pytest.raises(ValueError, match="set per run"):
        run_cli(["--config", str(bad), "--out", str(tmp_path / "o")])


def test_list_tasks(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["--list-tasks"]) == 0
    out = capsys.readouterr().out
    for name in SHIPPED:
        assert name in out


def test_posenc_command_reports_bad_input_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    main = pytest.importorskip("posenc.cli").main
    assert main(["lengthgen", "--task", "nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown task 'nope'" in err
    assert (
        main(["lengthgen", "--pe", "none+random", "--random-max", "5", "--out", str(tmp_path)]) == 2
    )
    assert "random_max=5" in capsys.readouterr().err
