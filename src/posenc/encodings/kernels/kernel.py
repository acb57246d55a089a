"""What every rotation kernel offers (RoFormer eq. 34 on plain tensors), so that the selector
can hand any of them to the code that rotates:

* ``takes(x, pair, tables)``: whether it can rotate ``x`` (and ``pair``) with these tables
  (dtype, device, layout; ``tables`` ``None`` for a rotary module's own float32 tables);
* ``rotate(x, out, cos, sin, interleaved, clockwise=False)``: one tensor, into ``out`` (``x``
  itself for in place, or a fresh contiguous tensor of its shape), ``cos``/``sin``
  broadcasting against ``x.shape[:-1]``; channels past ``r = 2 * cos.shape[-1]`` pass
  through; ``clockwise``: by ``-θ`` (the inverse, and the backward);
* ``rotate_pair(q, k, cos, sin, interleaved, inplace, rows, clockwise=False)``: ``q`` and
  ``k`` by the same table rows in one go, or ``None`` where the data rule it out (the caller
  then rotates each with ``rotate``, whose checks explain what is wrong). With ``rows``,
  ``cos`` and ``sin`` are whole ``(positions, r/2)`` tables: an ``int`` ``p`` turns ``q``'s
  and ``k``'s rows ``0, 1, ...`` by table rows ``p, p + 1, ...``; an integer tensor of
  positions ``(n,)`` or ``(b, n)``, already checked against the tables, by the rows it
  names, read on the device (a kernel that cannot index rows so returns ``None``; its
  ``reads_positions`` is ``False``).

Three implement it: the C kernel (``native``, CPU), the blocked pure-torch path (``torch``,
anything) and Triton (``triton``, CUDA). Triton turns clockwise by a switch of its kernel;
the other two negate ``sin`` (a table's worth of work). Under ``torch.compile`` Triton also
offers ``compiled_pair``: q and k as one ``torch.library.triton_op``. :mod:`.select` holds
them and chooses; nothing else names one.

Dimension legend: ``n`` sequence, ``r`` rotary channels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

Tables = tuple[Tensor, Tensor]


@dataclass(frozen=True, eq=False)  # (compared and hashed by identity: a cheap dict key)
class Kernel:
    """One implementation of the rotation; see this module's docstring."""

    name: str
    takes: Callable[[Tensor, Tensor | None, Tables | None], bool]
    rotate: Callable[..., None]  # (x, out, cos, sin, interleaved, clockwise=False)
    # (q, k, cos, sin, interleaved, inplace, rows, clockwise=False)
    rotate_pair: Callable[..., tuple[Tensor, Tensor] | None]
    pairs: bool = True  # whether rotate_pair ever turns a pair (else it always returns None)
    reads_positions: bool = False  # whether rotate_pair takes rows as a tensor of positions
    # (q, k, cos, sin, interleaved) -> (q, k) turned as one operator that torch.compile traces
    # into (its launch visible to inductor), or None where this call cannot
    compiled_pair: Callable[..., tuple[Tensor, Tensor] | None] | None = None

    def __repr__(self) -> str:
        return f"Kernel({self.name!r})"


def pair_refused(q: Tensor, k: Tensor, cos: Tensor, inplace: bool) -> bool:
    """Whether a kernel's ``rotate_pair`` must leave ``q`` and ``k`` to one rotation each: a
    different dtype, an empty tensor, a partial rotation, or an in-place rotation that
    :func:`~.rotate.check_inplace` must explain (an inference tensor outside inference mode,
    ``q`` and ``k`` at the same memory, elements sharing memory)."""
    if k.dtype is not q.dtype or not q.numel() or not k.numel():
        return True
    if 2 * cos.shape[-1] != q.shape[-1]:
        return True
    if not inplace:
        return False
    if (q.is_inference() or k.is_inference()) and not torch.is_inference_mode_enabled():
        return True
    return q.data_ptr() == k.data_ptr() or 1 in (
        torch._debug_has_internal_overlap(q),
        torch._debug_has_internal_overlap(k),
    )
