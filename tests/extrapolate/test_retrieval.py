"""posenc.extrapolate.retrieval and the training needles: the windows hold the text, the
needle at its depth and the repeat (or a fresh needle) at the end; an exact copier scores
copy accuracy 1.0 and the bits it saves by hand; an untrained model scores about chance;
the numbers of a real model equal a float64 computation by hand; training windows carry
needles at the share asked, deterministically; bad settings exit 2 with one line."""

from __future__ import annotations

import argparse
import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from posenc.app.cli import main
from posenc.errors import PosencValueError
from posenc.extrapolate import cli as ex_cli
from posenc.extrapolate import train
from posenc.extrapolate.config import DEFAULT_PES, SCHEDULES, ExtrapolateConfig
from posenc.extrapolate.retrieval import (
    DEPTHS,
    RETRIEVAL_STREAM,
    check_retrieval,
    cue_len,
    needle_start,
    needle_windows,
    retrieval,
)
from posenc.extrapolate.windows import (
    Needles,
    add_needles,
    needle_rows,
    token_alphabet,
    train_batch,
)
from posenc.runs.trainer import optimizer_for
from tests.extrapolate.toys import Copier, tiny_model, toy_corpus, window_scores

V = 64
M = 8  # needle length: cue 2, 6 scored tokens


@pytest.fixture
def toy() -> tuple:
    rng = np.random.default_rng(11)
    valid = rng.integers(0, V, size=600).astype(np.uint16)
    token_bytes = np.ones(V, dtype=np.int64)
    return toy_corpus(valid, token_bytes), token_alphabet(valid, V)


def test_the_windows_hold_text_needle_and_repeat(toy: tuple) -> None:
    corpus, alphabet = toy
    n, trials = 32, 3
    for depth in (0.0, 0.5, 1.0):
        repeat, fresh = needle_windows(corpus.valid, alphabet, n, depth, M, trials)
        assert repeat.shape == fresh.shape == (trials, n + 1) and repeat.dtype == np.int64
        d = round(depth * (n + 1 - 2 * M))
        assert d == needle_start(depth, n, M)
        for i in range(trials):
            a = i * (len(corpus.valid) - n) // trials
            text = np.asarray(corpus.valid[a : a + n + 1], dtype=np.int64)
            needle, other = np.random.default_rng([RETRIEVAL_STREAM, n, i]).choice(
                alphabet, size=(2, M)
            )
            want = text.copy()
            want[d : d + M] = needle
            want[n + 1 - M :] = needle
            np.testing.assert_array_equal(repeat[i], want)
            want[n + 1 - M :] = other
            np.testing.assert_array_equal(fresh[i], want)
    assert needle_start(1.0, n, M) + M == n + 1 - M  # depth 1: just before the repeat
    assert [cue_len(m) for m in (4, 7, 8, 16, 32)] == [1, 1, 2, 4, 8]
    with pytest.raises(PosencValueError, match="at least 16 tokens"):
        needle_windows(corpus.valid, alphabet, 15, 0.5, M, 1)


def test_an_exact_copier_copies_everything_and_saves_what_the_logits_say(toy: tuple) -> None:
    corpus, alphabet = toy
    cue = cue_len(M)
    rows = retrieval(Copier(V, cue), corpus, [16, 32], train_len=16, needle_len=M, trials=3,
                     alphabet=alphabet, depths=(0.0, 0.5, 1.0))  # fmt: skip
    assert [(r["length"], r["depth"]) for r in rows] == [
        (n, d) for n in (16, 32) for d in (0.0, 0.5, 1.0)
    ]
    # Repeat: logit 5 on the right token of V: -ln p = ln(1 + (V - 1) e^-5). Fresh: no earlier
    # match, uniform: ln V.
    saved = (math.log(V) - math.log1p((V - 1) * math.exp(-5.0))) / math.log(2)
    for row in rows:
        assert row["copy_accuracy"] == 1.0
        assert row["bits_saved"] == pytest.approx(saved, rel=1e-6)
    # A model that avoids the copied token loses bits on the repeat: the sign flips.
    avoid = retrieval(Copier(V, cue, confidence=-5.0), corpus, [16], train_len=16,
                      needle_len=M, trials=2, alphabet=alphabet)  # fmt: skip
    lost = (math.log(V) - 5.0 - math.log(V - 1 + math.exp(-5.0))) / math.log(2)
    assert lost < 0
    for row in avoid:
        assert row["copy_accuracy"] == 0.0 and row["bits_saved"] == pytest.approx(lost, rel=1e-6)


