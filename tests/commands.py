"""Running the ``posenc`` command from tests: in-process through ``posenc.app.cli.main`` (with
the heavy work replaced by a stub, see the ``stubbed`` fixture in ``conftest.py``), or as a
subprocess that imports the posenc these tests import."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import posenc
from posenc.app.cli import main

#: The environment of a subprocess: it imports the posenc this test imported, whatever the
#: working folder.
SUBPROCESS_ENV = {**os.environ, "PYTHONPATH": str(Path(posenc.__file__).resolve().parents[1])}


class Ran(BaseException):
    """Raised by the stubs of heavy work: validation let the call through."""


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int | str, str]:
    """``main(argv)`` in-process: (exit status, or ``"ran"`` when the stubbed work was
    reached; stderr)."""
    try:
        status: int | str = main(argv)
    except Ran:
        status = "ran"
    return status, capsys.readouterr().err


def posenc_cli(
    *args: str, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m posenc.app.cli ARGS`` in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "posenc.app.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=SUBPROCESS_ENV,
    )


def assert_one_line_exit_2(status: int | str, err: str) -> str:
    """The command refused a caller's mistake: status 2, exactly one line on stderr, no
    traceback. Returns that line."""
    assert status == 2, (status, err)  # in particular never "ran": no work before the error
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def kill_after_first_checkpoint(
    module: str, argv: list[str], checkpoint: Path, env: dict[str, str] | None = None
) -> None:
    """``python -m MODULE ARGV`` in a subprocess, killed with SIGKILL a moment after
    ``checkpoint`` first appears (somewhere in a later step or checkpoint write); fails if the
    run ended on its own before that."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *argv],
        env=SUBPROCESS_ENV if env is None else env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not checkpoint.exists():
            assert proc.poll() is None, "training ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.01)
        time.sleep(0.05)  # land somewhere in the middle of a later step or write
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"


def torchrun_two(module: str, argv: list[str], env: dict[str, str] | None = None) -> None:
    """``python -m torch.distributed.run --standalone --nproc_per_node 2 -m MODULE ARGV``; fails
    with the end of its stderr unless it exits 0."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    result = subprocess.run(
        [*launcher, "--nproc_per_node", "2", "-m", module, *argv],
        env=SUBPROCESS_ENV if env is None else env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
