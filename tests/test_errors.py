"""posenc's error classes, the memory budget, and how the command tells a caller's mistake
(one line, status 2) from a bug in posenc (its traceback, status 1)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import posenc
from posenc.app.cli import main
from posenc.errors import (
    ENV_VAR,
    MemoryBudgetError,
    PosencError,
    PosencTypeError,
    PosencValueError,
    check_bytes,
    get_memory_budget,
    parse_bytes,
    physical_memory,
    set_memory_budget,
)
from tests.misuse import Misuse, check

ROOT = Path(posenc.__file__).resolve().parents[1]  # the folder that holds posenc


@pytest.fixture
def budget() -> Iterator[None]:
    """Restore the budget a test changes."""
    yield
    set_memory_budget(None)


def test_error_classes_are_the_builtin_ones_too() -> None:
    assert issubclass(PosencValueError, ValueError) and issubclass(PosencValueError, PosencError)
    assert issubclass(PosencTypeError, TypeError) and issubclass(PosencTypeError, PosencError)
    assert issubclass(MemoryBudgetError, PosencValueError)
    check(Misuse("dim-zero", lambda: posenc.sinusoidal_table(4, 0), ValueError, "dim", 0))


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1536", 1536), ("512M", 512 << 20), ("2G", 2 << 30), ("1.5GiB", 3 << 29), ("3k", 3072)],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1G", "2X", "0"])
def test_parse_bytes_refuses_naming_the_variable(text: str) -> None:
    with pytest.raises(PosencValueError, match=ENV_VAR):
        parse_bytes(text)


def test_budget_comes_from_function_then_environment_then_machine(
    budget: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, "3G")
    assert get_memory_budget() == 3 << 30
    set_memory_budget("1M")
    assert get_memory_budget() == 1 << 20
    set_memory_budget(12345)
    assert get_memory_budget() == 12345
    set_memory_budget(None)
    assert get_memory_budget() == 3 << 30
    monkeypatch.delenv(ENV_VAR)
    assert get_memory_budget() == physical_memory() > 0


@pytest.mark.parametrize(
    ("value", "error", "shown"),
    [
        (0, PosencValueError, 0),
        (1.5, PosencTypeError, "float"),
        (True, PosencTypeError, "bool"),
        ("many", PosencValueError, "many"),
    ],
)
def test_set_memory_budget_refuses_bad_values(
    budget: None, value: object, error: type[Exception], shown: object
) -> None:
    call = lambda: set_memory_budget(value)  # type: ignore[arg-type]  # noqa: E731
    check(Misuse(str(value), call, error, "nbytes", shown))


def test_check_bytes_names_argument_value_and_bytes(budget: None) -> None:
    set_memory_budget("1K")
    check_bytes("n", 3, 1024)  # at the budget: fine
    with pytest.raises(MemoryBudgetError) as info:
        check_bytes("n", 3, 3 * 1024**3)
    assert str(info.value).startswith("n=3 would need 3.0 GiB, more than the memory budget")
    check_bytes("n", 3, 3 * 1024**3, device="meta")  # meta tensors hold no memory


def test_a_lower_budget_refuses_what_the_machine_would_allow(budget: None) -> None:
    posenc.sinusoidal_table(1000, 64)
    set_memory_budget("1M")
    check(
        Misuse(
            "over",
            lambda: posenc.sinusoidal_table(10_000, 64),
            MemoryBudgetError,
            "num_positions x dim",
            "10000 x 64",
        )
    )
    set_memory_budget(None)
    assert torch.equal(
        posenc.sinusoidal_table(10_000, 64)[:1000], posenc.sinusoidal_table(1000, 64)
    )


def test_meta_modules_are_exempt() -> None:
    """A model built on the meta device allocates nothing, whatever its size."""
    with torch.device("meta"):
        pe = posenc.LearnedPositionalEncoding(64, max_len=10**10)
        model = posenc.TransformerModel(10**8, 64, 2, 4)
    assert pe.weight.is_meta and pe.weight.shape == (10**10, 64)
    assert model.embed.weight.is_meta
    table = posenc.sinusoidal_table(10**9, 64, device="meta")
    assert table.is_meta and table.shape == (10**9, 64)


def test_over_budget_command_is_one_line_and_status_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv(ENV_VAR, "1M")
    status = main(["plot", "rope", "--positions", "4096", "-o", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.strip().splitlines()) == 1
    assert "would need" in err and "memory budget of 1.0 MiB" in err
    assert not (tmp_path / "x.png").exists()


# --------------------------------------------------------------------------- faults

#: A registered scheme whose ``encode`` raises what the test asks for, then the command.
FAULTY = """
import sys
import posenc
from posenc.app.cli import main
from posenc.errors import PosencValueError


@posenc.register("faulty", "raises on purpose")
class Faulty(posenc.AdditiveEncoding):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        self.dropout = posenc.NoPE()

    @classmethod
    def for_model(cls, dim, num_heads, **kw):
        return cls(dim)

    def encode(self, positions, dtype):
        raise {error}


sys.exit(main(["plot", "faulty", "--kind", "heatmap", "-o", "x.png"]))
"""


def _run_faulty(error: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FAULTY.format(error=error))],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"},
    )


@pytest.mark.slow
def test_a_bug_in_a_scheme_keeps_its_traceback_and_exits_1(tmp_path: Path) -> None:
    """A plain TypeError from posenc's (here: a scheme's) own code is a bug, not the user's
    mistake: Python's traceback, naming the faulty line, and status 1."""
    done = _run_faulty("TypeError('unsupported operand: a bug')", tmp_path)
    assert done.returncode == 1, done.stderr
    assert "Traceback (most recent call last)" in done.stderr
    assert "in encode" in done.stderr and "TypeError: unsupported operand: a bug" in done.stderr


@pytest.mark.slow
def test_a_validation_error_in_a_scheme_is_one_line_and_exits_2(tmp_path: Path) -> None:
    done = _run_faulty("PosencValueError('positions must be even, got 3')", tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "posenc: error: positions must be even, got 3"


def test_an_os_error_without_a_path_is_a_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    """An OSError that names no file did not come from a path the user gave: it propagates."""

    def broken(args: object) -> int:
        raise OSError("device not ready")

    monkeypatch.setattr("posenc.app.cli.cmd_list", broken)
    with pytest.raises(OSError, match="device not ready"):
        main(["list"])