def test_a_fresh_model_copies_at_about_chance(toy: tuple) -> None:
    corpus, alphabet = toy
    rows = retrieval(tiny_model(V), corpus, [16, 32], train_len=16, needle_len=M, trials=8,
                     alphabet=alphabet)  # fmt: skip
    accuracy = np.mean([r["copy_accuracy"] for r in rows])
    assert accuracy < 4 / len(alphabet)  # chance is 1 / 64
    assert abs(np.mean([r["bits_saved"] for r in rows])) < 0.5


def test_the_numbers_of_a_real_model_equal_a_computation_by_hand(toy: tuple) -> None:
    corpus, alphabet = toy
    model = tiny_model(V)
    n, trials, cue = 24, 3, cue_len(M)
    rows = retrieval(model, corpus, [n], train_len=16, needle_len=M, trials=trials,
                     alphabet=alphabet, depths=(0.2, 0.8), batch_tokens=50)  # fmt: skip
    for row, depth in zip(rows, (0.2, 0.8), strict=True):
        repeat, fresh = needle_windows(corpus.valid, alphabet, n, depth, M, trials)
        hits, saved = [], []
        for i in range(trials):
            loss_r, top = window_scores(model, repeat[i])
            loss_f, _ = window_scores(model, fresh[i])
            scored = slice(n - M + cue, n)  # targets repeat[i][n + 1 - M + cue :]
            hits += list(top[scored] == repeat[i][n + 1 - M + cue :])
            saved += list((loss_f[scored] - loss_r[scored]) / math.log(2))
        assert row["copy_accuracy"] == pytest.approx(np.mean(hits), abs=1e-12)
        assert row["bits_saved"] == pytest.approx(np.mean(saved), rel=1e-5, abs=1e-6)
    assert DEPTHS == (0.1, 0.3, 0.5, 0.7, 0.9)


def test_retrieval_needs_the_needle_twice_in_every_window() -> None:
    check_retrieval(8, [16, 64])
    with pytest.raises(
        PosencValueError, match=r"needle_len \(16\).*shortest evaluation length \(16\)"
    ):
        check_retrieval(16, [64, 16])
    with pytest.raises(PosencValueError, match="needle_len"):
        check_retrieval(3, [64])


def test_training_windows_carry_needles_at_the_share_asked() -> None:
    tokens = np.arange(5000) % 97  # text without a repeated 4-gram inside a window of 33
    alphabet = np.arange(97)
    needles = Needles(0.3, 4, alphabet)
    carried = 0
    for step in range(40):
        plain = train_batch(tokens, step, 8, 32, seed=1)  # (b, n + 1)
        batch = add_needles(plain, step, 1, needles)
        np.testing.assert_array_equal(batch, add_needles(plain, step, 1, needles))
        changed = [row for row in range(8) if not np.array_equal(batch[row], plain[row])]
        assert len(changed) == needle_rows(step, 8, 0.3)
        for row in changed:  # one 4-gram twice, the second after the first, nowhere else
            grams = [tuple(batch[row, i : i + 4]) for i in range(30)]
            twice = [g for g in set(grams) if grams.count(g) == 2]
            assert len(twice) == 1
            first, second = (i for i, g in enumerate(grams) if g == twice[0])
            assert second >= first + 4
        carried += len(changed)
    assert carried == math.floor(0.3 * 8 * 40) == 96
    assert not np.array_equal(add_needles(plain, 39, 2, needles), batch)  # seed matters
    np.testing.assert_array_equal(add_needles(plain, 0, 1, Needles(0.0, 4, alphabet)), plain)
    everything = add_needles(plain, 0, 1, Needles(1.0, 4, alphabet))
    assert all(not np.array_equal(everything[r], plain[r]) for r in range(8))
    with pytest.raises(PosencValueError, match="does not fit"):
        add_needles(plain, 0, 1, Needles(1.0, 17, alphabet))


