"""Settings every test runs under.

- **A small memory budget.** ``POSENC_MEMORY_BUDGET`` is 2 GiB (unless already set), before
  posenc is imported and for every process the tests start, so no test can allocate a large
  block by accident: a size past it is a ``MemoryBudgetError`` naming the argument.
- **Deterministic fuzzing.** Hypothesis runs the ``posenc`` profile by default: derandomized
  (the same examples on every run and machine), no deadline, and a failure printed with its
  reproduction blob. ``HYPOTHESIS_PROFILE=fuzz`` draws fresh random examples, twenty times
  as many (``tests/fuzzing.py``), for a fuzzing session; keep every failure it finds as an
  ``@example`` on its test.

Shared helpers live beside this file: ``fuzzing.py`` (example counts), ``misuse.py`` (bad
calls and what their errors must say), ``schemes.py`` (the registered schemes and what the
tests must know about each), ``commands.py`` (running the ``posenc`` command).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("POSENC_MEMORY_BUDGET", "2G")

import matplotlib
import pytest
import torch
from hypothesis import HealthCheck, settings

matplotlib.use("Agg")

_QUIET_CHECKS = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
settings.register_profile(
    "posenc",
    derandomize=True,
    deadline=None,
    print_blob=True,
    database=None,  # nothing carried between runs: a run depends on the code alone
    suppress_health_check=_QUIET_CHECKS,
)
settings.register_profile(
    "fuzz",
    derandomize=False,
    deadline=None,
    print_blob=True,
    suppress_health_check=_QUIET_CHECKS,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "posenc"))


if os.environ.get("PYTEST_XDIST_WORKER"):
    # one of two workers on a two-core machine: one thread each, so they do not fight
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Replace the expensive bodies of the commands (training, benchmarks, the tour, the
    report, the analysis) by raising ``tests.commands.Ran``, and work in a temporary folder:
    a command that gets that far validated its arguments."""
    import posenc.analysis
    import posenc.app.report
    import posenc.app.tour
    import posenc.bench.harness
    import posenc.lengthgen.train

    from .commands import Ran

    def stop(*args: Any, **kwargs: Any) -> Any:
        raise Ran

    monkeypatch.setattr(posenc.lengthgen.train, "run_sweep", stop)
    monkeypatch.setattr(posenc.bench.harness, "environment", stop)
    monkeypatch.setattr(posenc.app.tour, "run_tour", stop)
    monkeypatch.setattr(posenc.app.report, "_tour_section", stop)
    monkeypatch.setattr(posenc.analysis, "analyze", stop)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
