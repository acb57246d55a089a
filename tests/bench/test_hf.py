"""The ``hf`` suite of ``posenc bench`` (``posenc.bench.suites.hf``), run end to end at tiny
sizes: its table's rows, and the token check it makes before timing. No timing is asserted."""

from __future__ import annotations

import pytest

from posenc.bench.suites import SUITES, run_suites
from posenc.bench.suites.settings import settings_for

TINY = settings_for(True, warmup=0, hf=(32, 1, 2, 1, 6, 3), hf_vocab=50, hf_repeats=1)


def test_the_suite_runs_end_to_end_and_fills_its_table() -> None:
    pytest.importorskip("transformers")
    assert "hf" in SUITES
    (section,) = run_suites(["hf"], TINY)
    (table,) = section.tables
    assert [row[0] for row in table.rows] == ["transformers", "patched", "transformers / patched"]
    for label in ("transformers", "patched"):
        rotary, total, calls = section.data["hf"]["shares"][label]
        assert 0 < rotary < total
        assert calls == 3 * (1 + 1)  # 3 forwards: the rotary module, then q and k in 1 layer
