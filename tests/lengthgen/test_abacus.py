"""``posenc lengthgen --task add`` with Abacus positions: the task's sums against Python's
integers, ``--pe`` entries with ``+abacus``, the model against its parts written out, a tiny
run of ``abacus`` and ``fire+abacus``, refusals before any work, and the preset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.lengthgen.abacus import AbacusModel
from posenc.lengthgen.cli import PRESETS, build_configs, parse_pes
from posenc.lengthgen.config import TrainConfig
from posenc.lengthgen.evaluate import read_jsonl
from posenc.lengthgen.tasks import AddReversed, get_task
from tests.lengthgen import tiny
from tests.lengthgen.tiny import run_cli


def number(digits: list[int]) -> int:
    """The integer whose digits, least significant first, are ``digits``."""
    return int("".join(str(d) for d in reversed(digits)))


@pytest.mark.parametrize("length", [1, 2, 7, 40])
def test_add_is_reversed_digit_addition(length: int) -> None:
    task = get_task("add")
    rng = np.random.default_rng(length)
    for _ in range(20):
        x, y = task.sample(length, rng)
        assert len(x) == task.input_length(length) == 2 * length + 1 and x[length] == task.PLUS
        a, b = x[:length], x[length + 1 :]
        if length > 1:
            assert a[-1] != 0 and b[-1] != 0
        assert number(y) == number(a) + number(b) and len(y) in (length, length + 1)
        assert all(0 <= t <= 9 for t in y)


def test_pe_entries_with_abacus() -> None:
    assert parse_pes("abacus,fire+abacus,rope,rope+abacus+random") == [
        ("none", "", True),
        ("fire", "", True),
        ("rope", "", False),
        ("rope", "random", True),
    ]
    with pytest.raises(ValueError, match="names an encoding twice"):
        parse_pes("abacus,none+abacus")
    with pytest.raises(ValueError, match="suffixes"):
        parse_pes("fire+abacus+wrong")


def test_the_model_is_its_parts() -> None:
    torch.manual_seed(0)
    base = posenc.TransformerModel(16, 16, 1, 2, pe="fire", causal=True)
    abacus = posenc.Abacus(16, max_len=12, max_offset=3)
    with torch.no_grad():
        abacus.weight.normal_()
    model = AbacusModel(base, abacus, digit_tokens=range(10)).eval()
    tokens = torch.tensor([[12, 3, 4, 10, 5, 6, 13, 9, 0, 1]])
    index = torch.tensor([[0, 1, 2, 0, 1, 2, 0, 1, 2, 3]])
    x = base.embed(tokens) * base.scale + abacus.weight[index]
    assert_close(model(tokens), base.head(base.encoder(x)), atol=0, rtol=0)


def test_abacus_runs_train_and_are_recorded(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["--task", "add", "--pe", "abacus,fire+abacus", "--out", str(out), *tiny.TINY_CLI]
    argv += ["--train-lengths", "1-3", "--test-lengths", "4-5", "--steps", "3", "--no-plot"]
    assert run_cli(argv) == 0
    records = read_jsonl(out / "results.jsonl")
    assert [(r["label"], r["pe"], r["abacus"]) for r in records] == [
        ("abacus", "none", True),
        ("fire+abacus", "fire", True),
    ]
    assert all(np.isfinite(r["losses"]).all() for r in records)


def test_abacus_is_refused_before_any_work() -> None:
    with pytest.raises(ValueError, match=r"digit_tokens.*'copy-v3'"):
        TrainConfig(**tiny.TINY, task="copy-v3", abacus=True).validate()
    with pytest.raises(ValueError, match="abacus_offset"):
        TrainConfig(**tiny.TINY, task="add", abacus=True, abacus_offset=-1).validate()
    settings = {"task": "add", "pe": "none", "seeds": 1, "out": "x", "jobs": 1}
    settings |= {"pe_options": {}, "device": None, "abacus": True}
    with pytest.raises(ValueError, match="'abacus' is set per run"):
        build_configs(settings)


def test_the_preset_is_mcleishs_setting() -> None:
    preset = PRESETS["abacus"]
    assert preset["task"] == ["add"] and {"abacus", "fire+abacus"} <= set(preset["pe"])
    assert {"none", "rope", "fire"} <= set(preset["pe"])
    assert (preset["train_max_length"], preset["test_max_length"]) == (20, 100)
    config = TrainConfig(task="add", abacus=True, train_max_length=20, test_max_length=100)
    assert config.abacus_rows(AddReversed()) >= 101 + 100 + 1  # longest answer, offset, row 0
