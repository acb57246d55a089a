"""Attention masks: :class:`MaskSpec`, the one statement of which keys a query may read
(causal order, key padding, documents, a sliding window, a chunk), and the check of a
``key_padding_mask`` (posenc's convention: True marks padding, as in
``torch.nn.MultiheadAttention``; transformers' ``attention_mask`` is the opposite).

Every mask posenc builds reads a :class:`MaskSpec`: the boolean mask of the SDPA and math
backends evaluates :meth:`MaskSpec.allows` on every pair at once (:meth:`MaskSpec.dense`),
flex attention's ``mask_mod`` evaluates the same method on the pairs its kernel visits, and
its block mask skips the blocks :meth:`MaskSpec.blocks` bounds from the same rules.

Dimension legend: ``b`` batch, ``nq``/``nk`` query and key lengths, ``mq``/``mk`` blocks of
queries and keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import PosencTypeError, PosencValueError

__all__ = ["MaskSpec", "attention_mask", "check_key_padding_mask"]


@dataclass(frozen=True, eq=False)
class MaskSpec:
    """Which of ``nk`` keys each of ``nq`` queries may read, in ``batch`` rows: a pair is
    allowed when every rule in force allows it.

    * ``causal``: key ``j`` lies at or before query ``i``, the last query aligned with the
      last key (the queries of a cached call are the newest keys): ``j <= i + nk - nq``.
      Off when it restricts nothing (a single query, the newest, reads every key);
    * ``keep`` ``(b, nk)``: the key is a real token (``~key_padding_mask``);
    * ``q_documents`` ``(b, nq)`` / ``k_documents`` ``(b, nk)``: the query and the key lie
      in the same document (run numbers, never decreasing along a row; see
      :mod:`posenc.sequence.context`);
    * ``window``: ``|p_i - p_j| < window`` over the positions ``q_positions`` ``(b, nq)`` and
      ``k_positions`` ``(b, nk)`` (``i - w < j <= i`` with causal order);
    * ``chunk``: ``p_i // chunk == p_j // chunk`` (Llama 4's chunked attention).

    Made by :meth:`build`, which checks that each rule has what it reads.
    """

    batch: int
    nq: int
    nk: int
    causal: bool = False
    keep: Tensor | None = None
    q_documents: Tensor | None = None
    k_documents: Tensor | None = None
    q_positions: Tensor | None = None
    k_positions: Tensor | None = None
    window: int | None = None
    chunk: int | None = None

    @classmethod
    def build(
        cls,
        batch: int,
        nq: int,
        nk: int,
        *,
        causal: bool,
        key_padding_mask: Tensor | None = None,
        q_documents: Tensor | None = None,
        k_documents: Tensor | None = None,
        q_positions: Tensor | None = None,
        k_positions: Tensor | None = None,
        window: int | None = None,
        chunk: int | None = None,
    ) -> MaskSpec:
        """The rules of one attention call (arguments as :func:`attention_mask`'s)."""
        documents = q_documents is not None and k_documents is not None
        if window is not None or chunk is not None:
            assert q_positions is not None and k_positions is not None
        return cls(
            batch,
            nq,
            nk,
            causal=causal and bool(nq > 1),  # (a plain bool under symbolic sizes)
            keep=None if key_padding_mask is None else ~key_padding_mask,
            q_documents=q_documents if documents else None,
            k_documents=k_documents if documents else None,
            q_positions=q_positions if window is not None or chunk is not None else None,
            k_positions=k_positions if window is not None or chunk is not None else None,
            window=window,
            chunk=chunk,
        )

    @property
    def rules(self) -> tuple[object, ...]:
        """Which rules are in force (and the window's and chunk's sizes): what a compiled
        kernel is keyed by besides the code that reads them."""
        return (
            self.causal,
            self.keep is not None,
            self.q_documents is not None,
            self.window,
            self.chunk,
        )

    @property
    def restricts(self) -> bool:
        """Whether some rule is in force (else every pair is allowed)."""
        return any(rule not in (False, None) for rule in self.rules)

    def allows(self, b: Tensor, q_idx: Tensor, kv_idx: Tensor, offset: Tensor | int) -> Tensor:
        """Whether query ``q_idx`` of row ``b`` may read key ``kv_idx``, for index tensors that
        broadcast together (scalars inside flex's ``mask_mod``, or ``(b|1, 1, nq|1, nk|1)``
        grids in :meth:`dense`); ``offset`` is ``nk - nq`` (a tensor in a compiled kernel,
        which then serves every length). Needs :attr:`restricts`."""
        allowed: Tensor | None = None

        def both(rule: Tensor) -> Tensor:
            return rule if allowed is None else allowed & rule

        if self.causal:
            allowed = both(kv_idx <= q_idx + offset)
        if self.keep is not None:
            allowed = both(self.keep[b, kv_idx])
        if self.q_documents is not None and self.k_documents is not None:
            allowed = both(self.q_documents[b, q_idx] == self.k_documents[b, kv_idx])
        if self.q_positions is not None and self.k_positions is not None:
            qp, kp = self.q_positions[b, q_idx], self.k_positions[b, kv_idx]
            if self.window is not None:
                allowed = both((qp - kp).abs() < self.window)
            if self.chunk is not None:
                allowed = both(qp // self.chunk == kp // self.chunk)
        assert allowed is not None, "no rule in force: every pair is allowed"
        return allowed

    def dense(
        self, device: torch.device | None = None, queries: tuple[int, int] | None = None
    ) -> Tensor | None:
        """The boolean ``(b|1, 1, nq|1, nk)`` mask, True where attending is allowed
        (:meth:`allows` on every pair; an axis no rule reads stays 1); ``None`` if every pair
        is allowed. ``queries=(start, stop)``: only those rows, made without the others."""
        if not self.restricts:
            return None
        for t in (self.keep, self.q_documents, self.q_positions):
            if t is not None:
                device = t.device
        start, stop = (0, self.nq) if queries is None else queries
        rows = torch.arange(self.batch, device=device).view(-1, 1, 1, 1)
        queries_at = torch.arange(start, stop, device=device).view(1, 1, -1, 1)
        keys = torch.arange(self.nk, device=device).view(1, 1, 1, -1)
        return self.allows(rows, queries_at, keys, self.nk - self.nq)

    def blocks(self, size: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """The rules per block of ``size`` queries by ``size`` keys: ``(some, every)``, each
        ``(B, mq, mk)`` bool (``B`` is 1 where no rule reads the row): some pair of the block
        may be allowed / every pair is. Judged from each block's first and last index, its
        first and last document run (runs never decrease along a row) and its smallest and
        largest position, never pair by pair."""
        nq, nk, batch = self.nq, self.nk, self.batch
        mq, mk = -(-nq // size), -(-nk // size)
        q_first = torch.arange(mq, device=device) * size
        q_last = (q_first + size).clamp(max=nq) - 1
        k_first = torch.arange(mk, device=device) * size
        k_last = (k_first + size).clamp(max=nk) - 1
        some = torch.ones(1, mq, mk, dtype=torch.bool, device=device)
        every = some.clone()
        offset = nk - nq
        if self.causal:  # key j is allowed for query i when j <= i + offset
            some = some & (k_first.view(1, 1, mk) <= q_last.view(1, mq, 1) + offset)
            every = every & (k_last.view(1, 1, mk) <= q_first.view(1, mq, 1) + offset)
        if self.keep is not None:
            tail = mk * size - nk
            some_keys = F.pad(self.keep, (0, tail), value=False).view(batch, mk, size).any(-1)
            every_keys = F.pad(self.keep, (0, tail), value=True).view(batch, mk, size).all(-1)
            some = some & some_keys.view(batch, 1, mk)
            every = every & every_keys.view(batch, 1, mk)
        if self.q_documents is not None and self.k_documents is not None:
            q_docs, k_docs = self.q_documents, self.k_documents
            q_lo, q_hi = q_docs[:, q_first].view(batch, mq, 1), q_docs[:, q_last]
            k_lo, k_hi = k_docs[:, k_first].view(batch, 1, mk), k_docs[:, k_last]
            q_hi, k_hi = q_hi.view(batch, mq, 1), k_hi.view(batch, 1, mk)
            some = some & (q_lo <= k_hi) & (k_lo <= q_hi)  # the two blocks share a document
            every = every & (q_lo == q_hi) & (k_lo == k_hi) & (q_lo == k_lo)  # ... and only it
        if self.q_positions is not None and self.k_positions is not None:
            q_lo, q_hi = _block_range(self.q_positions, size, mq)  # (b, mq) each
            k_lo, k_hi = _block_range(self.k_positions, size, mk)
            q_lo, q_hi = q_lo.view(batch, mq, 1), q_hi.view(batch, mq, 1)
            k_lo, k_hi = k_lo.view(batch, 1, mk), k_hi.view(batch, 1, mk)
            if self.window is not None:  # the nearest pair is within reach / the farthest is
                gap = torch.maximum(k_lo - q_hi, q_lo - k_hi)
                some = some & (gap < self.window)
                every = every & (torch.maximum(q_hi - k_lo, k_hi - q_lo) < self.window)
            if self.chunk is not None:
                cq_lo, cq_hi, ck_lo, ck_hi = (
                    torch.div(t, self.chunk, rounding_mode="floor")
                    for t in (q_lo, q_hi, k_lo, k_hi)
                )
                some = some & (cq_lo <= ck_hi) & (ck_lo <= cq_hi)
                every = every & (cq_lo == cq_hi) & (ck_lo == ck_hi) & (cq_lo == ck_lo)
        return some, every


def _block_range(positions: Tensor, size: int, blocks: int) -> tuple[Tensor, Tensor]:
    """The smallest and largest position in each block of ``size`` tokens: ``(b, blocks)``."""
    n = positions.shape[-1]
    tail = blocks * size - n
    # past the end: above every position, and exact in the positions' dtype (the pad value
    # passes through a double: int64's largest would round up and wrap to its most negative)
    top = (
        float("inf")
        if positions.is_floating_point()
        else min(2**62, torch.iinfo(positions.dtype).max)
    )
    low = F.pad(positions, (0, tail), value=top)
    high = F.pad(positions, (0, tail), value=-1)
    return low.view(-1, blocks, size).amin(-1), high.view(-1, blocks, size).amax(-1)


def attention_mask(
    batch: int,
    nq: int,
    nk: int,
    *,
    causal: bool,
    key_padding_mask: Tensor | None,
    device: torch.device | None,
    q_documents: Tensor | None = None,
    k_documents: Tensor | None = None,
    q_positions: Tensor | None = None,
    k_positions: Tensor | None = None,
    window: int | None = None,
    chunk: int | None = None,
) -> Tensor | None:
    """Boolean ``(b, 1, nq, nk)`` mask, True where attending is allowed; ``None`` if all is:
    the :class:`MaskSpec` of these arguments, evaluated on every pair.

    ``key_padding_mask`` is ``(b, nk)`` with True marking padding (as in
    ``torch.nn.MultiheadAttention``). Causal masking aligns the last query with the last key
    (the queries of a cached call are the newest keys). ``q_documents`` ``(b, nq)`` and
    ``k_documents`` ``(b, nk)`` keep each query to the keys of its own document.

    ``window`` and ``chunk`` read positions, ``q_positions`` ``(b, nq)`` and ``k_positions``
    ``(b, nk)``: a sliding window keeps the keys less than ``window`` positions from the query
    (``i - w < j <= i`` with causal masking), a chunk the keys whose ``position // chunk``
    is the query's (Llama 4's chunked attention).
    """
    spec = MaskSpec.build(
        batch,
        nq,
        nk,
        causal=causal,
        key_padding_mask=key_padding_mask,
        q_documents=q_documents,
        k_documents=k_documents,
        q_positions=q_positions,
        k_positions=k_positions,
        window=window,
        chunk=chunk,
    )
    return spec.dense(device)


#: How a transformers ``attention_mask`` (1 = keep) becomes posenc's ``key_padding_mask``.
_FROM_TRANSFORMERS = (
    "posenc's key_padding_mask marks padding with True (as torch.nn.MultiheadAttention); "
    "from a transformers attention_mask (1 = keep) use key_padding_mask = attention_mask == 0"
)


def check_key_padding_mask(
    mask: object, batch: int, seq: int, *, read_values: bool = False
) -> Tensor | None:
    """``mask`` checked to be a ``(batch, seq)`` bool tensor (True = padding), or ``None``.

    ``read_values`` also reads it (one transfer from its device) and refuses a row that is
    padding throughout: no real token is left to attend to, which is almost always a mask
    with the opposite convention (transformers' ``attention_mask.bool()``). The entry points
    (``Encoder.forward``, ``MultiHeadAttention.forward``) read it once per forward; the layers
    only check its type and shape.
    """
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise PosencTypeError(f"key_padding_mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise PosencTypeError(
            f"key_padding_mask must be a bool tensor, got {mask.dtype}; {_FROM_TRANSFORMERS}"
        )
    if tuple(mask.shape) != (batch, seq):
        raise PosencValueError(
            f"key_padding_mask must have shape (batch, seq) = {(batch, seq)}, "
            f"got {tuple(mask.shape)}"
        )
    if read_values and mask.numel() and not mask.is_meta and not torch.compiler.is_compiling():
        empty = mask.all(dim=-1)  # (b,)
        if bool(empty.any()):
            rows = empty.nonzero().flatten().tolist()
            raise PosencValueError(
                f"key_padding_mask marks every token of row(s) {rows[:8]} as padding (an "
                "attention_mask with no 1 in the row), leaving nothing to attend to; "
                f"{_FROM_TRANSFORMERS}"
            )
    return mask
