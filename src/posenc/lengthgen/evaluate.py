"""Scoring a trained model per input length, and summarising runs over seeds.

Two numbers per length, following Kazemnejad et al. 2023 (§3) and Ruoss et al. 2023:

- **exact match**: the whole answer is right (decoder tasks: the greedy continuation of
  ``BOS x SEP`` is ``y EOS`` token for token; encoder tasks: every blank is predicted right);
- **per-token accuracy**: the fraction of answer tokens (and the EOS) that are right.

Greedy decoding reproduces ``y EOS`` exactly when, fed the right prefix, the model's argmax
is right at every answer position: both see the same prefixes. So decoder tasks are scored
by default in one teacher-forced pass (about 30 times faster at the default lengths), which
gives the greedy exact match; its per-token accuracy is then the teacher-forced one (each
token judged given the right prefix). ``greedy=True`` runs the actual greedy decoding
instead, re-running the whole (short) sequence per new token, and reads per-token accuracy
off that continuation (a slip early in an answer then also costs the tokens after it).

A run whose in-distribution exact match (lengths it was trained on) is under 99% did not
learn the task; it is marked invalid and left out of the mean over seeds, since its
extrapolation numbers would say nothing about the positional encoding.

Results are stored as one JSON object per run (see :func:`run_record`); :func:`aggregate`
groups them by (task, encoding) into mean and spread over the valid seeds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..runs.checkpoint import write_text
from ..runs.device import autocast, model_device
from .data import (
    Vocab,
    checked_sample,
    collate,
    example_positions,
    model_length,
    random_positions,
)
from .tasks import Task

#: A run is valid when its in-distribution exact match reaches this fraction.
VALID_THRESHOLD = 0.99

# Salts that keep the evaluation streams apart from the training stream (seed, 0).
PERIODIC_SALT, FINAL_SALT = 1, 2


def eval_rng(seed: int, salt: int, length: int) -> np.random.Generator:
    """The generator for one evaluation length: independent of the training stream and of
    which other lengths are evaluated, so evaluation never changes training and vice versa."""
    return np.random.default_rng([seed, salt, length])


@torch.no_grad()
def evaluate_length(
    model: nn.Module,
    task: Task,
    length: int,
    samples: int,
    rng: np.random.Generator,
    *,
    random_max: int | None = None,
    coupled: bool = False,
    greedy: bool = False,
    batch_size: int = 256,
    precision: str = "fp32",
) -> dict[str, float | int]:
    """Exact match and per-token accuracy of ``model`` on ``samples`` fresh examples of input
    length ``length``. Returns ``{"length", "exact", "token", "n"}``.

    ``greedy`` scores decoder tasks by greedy decoding rather than one teacher-forced pass
    (same examples, same positions, the same exact match; see the module docs). The model
    runs on its own device, under ``precision``'s autocast (``fp32``: none)."""
    vocab = Vocab(task.vocab_size)
    device = model_device(model)
    was_training = model.training
    model.eval()
    exact = correct = total = 0
    try:
        remaining = samples
        while remaining > 0:
            chunk = min(batch_size, remaining)
            remaining -= chunk
            examples = [checked_sample(task, length, rng) for _ in range(chunk)]
            longest = max(model_length(task.kind, len(x), len(y)) for x, y in examples)
            positions = None
            if coupled:
                positions = [
                    _pad_to(
                        example_positions(task, ex, rng, random_max=None, coupled=True), longest
                    )
                    for ex in examples
                ]
            elif random_max is not None:
                positions = [random_positions(longest, random_max, rng) for _ in examples]
            with autocast(device, precision):
                if task.kind == "decoder" and greedy:
                    hits, right, count = _greedy_decoder(model, examples, vocab, positions, device)
                else:
                    hits, right, count = _one_pass(
                        model, task.kind, examples, vocab, positions, device
                    )
            exact, correct, total = exact + hits, correct + right, total + count
    finally:
        model.train(was_training)
    return {"length": length, "exact": exact / samples, "token": correct / total, "n": samples}


def _pad_to(positions: np.ndarray | None, length: int) -> np.ndarray:
    """Extend ``positions`` to ``length`` by repeating the last one (pads are never scored)."""
    assert positions is not None
    return np.pad(positions, (0, length - len(positions)), mode="edge")


