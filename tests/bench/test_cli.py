"""``posenc bench`` through its entry point (``posenc.bench.cli``): a regression guard that
runs every suite on tiny sizes and checks the tables are produced (never the timings), and
bad arguments (status 2, one line naming the argument and the value)."""

from __future__ import annotations

from pathlib import Path

import pytest

from posenc.bench.suites import SUITES
from tests.commands import posenc_cli
from tests.misuse import BadCommand, check_command, commands


@pytest.mark.slow
def test_quick_run_of_every_suite_writes_the_tables(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    done = posenc_cli("bench", "--quick", "--output", str(out), timeout=240)
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


BAD_COMMANDS = [
    BadCommand(["bench", "nosuch"], "bench suite", "nosuch"),
    BadCommand(["bench", "--quick", "table", "tabel"], "bench suite", "tabel"),
    BadCommand(["bench", "--output", "out.txt"], "--output", "out.txt"),
    BadCommand(["bench", "--repeats", "0"], "--repeats", "0"),
    BadCommand(["bench", "--threads", "two"], "--threads", "two"),
    BadCommand(["bench", "--max-call-seconds", "-1"], "--max-call-seconds", "-1"),
    BadCommand(["bench", "--max-call-seconds", "nan"], "--max-call-seconds", "nan"),
    BadCommand(["bench", "rope", "--device", "tpu"], "--device", "tpu"),
    BadCommand(["bench", "table", "--device", "cuda"], "--device", "cuda"),
]


@pytest.mark.parametrize("case", commands(BAD_COMMANDS))
def test_bad_arguments_exit_2_with_one_line_naming_them(
    case: BadCommand, stubbed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check_command(case, capsys)


def test_device_cuda_without_a_gpu_exits_2(
    stubbed: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from tests.commands import assert_one_line_exit_2, run_main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = assert_one_line_exit_2(*run_main(["bench", "rope", "--device", "cuda"], capsys))
    assert "--device cuda" in line and "no CUDA device" in line
