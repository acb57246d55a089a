"""Measuring in a worker subprocess (``posenc.bench.suites.sweeps``): a sweep asks the worker
only for the sizes this run has not measured with every variant, hands it the last timing of
each variant, returns rows in (size, variant) order, and reports a failed worker in a note.
The worker itself is replaced by a recording stand-in: nothing is timed."""

from __future__ import annotations

from typing import Any

import pytest

from posenc.bench.suites import sweeps


def fake_rows(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"n": n, "variant": v, "median_s": n * 1e-6 * (1 + i)}
        for n in spec["sizes"]
        for i, v in enumerate(spec["variants"])
    ]


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The specs the worker was started with, in order; each run starts with nothing measured."""
    specs: list[dict[str, Any]] = []

    def worker(spec: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
        specs.append(spec)
        return fake_rows(spec), None

    monkeypatch.setattr(sweeps, "_MEASURED", {})
    monkeypatch.setattr(sweeps, "_run_worker", worker)
    return specs


def test_a_second_sweep_measures_only_the_new_sizes(asked: list[dict[str, Any]]) -> None:
    spec = {"dim": 8}
    rows, notes = sweeps.worker_rows("attention", spec, (32, 64), ("flex", "sdpa"))
    assert notes == [] and len(asked) == 1
    assert asked[0] == {"dim": 8, "kind": "attention", "sizes": [32, 64],
                        "variants": ["flex", "sdpa"], "last": {}}  # fmt: skip
    assert [(r["n"], r["variant"]) for r in rows] == [
        (32, "flex"), (32, "sdpa"), (64, "flex"), (64, "sdpa"),
    ]  # fmt: skip
    again, _ = sweeps.worker_rows("attention", spec, (128, 32, 64), ("flex", "sdpa"))
    assert asked[1]["sizes"] == [128]
    assert asked[1]["last"] == {"flex": [64, 64e-6], "sdpa": [64, 128e-6]}  # the largest known
    assert [(r["n"], r["variant"]) for r in again][:4] == [(r["n"], r["variant"]) for r in rows]
    assert again[:4] == rows  # reused, not measured again


def test_a_new_variant_or_spec_is_measured_again(asked: list[dict[str, Any]]) -> None:
    sweeps.worker_rows("attention", {"dim": 8}, (32,), ("flex",))
    sweeps.worker_rows("attention", {"dim": 8}, (32,), ("flex", "math"))
    sweeps.worker_rows("attention", {"dim": 16}, (32,), ("flex",))
    sweeps.worker_rows("rope", {"dim": 8}, (32,), ("flex",))
    assert len(asked) == 4


def test_a_failed_worker_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweeps, "_MEASURED", {})
    monkeypatch.setattr(sweeps, "_run_worker", lambda spec: ([], "the subprocess stopped"))
    rows, notes = sweeps.worker_rows("rope", {}, (32,), ("posenc",))
    assert rows == [] and notes == ["the subprocess stopped"]


def test_labels_and_skips() -> None:
    assert sweeps.mib(None) == "n/a" and sweeps.mib(12.345) == "12.3"
    rows = [
        {"n": 64, "variant": "flex", "median_s": 1.0},
        {"n": 128, "variant": "torch-mha", "skipped": "predicted 9 s per call"},
        {"n": 128, "variant": "other", "skipped": "no memory"},
    ]
    assert sweeps.skips(rows) == [
        "n = 128, torch MultiheadAttention + bias: skipped, predicted 9 s per call",
        "n = 128, other: skipped, no memory",
    ]