def _greedy_decoder(
    model: nn.Module,
    examples: list[tuple[list[int], list[int]]],
    vocab: Vocab,
    positions: list[np.ndarray] | None,
    device: torch.device,
) -> tuple[int, int, int]:
    """Greedy decoding of ``y EOS`` after ``BOS x SEP``, re-running the whole (short) sequence
    at every step. All examples share one input length, so no padding is needed."""
    prompt = torch.tensor([[vocab.bos, *x, vocab.sep] for x, _ in examples], device=device)
    answers = [[*y, vocab.eos] for _, y in examples]  # prompt: (b, n+2)
    steps = max(len(a) for a in answers)
    pos = None if positions is None else torch.from_numpy(np.stack(positions)).to(device)
    seq = prompt
    for _ in range(steps):
        n = seq.shape[1]
        logits = model(seq, positions=None if pos is None else pos[:, :n])  # (b, n, V)
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    generated = seq[:, prompt.shape[1] :].tolist()
    hits = right = count = 0
    for gen, target in zip(generated, answers, strict=True):
        same = [g == t for g, t in zip(gen, target, strict=True)]
        hits += all(same)
        right += sum(same)
        count += len(target)
    return hits, right, count


def _one_pass(
    model: nn.Module,
    kind: str,
    examples: list[tuple[list[int], list[int]]],
    vocab: Vocab,
    positions: list[np.ndarray] | None,
    device: torch.device,
) -> tuple[int, int, int]:
    """Score every answer position in one forward: the blanks of an encoder task, or the
    teacher-forced predictions of ``y EOS`` of a decoder task."""
    batch = collate(kind, examples, vocab, positions=positions).to(device)
    logits = model(batch.tokens, positions=batch.positions, key_padding_mask=batch.key_padding_mask)
    same = (logits.argmax(-1) == batch.targets) & batch.loss_mask  # (b, n)
    per_example_right = same.sum(1)
    per_example_count = batch.loss_mask.sum(1)
    hits = int((per_example_right == per_example_count).sum())
    return hits, int(per_example_right.sum()), int(per_example_count.sum())


def evaluate_lengths(
    model: nn.Module,
    task: Task,
    lengths: Iterable[int],
    samples: int,
    *,
    seed: int,
    salt: int = FINAL_SALT,
    random_max: int | None = None,
    coupled: bool = False,
    greedy: bool = False,
    precision: str = "fp32",
) -> list[dict[str, float | int]]:
    """:func:`evaluate_length` at every length, each with its own :func:`eval_rng`."""
    return [
        evaluate_length(
            model,
            task,
            n,
            samples,
            eval_rng(seed, salt, n),
            random_max=random_max,
            coupled=coupled,
            greedy=greedy,
            precision=precision,
        )
        for n in lengths
    ]


def mean_of(rows: Sequence[dict[str, Any]], key: str) -> float:
    """Mean of ``row[key]`` over rows (each length weighs the same)."""
    return float(np.mean([r[key] for r in rows])) if rows else float("nan")


# --------------------------------------------------------------------------- over seeds


def run_record(
    *,
    config: dict[str, Any],
    task_name: str,
    label: str,
    in_distribution: list[dict[str, Any]],
    test: list[dict[str, Any]],
    valid_threshold: float = VALID_THRESHOLD,
    **extra: Any,
) -> dict[str, Any]:
    """The JSON object describing one finished run."""
    id_exact = mean_of(in_distribution, "exact")
    return {
        "task": task_name,
        "pe": config["pe"],
        "random_positions": config["random_positions"],
        "coupled_positions": config.get("coupled_positions", False),
        "abacus": config.get("abacus", False),
        "label": label,
        "seed": config["seed"],
        "in_distribution": {
            "exact": id_exact,
            "token": mean_of(in_distribution, "token"),
        },
        "test": {"exact": mean_of(test, "exact"), "token": mean_of(test, "token")},
        "valid": bool(id_exact >= valid_threshold),
        "lengths": [
            {**row, "split": split}
            for split, rows in (("train", in_distribution), ("test", test))
            for row in rows
        ],
        **extra,
        "config": config,
    }


