"""The suites of ``posenc bench`` run by name (``posenc.bench.suites``, its ``__init__``):
unknown names are refused before any work, every suite has a runner and a line in the
module's table, and the suites run in the order given, each timed.
"""

from __future__ import annotations

import pytest

from posenc.bench import suites
from posenc.bench.harness import Section
from posenc.bench.suites import run_suites
from posenc.bench.suites.settings import QUICK, Settings, settings_for


def test_run_suites_rejects_unknown_names_before_any_work() -> None:
    with pytest.raises(ValueError, match="bench suite") as info:
        run_suites(["table", "nope"], settings_for(True))
    assert "'nope'" in str(info.value)


def test_every_suite_has_a_runner_and_a_line_in_the_table() -> None:
    assert list(suites.RUNNERS) == list(suites.SUITES)
    described = [line.split()[0] for line in suites.__doc__.splitlines() if line[:1].isalpha()]
    assert [name for name in described if name in suites.SUITES] == list(suites.SUITES)


def test_run_suites_runs_in_the_order_given_and_times_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[str] = []

    def runner(name: str):  # type: ignore[no-untyped-def]
        def run(settings: Settings) -> Section:
            assert settings is QUICK
            ran.append(name)
            return Section(name, name)

        return run

    monkeypatch.setattr(suites, "RUNNERS", {name: runner(name) for name in suites.SUITES})
    sections = run_suites(["scaling", "table", "scaling"], QUICK)
    assert ran == ["scaling", "table", "scaling"]
    assert [s.name for s in sections] == ran and all(s.seconds >= 0 for s in sections)
