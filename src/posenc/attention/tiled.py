"""SDPA over tiles of queries, each tile making its own rows of the bias: the backend
``tiled``, for a learned bias that trains on a GPU.

A bias whose table has a gradient (T5's buckets, KERPLE's kernel, DPB's and FIRE's MLPs)
trains badly through flex attention on a GPU: its backward adds each score's gradient into
the table with one atomic add (``h · n²`` of them onto ``h · (2n - 1)`` addresses). SDPA
with the bias materialised reduces that gradient with ordinary reductions, but holds the
whole ``(b, h, n, n)`` bias. Here the queries are split into tiles of ``t`` rows: the softmax
runs per row, so each tile's output is exact on its own. A tile makes its ``(b|1, h, t, nk)``
bias from the positions, runs SDPA, and drops it; under autograd the tile runs inside
:func:`torch.utils.checkpoint.checkpoint` (non-reentrant), so its backward makes the bias
again instead of keeping every tile's alive. At most one tile's bias (and the additive mask
made from it) lives at a time: ``t`` is chosen so that it holds at most
:data:`TILE_ELEMENTS` elements, from host integers alone.

Dimension legend: ``b`` batch, ``h`` heads, ``g`` key/value heads, ``nq``/``nk`` queries and
keys, ``t`` queries per tile, ``d`` head dim.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..sequence.masks import MaskSpec
from .sdpa import fused_attention

__all__ = ["TILE_ELEMENTS", "tile_rows", "tiled_attention"]

#: The most elements one tile's bias ``(b, h, t, nk)`` may hold (2**26 is 256 MiB in fp32):
#: the tiled backend's memory budget for the bias, per attention call.
TILE_ELEMENTS = 2**26

#: ``bias(start, stop, q_tile) -> (h, t, nk) | (b, h, t, nk)``: the bias of queries
#: ``start .. stop - 1``.
BiasRows = Callable[[int, int, Tensor], Tensor]


def tile_rows(batch: int, heads: int, nq: int, nk: int, budget: int | None = None) -> int:
    """Queries per tile: as many as keep ``batch · heads · t · nk <= budget`` (default
    :data:`TILE_ELEMENTS`), at least one, at most ``nq``."""
    budget = TILE_ELEMENTS if budget is None else budget
    return max(1, min(nq, budget // max(1, batch * heads * nk)))


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: BiasRows,
    spec: MaskSpec,
    *,
    dropout_p: float = 0.0,
    scale: float | None = None,
    sinks: Tensor | None = None,
    budget: int | None = None,
) -> Tensor:
    """Attention of ``q`` ``(b, h, nq, d)`` over ``k``, ``v`` ``(b, g, nk, d)`` with the bias
    made per tile of queries (see the module docstring): each tile runs
    :func:`~posenc.attention.sdpa.fused_attention` with its rows of ``bias`` and of the mask
    ``spec``; under autograd its bias is made again in the backward. Returns ``(b, h, nq, d)``."""
    b, h, nq, _ = q.shape
    nk = k.shape[-2]
    rows = tile_rows(b, h, nq, nk, budget)
    records = torch.is_grad_enabled()

    def tile(q_tile: Tensor, k: Tensor, v: Tensor, start: int, stop: int) -> Tensor:
        mask = spec.dense(q.device, queries=(start, stop))  # rows start:stop alone
        return fused_attention(
            q_tile, k, v, mask, bias(start, stop, q_tile), dropout_p, scale=scale, sinks=sinks
        )

    outs = []
    for start in range(0, nq, rows):
        stop = min(start + rows, nq)
        q_tile = q[:, :, start:stop]
        if records:
            out = checkpoint(tile, q_tile, k, v, start, stop, use_reentrant=False)
        else:
            out = tile(q_tile, k, v, start, stop)
        outs.append(out)  # (b, h, t, d)
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
