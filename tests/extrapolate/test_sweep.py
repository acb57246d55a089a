"""A ``posenc extrapolate`` sweep (``posenc.extrapolate.sweep``), with the training of each run
replaced by a recording stand-in: the folders are ``<pe>/seed<k>`` (and ``finetune-<type>-<n>``
inside), two runs may not share one, the lengths must fit the corpus, a started run needs
``resume``, results come back in the order of the configs, and each finished run is logged
with its curve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from posenc.errors import PosencValueError
from posenc.extrapolate import sweep
from posenc.extrapolate.config import EvalSettings, ExtrapolateConfig
from posenc.extrapolate.corpus import Corpus, prepare_corpus
from posenc.runs.checkpoint import CHECKPOINT
from tests.extrapolate.corpora import many_small, own_cache

SMALL = {"dim": 16, "depth": 1, "heads": 2, "train_len": 8, "steps": 2}


@pytest.fixture
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Corpus:
    own_cache(tmp_path, monkeypatch)
    many_small(tmp_path / "text", 40)
    return prepare_corpus(tmp_path / "text")


class Console:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, line: str) -> None:
        self.lines.append(line)


def fake_run_one(config: ExtrapolateConfig, corpus: Corpus, settings: EvalSettings,
                 run_dir: Path, **kwargs: Any) -> dict[str, Any]:  # fmt: skip
    lengths = settings.lengths(config.train_len)
    curve = [{"length": n, "bpb": 1.0 + n / 100} for n in lengths]
    timing = {"pe": config.pe, "seed": config.seed, "train_seconds": 12.3,
              "eval_seconds": 4.0, "run_dir": str(run_dir)}  # fmt: skip
    return {"runs": [{"pe": config.pe, "eval": curve}], "timing": timing}


def test_folders_are_named_after_the_encoding_and_seed(tmp_path: Path) -> None:
    run_dir = sweep.run_dir_for(tmp_path, ExtrapolateConfig(pe="rope", seed=3))
    assert run_dir == tmp_path / "rope" / "seed3"
    assert sweep.finetune_dir(run_dir, "yarn", 512) == run_dir / "finetune-yarn-512"


def test_the_sweep_checks_before_any_work(corpus: Corpus, tmp_path: Path) -> None:
    settings = EvalSettings(eval_lens=[8, 16])
    configs = [ExtrapolateConfig(pe=pe, **SMALL) for pe in ("rope", "alibi")]
    dirs = sweep.check_sweep(configs, corpus, settings, tmp_path / "out")
    assert dirs == [tmp_path / "out" / "rope" / "seed0", tmp_path / "out" / "alibi" / "seed0"]
    with pytest.raises(PosencValueError, match="would share the folder"):
        sweep.check_sweep(configs + configs[:1], corpus, settings, tmp_path / "out")
    too_long = EvalSettings(eval_lens=[8, len(corpus.valid)])
    with pytest.raises(PosencValueError, match="validation tokens"):
        sweep.check_sweep(configs, corpus, too_long, tmp_path / "out")
    assert sweep.eval_tokens(corpus, [8, 16], settings) % 16 == 0


def test_results_come_back_in_order_and_are_logged(
    corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep, "run_one", fake_run_one)
    configs = [ExtrapolateConfig(pe="rope", seed=s, **SMALL) for s in (2, 0, 1)]
    console = Console()
    out = tmp_path / "out"
    results = sweep.run_sweep(configs, corpus, EvalSettings(eval_lens=[8, 16]), out,
                              console=console)  # fmt: skip
    assert [r["timing"]["run_dir"] for r in results] == [
        str(out / "rope" / f"seed{s}") for s in (2, 0, 1)
    ]
    assert console.lines[0] == (
        "done: rope seed 2: bits per byte 8: 1.080, 16: 1.160; train 12 s, eval 4 s"
    )
    assert len(console.lines) == 3
    sweep.log_done(None, results[0])  # no console: nothing to do
    sweep.log_done(console, {})  # another rank's empty result
    assert len(console.lines) == 3


def test_a_started_run_needs_resume(
    corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep, "run_one", fake_run_one)
    configs = [ExtrapolateConfig(pe="rope", **SMALL)]
    started = tmp_path / "out" / "rope" / "seed0"
    started.mkdir(parents=True)
    (started / CHECKPOINT).write_bytes(b"")
    settings = EvalSettings(eval_lens=[8, 16])
    with pytest.raises(PosencValueError, match="pass --resume to continue"):
        sweep.run_sweep(configs, corpus, settings, tmp_path / "out")
    assert len(sweep.run_sweep(configs, corpus, settings, tmp_path / "out", resume=True)) == 1