def _std(values: list[float]) -> float | None:
    """Sample standard deviation (n - 1), or None for fewer than two values."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def aggregate(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Group run records by (task, label) in first-seen order; mean and spread over valid runs.

    Each group: ``task``, ``label``, ``runs``, ``valid``, ``test_exact_mean``/``_std``,
    ``test_token_mean``/``_std``, ``id_exact_mean`` (over all runs), and ``lengths``: per
    length the mean exact match and per-token accuracy over valid runs (with min and max).
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rec in records:
        groups.setdefault((rec["task"], rec["label"]), []).append(rec)
    out = []
    for (task, label), runs in groups.items():
        good = [r for r in runs if r["valid"]]
        exact = [r["test"]["exact"] for r in good]
        token = [r["test"]["token"] for r in good]
        per_length: dict[int, list[tuple[float, float, str]]] = {}
        for r in good:
            for row in r["lengths"]:
                per_length.setdefault(row["length"], []).append(
                    (row["exact"], row["token"], row["split"])
                )
        lengths = [
            {
                "length": n,
                "split": vals[0][2],
                "exact": float(np.mean([v[0] for v in vals])),
                "exact_min": float(min(v[0] for v in vals)),
                "exact_max": float(max(v[0] for v in vals)),
                "token": float(np.mean([v[1] for v in vals])),
            }
            for n, vals in sorted(per_length.items())
        ]
        out.append(
            {
                "task": task,
                "label": label,
                "runs": len(runs),
                "valid": len(good),
                "seeds": [r["seed"] for r in runs],
                "test_exact_mean": float(np.mean(exact)) if exact else None,
                "test_exact_std": _std(exact),
                "test_token_mean": float(np.mean(token)) if token else None,
                "test_token_std": _std(token),
                "id_exact_mean": float(np.mean([r["in_distribution"]["exact"] for r in runs])),
                "lengths": lengths,
            }
        )
    return out


def _pct(mean: float | None, std: float | None = None) -> str:
    if mean is None or math.isnan(mean):
        return "–"
    text = f"{100 * mean:.1f}"
    return text if std is None else f"{text} ± {100 * std:.1f}"


def markdown_table(groups: list[dict[str, Any]]) -> str:
    """One row per (task, encoding): valid seeds, in-distribution and test accuracy (%)."""
    lines = [
        "| task | encoding | valid seeds | in-dist. exact | test exact (mean ± std) "
        "| test per-token |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for g in groups:
        lines.append(
            f"| {g['task']} | {g['label']} | {g['valid']}/{g['runs']} "
            f"| {_pct(g['id_exact_mean'])} | {_pct(g['test_exact_mean'], g['test_exact_std'])} "
            f"| {_pct(g['test_token_mean'], g['test_token_std'])} |"
        )
    return "\n".join(lines)


def wide_table(groups: list[dict[str, Any]]) -> str:
    """The paper's layout: tasks as rows, encodings as columns, test exact match (%) as
    ``mean`` over valid seeds, ``(k/n)`` appended when some seeds were invalid."""
    tasks = list(dict.fromkeys(g["task"] for g in groups))
    labels = list(dict.fromkeys(g["label"] for g in groups))
    cell = {(g["task"], g["label"]): g for g in groups}
    lines = ["| task | " + " | ".join(labels) + " |", "| --- " * (len(labels) + 1) + "|"]
    for task in tasks:
        row = []
        for label in labels:
            g = cell.get((task, label))
            if g is None:
                row.append("")
                continue
            text = _pct(g["test_exact_mean"])
            if g["valid"] < g["runs"]:
                text += f" ({g['valid']}/{g['runs']} valid)"
            row.append(text)
        lines.append(f"| {task} | " + " | ".join(row) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- files


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Write one JSON object per line (atomically: temp file, then rename)."""
    write_text(path, "".join(json.dumps(rec, sort_keys=True) + "\n" for rec in records))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a ``results.jsonl`` file."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def markdown_report(records: list[dict[str, Any]]) -> str:
    """The markdown summary written next to ``results.jsonl`` (and used by ``posenc report``)."""
    groups = aggregate(records)
    return (
        "## Length generalization\n\n"
        "Test exact match (%), mean over valid seeds (in-distribution exact match >= "
        f"{100 * VALID_THRESHOLD:.0f}%):\n\n"
        + wide_table(groups)
        + "\n\nPer encoding:\n\n"
        + markdown_table(groups)
        + "\n"
    )
