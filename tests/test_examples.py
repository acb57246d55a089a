"""Every script in examples/ runs and says what it should."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXPECT = {
    "seed000_fixed_table_block.py": "logits (2, 10, 1000)",
    "seed001_learnable_block.py": "Output Shape: (4,",
    "seed003_encoder_stack.py": "all checks passed",
}


def test_every_example_is_covered() -> None:
    assert {p.name for p in EXAMPLES.glob("*.py")} == set(EXPECT)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECT))
def test_example_runs(name: str, tmp_path: Path) -> None:
    args = [sys.executable, str(EXAMPLES / name)]
    if name.startswith("seed000"):
        args += ["--out", str(tmp_path)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert EXPECT[name] in done.stdout
