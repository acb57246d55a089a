"""Saving figures (``posenc.plots``, its ``__init__``): a seeded ``posenc plot`` writes the same
bytes on every run, in PNG, SVG and PDF."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.commands import posenc_cli


@pytest.mark.slow
@pytest.mark.parametrize("suffix", ["png", "svg", "pdf"])
def test_plot_is_byte_identical_across_runs(suffix: str, tmp_path: Path) -> None:
    """PNG, SVG and PDF: the same bytes (SVG and PDF used to embed the date, and SVG a random
    salt in its element ids)."""
    for run in ("a", "b"):
        done = posenc_cli(
            "plot", "rope", "alibi", "--kind", "distance", "--positions", "24", "--dpi", "40",
            "-o", f"{run}.{suffix}", cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    first, second = ((tmp_path / f"{run}.{suffix}").read_bytes() for run in ("a", "b"))
    assert len(first) > 1000
    assert first == second
