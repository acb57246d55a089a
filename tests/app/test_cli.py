"""The ``posenc`` command (``posenc.app.cli``): its output and files, and bad input: status 2,
one line naming the argument and the value, no traceback, no work done (table-driven,
in-process with the heavy work stubbed, and a few cases through the console script); then
hypothesis fuzzes the argument parsing with argv lists built from the real flags, real and
garbage values. The ``bench`` and ``lengthgen`` subcommands have their own tests in
``tests/bench/test_cli.py`` and ``tests/lengthgen/test_cli.py``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from matplotlib.image import imread

import posenc
from posenc.app.cli import main
from tests.commands import assert_one_line_exit_2, posenc_cli, run_main
from tests.fuzzing import examples
from tests.misuse import MISSING, BadCommand, check_command, commands
from tests.schemes import NAMES, SEQUENCE


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(posenc.available())
    for name in NAMES:
        (line,) = [line for line in lines if line.split()[0] == name]
        assert posenc.entry(name).family in line


def test_plot_help_names_the_kinds_each_scheme_supports(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``posenc plot --help`` lists, per scheme, the kinds a built module of it accepts (the
    default first), read from the registry without building anything."""
    from posenc.plots import build_for_plot, default_kind, kinds_for

    assert main(["plot", "--help"]) == 0
    out = capsys.readouterr().out
    shown = {
        line.split()[0]: line.split(None, 1)[1].split(", ")
        for line in out.split("kinds each scheme supports")[1].splitlines()[1:]
        if line.strip()
    }
    assert set(shown) == set(posenc.available())
    for name in NAMES:
        pe = build_for_plot(name)
        assert set(shown[name]) == set(kinds_for(pe)), name
        assert shown[name][0] == default_kind(pe), name


@pytest.mark.parametrize("kind", ["heatmap", "dims"])
@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_plot(tmp_path: Path, kind: str, suffix: str) -> None:
    target = tmp_path / f"pe.{suffix}"
    assert main(["plot", "sinusoidal", "--kind", kind, "--dim", "32", "-o", str(target)]) == 0
    assert target.stat().st_size > 1000


@pytest.mark.parametrize("name", NAMES)
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
    assert (
        main(["plot", "rope", "alibi", "sinusoidal", "--kind", "distance", "-o", str(target)]) == 0
    )
    assert imread(target).shape[1] > 3 * 300


def test_analyze_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "sinusoidal", "none", "--length", "16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["sinusoidal", "none"]
    assert rows[0]["translation_residual"] < 1e-12


def test_analyze_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "sinusoidal", "--length", "8"]) == 0
    assert "shift resid." in capsys.readouterr().out


def test_help_and_version_return_0_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("posenc ")
    assert main(["plot", "--help"]) == 0
    assert "--positions" in capsys.readouterr().out


# --------------------------------------------------------------------------- bad input


BAD_COMMANDS = [
    BadCommand(["plot", "nosuch", "-o", "x.png"], "positional encoding", "nosuch"),
    BadCommand(["plot", "sinusoidal", "--kind", "bars", "-o", "x.png"], "kind", "bars"),
    BadCommand(["plot", "sinusoidal", "--dim", "0", "-o", "x.png"], "--dim", 0),
    BadCommand(["plot", "sinusoidal", "--positions", "-3", "-o", "x.png"], "--positions", -3),
    BadCommand(["plot", "sinusoidal", "--positions", "ten", "-o", "x.png"], "--positions", "ten"),
    BadCommand(["plot", "sinusoidal", "--positions", "100000000", "-o", "x.png"], "--positions",
               100000000),
    BadCommand(["plot", "sinusoidal", "--dpi", "100000", "-o", "x.png"], "--dpi", 100000),
    BadCommand(["plot", "sinusoidal", "--heads", "x", "-o", "x.png"], "--heads", "x"),
    BadCommand(["plot", "sinusoidal", "-o", "x.txt"], "--output", "x.txt"),
    BadCommand(["plot", "sinusoidal"], "--output", MISSING),
    BadCommand(["plot", "sinusoidal", "-o", "/proc/posenc/x.png"], "--output", "/proc/posenc"),
    BadCommand(["plot", "rope", "--dim", "30", "-o", "x.png"], "dim", 30),
    BadCommand(["plot", "alibi", "--kind", "dims", "-o", "x.png"], "kind", "dims"),
    BadCommand(["plot", "learned", "--positions", "3000", "-o", "x.png"], "positions", 3000),
    BadCommand(["analyze", "--length", "0"], "--length", 0),
    BadCommand(["analyze", "--length", "99999999999999999999999"], "--length",
               99999999999999999999999),
    BadCommand(["analyze", "--seed", "abc"], "--seed", "abc"),
    BadCommand(["analyze", "--seed", "99999999999999999999999"], "--seed",
               99999999999999999999999),
    BadCommand(["analyze", "sinusoidal", "bogus"], "positional encoding", "bogus"),
    BadCommand(["tour", "--format", "gif"], "--format", "gif"),
    BadCommand(["report", "nosuch"], "positional encoding", "nosuch"),
    BadCommand(["frobnicate"], "COMMAND", "frobnicate"),
    BadCommand([], "COMMAND", MISSING),
]  # fmt: skip


@pytest.mark.parametrize("case", commands(BAD_COMMANDS))
def test_bad_arguments_exit_2_with_one_line_naming_them(
    case: BadCommand, stubbed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check_command(case, capsys)


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        ["plot", "sinusoidal", "--dpi", "100000", "-o", "x.png"],
        ["analyze", "--length", "99999999999999999999999"],
        ["analyze", "sinusoidal", "bogus"],
        ["plot", "sinusoidal", "-o", "/proc/posenc/x.png"],
    ],
)
def test_cli_subprocess_exit_2_one_line(argv: list[str], tmp_path: Path) -> None:
    """The console script itself (``python -m posenc.app.cli``), for the cases that used to end
    in a traceback."""
    done = posenc_cli(*argv, cwd=tmp_path, timeout=120)
    assert_one_line_exit_2(done.returncode, done.stderr)


