"""The resolution study (posenc.extrapolate.resolution) end to end at tiny sizes: the task's labels
against a loop, the reported accuracies against the trained models' own predictions, the
command's output, and bad settings refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from posenc.app.cli import main
from posenc.errors import PosencValueError
from posenc.extrapolate.resolution import (
    MARK_A,
    MARK_B,
    SCHEMES,
    StudyConfig,
    TinyViT,
    make_batch,
    run_study,
    train_scheme,
)

TINY = StudyConfig(
    grid=3, scales=(1.0, 2.0), dim=16, depth=1, heads=2, steps=3, batch=8, eval_examples=20
)


def test_make_batch_labels_say_where_b_lies_from_a() -> None:
    side = 5
    tokens, mark, label = make_batch(side, 50, torch.Generator().manual_seed(0))
    for t, m, y in zip(tokens, mark, label, strict=True):
        (a,) = (t == MARK_A).nonzero()[:, 0].tolist()
        (b,) = (t == MARK_B).nonzero()[:, 0].tolist()
        assert a == int(m) and int((t == 0).sum()) == side * side - 2
        (ra, ca), (rb, cb) = divmod(a, side), divmod(b, side)
        assert ra != rb and ca != cb
        assert int(y) == 2 * (rb > ra) + (cb > ca)


def test_study_reports_what_the_models_predict() -> None:
    results = run_study(TINY)
    assert [r.scheme for r in results] == list(SCHEMES)
    for r in results:
        model, loss = train_scheme(r.scheme, TINY)  # deterministic: the same model again
        assert loss == r.final_loss
        model.eval()
        for side in (3, 6):
            gen = torch.Generator().manual_seed(TINY.seed + 1000 + side)
            tokens, mark, label = make_batch(side, TINY.eval_examples, gen)
            with torch.no_grad():
                pred = model(tokens, mark, side).argmax(-1)
            assert r.accuracy[side] == float((pred == label).double().mean())


def test_learned_table_is_resampled_to_the_test_grid() -> None:
    model = TinyViT("learned-2d", TINY)
    tokens, mark, _ = make_batch(6, 2, torch.Generator().manual_seed(0))
    assert model(tokens, mark, 6).shape == (2, 4)
    assert model.table is not None and model.table.weight.shape == (9, 16)  # unchanged


def test_command_writes_table_json_and_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "r.json"  # folders are made, as posenc plot makes them
    argv = [
        "resolution",
        "--schemes",
        "rope2d",
        "rope-dinov3",
        "--grid",
        "3",
        "--steps",
        "2",
        "--dim",
        "16",
        "--examples",
        "8",
        "--json",
        str(out),
        "--plot",
        str(tmp_path / "figs" / "r.png"),
    ]
    assert main(argv) == 0
    assert "| rope2d |" in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert [r["scheme"] for r in record["results"]] == ["rope2d", "rope-dinov3"]
    assert (tmp_path / "figs" / "r.png").stat().st_size > 1000


def test_an_output_that_cannot_be_made_fails_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    argv = ["resolution", "--steps", "1", "--json", str(tmp_path / "file" / "r.json")]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["resolution", "--schemes", "rope"], "invalid choice"),
        (["resolution", "--grid", "0"], "expected a positive integer, got 0"),
        (["resolution", "--grid", "1"], "grid must be >= 2"),
        (["resolution", "--dim", "20"], "multiple of 4 * heads"),
        (["resolution", "--plot", "x.txt"], "must end in .png"),
    ],
)
def test_bad_settings_are_one_line_and_status_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_config_refuses_bad_values() -> None:
    with pytest.raises(PosencValueError, match="scales must be finite and >= 1"):
        StudyConfig(scales=(0.5,))
    with pytest.raises(PosencValueError, match="steps must be a positive integer"):
        StudyConfig(steps=0)


def test_docs_vision_vit_example_runs() -> None:
    import re

    text = (Path(__file__).resolve().parents[2] / "docs" / "vision.md").read_text()
    section = text.split("## A ViT with RoPE-Mixed in ten lines", 1)[1]
    (block,) = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], flags=re.S)
    assert len(block.strip().splitlines()) == 10
    namespace: dict[str, object] = {}
    exec(compile(block, "docs/vision.md ViT example", "exec"), namespace)
    assert namespace["out"].shape == (2, 196, 192)  # type: ignore[attr-defined]
    assert namespace["logits"].shape == (2, 1000)  # type: ignore[attr-defined]
