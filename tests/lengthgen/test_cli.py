"""``posenc lengthgen`` (``posenc.lengthgen.cli``): a sweep end to end, TOML settings and
their precedence, presets, and bad input (one line naming the argument and the value, before
any work); hypothesis fuzzes the TOML settings file."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import posenc
from posenc.lengthgen import cli as lg_cli
from posenc.lengthgen.evaluate import read_jsonl
from posenc.lengthgen.tasks import get_task
from posenc.lengthgen.train import build_model
from tests.commands import SUBPROCESS_ENV, assert_one_line_exit_2, run_main
from tests.fuzzing import examples
from tests.lengthgen.tiny import SHIPPED, TINY_CLI, run_cli
from tests.misuse import BadCommand, Misuse, check, check_command, commands


def test_cli_sweep_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "out"
    sweep = ["--task", "copy-v1,even-pairs", "--pe", "none,sinusoidal+random", "--seeds", "2",
             "--random-max", "32", "--out", str(out), *TINY_CLI]  # fmt: skip
    code = run_cli(sweep)
    assert code == 0
    records = read_jsonl(out / "results.jsonl")
    assert [(r["task"], r["label"], r["seed"]) for r in records] == [
        (t, p, s)
        for t in ("copy-v1", "even-pairs")
        for p in ("none", "sinusoidal+random")
        for s in (0, 1)
    ]
    rec = records[-1]
    assert rec["random_positions"] is True and rec["config"]["random_max"] == 32
    assert set(rec["in_distribution"]) == {"exact", "token"}
    assert [r["split"] for r in rec["lengths"]] == ["train"] * 5 + ["test"] * 2
    assert (out / "accuracy.png").stat().st_size > 0
    assert "| even-pairs |" in (out / "results.md").read_text()
    # the per-run record on disk is the same as the line in results.jsonl
    on_disk = json.loads(
        (out / "even-pairs" / "sinusoidal+random" / "seed1" / "result.json").read_text()
    )
    assert on_disk == rec
    # running again without --resume refuses; with --resume it reuses every finished run
    with pytest.raises(ValueError, match="pass --resume"):
        run_cli(["--task", "copy-v1", "--pe", "none", "--out", str(out), *TINY_CLI])
    assert run_cli([*sweep, "--resume"]) == 0
    assert read_jsonl(out / "results.jsonl") == records


def test_toml_config_and_precedence(tmp_path: Path) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text(
        'task = ["copy-v3"]\npe = "none,learned"\nseeds = [4, 7]\nsteps = 77\nlr = 0.002\n'
        "train_max_length = 9\n[pe_options.learned]\nmax_len = 512\n"
    )
    parser = argparse.ArgumentParser()
    lg_cli.add_subcommand(parser.add_subparsers())
    args = parser.parse_args(["lengthgen", "--config", str(path), "--lr", "0.003"])
    configs = lg_cli.build_configs(lg_cli.resolve_settings(args))
    assert [(c.pe, c.seed) for c in configs] == [
        ("none", 4),
        ("none", 7),
        ("learned", 4),
        ("learned", 7),
    ]
    assert {c.steps for c in configs} == {77} and {c.train_max_length for c in configs} == {9}
    assert {c.lr for c in configs} == {0.003}  # the command line wins over the file
    assert configs[2].pe_options == {"max_len": 512} and configs[0].pe_options == {}


def test_preset_kazemnejad() -> None:
    parser = argparse.ArgumentParser()
    lg_cli.add_subcommand(parser.add_subparsers())
    args = parser.parse_args(["lengthgen", "--preset", "kazemnejad", "--task", "copy-v1"])
    settings = lg_cli.resolve_settings(args)
    needed = {"none", "t5", "alibi", "rope", "sinusoidal"}
    missing = needed - set(posenc.available())
    if missing:
        with pytest.raises(ValueError, match="unknown positional encoding"):
            lg_cli.build_configs(settings)
        return
    configs = lg_cli.build_configs(settings)
    assert len(configs) == 18 and {c.task for c in configs} == {"copy-v1"}
    assert [c.label for c in configs[::3]] == [
        "none",
        "t5",
        "alibi",
        "rope",
        "sinusoidal",
        "learned",
    ]
    c = configs[0]
    assert (c.dim, c.depth, c.heads, c.steps, c.batch_size, c.lr) == (64, 2, 4, 1000, 64, 1e-3)
    assert (c.train_max_length, c.test_min_length, c.test_max_length) == (20, 21, 40)
    assert next(c.pe_options for c in configs if c.pe == "rope") == {"rotary_dim": 4}
    assert next(c.pe_options for c in configs if c.pe == "t5") == {"bidirectional": False}
    for c in configs[::3]:  # every encoding of the preset builds and reaches the test lengths
        c.validate()
        build_model(c, get_task(c.task))


def test_preset_options_follow_the_pe_list() -> None:
    """A preset's options for encodings the pe list leaves out are dropped; the user's own
    options for such encodings are still an error (a typo)."""
    parser = argparse.ArgumentParser()
    lg_cli.add_subcommand(parser.add_subparsers())
    argv = ["lengthgen", "--preset", "kazemnejad", "--pe", "rope+coupled"]
    settings = lg_cli.resolve_settings(parser.parse_args([*argv, "--pe-option", "rope.base=500"]))
    configs = lg_cli.build_configs(settings)
    assert {c.label for c in configs} == {"rope+coupled"} and len(configs) == 12
    assert configs[0].pe_options == {"rotary_dim": 4, "base": 500}
    settings = lg_cli.resolve_settings(parser.parse_args([*argv, "--pe-option", "alibi.x=1"]))
    with pytest.raises(ValueError, match="pe_options for alibi, which is not in the pe list"):
        lg_cli.build_configs(settings)
    argv = ["lengthgen", "--task", "copy-v1", "--pe", "rope+random+coupled,rope+random"]
    configs = lg_cli.build_configs(lg_cli.resolve_settings(parser.parse_args(argv)))
    assert [(c.label, c.random_positions, c.coupled_positions) for c in configs] == [
        ("rope+random+coupled", True, True),
        ("rope+random", True, False),
    ]


# --------------------------------------------------------------------------- bad input

NAN, INF = float("nan"), float("inf")

#: (arguments after a valid tiny sweep, error, the argument the message names, the value)
BAD_INPUT = [
    (["--task", "nope"], ValueError, "task", "nope"),
    (["--pe", "nope"], ValueError, "positional encoding", "nope"),
    (["--pe", "none+noise"], ValueError, "pe", "none+noise"),
    (["--pe", "none,,learned"], ValueError, "pe list", "none,,learned"),
    (["--pe", "none,none"], ValueError, "pe list", "none,none"),
    (["--seeds", "0"], ValueError, "seeds", 0),
    (["--seeds", "x"], ValueError, "seeds", "x"),
    (["--jobs", "0"], ValueError, "jobs", "0"),
    (["--train-lengths", "20"], ValueError, "--train-lengths", "20"),
    (["--test-lengths", "9-3"], ValueError, "--test-lengths", "9-3"),
    (["--steps", "0"], ValueError, "steps", 0),
    (["--heads", "3"], ValueError, "heads", 3),
    (["--warmup", "1.5"], ValueError, "warmup", 1.5),
    (["--pe", "none+random", "--random-max", "10"], ValueError, "random_max", 10),
    (["--pe-option", "rope"], ValueError, "--pe-option", "rope"),
    (["--pe", "none", "--pe-option", "learned.max_len=4"], ValueError, "pe_options", "learned"),
    (["--pe", "learned", "--pe-option", "learned.max_len=4"], ValueError, "max_len", 4),
    (["--pe", "learned", "--pe-option", "learned.bogus=1"], TypeError, "keyword argument", "bogus"),
    (["--config", "missing.toml"], ValueError, "--config", "missing.toml"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "error", "argument", "value"),
    [pytest.param(*row, id=" ".join(row[0])) for row in BAD_INPUT],
)
def test_bad_input(
    argv: list[str], error: type[Exception], argument: str, value: object, tmp_path: Path
) -> None:
    full = ["--task", "copy-v1", "--pe", "none", "--out", str(tmp_path / "o"), *TINY_CLI]
    check(Misuse(" ".join(argv), lambda: run_cli(full + argv), error, argument, value))
    assert not (tmp_path / "o" / "copy-v1").exists() or argument == "max_len"


@pytest.mark.parametrize(
    ("text", "error", "argument", "value"),
    [
        pytest.param("stepz = 3\n", ValueError, "training option", "stepz", id="unknown-key"),
        pytest.param("steps = 'many'\n", TypeError, "steps", "many", id="wrong-type"),
        pytest.param("steps = [\n", ValueError, "--config", "bad.toml", id="invalid-toml"),
        pytest.param("seed = 3\n", ValueError, "seed", 3, id="seed"),
    ],
)
def test_bad_toml(
    text: str, error: type[Exception], argument: str, value: object, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text)

    def call() -> object:
        return run_cli(["--config", str(bad), "--out", str(tmp_path / "o")])

    check(Misuse(text, call, error, argument, value))


BAD_COMMANDS = [
    BadCommand(["lengthgen", "--steps", "0"], "steps", 0),
    BadCommand(["lengthgen", "--steps", "1e3"], "--steps", "1e3"),
    BadCommand(["lengthgen", "--lr", "nan"], "lr", NAN),
    BadCommand(["lengthgen", "--weight-decay", "nan"], "weight_decay", NAN),
    BadCommand(["lengthgen", "--grad-clip", "inf"], "grad_clip", INF),
    BadCommand(["lengthgen", "--warmup", "nan"], "warmup", NAN),
    BadCommand(["lengthgen", "--dropout", "nan"], "dropout", NAN),
    BadCommand(["lengthgen", "--valid-threshold", "nan"], "valid_threshold", NAN),
    BadCommand(["lengthgen", "--pe", "nosuch"], "positional encoding", "nosuch"),
    BadCommand(["lengthgen", "--pe", "rope+foo"], "pe", "rope+foo"),
    BadCommand(["lengthgen", "--pe", "rope2d"], "pe", "rope2d"),
    BadCommand(["lengthgen", "--task", "nosuch"], "task", "nosuch"),
    BadCommand(["lengthgen", "--seeds", "100000000"], "seeds", 100000000),
    BadCommand(["lengthgen", "--seeds", "5000000000,1"], "seeds", "5000000000,1"),
    BadCommand(["lengthgen", "--jobs", "x"], "jobs", "x"),
    BadCommand(["lengthgen", "--train-lengths", "5-1"], "--train-lengths", "5-1"),
    BadCommand(["lengthgen", "--test-lengths", "21-100000"], "test_max_length", 100000),
    BadCommand(["lengthgen", "--pe-option", "rope"], "--pe-option", "rope"),
    BadCommand(["lengthgen", "--pe", "rope", "--pe-option", "rope.foo=1"], "keyword argument",
               "foo"),
    BadCommand(["lengthgen", "--pe", "alibi", "--pe-option", "alibi.causal=1"], "causal", "int"),
    BadCommand(["lengthgen", "--pe", "rope", "--pe-option", "rope.rotary_dim=3"], "rotary_dim",
               3),
    BadCommand(["lengthgen", "--pe", "rope", "--dim", "12", "--heads", "4"], "head_dim", 3),
    BadCommand(["lengthgen", "--pe", "learned", "--pe-option", "learned.max_len=8"], "max_len",
               8),
    BadCommand(["lengthgen", "--pe", "none+random", "--random-max", "5"], "random_max", 5),
    BadCommand(["lengthgen", "--threads", "-1"], "--threads", -1),
    BadCommand(["lengthgen", "--config", "missing.toml"], "--config", "missing.toml"),
]  # fmt: skip


@pytest.mark.parametrize("case", commands(BAD_COMMANDS))
def test_posenc_lengthgen_bad_arguments_exit_2_with_one_line_naming_them(
    case: BadCommand, stubbed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check_command(case, capsys)


def no_gpu(monkeypatch: pytest.MonkeyPatch, count: int = 0) -> None:
    """This machine as one with ``count`` CUDA devices and no MPS, whatever it has."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


