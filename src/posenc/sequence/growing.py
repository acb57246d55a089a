"""A tensor grown along one dimension by doubling, with a staged write beside the committed
entries: the storage of every record of a :class:`~posenc.KVCache`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["Growing"]


class Growing:
    """A tensor grown along one dimension by doubling. Entries are numbered by their index in
    the sequence: ``append`` stages new ones past the committed ``length`` and returns the
    live ones up to them; :meth:`commit` makes the staged buffer the committed one and moves
    ``length``; :meth:`rollback` forgets it. What :meth:`view` returns never changes before a
    commit (a write lands past the committed entries, or in a new buffer). :meth:`drop_before`
    forgets a prefix (a windowed layer's keys no query can read again), whose room the next
    growth reclaims."""

    def __init__(self, dim: int, *, follow_dtype: bool = False) -> None:
        self.dim = dim
        #: On a new dtype, convert what is stored to it (keys and values follow the model,
        #: moved to bf16 between calls, say); otherwise promote (positions: int, then float).
        self.follow_dtype = follow_dtype
        self.data: Tensor | None = None  # holds entries base, base + 1, ...
        self.base = 0  # the index of data's first entry
        self.first = 0  # the first live entry (>= base)
        self.length = 0
        self._staged: tuple[Tensor, int] | None = None  # (data, base) after the append

    def view(self) -> Tensor | None:
        """The live committed entries, ``first … length - 1``."""
        if self.data is None:
            return None
        return self.data.narrow(self.dim, self.first - self.base, self.length - self.first)

    def append(self, new: Tensor) -> Tensor:
        """Stage ``new`` after the committed entries; return the live ones, ``new`` included."""
        start, count = self.length, new.shape[self.dim]
        end = start + count
        data, base = self.data, self.base
        if data is not None and data.dtype != new.dtype:
            dtype = new.dtype if self.follow_dtype else torch.promote_types(data.dtype, new.dtype)
            data, new = data.to(dtype), new.to(dtype)
        if data is None or (torch.is_grad_enabled() and new.requires_grad):
            # autograd (or a first call): a new tensor, never written into later
            old = (
                None
                if data is None
                else data.narrow(self.dim, self.first - base, start - self.first)
            )
            data = new.clone() if old is None else torch.cat([old, new], dim=self.dim)
            self._staged = (data, self.first)
            return data
        if end - base > data.shape[self.dim]:
            # out of room: move the live entries to a buffer twice their size (amortised O(1)
            # per entry, and a dropped prefix's room is reclaimed)
            live = start - self.first
            shape = list(data.shape)
            shape[self.dim] = max(2 * (live + count), 1)
            grown = data.new_empty(shape)
            grown.narrow(self.dim, 0, live).copy_(data.narrow(self.dim, self.first - base, live))
            data, base = grown, self.first
        data.narrow(self.dim, start - base, count).copy_(new)
        self._staged = (data, base)
        return data.narrow(self.dim, self.first - base, end - self.first)

    def commit(self, length: int) -> None:
        if self._staged is not None:
            self.data, self.base = self._staged
            self._staged = None
        self.length = length

    def rollback(self) -> None:
        """Forget what was staged since the last commit."""
        self._staged = None

    def drop_before(self, index: int) -> None:
        """Forget the entries before ``index`` (never the uncommitted ones)."""
        self.first = max(self.first, min(index, self.length))
