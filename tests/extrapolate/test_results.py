"""posenc extrapolate end to end on a tiny corpus: results.json follows the schema of the issue,
results.md and the figure are written, ``posenc report`` includes them, and the checks of
Press et al. / Peng et al. read the numbers they claim to."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.figure import Figure

from posenc.app.cli import main
from posenc.extrapolate.plots import plot_extrapolation
from posenc.extrapolate.results import (
    check_results,
    markdown_report,
    press_checks,
    read_results,
)
from posenc.extrapolate.summary import run_label

TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--batch-size", "4", "--train-len", "8",
        "--threads", "1", "--no-progress"]  # fmt: skip


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "cache"))


def write_text(root: Path, files: int = 40, nbytes: int = 1500) -> Path:
    rng = np.random.default_rng(0)
    words = ["def", "return", "value", "naïve", "x", "\n", "    ", "(", ")", ":"]
    for i in range(files):
        path = root / f"doc{i:03d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(" ".join(rng.choice(words, size=nbytes // 4)), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POSENC_CACHE_DIR", str(root / "cache"))
        argv = ["extrapolate", "--text", str(write_text(root / "text")), "--pe", "rope,learned",
                "--steps", "3", "--eval-lens", "8,16,32", "--pe-option", "learned.max_len=16",
                "--finetune-steps", "2", "--out", str(root / "out"), "--retrieval",
                "--needle-len", "4", "--needle-share", "0.5", "--retrieval-trials", "2",
                "--context-blocks", "8", *TINY]  # fmt: skip
        assert main(argv) == 0
    return root / "out"


def test_results_json_follows_the_schema(sweep: Path) -> None:
    results = json.loads((sweep / "results.json").read_text())
    check_results(results)
    assert set(results) == {"config", "corpus", "runs"}
    assert set(results["corpus"]) == {"name", "sha256", "tokenizer", "train_tokens", "valid_tokens"}
    assert results["corpus"]["name"] == "text" and results["corpus"]["tokenizer"] == "bytes"
    config = results["config"]
    assert config["eval_lens"] == [8, 16, 32] and config["train_len"] == 8
    assert config["pe"] == ["rope", "learned"] and config["seeds"] == [0]
    assert config["eval_tokens"] % 32 == 0 and config["eval_tokens"] > 0
    assert (config["needle_share"], config["needle_len"], config["retrieval"]) == (0.5, 4, True)
    assert (config["context_blocks"], config["retrieval_trials"]) == (8, 2)
    runs = results["runs"]
    labels = [run_label(run, 8) for run in runs]
    assert labels == ["rope", "rope+linear", "rope+dynamic", "rope+yarn",
                      "rope+linear ft2@32", "rope+yarn ft2@32", "learned"]  # fmt: skip
    for run in runs:
        assert set(run) == {"pe", "scaling", "finetune_steps", "seed", "skipped_lengths", "eval",
                            "by_context", "retrieval"}  # fmt: skip
        # contexts 0, 2, 4, 8, 16, 32 before blocks of T = 4 (learned: windows up to 16)
        want = ["0", "2", "4", "8"] if run["pe"] == "learned" else ["0", "2", "4", "8", "16", "32"]
        assert list(run["by_context"]) == want
        assert all(0 < v < 16 for v in run["by_context"].values())
        usable = [row["length"] for row in run["eval"]]
        assert [(r["length"], r["depth"]) for r in run["retrieval"]] == [
            (n, d) for n in usable for d in (0.1, 0.3, 0.5, 0.7, 0.9)
        ]
        for row in run["retrieval"]:
            assert 0 <= row["copy_accuracy"] <= 1 and math.isfinite(row["bits_saved"])
        for row in run["eval"]:
            assert set(row) == {"length", "factor", "bpb", "by_position"}
            assert math.isfinite(row["bpb"]) and 0 < row["bpb"] < 16
            assert list(row["by_position"])[-1].endswith(f"-{row['length']}")
    rope, linear, dynamic, yarn, tuned_linear, tuned_yarn, learned = runs
    assert rope["scaling"] is None and [r["factor"] for r in rope["eval"]] == [None] * 3
    assert linear["scaling"] == {"rope_type": "linear"}
    assert [r["factor"] for r in linear["eval"]] == [1.0, 2.0, 4.0]
    assert dynamic["scaling"] == {
        "rope_type": "dynamic",
        "factor": 1.0,
        "original_max_position_embeddings": 8,
    }
    assert yarn["scaling"] == {"rope_type": "yarn", "original_max_position_embeddings": 8}
    assert tuned_linear["finetune_steps"] == 2
    assert tuned_linear["scaling"] == {"rope_type": "linear", "factor": 4.0}
    assert [r["factor"] for r in tuned_yarn["eval"]] == [4.0] * 3
    assert rope["eval"][0]["bpb"] == linear["eval"][0]["bpb"]  # factor 1 changes nothing
    for c in ("0", "2", "4"):  # windows c + 4 <= L: factor 1 there too
        assert rope["by_context"][c] == linear["by_context"][c]
    assert rope["by_context"]["32"] != linear["by_context"]["32"]
    assert rope["retrieval"][:5] == linear["retrieval"][:5]  # length 8 = L
    # The learned table holds 16 positions: length 32 is skipped and recorded.
    assert learned["skipped_lengths"] == [32] and [r["length"] for r in learned["eval"]] == [8, 16]
    assert rope["skipped_lengths"] == []
    # Every checkpoint is there, and each training record too.
    for folder in ("rope/seed0", "learned/seed0", "rope/seed0/finetune-linear-32"):
        assert (sweep / folder / "checkpoint.pt").is_file()
        assert json.loads((sweep / folder / "result.json").read_text())["steps"] in (2, 3)


def test_results_md_figure_and_report(sweep: Path, tmp_path: Path) -> None:
    text = (sweep / "results.md").read_text()
    assert "| encoding | 8 | 16 | 32 |" in text and "| learned |" in text
    assert "![bits per byte against evaluation length](extrapolate.png)" in text
    assert "posenc extrapolate --pe rope,learned --retrieval" in text
    assert (sweep / "extrapolate.png").stat().st_size > 10_000
    assert (sweep / "retrieval.png").stat().st_size > 10_000
    assert "![copy accuracy by needle depth and window length](retrieval.png)" in text
    assert "| encoding | c=0 | c=2 | c=4 | c=8 | c=16 | c=32 |" in text
    assert "| learned | " in text.split("(context gain)")[1]
    assert "| rope+yarn | 0.9 |" in text.split("Copy accuracy:\n")[1]
    assert "*and* the position index p" in text  # what the position buckets mix
    assert isinstance(plot_extrapolation(read_results(sweep)), Figure)
    # Run again with --resume: nothing is trained again, the numbers are the same.
    before = json.loads((sweep / "results.json").read_text())
    # posenc report --results DIR inlines the table and the figure.
    import posenc.app.report

    html = posenc.app.report._results_section(sweep)
    assert "Train short, test long" in html and "data:image/png;base64," in html
    assert before == read_results(sweep)


def test_a_broken_results_file_is_named() -> None:
    good = {
        "config": {"train_len": 8},
        "corpus": {"name": "a", "sha256": "b", "tokenizer": "bytes", "train_tokens": 1,
                   "valid_tokens": 1},
        "runs": [{"pe": "rope", "scaling": None, "finetune_steps": 0, "seed": 0,
                  "skipped_lengths": [], "eval": [{"length": 16, "factor": None, "bpb": 2.0,
                                                   "by_position": {"0-8": 1.0, "8-16": 3.0}}]}],
    }  # fmt: skip
    check_results(good)
    bad_bucket = json.loads(json.dumps(good))
    bad_bucket["runs"][0]["eval"][0]["by_position"] = {"0-8": 1.0}
    with pytest.raises(ValueError, match=r"runs\[0\]\.eval\[0\]"):
        check_results(bad_bucket)
    extra = json.loads(json.dumps(good))
    extra["runs"][0]["label"] = "rope"
    with pytest.raises(ValueError, match=r"runs\[0\]"):
        check_results(extra)
    measured = json.loads(json.dumps(good))
    measured["runs"][0]["by_context"] = {"0": 2.5, "8": 2.25}
    measured["runs"][0]["retrieval"] = [
        {"length": 16, "depth": 0.5, "copy_accuracy": 0.75, "bits_saved": -0.5}
    ]
    check_results(measured)
    for key, bad in (
        ("by_context", {"c0": 2.5}),
        ("by_context", {"0": math.nan}),
        ("retrieval", [{"length": 16, "depth": 0.5, "copy_accuracy": 1.5, "bits_saved": 1.0}]),
        ("retrieval", [{"length": 16, "depth": 0.5, "copy_accuracy": 0.5}]),
    ):
        broken = json.loads(json.dumps(measured))
        broken["runs"][0][key] = bad
        with pytest.raises(ValueError, match=rf"runs\[0\]\.{key}"):
            check_results(broken)


def synthetic(curves: dict[str, list[float]], positions: dict[str, float] | None = None) -> dict:
    """Results with one run per label (``pe`` or ``pe+scaling``) at lengths 8..128."""
    lengths = [8, 16, 32, 64, 128]
    runs: list[dict[str, Any]] = []
    for label, values in curves.items():
        pe, _, rope_type = label.partition("+")
        tuned = " ft" in rope_type
        rope_type = rope_type.split(" ")[0]
        scaling = None
        if rope_type:
            scaling = {"rope_type": rope_type, **({"factor": 4.0} if tuned else {})}
        rows = [
            {"length": n, "factor": None, "bpb": v, "by_position": {f"0-{n}": v}}
            for n, v in zip(lengths, values, strict=True)
        ]
        if pe == "sinusoidal" and positions:
            rows[1]["by_position"] = positions
        runs.append(
            {
                "pe": pe,
                "scaling": scaling,
                "finetune_steps": 10 if tuned else 0,
                "seed": 0,
                "skipped_lengths": [],
                "eval": rows,
            }
        )
    return {
        "config": {"train_len": 8, "steps": 1, "batch_size": 1, "dim": 1, "depth": 1, "heads": 1},
        "corpus": {
            "name": "toy",
            "sha256": "0" * 64,
            "tokenizer": "bytes",
            "train_tokens": 1,
            "valid_tokens": 1,
        },
        "runs": runs,
    }


def test_the_checks_read_the_numbers_they_state() -> None:
    results = synthetic(
        {
            "sinusoidal": [2.0, 3.5, 5.0, 6.0, 7.0],
            "alibi": [2.0, 1.95, 1.9, 1.9, 1.9],
            "rope": [2.0, 2.2, 2.6, 3.0, 3.5],
            "rope+linear": [2.0, 2.5, 3.0, 3.5, 4.0],
            "rope+yarn": [2.0, 2.1, 2.4, 2.9, 3.6],
            "rope+dynamic": [2.0, 2.15, 2.5, 2.8, 3.2],
            "rope+linear ft10": [2.0, 2.0, 2.1, 2.5, 3.0],
            "t5": [2.0, 2.1, 2.3, 2.5, 2.7],
        },
        positions={"0-8": 2.0, "8-16": 3.1},
    )
    checks = {c["statement"].split(":")[0].split(" ")[0]: c for c in press_checks(results)}
    verdicts = [c["holds"] for c in press_checks(results)]
    assert verdicts == [True, True, True, True, True, True, True]
    assert "ratio 1.55" in checks["sinusoidal"]["numbers"]
    results["runs"][1]["eval"][-1]["bpb"] = 2.01  # alibi worse at 16L than at L
    results["runs"][4]["eval"][3]["bpb"] = 3.1  # yarn above rope at 64, but dynamic below
    results["runs"][5]["eval"][4]["bpb"] = 3.7  # both above rope at 128
    verdicts = [c["holds"] for c in press_checks(results)]
    assert verdicts == [True, False, True, False, True, True, True]
    only = synthetic({"alibi": [2.0, 2.0, 2.0, 2.0, 2.0]})
    assert [c["holds"] for c in press_checks(only)] == [None, True, None, None, None, None, None]
    text = markdown_report(results)
    assert "**does not hold**" in text and "**not measured**" not in text


def test_checks_without_their_lengths_are_not_measured() -> None:
    """A check whose lengths were not evaluated (L left out of ``--eval-lens``, or one label
    short of a length) reads "not measured", and the others still read their numbers."""
    results = synthetic(
        {
            "alibi": [2.0, 1.95, 1.9, 1.9, 1.9],
            "rope": [2.0, 2.2, 2.6, 3.0, 3.5],
            "rope+linear": [2.0, 2.5, 3.0, 3.5, 4.0],
            "rope+yarn": [2.0, 2.1, 2.4, 2.9, 3.6],
            "t5": [2.0, 2.1, 2.3, 2.5, 2.7],
        }
    )
    for run in results["runs"]:
        run["eval"] = [row for row in run["eval"] if row["length"] != 8]  # no L = 8
    results["runs"][3]["eval"].pop()  # yarn not at 128
    checks = press_checks(results)
    verdicts = [c["holds"] for c in checks]
    assert verdicts == [None, None, None, None, True, None, True]
    assert "t5 at 8: not measured" in checks[-1]["numbers"]
    text = markdown_report(results)
    assert "alibi: bits per byte at 128 no worse than at 8: **not measured**" in text


def test_eval_lens_without_the_training_length(tmp_path: Path) -> None:
    """``--eval-lens`` leaving out L: the command finishes (it crashed formatting a missing
    number) and writes results.md, whose checks that need L read "not measured"."""
    out = tmp_path / "out"
    argv = ["extrapolate", "--text", str(write_text(tmp_path / "text", files=20)),
            "--pe", "rope,alibi,t5", "--steps", "2", "--eval-lens", "16,32",
            "--out", str(out), *TINY]  # fmt: skip
    assert main(argv) == 0
    text = (out / "results.md").read_text()
    assert "alibi: bits per byte at 32 no worse than at 8: **not measured**" in text
    assert "t5 at 8: not measured" in text
    assert (out / "extrapolate.png").stat().st_size > 10_000
