"""Which heads a rotary module turns, and by which rows of a per-head table.

Two options of :class:`~posenc.RotaryEmbedding` act per head:

* ``rotary_heads=R``: only ``R`` of the query heads rotate, the others pass through unchanged
  (x-transformers' ``Attention(rotate_num_heads=R)``, which rotates the **last** ``R`` heads,
  the decoupled-RoPE heads of multi-latent attention; here the first ``R`` by default, the
  last with ``rotary_heads_at="last"``);
* per-head frequencies (flash-attention issue 578): tables with a head axis, one row of
  frequencies per rotated key head.

With grouped-query attention (``hq = g * hk`` query heads, ``hk`` key heads; query head ``i``
reads key head ``i // g``) both are stated in query heads and must fall on whole groups: a key
head rotates exactly where all the ``g`` query heads that read it rotate, so ``R`` must be a
multiple of ``g`` (``R / g`` key heads rotate), and a per-head table has one row per rotated
key head, query head ``i`` of the rotated ones turning by row ``i // g`` (so a query and the
key it reads turn by the same frequencies, and their score stays a function of ``m - n``).
Anything else has no clear meaning and is refused by name. x-transformers refuses every
partial rotation with fewer key heads than query heads; where ``g = 1`` the two agree.

A rotation of some heads turns views of ``q`` and ``k`` (a head slice is a view: the kernels
index heads by stride). In place the other heads are not touched at all; out of place the
result is one new tensor per input, the untouched heads copied into it once.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim, ``r`` rotary dim,
``H`` rows of a per-head table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ...errors import PosencTypeError, PosencValueError
from ..checks import check_positive_int
from .common import apply_tables, apply_tables_qk, check_base
from .kernels.select import Plan

if TYPE_CHECKING:
    from .spec import RotarySpec

__all__ = [
    "RotaryHeads",
    "check_rotary_heads",
    "frequencies",
    "given_frequencies",
    "head_axis",
    "heads_group",
    "per_head_bases",
]

Tables = tuple[Tensor, Tensor]


def check_rotary_heads(rotary_heads: object, at: object) -> tuple[int | None, bool]:
    """``rotary_heads``: ``None`` (every head) or a positive int; ``at``: ``"first"`` or
    ``"last"``. Returns ``(count, last)``."""
    if at not in ("first", "last"):
        raise PosencValueError(f"rotary_heads_at must be 'first' or 'last', got {at!r}")
    if rotary_heads is None:
        return None, at == "last"
    return check_positive_int("rotary_heads", rotary_heads), at == "last"


def heads_group(query_heads: object, heads: int) -> int:
    """Query heads per head of a tensor with ``heads`` heads (``query_heads`` ``None``: 1)."""
    if query_heads is None:
        return 1
    query_heads = check_positive_int("query_heads", query_heads)
    if query_heads % heads:
        raise PosencValueError(
            f"query_heads ({query_heads}) must be a multiple of x's heads ({heads})"
        )
    return query_heads // heads


def per_head_bases(base: object) -> tuple[float, ...] | None:
    """``base`` as one base per head where it is a sequence or a 1-D tensor (each checked,
    named by its index); ``None`` for one base (checked by :class:`~.spec.RotarySpec`)."""
    if isinstance(base, Tensor):
        if base.dim() == 0:
            return None
        if base.dim() != 1:
            raise PosencValueError(f"base must be a number or 1-D, got shape {tuple(base.shape)}")
        base = base.tolist()
    if isinstance(base, (str, bytes)) or not isinstance(base, Sequence):
        return None
    if not base:
        raise PosencValueError("base must not be an empty sequence (one base per head)")
    bases = []
    for i, value in enumerate(base):
        try:
            bases.append(check_base(value))
        except (PosencValueError, PosencTypeError) as error:
            raise type(error)(f"base[{i}]: {error}") from None
    return tuple(bases)


def given_frequencies(
    inv_freq: object, spec: RotarySpec, base: object, scaling: object
) -> Tensor | None:
    """The frequencies given as ``inv_freq``, checked: a finite floating tensor ``(r/2,)`` or
    ``(H, r/2)`` (one row: ``(r/2,)``), float64 on the CPU; refused beside ``base`` or
    ``scaling``, which it replaces."""
    if inv_freq is None:
        return None
    if not isinstance(inv_freq, Tensor) or not inv_freq.is_floating_point():
        got = getattr(inv_freq, "dtype", type(inv_freq).__name__)
        raise PosencTypeError(f"inv_freq must be a floating-point tensor, got {got}")
    half = spec.rotary_dim // 2
    if inv_freq.dim() not in (1, 2) or inv_freq.shape[-1] != half or not inv_freq.numel():
        raise PosencValueError(
            f"inv_freq must have shape ({half},) or (heads, {half}) (rotary_dim // 2 = {half}), "
            f"got {tuple(inv_freq.shape)}"
        )
    if scaling is not None or isinstance(base, (Sequence, Tensor)) or base != 10000.0:
        raise PosencValueError(
            "inv_freq replaces base and scaling: pass base and scaling at their defaults, got "
            f"base={base!r}, scaling={scaling!r}"
        )
    freq = inv_freq.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(freq).all()):
        raise PosencValueError("inv_freq must be finite")
    return freq[0] if freq.dim() == 2 and freq.shape[0] == 1 else freq.clone()


def frequencies(
    spec: RotarySpec, bases: tuple[float, ...] | None, given: Tensor | None, seq_len: float | None
) -> tuple[Tensor, float]:
    """``(inv_freq, attention_factor)`` of a RoPE module at the length ``seq_len``, float64:
    the ``given`` frequencies, one row per base of ``bases`` (``(H, r/2)``, each what the
    spec gives with that base), or the spec's ``(r/2,)``."""
    if given is not None:
        return given, 1.0
    if bases is None:
        return spec.frequencies(seq_len)
    rows = [replace(spec, base=b).frequencies(seq_len) for b in bases]
    factors = {factor for _, factor in rows}
    if len(factors) > 1:  # (no built-in type's factor reads the base)
        raise PosencValueError(
            f"base={bases}: the attention factors of the heads differ ({sorted(factors)})"
        )
    return torch.stack([row for row, _ in rows]), rows[0][1]