DEVICE_COMMANDS = [
    (0, BadCommand(["lengthgen", "--device", "cuda"], "device", "cuda")),
    (1, BadCommand(["lengthgen", "--device", "cuda:7"], "device", "cuda:7")),
    (0, BadCommand(["lengthgen", "--device", "mps"], "device", "mps")),
    (0, BadCommand(["lengthgen", "--device", "gpu"], "device", "gpu")),
    (0, BadCommand(["lengthgen", "--precision", "fp16"], "precision", "fp16")),
]


@pytest.mark.parametrize(
    ("gpus", "case"), [pytest.param(g, c, id=" ".join(c.argv)) for g, c in DEVICE_COMMANDS]
)
def test_a_device_or_precision_this_machine_lacks_is_one_line_before_any_work(
    gpus: int,
    case: BadCommand,
    stubbed: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    no_gpu(monkeypatch, gpus)
    check_command(case, capsys)  # status 2, one line, the sweep (stubbed) never reached
    assert not (stubbed / lg_cli.DEFAULT_OUT).exists()


def test_device_and_precision_reach_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the flags and from a TOML file: every config carries the precision, the sweep
    gets the device, resolved."""
    import torch

    import posenc.lengthgen.train as train_module

    seen: dict[str, Any] = {}

    def fake_sweep(configs: list, out: Path, **options: Any) -> list:
        seen.update(configs=configs, **options)
        return []

    monkeypatch.setattr(train_module, "run_sweep", fake_sweep)
    monkeypatch.setattr(lg_cli, "write_outputs", lambda *a, **k: None)
    no_gpu(monkeypatch)
    argv = ["--task", "copy-v1", "--pe", "none,alibi", "--out", str(tmp_path / "o"), *TINY_CLI]
    assert run_cli([*argv, "--precision", "bf16", "--device", "cpu"]) == 0
    assert [c.precision for c in seen["configs"]] == ["bf16", "bf16"]
    assert seen["device"] == torch.device("cpu")
    toml = tmp_path / "sweep.toml"
    toml.write_text('device = "auto"\nprecision = "bf16"\n')
    assert run_cli([*argv, "--config", str(toml)]) == 0
    assert seen["device"] == torch.device("cpu")  # auto without a GPU
    assert {c.precision for c in seen["configs"]} == {"bf16"}
    toml.write_text('device = "cuda"\n')
    with pytest.raises(ValueError, match="device 'cuda': CUDA is not available"):
        run_cli([*argv, "--config", str(toml)])
    toml.write_text("device = 3\n")
    with pytest.raises(TypeError, match="device must be a string, got 3"):
        run_cli([*argv, "--config", str(toml)])


@pytest.mark.slow
def test_lengthgen_module_entry_point_one_line(tmp_path: Path) -> None:
    """``python -m posenc.lengthgen`` (the torchrun entry point) used to print argparse's
    usage block; a bad argument is now one line and status 2, as for ``posenc``."""
    done = subprocess.run(
        [sys.executable, "-m", "posenc.lengthgen", "--steps", "many"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=SUBPROCESS_ENV,
    )
    line = assert_one_line_exit_2(done.returncode, done.stderr)
    assert "--steps" in line and "'many'" in line


def test_list_tasks(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["--list-tasks"]) == 0
    out = capsys.readouterr().out
    for name in SHIPPED:
        assert name in out


# --------------------------------------------------------------------------- TOML fuzzing


def _toml_value(value: Any) -> str:
    """A minimal TOML writer for the values the fuzzer makes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f'"{k}" = {_toml_value(v)}' for k, v in value.items()) + "}"
    raise TypeError(value)


