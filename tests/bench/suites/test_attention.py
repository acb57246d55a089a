"""The ``bias`` and ``scaling`` suites of ``posenc bench`` (``posenc.bench.suites.attention``),
on rows made up here in place of the worker's: the ``x torch`` columns are posenc's figure over
torch's at the same n, a backend that fell back is named, and the fitted exponents recover
the power laws the rows were made from."""

from __future__ import annotations

from typing import Any

import pytest

from posenc.bench.suites import attention
from posenc.bench.suites.settings import settings_for


def made_up(kind: str, spec: dict[str, Any], sizes: tuple[int, ...], variants: tuple[str, ...]):  # type: ignore[no-untyped-def]
    """Time ``c·n²`` and memory ``c·n`` (``c`` the variant's rank + 1) for every variant but
    RoPE's, which grows as ``n``; ``math`` at the largest n fell back to ``sdpa``."""
    rows = []
    for n in sizes:
        for rank, v in enumerate(variants, start=1):
            power = 1 if kind == "rope" else 2
            rows.append(
                {"n": n, "variant": v, "median_s": rank * 1e-9 * n**power,
                 "low_s": 0.0, "high_s": 1.0, "extra_mib": rank * 1e-3 * n, "first_s": 0.5,
                 "backend_used": "sdpa" if (v == "math" and n == sizes[-1]) else v}
            )  # fmt: skip
    return rows, ["a note from the sweep"]


@pytest.fixture(autouse=True)
def no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "worker_rows", made_up)


def test_bias_table_divides_by_torch_at_the_same_n() -> None:
    section = attention.suite_bias(settings_for(True, bias_sizes=(64, 128)))
    (table,) = section.tables
    assert [row[:2] for row in table.rows[:4]] == [
        ["64", "posenc flex"],
        ["64", "posenc sdpa"],
        ["64", "posenc math"],
        ["64", "torch MultiheadAttention + bias"],
    ]
    ratios = {(row[0], row[1]): (row[4], row[6]) for row in table.rows}
    # flex is rank 1, torch rank 4: a quarter of torch's time and memory
    assert ratios["128", "posenc flex"] == ("0.25", "0.25")
    assert ratios["128", "posenc math"] == ("0.75", "0.75")
    assert ratios["64", "torch MultiheadAttention + bias"] == ("1.00", "1.00")
    assert "a note from the sweep" in section.notes
    assert any("n = 128: backend `math` could not run here" in note for note in section.notes)


def test_scaling_fits_the_exponents_of_the_rows() -> None:
    section = attention.suite_scaling(settings_for(True, scaling_sizes=(32, 64, 128, 256)))
    rope, attn = section.tables
    assert rope.headers[:3] == ["n", "posenc RotaryEmbedding ms", "posenc RotaryEmbedding MiB"]
    assert [row[0] for row in attn.rows] == ["32", "64", "128", "256"]
    fits = [note for note in section.notes if note.startswith("fitted growth")]
    assert len(fits) == 6
    assert "fitted growth, posenc RotaryEmbedding: time ∝ n^1.00, memory ∝ n^1.00" in fits[0]
    assert "fitted growth, posenc flex: time ∝ n^2.00, memory ∝ n^1.00" in fits[3]
    assert "n = 32…256, 4 sizes" in fits[5]
