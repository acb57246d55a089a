"""The `posenc` command through its entry point: output, files, and bad input (exit 2, one
line, no traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.image import imread

from posenc.cli import main


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "posenc.cli", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_tour(tmp_path: Path) -> None:
    done = run("tour", "--out", str(tmp_path))
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


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    import posenc

    assert len(lines) == len(posenc.available())
    assert any(line.startswith("sinusoidal ") and "additive" in line for line in lines)


@pytest.mark.parametrize("kind", ["heatmap", "dims"])
@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_plot(tmp_path: Path, kind: str, suffix: str) -> None:
    target = tmp_path / f"pe.{suffix}"
    assert main(["plot", "sinusoidal", "--kind", kind, "--dim", "32", "-o", str(target)]) == 0
    assert target.stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plot", "nosuch", "-o", "x.png"], "unknown positional encoding 'nosuch'"),
        (["plot", "sinusoidal", "--kind", "bars", "-o", "x.png"], "kind 'bars'"),
        (["plot", "sinusoidal", "--dim", "0", "-o", "x.png"], "positive integer"),
        (["plot", "sinusoidal", "--positions", "ten", "-o", "x.png"], "positive integer"),
        (["plot", "sinusoidal", "-o", "x.txt"], ".png, .svg or .pdf"),
        (["plot", "sinusoidal"], "required"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
        (["tour", "--format", "gif"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args: list[str], message: str) -> None:
    done = run(*args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert message in lines[0]
    assert "Traceback" not in done.stderr


import posenc  # noqa: E402


@pytest.mark.parametrize("name", posenc.available())
def test_plot_every_encoding(name: str, tmp_path: Path) -> None:
    from posenc.plots import build_for_plot, kinds_for

    kinds = kinds_for(build_for_plot(name))
    assert kinds, name
    for kind in kinds:
        target = tmp_path / f"{kind}.png"
        assert main(["plot", name, "--kind", kind, "--positions", "24", "-o", str(target)]) == 0
        assert imread(target).std() > 0.01


def test_plot_side_by_side(tmp_path: Path) -> None:
    target = tmp_path / "cmp.png"
    names = [n for n in ("rope", "alibi", "sinusoidal") if n in posenc.available()]
    assert main(["plot", *names, "--kind", "distance", "-o", str(target)]) == 0
    assert imread(target).shape[1] > 3 * 300


def test_analyze_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["analyze", "sinusoidal", "none", "--length", "16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["sinusoidal", "none"]
    assert rows[0]["translation_residual"] < 1e-12


def test_analyze_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "sinusoidal", "--length", "8"]) == 0
    assert "shift resid." in capsys.readouterr().out


@pytest.mark.slow
def test_analyze_unknown_exits_2() -> None:
    done = run("analyze", "sinusoidal", "bogus")
    assert done.returncode == 2 and "unknown positional encoding 'bogus'" in done.stderr
