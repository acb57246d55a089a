"""``posenc bench``: a regression guard that runs every suite on tiny sizes through the entry
point and checks the tables are produced (never the timings), the reference tables the
``table`` suite times against, the fitted exponent, and bad arguments (exit 2, one line)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from posenc.bench.harness import Case, fit_exponent, round_robin
from posenc.bench.suites import (
    SUITES,
    float64_table,
    numpy_table_fp32,
    run_suites,
    settings_for,
    torch_table_fp32,
)
from posenc.bench.worker import alibi_bias_reference
from posenc.cli import main


def _posenc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "posenc.cli", *args], capture_output=True, text=True, timeout=240
    )


@pytest.mark.slow
def test_quick_run_of_every_suite_writes_the_tables(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    done = _posenc("bench", "--quick", "--output", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    assert done.stdout.count("## ") == len(SUITES)  # the tables are printed too
    for heading in (
        "## Sinusoidal table generation",
        "## Adding an absolute encoding",
        "## RoPE applied to queries and keys",
        "## Attention with a bias (ALiBi) per backend",
        "## A whole encoder",
        "## Scaling with sequence length",
    ):
        assert heading in text
    for row in (
        "| posenc sinusoidal_table |",
        "| NumPy, float32 angles |",
        "| torch, float32 angles |",
        "| positional-encodings PositionalEncoding1D |",
        "| float32 | copy floor |",
        "| bfloat16 | posenc SinusoidalPositionalEncoding |",
        "| float32 | posenc RotaryEmbedding | half |",
        "| bfloat16 | posenc RotaryEmbedding | interleaved |",
        "| float32 | transformers | half |",
        "| float32 | rotary-embedding-torch | interleaved |",
        "| float32 | x-transformers | interleaved |",
        "| posenc flex |",
        "| posenc sdpa |",
        "| posenc math |",
        "| torch MultiheadAttention + bias |",
        "| eval | forward | posenc Encoder |",
        "| train | forward+backward | torch TransformerEncoder |",
    ):
        assert row in text, row
    assert "time ∝ n^" in text  # fitted exponents
    assert "torch 2." in text and "threads" in text and "load average" in text
    for name in ("RESULTS_bias.png", "RESULTS_scaling.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name})" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bench", "nosuch"], "unknown bench suite 'nosuch'"),
        (["bench", "--quick", "table", "tabel"], "unknown bench suite 'tabel'"),
        (["bench", "--output", "out.txt"], "'out.txt'"),
        (["bench", "--repeats", "0"], "--repeats must be a positive number, got '0'"),
        (["bench", "--threads", "two"], "--threads must be a positive number, got 'two'"),
        (["bench", "--max-call-seconds", "-1"], "got '-1'"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_run_suites_rejects_unknown_names_before_any_work() -> None:
    with pytest.raises(ValueError, match="'nope'"):
        run_suites(["table", "nope"], settings_for(True))


@pytest.mark.parametrize(("n", "d"), [(50, 16), (7, 9)])
def test_reference_tables_are_the_formula(n: int, d: int) -> None:
    """The float32 versions the table suite times follow the formula (to float32 angle
    rounding), and the float64 reference is the formula entry by entry."""
    exact = np.array(
        [
            [
                (math.sin if c % 2 == 0 else math.cos)(p / 10000.0 ** ((c - c % 2) / d))
                for c in range(d)
            ]
            for p in range(n)
        ]
    )
    np.testing.assert_allclose(float64_table(n, d), exact, rtol=0, atol=1e-15)
    np.testing.assert_allclose(numpy_table_fp32(n, d), exact, rtol=0, atol=2e-5)
    torch.testing.assert_close(
        torch_table_fp32(n, d), torch.from_numpy(exact).float(), rtol=0, atol=2e-5
    )


def test_alibi_reference_bias_matches_posenc() -> None:
    import posenc

    pe = posenc.ALiBi(5)
    pos = torch.arange(12)
    torch.testing.assert_close(
        alibi_bias_reference(pe.slopes, 12), pe.bias(pos, pos).float(), rtol=0, atol=1e-6
    )


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
