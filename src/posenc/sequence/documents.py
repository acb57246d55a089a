"""How a forward's new tokens are numbered: their document runs (a run of equal
``document_ids`` next to each other is a document, and a cached call without ids continues
each row's last one) and the positions they imply (counting from 0 where a document opens,
from the cached document's next position where it goes on), with the host's bound on them.

Dimension legend: ``b`` batch, ``n`` new tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..encodings.checks import (
    MAX_POSITION,
    PositionBound,
    check_position_range,
    on_host,
    resolve_bounded_positions,
)
from ..errors import PosencTypeError, PosencValueError
from .cache import KVCache

__all__ = [
    "check_document_ids",
    "check_floor",
    "default_positions",
    "document_runs",
    "given_positions",
    "has_splits",
    "new_documents",
    "within_range",
]


def check_document_ids(document_ids: object, batch: int, seq: int) -> Tensor | None:
    """``document_ids`` checked to be a ``(batch, seq)`` integer tensor, or ``None``."""
    if document_ids is None:
        return None
    if not isinstance(document_ids, Tensor):
        raise PosencTypeError(
            f"document_ids must be a torch.Tensor, got {type(document_ids).__name__}"
        )
    if (
        document_ids.is_floating_point()
        or document_ids.is_complex()
        or document_ids.dtype == torch.bool
    ):
        raise PosencTypeError(f"document_ids must be an integer tensor, got {document_ids.dtype}")
    if tuple(document_ids.shape) != (batch, seq):
        raise PosencValueError(
            f"document_ids must have shape (batch, seq) = {(batch, seq)}, "
            f"got {tuple(document_ids.shape)}"
        )
    return document_ids


def has_splits(runs: Tensor) -> bool:
    """Whether some row holds more than one document run (runs only grow along a row).

    Answered by reading the runs only where they are on the host; on a device that read
    would be a sync, so the answer is True there: the document mask is built, and over rows
    of one document each it masks nothing."""
    if not runs.numel():
        return False
    if not on_host(runs):
        return True
    return bool((runs[:, -1] != runs[:, 0]).any())


def document_runs(
    document_ids: Tensor, last_id: Tensor | None, last_run: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Run numbers ``(b, n)`` of new tokens with these ids (continuing the cache's numbering),
    and where a run opens ``(b, n)`` bool (a token whose id differs from the one before it;
    the first token opens one unless it continues the cache's last document)."""
    b = document_ids.shape[0]
    before = (
        torch.full((b, 1), -1, dtype=torch.long, device=document_ids.device)
        if last_id is None
        else last_id.long()
    )
    previous = torch.cat([before, document_ids[:, :-1]], dim=1)  # (b, n)
    opens = document_ids != previous
    if last_id is None and opens.shape[1]:
        opens[:, 0] = True
    start = -1 if last_run is None else last_run.long()  # (b, 1) or a number
    return start + opens.long().cumsum(dim=1), opens


def new_documents(
    document_ids: Tensor | None,
    last_id: Tensor | None,
    last_run: Tensor | None,
    batch: int,
    seq: int,
    device: torch.device,
) -> tuple[Tensor, Tensor, Tensor]:
    """The new tokens' document ids, run numbers and where a run opens, ``(b, n)`` each:
    without ids, the cache's last document (``last_id``, ``last_run`` ``(b, 1)``) goes on,
    or one document opens."""
    if document_ids is None and last_id is not None and last_run is not None:
        opens = torch.zeros(batch, seq, dtype=torch.bool, device=device)
        return last_id.expand(batch, seq), last_run.expand(batch, seq), opens
    if document_ids is None:
        document_ids = torch.zeros(batch, seq, dtype=torch.long, device=device)
    document_ids = document_ids.to(device=device, dtype=torch.long)
    q_runs, opens = document_runs(document_ids, last_id, last_run)
    return document_ids, q_runs, opens


def default_positions(
    cache: KVCache | None, q_runs: Tensor, opens: Tensor, last_run: Tensor | None, given: bool
) -> tuple[Tensor, PositionBound | None]:
    """Positions of new tokens: counting from 0 where a document opens, and from the cached
    document's largest position + 1 for the tokens continuing it; and the host's bound on
    them."""
    b, n = q_runs.shape
    index = torch.arange(n, device=q_runs.device).expand(b, n)
    start = torch.where(opens, index, torch.zeros_like(index)).cummax(dim=1).values
    positions = index - start
    if cache is not None and last_run is not None and cache.next_position is not None:
        continuing = q_runs == last_run  # (b, n): the first run, when it continues the cache
        positions = torch.where(continuing, cache.next_position + index, positions)
    # counted from 0, or from a row's next position (at most first.largest) where the
    # cache's document goes on; exact where no new document opens (every row then continues
    # the cache's, or counts 0 .. n - 1 in a first call)
    first = PositionBound(0, True)
    if cache is not None and last_run is not None:
        first = cache.position_bound()
    if not n or first is None:
        return positions, None
    return positions, within_range(first.largest + n - 1, first.exact and not given)


def given_positions(
    positions: Tensor,
    cache: KVCache | None,
    continuing: Tensor | None,
    batch: int,
    seq: int,
    device: torch.device,
) -> tuple[Tensor, PositionBound | None]:
    """Positions a user gave, checked and expanded to ``(b, n)``, with their bound; those of
    the ``continuing`` tokens (``(b, n)`` bool: in each row's cached document) must not go
    back below where a windowed cache stands."""
    positions, bound = resolve_bounded_positions(
        positions, seq, batch=batch, device=device, name="positions"
    )
    positions = positions.expand(batch, seq)
    if cache is not None and cache.floor is not None and continuing is not None:
        check_floor(positions, cache.floor, continuing)
    return positions, bound


def check_floor(positions: Tensor, floor: Tensor, continuing: Tensor) -> None:
    """Refuse explicit positions that go back below a row's next position, for the tokens
    continuing its document: a windowed layer of the cache dropped the keys they could
    read."""
    back = continuing & (positions < floor)  # (b, n)
    if bool(back.any()):
        row = int(back.any(dim=1).float().argmax())
        raise PosencValueError(
            f"positions go back in row {row}: the next position there is "
            f"{floor[row, 0].item()}, got {positions[row][back[row]].min().item()}; this "
            "cache's windowed layers no longer hold the keys such a token would read (use a "
            "new KVCache)"
        )


def within_range(largest: int, exact: bool) -> PositionBound | None:
    """The bound on default positions that continue a cache, checked on the host: past
    2**53 it refuses where some position equals it (``exact``), and is dropped where it is
    only a bound (the positions are then read and checked where they are used)."""
    if largest > MAX_POSITION:
        if exact:
            check_position_range("positions", 0, largest)
        return None
    return PositionBound(largest, exact)
