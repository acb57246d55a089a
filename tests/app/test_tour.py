"""``posenc tour`` (``posenc.app.tour``): the pictures it writes and the story it prints."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.image import imread

from posenc.app.cli import main
from tests.commands import posenc_cli


@pytest.mark.slow
def test_tour(tmp_path: Path) -> None:
    done = posenc_cli("tour", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    for name in ("heatmap", "dimensions", "attention"):
        image = imread(tmp_path / f"{name}.png")
        assert image.shape[0] > 100 and image.std() > 0.01
    out = done.stdout
    for heading in ("cannot see word order", "fixed linear map", "own encoding", "encoder stack"):
        assert heading in out


@pytest.mark.slow
def test_tour_svg(tmp_path: Path) -> None:
    assert main(["tour", "--out", str(tmp_path), "--format", "svg"]) == 0
    assert (tmp_path / "heatmap.svg").read_text().lstrip().startswith("<?xml")
