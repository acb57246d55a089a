"""The Triton rotary kernel (:mod:`posenc.encodings.kernels.triton_kernel`) in the suite's
run: its cases against the float64 formula under Triton's interpreter, in a subprocess
(``interpreted_triton.py``: the interpreter is chosen when the kernel is decorated, so
``TRITON_INTERPRET=1`` must be set before the module is imported, and only there), and that
posenc's import and command never import triton."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ...commands import SUBPROCESS_ENV

pytest.importorskip("triton", reason="triton ships Linux x86-64 wheels only")

HERE = Path(__file__).parent
#: pytest on the interpreted cases, one process, without the suite's addopts (no workers)
INTERPRETED = ["-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider", "-o", "addopts="]


@pytest.mark.slow  # (a subprocess: about 5 s)
def test_the_kernel_is_the_formula_under_the_interpreter() -> None:
    """Every case of the covering design, plus the errors, against float64 (CPU tensors)."""
    done = subprocess.run(
        [sys.executable, *INTERPRETED, str(HERE / "interpreted_triton.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**SUBPROCESS_ENV, "TRITON_INTERPRET": "1"},
        cwd=HERE.parents[2],
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary


@pytest.mark.slow  # (a subprocess)
def test_posenc_and_its_command_import_no_triton() -> None:
    code = (
        "import sys, posenc, posenc.cli; "
        "assert 'triton' not in sys.modules, 'triton imported'; "
        "assert not any(m.startswith('posenc.encodings.kernels.triton') for m in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=SUBPROCESS_ENV
    )
    assert done.returncode == 0, done.stderr
