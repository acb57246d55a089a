"""The bias-attention benchmark script (``posenc.bench.bias``): one size in this process gives a
row per backend whose outputs agree; the sweep skips a backend predicted to need more than 60%
of the free memory or more than a minute per call (time grows as n²) and notes a failed size;
the report divides sdpa's time by flex's. Subprocesses and memory are replaced by stand-ins
where the sweep is tested: nothing here takes long."""

from __future__ import annotations

from typing import Any

import pytest

from posenc.bench import bias


def test_one_size_times_every_backend_and_they_agree() -> None:
    rows = bias.run_size("alibi", 64, ["sdpa", "math"], repeats=2)
    assert [r["backend"] for r in rows] == ["sdpa", "math"]
    for r in rows:
        assert (r["scheme"], r["n"], r["repeats"]) == ("alibi", 64, 2)
        assert 0 < r["low_s"] <= r["median_s"] <= r["high_s"]
        assert r["max_abs_diff"] < 1e-5  # math's output is sdpa's
    assert rows[0]["max_abs_diff"] == 0.0


def test_predicted_memory_is_the_materialised_tensors() -> None:
    one = 16 * 8192 * 8192 * 4 / 2**30  # one fp32 (h, n, n) tensor at n = 8192: 4 GiB
    assert one == 4.0
    assert [bias._predicted_extra_gib(b, 8192) for b in ("flex", "sdpa", "math")] == [
        0.0,
        pytest.approx(1.2 * 4.0),
        pytest.approx(3.2 * 4.0),
    ]


def test_the_sweep_skips_what_would_not_fit_or_finish(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked: list[tuple[str, int, list[str]]] = []
    seconds = {"flex": 0.25, "sdpa": 1.0, "math": 5.0}  # per call at n = 1024

    def fake(scheme: str, n: int, backends: list[str], repeats: int) -> list[dict[str, Any]]:
        asked.append((scheme, n, backends))
        if scheme == "t5":
            raise RuntimeError("killed")
        return [
            {"backend": b, "scheme": scheme, "n": n, "median_s": seconds[b] * (n / 1024) ** 2}
            for b in backends
        ]

    monkeypatch.setattr(bias, "_subprocess", fake)
    monkeypatch.setattr(bias, "_available_gib", lambda: 20.0)  # 60%: 12 GiB
    results, skipped = bias.sweep((1024, 2048, 4096, 8192), {"alibi": bias.SIZES, "t5": (1024,)})
    # math at 4096: 20 s at 2048 x 4; sdpa at 8192: 16 s at 4096 x 4; math at 8192: 12.8 GiB
    assert asked == [
        ("alibi", 1024, ["flex", "sdpa", "math"]),
        ("alibi", 2048, ["flex", "sdpa", "math"]),
        ("alibi", 4096, ["flex", "sdpa"]),
        ("alibi", 8192, ["flex"]),
        ("t5", 1024, ["flex", "sdpa", "math"]),
    ]
    assert skipped == [
        "alibi/math at n=4096: predicted 80 s per call (> 60 s)",
        "alibi/sdpa at n=8192: predicted 64 s per call (> 60 s)",
        "alibi/math at n=8192: needs about 12.8 GiB, 20.0 GiB available",
        "t5 at n=1024: failed: killed",
    ]
    assert len(results) == 9 and "failed" in capsys.readouterr().out


def test_the_report_divides_sdpa_by_flex() -> None:
    def row(backend: str, median: float) -> dict[str, Any]:
        return {"scheme": "alibi", "n": 1024, "backend": backend, "median_s": median,
                "low_s": median, "high_s": median, "extra_gib": 0.5, "first_call_s": 3.0,
                "max_abs_diff": 1e-7}  # fmt: skip

    text = bias.report([row("flex", 0.5), row("sdpa", 2.0)], ["t5 at n=4096: failed"], 90.0)
    lines = text.splitlines()
    assert "| alibi | 1024 | flex | 0.500 | 0.500-0.500 | 0.500 | 3.0 | 4.00x | 1.0e-07 |" in lines
    assert "| alibi | 1024 | sdpa | 2.000 | 2.000-2.000 | 0.500 | 3.0 |  | 1.0e-07 |" in lines
    assert "in 1.5 min" in text and lines[-1] == "- t5 at n=4096: failed"
