"""The timing harness of ``posenc bench`` (``posenc.bench.harness``): the fitted exponent
and the round-robin schedule."""

from __future__ import annotations

import pytest

from posenc.bench.harness import Case, fit_exponent, round_robin


def test_fit_exponent_recovers_a_power_law() -> None:
    sizes = [512, 1024, 2048, 4096]
    assert fit_exponent(sizes, [3e-6 * n**2 for n in sizes]) == pytest.approx(2.0)
    assert fit_exponent(sizes, [5.0 * n for n in sizes]) == pytest.approx(1.0)
    assert fit_exponent([512], [1.0]) is None


def test_round_robin_calls_each_case_warmup_plus_repeats_times() -> None:
    calls = {"a": 0, "b": 0}

    def bump(name: str) -> None:
        calls[name] += 1

    timings = round_robin(
        [Case("a", lambda: bump("a")), Case("b", lambda: bump("b"))], warmup=2, repeats=3
    )
    assert calls == {"a": 5, "b": 5}
    assert [t.label for t in timings] == ["a", "b"] and all(t.repeats == 3 for t in timings)
    assert all(t.low <= t.median <= t.high for t in timings)
