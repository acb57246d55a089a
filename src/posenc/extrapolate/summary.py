"""Curves read from a ``results.json`` document: bits per byte by run label and length, by
position bucket and by context length, and the retrieval grid. :mod:`.results` (tables,
checks) and :mod:`.plots` (the figures) both read them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def run_label(run: dict[str, Any], train_len: int) -> str:
    """``rope``, ``rope+yarn`` (zero-shot), ``rope+linear ft200@256`` (fine-tuned)."""
    if run["scaling"] is None:
        return run["pe"]
    label = f"{run['pe']}+{run['scaling']['rope_type']}"
    if run["finetune_steps"]:
        length = round(run["scaling"]["factor"] * train_len)
        label += f" ft{run['finetune_steps']}@{length}"
    return label


def curves(results: dict[str, Any]) -> dict[str, dict[int, list[float]]]:
    """``label -> length -> bits per byte of each seed``, in the order runs appear."""
    train_len = results["config"]["train_len"]
    out: dict[str, dict[int, list[float]]] = {}
    for run in results["runs"]:
        per_length = out.setdefault(run_label(run, train_len), {})
        for row in run["eval"]:
            per_length.setdefault(row["length"], []).append(row["bpb"])
    return out


def position_curves(results: dict[str, Any], length: int) -> dict[str, dict[str, list[float]]]:
    """``label -> bucket -> bits per byte of each seed`` at evaluation ``length``."""
    train_len = results["config"]["train_len"]
    out: dict[str, dict[str, list[float]]] = {}
    for run in results["runs"]:
        for row in run["eval"]:
            if row["length"] == length:
                per_bucket = out.setdefault(run_label(run, train_len), {})
                for bucket, value in row["by_position"].items():
                    per_bucket.setdefault(bucket, []).append(value)
    by_start = lambda item: int(item[0].split("-")[0])  # noqa: E731
    return {label: dict(sorted(per.items(), key=by_start)) for label, per in out.items()}


def context_curves(results: dict[str, Any]) -> dict[str, dict[int, list[float]]]:
    """``label -> context length -> bits per byte of each seed``, from the runs that carry
    ``by_context``, contexts in increasing order."""
    train_len = results["config"]["train_len"]
    out: dict[str, dict[int, list[float]]] = {}
    for run in results["runs"]:
        if "by_context" in run:
            per = out.setdefault(run_label(run, train_len), {})
            for context, value in run["by_context"].items():
                per.setdefault(int(context), []).append(value)
    return {label: dict(sorted(per.items())) for label, per in out.items()}


def retrieval_grid(
    results: dict[str, Any], key: str
) -> dict[str, dict[tuple[float, int], list[float]]]:
    """``label -> (depth, length) -> the value of key`` (``"copy_accuracy"`` or
    ``"bits_saved"``) ``of each seed``, from the runs that carry ``retrieval``."""
    train_len = results["config"]["train_len"]
    out: dict[str, dict[tuple[float, int], list[float]]] = {}
    for run in results["runs"]:
        if "retrieval" in run:
            per = out.setdefault(run_label(run, train_len), {})
            for row in run["retrieval"]:
                per.setdefault((row["depth"], row["length"]), []).append(row[key])
    return out


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean of a non-empty sequence."""
    return sum(values) / len(values)


def lengths_of(results: dict[str, Any]) -> list[int]:
    """Every evaluation length in the document, sorted."""
    return sorted({row["length"] for run in results["runs"] for row in run["eval"]})
