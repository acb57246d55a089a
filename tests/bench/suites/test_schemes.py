"""The ``schemes`` suite of ``posenc bench`` (``posenc.bench.schemes``): it times every
registered sequence scheme (the 2024-26 ones among them) once, and its ratio column is each
median over ``none``'s."""

from __future__ import annotations

import pytest

import posenc
from posenc.bench import schemes as suite
from tests.schemes import SEQUENCE


def test_the_suite_times_every_sequence_scheme_once() -> None:
    section = suite.suite_schemes((8, 1, 2, 16, 1, 5), warmup=0, repeats=1)
    (table,) = section.tables
    rows = {row[0]: row for row in table.rows}
    assert sorted(rows) == sorted(suite.sequence_schemes())
    assert set(SEQUENCE) <= set(rows)  # every built-in scheme, the 2024-26 ones included
    for name, row in rows.items():
        assert row[1] == posenc.entry(name).family
        assert float(row[2]) > 0, name  # a median was measured
        ratio = float(row[2]) / float(rows["none"][2])
        assert float(row[4]) == pytest.approx(ratio, rel=0.02, abs=0.01), name  # 3 s.f. medians
    assert rows["none"][4] == "1.00"
