"""Tests of ``src/posenc/encodings/rotary/tables.py``: the positions reader and the cos/sin
tables of a RotaryEmbedding."""

from __future__ import annotations

import pytest
import torch

from posenc import PosencValueError, RotaryEmbedding
from posenc.encodings.rotary.tables import _extent, read_positions


def test_extent_reads_runs_only_when_consecutive() -> None:
    assert _extent(torch.tensor([4, 5, 6])) == (4, 6, True)
    assert _extent(torch.tensor([4, 6, 5])) == (4, 6, False)
    assert _extent(torch.tensor([[4, 5]])) == (4, 5, False)
    assert _extent(torch.arange(30, 0, -1)) == (1, 30, False)


def test_read_positions_reads_values_only_when_eager() -> None:
    """Eager integer positions come back with their extent; inside a graph (``eager`` false)
    they are validated without reading a value; anything wrong is named either way."""
    positions = torch.tensor([3, 4, 5])
    assert read_positions(positions, 3, 1, "cpu", True) == (positions, (3, 5, True))
    got, extent = read_positions(positions, 3, 1, "cpu", False)
    assert extent is None and torch.equal(got, positions)
    assert read_positions(None, 3, 1, "cpu", True) == (None, None)
    for eager in (True, False):
        with pytest.raises(PosencValueError, match="positions"):
            read_positions(torch.tensor([-1, 0, 1]), 3, 1, "cpu", eager)


def test_tables_grow_on_demand_and_match_the_formula() -> None:
    """Rows past the table's end grow it (by doubling, at least to the position asked for);
    the rows equal the float64 formula cast once; a far position is computed, not tabled."""
    rope = RotaryEmbedding(8)
    rope.reset_tables(16)
    tables = rope._tables
    freq = rope.inv_freq
    positions = torch.tensor([20, 3, 40])
    cos, sin = tables.rows(positions, 3, torch.float32, "cpu", (3, 40, False), True, freq)
    assert rope.cos_cached.shape[0] >= 41
    want_cos, want_sin = tables.formula(positions, freq, torch.float32)
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    rows = rope.cos_cached.shape[0]
    far = torch.tensor([10**9])
    cos, _ = tables.rows(far, 1, torch.float32, "cpu", (10**9, 10**9, True), True, freq)
    assert rope.cos_cached.shape[0] == rows  # no table up to 10^9
    assert torch.equal(cos, tables.formula(far, freq, torch.float32)[0])


def test_tables_are_buffers_of_the_module() -> None:
    """The tables object writes the module's own non-persistent buffers."""
    rope = RotaryEmbedding(8)
    buffers = dict(rope.named_buffers())
    assert buffers["cos_cached"] is rope._tables._buffers["cos_cached"]
    assert "cos_cached" not in rope.state_dict()
    rope.reset_tables(8)
    assert rope.cos_cached.shape == (8, 4)
    assert rope.double().cos_cached.dtype == torch.float32
