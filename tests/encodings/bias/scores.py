"""A score_mod evaluated over every score, as flex attention's eager reference does."""

from __future__ import annotations

from collections.abc import Callable

import torch


def on_grid(
    mod: Callable[..., torch.Tensor], b: int, h: int, nq: int, nk: int | None = None
) -> torch.Tensor:
    """``mod`` on zero scores ``(b, h, nq, nk)`` (``nk``: ``nq`` unless given) in float64
    with broadcast index tensors for the batch, the head, the query and the key: every
    score's value at once."""
    nk = nq if nk is None else nk
    grid = (
        torch.arange(b).view(b, 1, 1, 1),
        torch.arange(h).view(1, h, 1, 1),
        torch.arange(nq).view(1, 1, nq, 1),
        torch.arange(nk).view(1, 1, 1, nk),
    )
    return mod(torch.zeros(b, h, nq, nk, dtype=torch.float64), *grid)
