"""``posenc plot --grid`` and ``posenc analyze --grid``: files written, grid rows measured, bad
grids one line and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from posenc.analysis.grid import analyze_grid
from posenc.app.cli import main
from posenc.plots import plot_encoding


def test_plot_grid_writes_a_file_for_one_and_several_schemes(tmp_path: Path) -> None:
    out = tmp_path / "rope2d.png"
    assert main(["plot", "rope2d", "--grid", "6x5", "-o", str(out)]) == 0
    assert out.stat().st_size > 1000
    out = tmp_path / "all.png"
    names = ["rope3d", "rope-mixed", "swin-bias"]
    assert main(["plot", *names, "--grid", "4x3", "--dim", "48", "-o", str(out)]) == 0
    assert out.stat().st_size > 1000


def test_plot_grid_draws_the_grid_shape() -> None:
    fig = plot_encoding(["rope2d", "swinv2-cpb"], grid=(6, 5))
    images = [np.asarray(ax.images[0].get_array()) for ax in fig.axes if ax.images]
    assert [im.shape for im in images] == [(6, 5)] * 4
    assert np.argmax(images[0]) == 3 * 5 + 2  # rope2d: the centre most like itself
    plt.close(fig)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plot", "rope2d", "--grid", "1x4"], "expected HxW"),
        (["plot", "rope2d", "--grid", "ax4"], "expected HxW"),
        (["plot", "rope", "--grid", "4x4"], "(--grid) and kind 'grid' draw 2-D/3-D"),
        (["plot", "rope2d", "alibi", "--grid", "4x4"], "alibi encodes sequences (1-D)"),
        (["plot", "rope2d", "--grid", "3x4x4"], "grid of 2 sides"),
        (["plot", "rope2d", "--grid", "4x4", "--kind", "heads"], "draws the kind 'grid'"),
        (["analyze", "rope2d", "--grid", "3x3x3"], "grid must be 2 sides"),
    ],
)
def test_bad_grids_are_one_line_and_status_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if argv[0] == "plot":
        argv = [*argv, "-o", str(tmp_path / "x.png")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "x.png").exists()


def test_analyze_reports_grid_properties(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "rope2d", "rope", "--length", "8", "--grid", "4x3", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert "grid" not in rows["rope"]
    assert rows["rope2d"]["grid"] == analyze_grid("rope2d", grid=(4, 3)).to_dict()
    assert main(["analyze", "swin-bias", "--length", "8", "--grid", "4x3"]) == 0
    assert "row/col gap" in capsys.readouterr().out
