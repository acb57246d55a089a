"""Grouped-query attention without copies: ``g`` key/value heads each serve ``G = h / g``
query heads, and instead of repeating a key/value head ``G`` times the ``G`` query heads it
serves are folded into the query axis, ``(b, h, nq, d) -> (b, g, G·nq, d)``: one product
per key/value head reads it in place (query head ``i`` is served by key/value head
``i // G``, the pairing of ``repeat_interleave``).

Dimension legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads, ``G = h / g``,
``nq``/``nk`` queries and keys, ``d`` head dim.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..encodings.base import ScoreMod

__all__ = ["fold_flex_call", "fold_groups", "groups_of", "unfold_groups"]


def groups_of(q: Tensor, k: Tensor, v: Tensor) -> int:
    """How many query heads each key/value head serves, ``G = h / g``, for ``q``
    ``(..., h, nq, d)`` and ``k``, ``v`` ``(..., g, nk, ·)`` with ``g`` dividing ``h``; 1
    otherwise (as many heads, or shapes left to broadcasting)."""
    if not 3 <= q.dim() == k.dim() == v.dim():
        return 1
    h, g = q.shape[-3], k.shape[-3]
    if g in (0, h) or h % g or v.shape[-3] != g:
        return 1
    return h // g


def fold_groups(t: Tensor, groups: int) -> Tensor:
    """``(..., h, n, x)`` -> ``(..., h / G, G·n, x)``: each key/value head's ``G`` query heads
    one after another along the query axis (query head ``i`` is served by key/value head
    ``i // G``, as ``repeat_interleave`` would pair them). A view where the layout allows,
    else a copy of ``t`` (the queries or the scores, never the keys or values)."""
    *lead, h, n, x = t.shape
    return t.reshape(*lead, h // groups, groups * n, x)


def unfold_groups(t: Tensor, groups: int) -> Tensor:
    """The inverse of :func:`fold_groups`: ``(..., g, G·n, x)`` -> ``(..., g·G, n, x)``."""
    *lead, g, gn, x = t.shape
    return t.reshape(*lead, g * groups, gn // groups, x)


def fold_flex_call(
    q: Tensor, nk: int, score_mod: ScoreMod | None, block_mask: Any, groups: int, block: int
) -> tuple[Tensor, ScoreMod | None, Any]:
    """``q`` ``(b, h, nq, d)`` with its query groups folded into the query axis,
    ``(b, g, G·nq, d)``, and the ``score_mod`` and block mask of the folded call: folded row
    ``r`` of key/value head ``j`` is query ``r % nq`` of head ``j · G + r // nq``, so both are
    asked about that head and query. Under ``enable_gqa`` flex's eager reference repeats each
    grouped key and value head ``G`` times (``repeat_interleave``); folded, its keys and
    values keep their ``g`` heads. The block mask lists every block (the eager reference
    evaluates every pair anyway), in blocks of ``block`` tokens."""
    from torch.nn.attention.flex_attention import BlockMask

    nq = q.shape[-2]
    folded = fold_groups(q, groups)
    mq = -(-folded.shape[-2] // block)
    mk = -(-nk // block)
    rows = 1 if block_mask is None else block_mask.kv_num_blocks.shape[0]
    device = q.device
    counts = torch.full((rows, 1, mq), mk, dtype=torch.int32, device=device)
    order = torch.arange(mk, dtype=torch.int32, device=device).expand(rows, 1, mq, mk)

    def head_query(h: Tensor, row: Tensor) -> tuple[Tensor, Tensor]:
        return h * groups + torch.div(row, nq, rounding_mode="floor"), row % nq

    inner_mask = None if block_mask is None else block_mask.mask_mod
    mask_mod = None
    if inner_mask is not None:

        def mask_mod(b: Tensor, h: Tensor, row: Tensor, kv_idx: Tensor) -> Tensor:
            return inner_mask(b, *head_query(h, row), kv_idx)

    mod = None
    if score_mod is not None:
        inner = score_mod

        def mod(score: Tensor, b: Tensor, h: Tensor, row: Tensor, kv_idx: Tensor) -> Tensor:
            return inner(score, b, *head_query(h, row), kv_idx)

    mask = BlockMask.from_kv_blocks(
        counts, order.contiguous(), BLOCK_SIZE=block, mask_mod=mask_mod,
        seq_lengths=(folded.shape[-2], nk),
    )  # fmt: skip
    return folded, mod, mask
