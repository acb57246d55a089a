"""Misuse cases: a call with one bad argument, and what its error must say.

Every bad input gets a ``PosencValueError`` or ``PosencTypeError`` (posenc's own classes, so
the command reports it in one line; subclasses of ``ValueError`` / ``TypeError``, so callers
can catch the built-in ones), raised before any work. Its message must name the argument and
show the bad value: two checks, on the argument's name and on the value's ``repr`` or
``str``, so that rewording the rest of the sentence breaks no test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pytest

from posenc.errors import PosencError


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: The value of an argument that was required and not given.
MISSING = _Missing()


@dataclass(frozen=True)
class Misuse:
    """One bad call and what its error must say."""

    id: str
    call: Callable[[], object]
    error: type[Exception]
    #: The argument's name as the message spells it (``positions``, ``'factor'``, ``--dpi``).
    argument: str
    #: The bad value: the message must show its ``repr`` or its ``str``. For a value of the
    #: wrong type, the type's name (``"list"``); for a bad shape, the shape (``(5, 3)``);
    #: :data:`MISSING` for a required argument that was not given (only its name is checked).
    value: object
    #: Why the message does not show the value yet, where it does not: the error and the
    #: argument are still checked, the value's absence is reported as an expected failure,
    #: and a message that starts showing the value fails the case until ``gap`` is removed.
    gap: str | None = None


def cases(table: Iterable[Misuse]) -> list[object]:
    """The table as ``pytest.param``s, each with its id."""
    return [pytest.param(case, id=case.id) for case in table]


def check(case: Misuse) -> None:
    """Run the call; it must raise ``case.error``, naming the argument and showing the value."""
    with pytest.raises(case.error) as info:
        case.call()
    message = str(info.value)
    assert case.argument in message, f"{message!r} does not name {case.argument!r}"
    assert isinstance(info.value, PosencError), type(info.value).__mro__
    if case.value is MISSING:
        return
    shown = (repr(case.value), str(case.value))
    if case.gap:
        assert not any(text in message for text in shown), f"fixed: remove gap= from {case.id}"
        pytest.xfail(case.gap)
    assert any(text in message for text in shown), (
        f"{message!r} shows neither {shown[0]!r} nor {shown[1]!r}"
    )


@dataclass(frozen=True)
class BadCommand:
    """A ``posenc`` command line with one bad argument, and what the one line on stderr must
    say (status 2, no traceback, no work done)."""

    argv: list[str]
    #: The argument's name as the line spells it (``--dpi``, ``positional encoding``).
    argument: str
    #: The bad value, shown as its ``repr`` or ``str`` (or :data:`MISSING`).
    value: object
    #: As for :class:`Misuse`: why the line does not name the argument or show the value yet.
    gap: str | None = None


def commands(table: Iterable[BadCommand]) -> list[object]:
    """The table as ``pytest.param``s, each named by its command line."""
    return [pytest.param(case, id=" ".join(case.argv) or "(nothing)") for case in table]


def check_command(case: BadCommand, capsys: pytest.CaptureFixture[str]) -> None:
    """Run the command in-process (use with the ``stubbed`` fixture, so that a command that
    validates its arguments reaches a stub instead of working)."""
    from tests.commands import assert_one_line_exit_2, run_main

    line = assert_one_line_exit_2(*run_main(case.argv, capsys))
    names = case.argument in line
    shows = case.value is MISSING or any(t in line for t in (repr(case.value), str(case.value)))
    if case.gap:
        assert not (names and shows), f"fixed: remove gap= from {case.argv}"
        pytest.xfail(case.gap)
    assert names, f"{line!r} does not name {case.argument!r}"
    assert shows, f"{line!r} shows neither {case.value!r} nor {str(case.value)!r}"