def head_axis(t: Tensor, heads: int) -> Tensor:
    """A flat per-head table ``(n, H * r/2)`` or ``(b, 1, n, H * r/2)`` given its head axis,
    ``(H, n, r/2)`` or ``(b, H, n, r/2)``: views."""
    if t.dim() == 4:
        t = t.squeeze(1)  # (b, n, H * r/2)
    return t.unflatten(-1, (heads, -1)).transpose(-3, -2)


@dataclass(frozen=True)
class RotaryHeads:
    """Which heads turn, and how a per-head table's rows map to them.

    Attributes:
        count: rotated query heads ``R`` (``None``: every head).
        last: the last ``R`` heads instead of the first.
        table_heads: rows ``H`` of a per-head table (``None``: one table for every head).
    """

    count: int | None = None
    last: bool = False
    table_heads: int | None = None

    @property
    def trivial(self) -> bool:
        """Every head turns, by the same table."""
        return self.count is None and self.table_heads is None

    def summary(self) -> str:
        """What :meth:`extra_repr` adds."""
        text = "" if self.count is None else f", rotary_heads={self.count}"
        if self.count is not None and self.last:
            text += ", rotary_heads_at='last'"
        return text

    def part(self, x: Tensor, group: int, name: str) -> tuple[Tensor, int]:
        """The heads of ``x`` ``(b, hx, n, d)`` that turn, a view, and how many query heads
        share each of them in a table row (``group``: query heads per head of ``x``; 1 for
        queries, ``hq / hk`` for keys)."""
        hx = x.shape[1]
        queries = hx * group
        count = queries if self.count is None else self.count
        if count > queries:
            raise PosencValueError(f"rotary_heads ({count}) must be <= the query heads ({queries})")
        if count % group:
            raise PosencValueError(
                f"rotary_heads ({count}) must be a multiple of the query heads per key head "
                f"({queries} query heads, {hx} key heads: {group}), so that each key head's "
                "queries all rotate or none do"
            )
        rotated = count // group
        view = x if rotated == hx else (x[:, hx - rotated :] if self.last else x[:, :rotated])
        repeat = 1
        if self.table_heads is not None:
            if rotated % self.table_heads:
                raise PosencValueError(
                    f"frequencies for {self.table_heads} heads (rows of base=[...] or "
                    f"inv_freq) do not fit the {rotated} rotated heads of {name} (one row per "
                    "rotated key head; query head i of the rotated ones turns by row i // "
                    "(query heads per key head))"
                )
            repeat = rotated // self.table_heads
        return view, repeat

    def pair(self, q: Tensor, k: Tensor) -> tuple[Tensor, int, Tensor, int]:
        """The rotated views of ``q`` ``(b, hq, n, d)`` and ``k`` ``(b, hk, n, d)`` and the
        repeat of a per-head table's rows for each; refuses what has no clear meaning."""
        hq, hk = q.shape[1], k.shape[1]
        if hq % hk:
            if self.trivial:
                return q, 1, k, 1
            raise PosencValueError(
                f"rotary_heads or per-head frequencies need the query heads ({hq}) to be a "
                f"multiple of the key heads ({hk})"
            )
        q_view, q_repeat = self.part(q, 1, "q")
        k_view, k_repeat = self.part(k, hq // hk, "k")
        if self.table_heads is not None and k_repeat != 1:
            raise PosencValueError(
                f"frequencies for {self.table_heads} heads (rows of base=[...] or inv_freq): "
                "give one row per rotated key head "
                f"({k_view.shape[1]} of {hk} key heads for {hq} query heads)"
            )
        return q_view, q_repeat, k_view, k_repeat

    def check_counts(self, query_heads: int, key_heads: int) -> None:
        """Refuse, before any work, what :meth:`pair` would refuse for ``query_heads`` query
        heads and ``key_heads`` key heads (an attention's sizes, known when it is built)."""
        if self.trivial:
            return
        self.pair(torch.empty(0, query_heads, 0, 0), torch.empty(0, key_heads, 0, 0))

    def rows(self, tables: Tables, repeat: int) -> Tables:
        """A per-head table's rows ``(..., H, n, r/2)`` repeated ``repeat`` times each, for
        the query heads of a group (one table for every head: as it is)."""
        if repeat == 1 or self.table_heads is None:
            return tables
        return tables[0].repeat_interleave(repeat, -3), tables[1].repeat_interleave(repeat, -3)

    def join(self, x: Tensor, turned: Tensor, view: Tensor, inplace: bool) -> Tensor:
        """``x`` with its rotated heads ``view`` replaced by ``turned``: ``x`` itself in place
        (the view was turned in its storage), else one new tensor."""
        if view is x or inplace:
            return turned if view is x else x
        hx, rotated = x.shape[1], view.shape[1]
        if self.last:
            return torch.cat((x[:, : hx - rotated], turned), dim=1)
        return torch.cat((turned, x[:, rotated:]), dim=1)

    def apply_pair(
        self,
        q: Tensor,
        k: Tensor,
        q_tables: Tables,
        k_tables: Tables,
        interleaved: bool,
        inplace: bool,
        plan: Plan | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Turn the heads of ``q`` and ``k`` this selection names by the tables (``(n, r/2)``
        or ``(b, 1, n, r/2)``; per head ``(H, n, r/2)`` or ``(b, H, n, r/2)``)."""
        q_view, q_repeat, k_view, k_repeat = self.pair(q, k)
        if q_tables is k_tables and q_repeat == k_repeat:
            q_tables = k_tables = self.rows(q_tables, q_repeat)
        else:
            q_tables, k_tables = self.rows(q_tables, q_repeat), self.rows(k_tables, k_repeat)
        turned_q, turned_k = apply_tables_qk(
            q_view, k_view, q_tables, k_tables, interleaved, inplace, plan
        )
        return self.join(q, turned_q, q_view, inplace), self.join(k, turned_k, k_view, inplace)

    def apply_one(
        self,
        x: Tensor,
        tables: Tables,
        group: int,
        interleaved: bool,
        inplace: bool,
        plan: Plan | None = None,
    ) -> Tensor:
        """:meth:`apply_pair` for one tensor whose heads are each read by ``group`` query
        heads (1: queries)."""
        view, repeat = self.part(x, group, "x")
        turned = apply_tables(view, self.rows(tables, repeat), interleaved, inplace, "x", plan)
        return self.join(x, turned, view, inplace)
