"""What every rotation kernel offers (RoFormer eq. 34 on plain tensors), so that the selector
can hand any of them to the code that rotates:

* ``takes(x, pair, tables)``: whether it can rotate ``x`` (and ``pair``) with these tables
  (dtype, device, layout; ``tables`` ``None`` for a rotary module's own float32 tables);
* ``turn(x, out, cos, sin, interleaved, clockwise=False)``: one tensor, into ``out`` (``x``
  itself for in place, or a fresh contiguous tensor of its shape), ``cos``/``sin``
  broadcasting against ``x.shape[:-1]``; channels past ``r = 2 * cos.shape[-1]`` pass
  through; ``clockwise``: by ``-θ`` (the inverse, and the backward);
* ``turn_pair(q, k, cos, sin, interleaved, inplace, rows, clockwise=False)``: ``q`` and
  ``k`` by the same table rows in one go, or ``None`` where the data rule it out (the caller
  then turns each with ``turn``, whose checks explain what is wrong). With ``rows``,
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
    turn: Callable[..., None]  # (x, out, cos, sin, interleaved, clockwise=False)
    # (q, k, cos, sin, interleaved, inplace, rows, clockwise=False)
    turn_pair: Callable[..., tuple[Tensor, Tensor] | None]
    pairs: bool = True  # whether turn_pair ever turns a pair (else it always returns None)
    reads_positions: bool = False  # whether turn_pair takes rows as a tensor of positions
    # (q, k, cos, sin, interleaved) -> (q, k) turned as one operator that torch.compile traces
    # into (its launch visible to inductor), or None where this call cannot
    compiled_pair: Callable[..., tuple[Tensor, Tensor] | None] | None = None

    def __repr__(self) -> str:
        return f"Kernel({self.name!r})"


def pair_refused(q: Tensor, k: Tensor, cos: Tensor, inplace: bool) -> bool:
    """Whether a kernel's ``turn_pair`` must leave ``q`` and ``k`` to one rotation each: a
    different dtype, an empty tensor, a partial rotation, or an in-place rotation that
    :func:`~.rotate.check_inplace` or :func:`~posenc.encodings.rotary.common.apply_tables_qk` must
    explain (an inference tensor outside inference mode, ``q`` and ``k`` sharing memory
    (:func:`overlap`), elements sharing memory)."""
    if k.dtype is not q.dtype or not q.numel() or not k.numel():
        return True
    if 2 * cos.shape[-1] != q.shape[-1]:
        return True
    if not inplace:
        return False
    if (q.is_inference() or k.is_inference()) and not torch.is_inference_mode_enabled():
        return True
    return overlap(q, k) is not False or 1 in (
        torch._debug_has_internal_overlap(q),
        torch._debug_has_internal_overlap(k),
    )


#: The most steps :func:`overlap` takes before it answers "cannot tell" (it takes at most
#: two per dim on the views of one projection that attention and users slice).
_OVERLAP_STEPS = 64


def overlap(a: Tensor, b: Tensor) -> bool | None:
    """Whether an element of ``a`` and one of ``b`` lie at the same memory, from their
    addresses, sizes and strides alone (no pass over the data): ``False`` where none do,
    ``True`` where some do, ``None`` where it cannot tell cheaply (dtypes of different sizes
    or misaligned addresses over a common byte range, or strides that do not nest).

    Storages, then byte ranges, that do not meet answer at once (separate tensors). Where
    they meet, as the views ``qkv[:, :, 0]`` and ``qkv[:, :, 1]`` of one fused projection
    do, element ``i`` of ``a`` and element ``j`` of ``b`` coincide where ``sum(i *
    a.stride()) - sum(j * b.stride())`` is the distance between their first elements: a
    search over the dims from the largest stride down, each step keeping the multiples of
    its stride that the smaller strides can still make up (at most two where the strides
    nest, as a tensor's own do; past ``_OVERLAP_STEPS`` steps the answer is ``None``). The
    cost grows with the dims, never with the sizes."""
    if a is b:
        return True
    if not a.numel() or not b.numel():
        return False
    a_at, b_at = a.data_ptr(), b.data_ptr()
    if a_at == b_at:
        return True
    a_storage, b_storage = a.untyped_storage(), b.untyped_storage()
    a_start, b_start = a_storage.data_ptr(), b_storage.data_ptr()
    if a_start + a_storage.nbytes() <= b_start or b_start + b_storage.nbytes() <= a_start:
        return False  # (separate storages: the common case, in a microsecond)
    item = a.element_size()
    a_end = a_at + item * (1 + sum((n - 1) * s for n, s in zip(a.shape, a.stride(), strict=True)))
    b_end = b_at + b.element_size() * (
        1 + sum((n - 1) * s for n, s in zip(b.shape, b.stride(), strict=True))
    )
    if a_end <= b_at or b_end <= a_at:
        return False
    if b.element_size() != item or (b_at - a_at) % item:
        return None
    # c * stride for each stride, c in [low, high]: a's indices minus b's, equal strides merged
    reach: dict[int, list[int]] = {}
    for sizes, strides, sign in ((a.shape, a.stride(), 1), (b.shape, b.stride(), -1)):
        for n, s in zip(sizes, strides, strict=True):
            if n > 1 and s:
                reach.setdefault(s, [0, 0])[0 if sign < 0 else 1] += sign * (n - 1)
    dims = sorted(reach.items(), reverse=True)  # (stride, [low, high]), largest stride first
    below = [(0, 0)] * (len(dims) + 1)  # what the strides after each place can make up
    for place in range(len(dims) - 1, -1, -1):
        s, (low, high) = dims[place]
        below[place] = (below[place + 1][0] + low * s, below[place + 1][1] + high * s)
    steps = 0
    todo = [(0, (b_at - a_at) // item)]  # (place, what is left to make up)
    while todo:
        place, left = todo.pop()
        if place == len(dims):
            if left == 0:
                return True
            continue
        steps += 1
        if steps > _OVERLAP_STEPS:
            return None
        s, (low, high) = dims[place]
        rest_low, rest_high = below[place + 1]
        first = max(low, -((rest_high - left) // s))  # ceil((left - rest_high) / s)
        last = min(high, (left - rest_low) // s)
        if last - first >= _OVERLAP_STEPS:
            return None
        todo.extend((place + 1, left - c * s) for c in range(first, last + 1))
    return False
