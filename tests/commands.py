"""Running the ``posenc`` command from tests: in-process through ``posenc.cli.main`` (with
the heavy work replaced by a stub, see the ``stubbed`` fixture in ``conftest.py``), or as a
subprocess that imports the posenc these tests import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import posenc
from posenc.cli import main

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
    """``python -m posenc.cli ARGS`` in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "posenc.cli", *args],
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
