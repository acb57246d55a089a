"""``posenc.sequence.positions``: the positions of a padded batch's real tokens
(``positions_from_padding``, against the rule written out, and a padded batch against each row
alone, for every sequence scheme in ``tests/sequence/test_padding.py``), and randomized positions
(Ruoss
et al. 2023: order and ties kept, uniform over subsets)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

import posenc


@pytest.mark.parametrize(
    "mask",
    [
        [[1, 1, 0, 0, 0], [0, 0, 0, 0, 0]],  # left padding
        [[0, 0, 0, 1, 1], [0, 0, 0, 0, 1]],  # right padding
        [[0, 1, 0, 1, 0], [1, 0, 0, 0, 1]],  # padding between real tokens
        [[0, 0, 0, 0, 0], [0, 0, 0, 0, 0]],  # none
    ],
)
def test_positions_from_padding_numbers_each_rows_real_tokens(mask: list[list[int]]) -> None:
    padding = torch.tensor(mask, dtype=torch.bool)
    got = posenc.positions_from_padding(padding)
    assert got.dtype == torch.int64 and got.shape == padding.shape
    for row, pad in zip(got.tolist(), mask, strict=True):
        real = [p for p, is_pad in zip(row, pad, strict=True) if not is_pad]
        assert real == list(range(len(real)))  # 0, 1, 2, ... in order
        assert all(p == 0 for p, is_pad in zip(row, pad, strict=True) if is_pad)


def test_positions_from_padding_refuses_what_is_not_a_padding_mask() -> None:
    with pytest.raises(TypeError, match="attention_mask == 0"):
        posenc.positions_from_padding(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(batch, seq\).*\(3,\)"):
        posenc.positions_from_padding(torch.zeros(3, dtype=torch.bool))
    with pytest.raises(TypeError, match="list"):
        posenc.positions_from_padding([[False, True]])


def test_randomize_positions_keeps_order_and_ties() -> None:
    """Ruoss et al. 2023: sorted distinct draws from [0, L); coupled (tied) positions stay
    tied; one draw per row; reproducible from a generator."""
    g = torch.Generator().manual_seed(0)
    out = posenc.randomize_positions(None, 50, 200, generator=g)
    assert out.shape == (50,)
    assert bool((out[1:] > out[:-1]).all()) and int(out.min()) >= 0 and int(out.max()) < 200
    coupled = torch.tensor([[0, 1, 2, 1, 2, 3], [0, 0, 1, 1, 2, 2]])
    mapped = posenc.randomize_positions(coupled, 6, 30, generator=g)
    for row, src in zip(mapped, coupled, strict=True):
        for i in range(6):
            for j in range(6):  # the order of every pair is kept, ties included
                assert (row[i] < row[j]) == (src[i] < src[j])
                assert (row[i] == row[j]) == (src[i] == src[j])
    again = posenc.randomize_positions(None, 50, 200, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again, out)
    with pytest.raises(ValueError, match="max_positions >= 7"):
        posenc.randomize_positions(None, 7, 6)


def test_randomize_positions_is_uniform_over_subsets() -> None:
    """Every position of [0, L) is drawn equally often (the first of n draws is the minimum of
    a uniform n-subset: P(min = p) = C(L-1-p, n-1) / C(L, n))."""
    g = torch.Generator().manual_seed(1)
    draws = torch.stack([posenc.randomize_positions(None, 3, 8, generator=g) for _ in range(4000)])
    counts = torch.bincount(draws.flatten(), minlength=8).double() / draws.numel()
    assert_close(counts, torch.full((8,), 1 / 8, dtype=torch.float64), rtol=0, atol=0.02)
    first = torch.bincount(draws[:, 0], minlength=8).double() / len(draws)
    want = torch.tensor([math.comb(7 - p, 2) / math.comb(8, 3) for p in range(8)])
    assert_close(first, want.double(), rtol=0, atol=0.03)