SCALARS = st.one_of(
    st.booleans(),
    st.integers(-3, 50),
    st.sampled_from([0, 10**9, 2**40]),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from(["", "none", "rope", "alibi,t5", "rope+random", "copy-v1", "auto", "x"]),
)
VALUES = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=3),
    st.dictionaries(st.sampled_from(["rope", "t5", "x"]),
                    st.dictionaries(st.sampled_from(["rotary_dim", "max_len", "causal", "bad"]),
                                    SCALARS, max_size=2), max_size=2),
)  # fmt: skip
KEYS = st.sampled_from(
    ["task", "pe", "seeds", "jobs", "out", "pe_options", "steps", "batch_size", "lr", "dim",
     "heads", "depth", "dropout", "warmup", "grad_clip", "weight_decay", "decay",
     "train_min_length", "train_max_length", "test_min_length", "test_max_length",
     "random_max", "eval_every", "valid_threshold", "seed", "random_positions", "device",
     "precision", "bogus"]
)  # fmt: skip


@settings(
    max_examples=examples(120),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    base=st.booleans(),
    changes=st.dictionaries(KEYS, VALUES, max_size=4),
)
# found by fuzzing: a width of 10^9 reached the allocator instead of a one-line error
@example(base=True, changes={"dim": 10**9})
@example(base=True, changes={"dim": 2**40, "pe": "learned"})
@example(base=True, changes={"test_max_length": 2**40})
@example(base=True, changes={"batch_size": 10**9, "train_max_length": 50})
def test_fuzz_lengthgen_toml_config(
    base: bool, changes: dict[str, Any], stubbed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Any TOML settings file (a valid sweep with some keys changed, or only drawn keys):
    either every run validates (and the stubbed sweep is reached) or one line and status 2;
    never a traceback, never a run started on a bad value."""
    valid = {"task": "copy-v1", "pe": ["none", "alibi"], "seeds": 2, "steps": 1, "dim": 16}
    config = {**(valid if base else {}), **changes}
    path = stubbed / "sweep.toml"
    text = "\n".join(f"{key} = {_toml_value(value)}" for key, value in config.items())
    path.write_text(text + "\n", encoding="utf-8")
    status, err = run_main(["lengthgen", "--config", str(path), "--no-progress"], capsys)
    event(f"status {status}")
    assert status in (2, "ran"), (text, status, err)
    assert "Traceback" not in err, (text, err)
    if status == 2:
        assert len(err.strip().splitlines()) == 1, (text, err)
    else:  # everything validated: no value that must be rejected got through
        for key in ("lr", "dropout", "warmup", "grad_clip", "weight_decay", "valid_threshold"):
            value = config.get(key)
            assert not (isinstance(value, float) and not math.isfinite(value)), (key, value)


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(text=st.text(max_size=60))
def test_fuzz_lengthgen_toml_text(
    text: str, stubbed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Arbitrary text as a settings file: invalid TOML is one line naming the file."""
    path = stubbed / "sweep.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    status, err = run_main(["lengthgen", "--config", str(path)], capsys)
    assert status in (2, "ran"), (text, status, err)
    assert "Traceback" not in err
    if status == 2:
        assert len(err.strip().splitlines()) == 1, (text, err)


def test_test_lengths_inside_the_trained_range_warn_once(
    stubbed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--test-lengths`` inside ``--train-lengths`` runs, with one warning line on stderr for
    the whole sweep (not one per run, not a Python warning's two lines)."""
    argv = ["lengthgen", "--train-lengths", "1-20", "--test-lengths", "5-10", "--pe",
            "none,alibi", "--seeds", "0,1", "--no-progress"]  # fmt: skip
    status, err = run_main(argv, capsys)
    assert status == "ran"
    warned = [line for line in err.splitlines() if "warning" in line.lower()]
    assert warned == [
        "posenc lengthgen: warning: test lengths 5-10 overlap the trained range 1-20: lengths "
        "5-10 are in distribution, so their accuracy does not measure length generalization"
    ], err
    status, err = run_main(["lengthgen", "--no-progress"], capsys)  # 1-20 against 21-40
    assert status == "ran" and "warning" not in err.lower(), err
