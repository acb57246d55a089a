"""The layouts a rotary entry point is told its tensors are in, never guessed from their
shapes (a ``(1, 6, 2, 8)`` tensor is ``(b, h, n, d)`` with 2 positions, or ``(b, n, h, d)``
with 6):

* ``"bhsd"`` (default; SDPA's): ``(b, h, n, d)``;
* ``"bshd"`` (flash-attention's, torchtune's): ``(b, n, h, d)``;
* ``"thd"`` (packed varlen: flash-attention, vLLM, torchtitan): ``(t, h, d)``, ``t`` tokens
  of ``B`` sequences laid end to end, ``cu_seqlens (B + 1,)`` their boundaries; token ``t``
  of sequence ``b`` is at position ``t - cu_seqlens[b] + seqlen_offsets[b]``
  (flash-attention's ``apply_rotary_emb``), and positions given otherwise are refused.
  ``cu_seqlens`` (and ``max_seqlen``) are checked where they lie on the CPU; on a GPU, as
  positions are (:mod:`~.tables`), only under ``POSENC_CHECK_POSITIONS=1``.

:func:`rotary_embedding` (:mod:`.functional`) reads its tables by these rules;
the rotary modules turn the other layouts into the ``(b, h, n, d)`` view their rotation takes
(:class:`StatedLayout`) and hand back tensors in the layout they were given: ``q`` and ``k``
themselves in place, else ``bshd`` and ``thd`` views of new ``(b, h, n, d)`` tensors.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``t`` packed tokens, ``d`` head
dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from ...errors import PosencTypeError, PosencValueError
from .tables import reads_values

__all__ = ["LAYOUTS", "Layout", "StatedLayout", "stated_layout"]

Layout = Literal["bhsd", "bshd", "thd"]
#: The layouts, with the rank of a tensor in each.
LAYOUTS: dict[str, int] = {"bhsd": 4, "bshd": 4, "thd": 3}
#: Each layout's shape, as messages name it.
SHAPES = {"bhsd": "(b, h, n, d)", "bshd": "(b, n, h, d)", "thd": "(t, h, d)"}


@dataclass
class StatedLayout:
    """One call's tensors in a stated layout: as given (``given_q``, ``given_k``), as the
    ``(b, h, n, d)`` views a rotation takes (``q``, ``k``; ``k`` ``None`` for a one-tensor
    call), and the positions that layout gives them (``(n,)`` or ``(b, n)``; ``None``:
    ``arange(n)``)."""

    layout: str
    given_q: Tensor
    given_k: Tensor | None
    q: Tensor
    k: Tensor | None
    positions: Tensor | None

    def back(self, x: Tensor, view: Tensor | None, given: Tensor | None) -> Tensor:
        """A result ``x`` ``(b, h, n, d')`` in the stated layout: ``given`` itself where
        ``x`` is its ``view`` turned in place, else a view of ``x``."""
        if x is view and given is not None:
            return given
        if self.layout == "bshd":
            return x.transpose(1, 2)  # (b, n, h, d')
        if self.layout == "thd":
            return x[0].transpose(0, 1)  # (t, h, d')
        return x

    def one(self, x: Tensor) -> Tensor:
        """The result of a one-tensor call, in the stated layout."""
        return self.back(x, self.q, self.given_q)

    def pair(self, qk: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """The results of a call on ``q`` and ``k``, in the stated layout."""
        return self.back(qk[0], self.q, self.given_q), self.back(qk[1], self.k, self.given_k)


def stated_layout(
    q: Tensor,
    k: Tensor | None,
    positions: Tensor | None,
    layout: str,
    cu_seqlens: Tensor | None,
    seqlen_offsets: int | Tensor,
    max_seqlen: int | None,
    *,
    coordinates: bool = False,
) -> StatedLayout | None:
    """``q`` (and ``k``) in ``layout`` as :class:`StatedLayout`; ``None`` for the default
    call (``bhsd``, no offsets or packing), which needs nothing. Raises
    :class:`~posenc.errors.PosencValueError` naming the layout and the shape where a tensor
    cannot be in ``layout``, where ``cu_seqlens`` or ``max_seqlen`` come without ``thd``,
    where ``thd`` comes without ``cu_seqlens`` or with positions, and where positions and
    ``seqlen_offsets`` are both given, and where positions do not fit the sequence axis of
    the layout (``coordinates``: positions end in a coordinate axis, ``(..., n, a)``; ``thd``
    and ``seqlen_offsets`` are refused then, as they give 1-D positions)."""
    if (  # the default call, first: nothing to do
        layout == "bhsd"
        and cu_seqlens is None
        and max_seqlen is None
        and type(seqlen_offsets) is int
        and seqlen_offsets == 0
    ):
        return None
    offsets = not is_zero(seqlen_offsets)
    if layout not in LAYOUTS:
        raise PosencValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    for name, t in (("q", q), ("k", k)):
        if isinstance(t, Tensor) and t.dim() != LAYOUTS[layout]:
            raise PosencValueError(
                f"{name} of shape {tuple(t.shape)} cannot be layout={layout!r}, which is "
                f"{SHAPES[layout]}"
            )
        if t is not None and not isinstance(t, Tensor):
            raise PosencTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if isinstance(k, Tensor) and _sequence(q, layout) != _sequence(k, layout):
        raise PosencValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} in layout={layout!r} {SHAPES[layout]} "
            "must share batch and seq (rotate cached keys separately with .rotate(k, ...))"
        )
    if layout != "thd" and (cu_seqlens is not None or max_seqlen is not None):
        what = "cu_seqlens" if cu_seqlens is not None else "max_seqlen"
        raise PosencValueError(f"{what} is for layout='thd'; got layout={layout!r}")
    if coordinates and (offsets or layout == "thd"):
        what = "layout='thd' (cu_seqlens) gives" if layout == "thd" else "seqlen_offsets give"
        raise PosencValueError(
            f"{what} 1-D positions; grid coordinates (n, a) cannot come from them: give bhsd "
            "or bshd tensors with their coordinates"
        )
    if positions is not None and (offsets or layout == "thd"):
        raise PosencValueError(
            "positions (or position_ids) cannot be given with "
            + ("layout='thd': they come from cu_seqlens and seqlen_offsets" if layout == "thd"
               else "seqlen_offsets: give one of the two")
        )  # fmt: skip
    if layout == "thd":
        rows = packed_rows(q.shape[0], cu_seqlens, seqlen_offsets, max_seqlen, q.device)
        views = [None if t is None else t.transpose(0, 1).unsqueeze(0) for t in (q, k)]
        return StatedLayout(layout, q, k, views[0], views[1], rows)  # (1, h, t, d), (t,)
    view_q, view_k = q, k
    if layout == "bshd":  # (b, h, n, d) views
        view_q, view_k = q.transpose(1, 2), (None if k is None else k.transpose(1, 2))
    n = view_q.shape[2]
    if offsets:
        positions = offset_rows(q.shape[0], n, seqlen_offsets, q.device)  # (b, n)
    elif isinstance(positions, Tensor) and positions.dim():
        given = positions.shape[-2] if coordinates and positions.dim() > 1 else positions.shape[-1]
        if given != n:
            raise PosencValueError(
                f"positions of shape {tuple(positions.shape)} do not fit q of shape "
                f"{tuple(q.shape)} in layout={layout!r} {SHAPES[layout]}, whose sequence "
                f"has {n} tokens"
            )
    return StatedLayout(layout, q, k, view_q, view_k, positions)


def _sequence(x: Tensor, layout: str) -> tuple[int, ...]:
    """``x``'s batch and sequence sizes in ``layout`` (tokens for ``thd``)."""
    return (x.shape[0],) if layout == "thd" else (x.shape[0], x.shape[1 if layout == "bshd" else 2])


def is_zero(offsets: int | Tensor) -> bool:
    return isinstance(offsets, int) and not isinstance(offsets, bool) and offsets == 0


def _offsets(offsets: int | Tensor, batch: int, device: torch.device) -> Tensor:
    """``seqlen_offsets`` as a ``(B, 1)`` integer tensor."""
    if isinstance(offsets, bool) or not isinstance(offsets, (int, Tensor)):
        raise PosencTypeError(
            f"seqlen_offsets must be an int or a (B,) integer tensor, got {offsets!r:.60}"
        )
    if isinstance(offsets, int):
        return torch.full((batch, 1), offsets, dtype=torch.long, device=device)
    if offsets.is_floating_point() or offsets.dtype is torch.bool or offsets.shape != (batch,):
        raise PosencValueError(
            f"seqlen_offsets must be an int or a ({batch},) integer tensor, got dtype "
            f"{offsets.dtype}, shape {tuple(offsets.shape)}"
        )
    return offsets.to(device=device, dtype=torch.long)[:, None]


def offset_rows(batch: int, seq: int, offsets: int | Tensor, device: torch.device) -> Tensor:
    """Rows ``offset_b + 0 … S-1`` per batch row: ``(B, S)``."""
    return _offsets(offsets, batch, device) + torch.arange(seq, device=device)


def packed_rows(
    total: int,
    cu_seqlens: Tensor | None,
    offsets: int | Tensor,
    max_seqlen: int | None,
    device: torch.device,
) -> Tensor:
    """Each packed token's row: ``t - cu_seqlens[b] + offsets[b]`` for token ``t`` of sequence
    ``b``, ``(T,)``."""
    if cu_seqlens is None:
        raise PosencValueError("layout='thd' needs cu_seqlens (B + 1,), the sequences' bounds")
    if (
        not isinstance(cu_seqlens, Tensor)
        or cu_seqlens.dim() != 1
        or cu_seqlens.shape[0] < 2
        or cu_seqlens.is_floating_point()
        or cu_seqlens.dtype is torch.bool
    ):
        raise PosencValueError(
            f"cu_seqlens must be a (B + 1,) integer tensor, got {cu_seqlens!r:.60}"
        )
    bounds = cu_seqlens.to(device=device, dtype=torch.long)
    lengths = bounds[1:] - bounds[:-1]  # (B,)
    if max_seqlen is not None and (isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int)):
        raise PosencTypeError(f"max_seqlen must be an int, got {max_seqlen!r}")
    if reads_values(bounds):  # (on a GPU only under POSENC_CHECK_POSITIONS=1: a read syncs)
        _check_bounds(bounds, lengths, total, max_seqlen)
    batch = lengths.shape[0]
    starts = (bounds[:-1] - _offsets(offsets, batch, device)[:, 0]).repeat_interleave(
        lengths, output_size=total
    )  # (T,): each token's sequence start, less its offset
    return torch.arange(total, device=device) - starts


def _check_bounds(bounds: Tensor, lengths: Tensor, total: int, max_seqlen: int | None) -> None:
    """Raise unless ``cu_seqlens`` rises from 0 to the ``total`` packed tokens, each sequence
    at most ``max_seqlen`` long (two reads of the values)."""
    first, last = int(bounds[0]), int(bounds[-1])
    if first != 0 or last != total or bool((lengths < 0).any()):
        raise PosencValueError(
            f"cu_seqlens must rise from 0 to the {total} packed tokens of x, got "
            f"{bounds.tolist() if bounds.numel() <= 16 else tuple(bounds.shape)}"
        )
    if max_seqlen is not None:
        longest = int(lengths.max())
        if longest > max_seqlen:
            raise PosencValueError(
                f"max_seqlen={max_seqlen} but cu_seqlens holds a sequence of {longest} tokens"
            )
