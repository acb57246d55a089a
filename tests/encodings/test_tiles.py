"""posenc.encodings.tiles, the half-precision row blocking: the blocks cover every row of
every leading index exactly once, and ``add_encoding`` on bf16/fp16 input gives bit for bit
``(x.float() + pe).to(x.dtype)``, also when a tensor spans many blocks."""

from __future__ import annotations

import pytest
import torch

from posenc.encodings import tiles as blocks
from posenc.encodings.tiles import add_encoding, row_tiles, tile_rows


def test_block_rows_stays_between_one_and_n() -> None:
    assert tile_rows(10, 4) == 10  # everything fits in one block
    assert tile_rows(10**7, 1024) == blocks.TILE_ELEMENTS // 1024
    assert tile_rows(5, blocks.TILE_ELEMENTS * 4) == 1  # a row larger than a block
    assert tile_rows(3, 0) == 3


@pytest.mark.parametrize(("shape", "rows"), [((7, 3), 2), ((2, 3, 5, 4), 3), ((4, 2), 9)])
def test_row_blocks_cover_every_row_once(shape: tuple[int, ...], rows: int) -> None:
    seen = torch.zeros(shape[:-1], dtype=torch.long)  # (..., n)
    for index, span in row_tiles(torch.Size(shape), rows):
        assert 0 < span.stop - span.start <= rows
        seen[index][span] += 1
    assert torch.equal(seen, torch.ones_like(seen))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_elements", [1 << 20, 24])
def test_add_encoding_in_half_precision_rounds_once(
    dtype: torch.dtype, block_elements: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blocks, "TILE_ELEMENTS", block_elements)  # 24: 3 rows of 8 a block
    x = torch.randn(3, 10, 8).to(dtype)
    pe = torch.randn(10, 8)  # float32, broadcast over the batch
    want = (x.float() + pe).to(dtype)
    with torch.no_grad():
        got = add_encoding(x, pe, None)
    assert got.dtype == dtype and torch.equal(got, want)
    assert torch.equal(add_encoding(x, pe, None), want)  # the autograd path: the same numbers


def test_add_encoding_applies_dropout_in_the_work_dtype() -> None:
    x = torch.randn(2, 5, 4).to(torch.bfloat16)
    pe = torch.randn(5, 4)
    dropout = torch.nn.Dropout(0.5).train()
    torch.manual_seed(0)
    got = add_encoding(x, pe, dropout)
    torch.manual_seed(0)
    want = torch.nn.functional.dropout(x.float() + pe, 0.5).to(torch.bfloat16)
    assert torch.equal(got, want)
