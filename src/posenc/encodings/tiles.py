"""Half-precision row tiles: converting a bf16/fp16 tensor to float32 a cache-sized tile of
rows at a time, so that an operation reads its input once and writes its output once instead
of materialising full-size float32 temporaries. Used by :func:`add_encoding` (the additive
schemes' ``x + pe``); the pure-torch rotation tiles its rows by its own measure
(:data:`posenc.encodings.rotary.kernels.pytorch.TILE_ELEMENTS`).

Dimension legend: ``n`` rows (sequence), ``d`` elements per row.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

#: Work-dtype elements per tile of the half-precision operations (:func:`row_tiles`):
#: 2**20 float32 values are 4 MiB, which stays in the last-level cache while a tile is
#: worked on, and is large enough that per-operation overhead stays small.
TILE_ELEMENTS = 1 << 20


def tile_rows(n: int, d: int) -> int:
    """Rows of ``d`` elements per tile: as many as fit in :data:`TILE_ELEMENTS`, at least
    one, at most ``n``."""
    return max(1, min(n, TILE_ELEMENTS // max(d, 1)))


def row_tiles(shape: torch.Size, rows: int) -> list[tuple[tuple[int, ...], slice]]:
    """Cover a ``(..., n, d)`` tensor with tiles of ``rows`` whole rows (the last one shorter):
    ``(index, span)`` pairs, where ``t[index][span]`` is an ``(m, d)`` tile, ``m <= rows``.

    >>> [(index, span.start, span.stop) for index, span in row_tiles(torch.Size([2, 5, 4]), 3)]
    [((0,), 0, 3), ((0,), 3, 5), ((1,), 0, 3), ((1,), 3, 5)]
    """
    n = shape[-2]
    indices: list[tuple[int, ...]] = [()]
    for size in shape[:-2]:
        indices = [(*prefix, i) for prefix in indices for i in range(size)]
    return [
        (index, slice(start, min(start + rows, n)))
        for index in indices
        for start in range(0, n, rows)
    ]


def add_encoding(x: Tensor, pe: Tensor, dropout: nn.Module | None) -> Tensor:
    """``dropout(x + pe)`` computed in ``pe``'s dtype (the work dtype) and cast to ``x``'s once
    (``x + pe`` when ``dropout`` is ``None``).

    For a half-precision ``x`` outside autograd and without active dropout, each cache-sized
    tile of rows is converted into one reused float32 buffer, the encoding added there and
    the sum rounded into the output: bit-identical to ``(x.float() + pe).to(x.dtype)``, with
    memory seeing ``x`` read once and the output written once instead of two full-size
    float32 temporaries. (A mixed-dtype ``torch.add(x, pe, out=...)`` would be one pass too,
    but ATen runs it through a scalar casting loop, several times slower.)
    """
    dropping = dropout is not None and dropout.training and getattr(dropout, "p", 0.0) > 0
    if x.dtype == pe.dtype or dropping or torch.is_grad_enabled() or x.dim() < 2:
        out = x.to(pe.dtype) + pe
        return (out if dropout is None else dropout(out)).to(x.dtype)
    shape = torch.broadcast_shapes(x.shape, pe.shape)
    x, pe = x.expand(shape), pe.expand(shape)  # views
    out = torch.empty(shape, dtype=x.dtype, device=x.device)
    rows = tile_rows(shape[-2], shape[-1])
    buf = torch.empty(rows, shape[-1], dtype=pe.dtype, device=x.device)  # (rows, d)
    for index, span in row_tiles(shape, rows):
        tile = buf[: span.stop - span.start]
        tile.copy_(x[index][span])  # converts to float32
        tile.add_(pe[index][span])
        out[index][span].copy_(tile)  # rounds once
    return out
