"""The pure-torch rotation (Su et al. 2021, "RoFormer", eq. 34), for every tensor the native
kernel (:mod:`.native`) cannot take and every machine where it is not built. It goes one
cache-sized tile of rows at a time: the interleaved pairs are turned as one complex multiply;
the half layout with four operations, in place keeping a copy of ``x1``. Half-precision inputs
are widened tile by tile into a float32 buffer and rounded back once.

Whether it runs is decided by :func:`~.select.select`.

Dimension legend: ``n`` sequence, ``d`` channels of ``x``, ``r`` rotary channels (``r <= d``).
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

#: Elements (of the work dtype) per tile of :func:`turn_tiled`: 2**19 float32 values are
#: 2 MiB, so that a tile, its tables and its temporary stay in a last-level cache while the
#: operations of a tile run over it (``benchmarks/rope.md`` times the neighbouring sizes).
#: Smaller tensors are one tile. (The additive encodings tile by
#: :data:`posenc.encodings.tiles.TILE_ELEMENTS`, sized for their own operations.)
TILE_ELEMENTS = 1 << 19


def _complex_ok(t: Tensor) -> bool:
    """Whether ``view_as_complex`` can view the channel pairs of ``t`` where they lie."""
    return (
        t.dtype in (torch.float32, torch.float64)
        and t.stride(-1) == 1
        and t.storage_offset() % 2 == 0
        and all(s % 2 == 0 for s in t.stride()[:-1])
    )


def _tiles(lead: tuple[int, ...], rows: int) -> list[tuple[int | slice, ...]]:
    """Indices cutting a tensor whose leading dims (all but the channels) are ``lead`` into
    tiles of at most ``rows`` rows: whole inner dims, a slice of the next one out, and
    single indices of the dims outside it.

    >>> _tiles((2, 3, 4), 8)
    [(0, slice(0, 2, None)), (0, slice(2, 4, None)), (1, slice(0, 2, None)), (1, slice(2, 4, None))]
    """
    inner, m = 1, len(lead)
    while m > 0 and inner * lead[m - 1] <= rows:
        m -= 1
        inner *= lead[m]
    if m == 0:
        return [()]
    step = max(1, rows // inner)
    outer = itertools.product(*(range(size) for size in lead[: m - 1]))
    return [
        (*index, slice(start, start + step))
        for index in outer
        for start in range(0, lead[m - 1], step)
    ]


def _turn(
    src: Tensor,
    dst: Tensor,
    cos: Tensor,
    sin: Tensor,
    table: Tensor | None,
    spare: Tensor | None = None,
) -> None:
    """Write eq. 34 of the ``(..., r)`` channels ``src`` into ``dst``: through ``table``
    (complex ``cos + i sin``) for interleaved pairs; else in halves ``x1 = x[:r/2]``,
    ``x2 = x[r/2:r]``, in place (``dst is src``) keeping ``x1`` in ``spare`` ``(..., r/2)``.
    Both orders of operations give the same values."""
    if table is not None:  # (x1 + i x2)(cos + i sin)
        half = table.shape[-1]
        pairs = torch.view_as_complex(src.unflatten(-1, (half, 2)))
        out = pairs if dst is src else torch.view_as_complex(dst.unflatten(-1, (half, 2)))
        torch.mul(pairs, table, out=out)
        return
    x1, x2 = src.chunk(2, -1)  # (..., r/2) each
    if dst is src:
        x1_before = x1.clone() if spare is None else spare.copy_(x1)
        x1.mul_(cos).addcmul_(x2, sin, value=-1)
        x2.mul_(cos).addcmul_(x1_before, sin)
        return
    out1, out2 = dst.chunk(2, -1)
    torch.mul(x1, cos, out=out1).addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=out2).addcmul_(x1, sin)


def turn(
    x: Tensor, out: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, clockwise: bool = False
) -> None:
    """The pure-torch kernel's ``turn`` (:mod:`.kernel`): :func:`turn_tiled`, clockwise by
    ``-sin``."""
    if x.numel():
        turn_tiled(x, out, cos, -sin if clockwise else sin, interleaved)


def turn_tiled(x: Tensor, out: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> None:
    """The pure-torch fast path (where the native kernel is not built or cannot take the
    tensors). Write the rotation of ``x`` into ``out``: ``x`` itself (in place) or a tensor of its
    shape and dtype. ``cos``/``sin`` are in the work dtype and broadcast to
    ``x.shape[:-1] + (r/2,)``.

    Each tile of rows is rotated from ``x`` into ``out`` or in place, or, when ``x`` is not
    in the work dtype or its interleaved pairs cannot be viewed as complex numbers, widened
    into a reused buffer of the work dtype, rotated there in place and rounded into ``out``
    once. On CPU, tensors above :data:`TILE_ELEMENTS` go tile by tile.
    """
    half = cos.shape[-1]
    r, d = 2 * half, x.shape[-1]
    work, inplace = cos.dtype, out is x
    direct = x.dtype == work and (not interleaved or (_complex_ok(x) and _complex_ok(out)))
    table = torch.complex(cos, sin) if interleaved else None  # (..., n, r/2)
    if x.numel() <= TILE_ELEMENTS or x.device.type != "cpu" or x.dim() < 2:  # one tile
        if direct and r == d:  # the common case, straight to the arithmetic
            _turn(x, out, cos, sin, table)
        else:
            _turn_tile(x, out, cos, sin, table, r, direct, inplace, None, None)
        return
    lead = x.shape[:-1]
    rows = max(1, TILE_ELEMENTS // d)
    cos, sin = cos.expand(*lead, half), sin.expand(*lead, half)  # views
    if table is not None:
        table = table.expand(*lead, half)
    spare = buffer = None  # reused by every tile
    if not interleaved:
        spare = torch.empty(rows * half, dtype=work, device=x.device)
    if not direct:
        buffer = torch.empty(rows * r, dtype=work, device=x.device)
    for index in _tiles(tuple(lead), rows):
        t = None if table is None else table[index]
        dst = x[index] if inplace else out[index]
        _turn_tile(x[index], dst, cos[index], sin[index], t, r, direct, inplace, spare, buffer)


def _turn_tile(
    src: Tensor,
    dst: Tensor,
    cos: Tensor,
    sin: Tensor,
    table: Tensor | None,
    r: int,
    direct: bool,
    inplace: bool,
    spare: Tensor | None,
    buffer: Tensor | None,
) -> None:
    """One tile of :func:`turn_tiled`; ``spare`` (half the tile's rotary channels) and
    ``buffer`` (all of them) are flat reused work-dtype storage, or ``None`` for new."""
    d = src.shape[-1]
    if r < d:
        if not inplace:
            dst.narrow(-1, r, d - r).copy_(src.narrow(-1, r, d - r))
        src, dst = src.narrow(-1, 0, r), dst.narrow(-1, 0, r)
    if spare is not None:
        spare = _scratch(spare, (*src.shape[:-1], r // 2), cos)
    if direct and not inplace and spare is not None:
        # a large tensor: copy the tile into the fresh output, then rotate it there in place,
        # so that the four operations of the halves read and write memory the cache holds
        src, inplace = dst.copy_(src), True
    if direct:
        _turn(src, src if inplace else dst, cos, sin, table, spare)
        return
    widened = _scratch(buffer, src.shape, cos).copy_(src)
    _turn(widened, widened, cos, sin, table, spare)
    dst.copy_(widened)  # rounds once


def _scratch(flat: Tensor | None, shape: tuple[int, ...] | torch.Size, like: Tensor) -> Tensor:
    """A tensor of ``shape`` in ``like``'s dtype: a view of the reused ``flat`` storage, or
    new where there is none."""
    if flat is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    return flat[: math.prod(shape)].view(shape)