# --------------------------------------------------------------------------- fuzzing

GARBAGE = st.sampled_from(
    ["", "0", "-1", "1", "3", "16", "x", "nan", "inf", "-inf", "1e3", "2.5", "99999999999999999999",
     "4097", "--", "-", "a,b", "1-2", "5-1", "rope", "alibi", "none+random", "\x00", "é", " "]
)  # fmt: skip
NAME_OR_GARBAGE = st.sampled_from([*NAMES, "nosuch", ""])
FLAG_VALUES: dict[str, list[st.SearchStrategy[str]]] = {
    "plot": [
        st.just("--kind"), st.sampled_from(["heatmap", "dims", "similarity", "distance", "heads",
                                            "spectrum", "decay", "grid", "bars"]),
        st.just("--positions"), st.sampled_from(["1", "8", "0", "-2", "4097", "x"]),
        st.just("--dim"), st.sampled_from(["1", "7", "12", "24", "0", "x"]),
        st.just("--heads"), st.sampled_from(["1", "2", "3", "0"]),
        st.just("--dpi"), st.sampled_from(["10", "20", "0", "5000"]),
        st.just("-o"), st.sampled_from(["x.png", "x.svg", "x.txt", "", "sub/x.png",
                                        "/proc/posenc/x.png"]),
    ],
    "analyze": [st.just("--length"), GARBAGE, st.just("--seed"), GARBAGE, st.just("--json")],
    "lengthgen": [
        st.sampled_from(["--steps", "--batch-size", "--lr", "--weight-decay", "--warmup",
                         "--grad-clip", "--dim", "--depth", "--heads", "--ffn-dim", "--dropout",
                         "--random-max", "--eval-every", "--test-samples", "--seeds", "--jobs",
                         "--train-lengths", "--test-lengths", "--pe", "--task", "--pe-option",
                         "--threads", "--decay", "--valid-threshold", "--out"]),
        GARBAGE,
    ],
    "bench": [st.sampled_from(["--repeats", "--threads", "--max-call-seconds", "--output"]),
              GARBAGE],
    "tour": [st.sampled_from(["--format", "--out"]), st.sampled_from(["png", "svg", "gif", ""])],
    "report": [st.sampled_from(["-o", "--results"]), GARBAGE],
    "list": [GARBAGE],
}  # fmt: skip


#: A valid call of each command (cheap: plots are small, heavy work is stubbed).
VALID: dict[str, Callable[[str], list[str]]] = {
    "plot": lambda name: ["plot", name, "--positions", "8", "--dpi", "20", "-o", "fuzz.png"],
    "analyze": lambda name: ["analyze", name, "--length", "4", "--json"],
    "lengthgen": lambda name: ["lengthgen", "--pe", name, "--steps", "1", "--no-progress"],
    "list": lambda name: ["list"],
    "bench": lambda name: ["bench", "--quick", "rope"],
    "tour": lambda name: ["tour", "--out", "tour"],
    "report": lambda name: ["report", name, "-o", "report.html"],
}


@st.composite
def argvs(draw: st.DrawFn) -> list[str]:
    """A third valid calls, a third valid calls with one token replaced or one flag and value
    inserted, a third flags and values drawn at random."""
    mode = draw(st.sampled_from(["valid", "mutated", "random"]))
    command = draw(st.sampled_from(sorted(VALID)))
    if mode != "random":
        name = draw(st.sampled_from(SEQUENCE if command == "lengthgen" else NAMES))
        argv = VALID[command](name)
        if mode == "mutated":
            pieces = FLAG_VALUES[command]
            if draw(st.booleans()):
                argv[draw(st.integers(0, len(argv) - 1))] = draw(st.one_of(GARBAGE, *pieces))
            else:
                where = draw(st.integers(1, len(argv)))
                argv[where:where] = [draw(st.one_of(*pieces)), draw(GARBAGE)]
        return argv
    command = draw(st.sampled_from([*FLAG_VALUES, "frobnicate", "--version", ""]))
    argv = [command] if command else []
    if command in ("plot", "analyze", "report"):
        argv += draw(st.lists(NAME_OR_GARBAGE, max_size=2))
    pieces = FLAG_VALUES.get(command, [GARBAGE])
    for _ in range(draw(st.integers(0, 4))):
        argv.append(draw(st.one_of(*pieces)))
    return argv


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(argv=argvs())
def test_fuzz_cli_arguments(
    argv: list[str], stubbed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Any argv: status 0 (or the stubbed work reached) or 2, and on 2 exactly one line on
    stderr; never a traceback."""
    status, err = run_main(argv, capsys)
    event(f"{argv[0] if argv else '(none)'}: status {status}")
    assert status in (0, 2, "ran"), (argv, status, err)
    assert "Traceback" not in err, (argv, err)
    if status == 2:
        assert len(err.strip().splitlines()) == 1, (argv, err)


def test_a_closed_pipe_ends_the_command_quietly() -> None:
    """``posenc list | head``: once the reader has gone, the command stops with the shell's
    status for a closed pipe (141) and no traceback."""
    import os
    import subprocess
    import sys

    from tests.commands import SUBPROCESS_ENV

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    try:
        done = subprocess.run(
            [sys.executable, "-m", "posenc.app.cli", "list"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            env=SUBPROCESS_ENV,
        )
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr
