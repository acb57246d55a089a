"""The GPU scripts (``benchmarks/gpu_*.sh``) dry-run on the
CPU: their shell is valid, every step runs and says how it ended (the tests skip, the CUDA
benchmarks refuse in one line), and everything lands in ``$OUT``, a relative one included."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ..commands import SUBPROCESS_ENV

ROOT = Path(__file__).parents[2]
#: Each script, what it writes into $OUT, and the steps it reports.
SCRIPTS = {
    "gpu_run.sh": (
        {"device.txt", "triton_cuda_tests.txt", "decode_sync.txt", "bench.txt"},
        (
            "kernel tests on CUDA: exit",
            "decode steps without host synchronisation: exit",
            "bench rope --device cuda: exit",
        ),
    ),
    "gpu_attention.sh": (
        {"attention_device.txt", "attention_cuda_tests.txt", "attention_bench.txt"},
        ("attention tests on CUDA: exit", "bench bias encoder --device cuda: exit"),
    ),
    "gpu_first.sh": ({"first_device.txt", "gpu_first.md"}, ("gpu_first: exit 0",)),
    "gpu_patch.sh": (
        {"patch_device.txt", "patch_cuda_tests.txt", "hf_bench.txt"},
        ("patch tests on CUDA: exit", "bench hf --device cuda: exit"),
    ),
}
#: What one GPU call allows a script (seconds), less a minute for the machine's start.
GPU_CALL = 600 - 60


@pytest.mark.slow  # (a pytest run and a posenc command in subprocesses: about 6 s each)
@pytest.mark.skipif(torch.cuda.is_available(), reason="a dry run: on a GPU the script is real")
@pytest.mark.parametrize("script", SCRIPTS)
def test_the_script_dry_runs_into_a_relative_out(script: str, tmp_path: Path) -> None:
    path = ROOT / "benchmarks" / script
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    env = {**SUBPROCESS_ENV, "OUT": "out", "PYTHON": sys.executable}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run(
        ["bash", str(path)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    files, steps = SCRIPTS[script]
    assert {p.name for p in (tmp_path / "out").iterdir()} == files
    for step in steps:
        assert step in done.stdout, done.stdout
    assert "torch sees no CUDA device" in done.stdout  # the benchmark's one-line refusal
    assert not (ROOT / "out").exists()  # nothing written into the checkout
    shutil.rmtree(tmp_path / "out")


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_scripts_timeouts_fit_one_gpu_call(script: str) -> None:
    """The steps' timeouts add up to less than one 600-s GPU call (with its start)."""
    text = (ROOT / "benchmarks" / script).read_text()
    limits = [int(line.split()[1]) for line in text.splitlines() if line.startswith("timeout ")]
    assert limits and sum(limits) <= GPU_CALL, (script, limits)


@pytest.mark.slow  # (every section on tiny sizes: about 20 s)
def test_the_first_gpu_script_runs_every_section_on_the_cpu() -> None:
    """``gpu_first.py --device cpu --tiny``: every section runs and prints its rows (three times
    per case; no CUDA graphs on the CPU), none fails."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_first.py"), "--device", "cpu", "--tiny"],
        capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    out = done.stdout
    for section in ("versions", "rope vs clone", "host time", "decode vs transformers",
                    "bias attention", "training step", "sync check"):  # fmt: skip
        assert "## " in out and section in out, section
    assert "0 section(s) failed" in out
    assert out.count("n/a (no CUDA graphs on this device)") >= 10
    for case in ("posenc in place", "transformers rotary module", "| fire | forward+backward",
                 "posenc t5"):  # fmt: skip
        assert case in out, case
    # every path of the sync check ran (without the check on the CPU), and the SDPA kernels
    for path in ("decode step", "flex call with a causal mask (t5)", "training step (t5)"):
        assert f"| {path}" in out and "FAIL" not in out, path
    assert "| grouped, mask (enable_gqa) | ran |" in out  # (the CPU's flash kernel takes both)