def test_a_training_step_with_needles_trains_on_the_needled_windows(toy: tuple) -> None:
    corpus, _ = toy
    config = ExtrapolateConfig(pe="rope", dim=16, depth=1, heads=2, train_len=16, batch_size=4,
                               needle_share=0.5, needle_len=4)  # fmt: skip
    torch.manual_seed(0)
    model = train.build_model(config, V)
    before = copy.deepcopy(model)
    optimizer, scheduler = optimizer_for(model, config)
    needles = Needles(0.5, 4, token_alphabet(corpus.train, V))
    loss, _ = train.lm_step(model, optimizer, scheduler, corpus, 3, batch_size=4, length=16,
                            seed=0, grad_clip=1.0, needles=needles)  # fmt: skip
    windows = torch.from_numpy(add_needles(corpus.batch(3, 4, 16, 0), 3, 0, needles))
    with torch.no_grad():
        logits = before(windows[:, :-1])
    want = F.cross_entropy(logits.reshape(64, -1), windows[:, 1:].reshape(-1))
    assert loss == pytest.approx(float(want), rel=1e-5)


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["--needle-share", "1.5"], ["needle_share", "1.5"]),
        (["--needle-share", "nan"], ["needle_share", "nan"]),
        (["--needle-len", "3"], ["needle_len", "3"]),
        (["--needle-share", "0.5", "--needle-len", "40"], ["needle_len", "40", "train_len"]),
        (["--retrieval", "--needle-len", "40"], ["needle_len (40)", "shortest evaluation"]),
        (["--retrieval-trials", "0"], ["retrieval_trials", "0"]),
        (["--context-blocks", "-1"], ["context_blocks", "-1"]),
    ],
)
def test_bad_needle_settings_are_one_line_and_exit_2(
    argv: list[str], fragments: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text").mkdir()
    for i in range(30):
        (tmp_path / "text" / f"{i:02d}.txt").write_text(f"line {i} of some text\n" * 60)
    assert main(["extrapolate", "--text", str(tmp_path / "text"), "--eval-lens", "64", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert not (tmp_path / "extrapolate-results").exists()  # nothing was trained


def test_the_scale_preset_trains_with_needles_and_scores_retrieval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POSENC_MEMORY_BUDGET", "64G")  # a step needs ~5.4 GiB: checked, not run
    parser = argparse.ArgumentParser()
    ex_cli.add_subcommand(parser.add_subparsers())
    args = parser.parse_args(["extrapolate", "--preset", "scale"])
    settings = ex_cli.resolve_settings(args)
    configs, evaluation = ex_cli.build_configs(settings)
    assert [c.pe for c in configs] == [*DEFAULT_PES, *SCHEDULES]
    assert settings["out"].endswith("-scale")
    assert (configs[0].steps, configs[0].checkpoint_every, evaluation.batch_tokens) == (
        3000,
        0,
        32768,
    )
    config = configs[0]
    assert (config.dim, config.depth, config.heads, config.train_len) == (512, 8, 8, 256)
    assert (config.needle_share, config.needle_len, config.precision) == (0.5, 16, "bf16")
    assert evaluation.retrieval and evaluation.lengths(256) == [256, 512, 1024, 2048, 4096]
    check_retrieval(config.needle_len, evaluation.lengths(256))
    assert configs[1].validate() == 8192  # the learned table covers every window
    off = parser.parse_args(["extrapolate", "--preset", "scale", "--no-retrieval"])
    assert not ex_cli.build_configs(ex_cli.resolve_settings(off))[1].retrieval
    assert "--no-retrieval" in ex_cli.command_line(off)
