"""Abacus embeddings (McLeish et al. 2024): the digit indices against a loop over each row, the
rows added against the table, the training offset (one per row, digits only, reproducible
under a seed, off in eval), and bad arguments named."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from posenc import Abacus, abacus_positions


def indices_by_loop(is_digit: list[list[bool]]) -> list[list[int]]:
    """1-based place of each digit in its run of digits, 0 elsewhere."""
    out = []
    for row in is_digit:
        run, values = 0, []
        for digit in row:
            run = run + 1 if digit else 0
            values.append(run)
        out.append(values)
    return out


def test_indices_equal_the_loop() -> None:
    mask = torch.rand(5, 40, generator=torch.Generator().manual_seed(0)) < 0.7
    mask[0] = True  # one run over the whole row
    mask[1] = False  # no digit at all
    assert abacus_positions(mask).tolist() == indices_by_loop(mask.tolist())
    assert abacus_positions(mask).dtype == torch.int64


def test_eval_adds_the_rows_at_the_indices() -> None:
    pe = Abacus(8, max_len=32, max_offset=10).eval()
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(1))
    idx = torch.tensor([[1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])
    assert_close(pe(x, idx), x + pe.weight[idx], atol=0, rtol=0)


def test_training_offset_is_one_per_row_on_digits_and_seeded() -> None:
    pe = Abacus(4, max_len=64, max_offset=30).train()
    x = torch.zeros(8, 5, 4)
    idx = torch.tensor([[0, 1, 2, 0, 1]]).expand(8, 5)
    torch.manual_seed(5)
    first = pe(x, idx)
    torch.manual_seed(5)
    assert torch.equal(pe(x, idx), first)  # reproducible under a seed
    rows = {}
    for r in range(8):
        assert torch.equal(first[r, 0], pe.weight[0]) and torch.equal(first[r, 3], pe.weight[0])
        # the digit rows of this sequence: indices 1, 2, 1 moved by one offset k
        k = next(k for k in range(31) if torch.equal(first[r, 1], pe.weight[1 + k]))
        assert torch.equal(first[r, 2], pe.weight[2 + k]) and torch.equal(
            first[r, 4], pe.weight[1 + k]
        )
        rows[r] = k
    assert len(set(rows.values())) > 1  # the rows draw their own offsets
    assert all(0 <= k <= 30 for k in rows.values())
    assert torch.equal(pe.eval()(x, idx), pe.weight[idx])  # no offset in eval


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="max_offset must be an int >= 0, got -1"):
        Abacus(4, max_offset=-1)
    with pytest.raises(ValueError, match="max_offset \\(8\\) leaves no row"):
        Abacus(4, max_len=9, max_offset=8)
    with pytest.raises(ValueError, match="digit index 9 is outside the Abacus table"):
        Abacus(4, max_len=9).eval()(torch.zeros(1, 1, 4), torch.tensor([[9]]))
    with pytest.raises(TypeError, match="is_digit must be a \\(batch, seq\\) bool tensor"):
        abacus_positions(torch.ones(3, dtype=torch.bool))
