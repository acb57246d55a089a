"""The cos/sin tables of a :class:`~posenc.RotaryEmbedding` and the positions that read them.

* :func:`read_positions` validates the positions of one call once and, for integer positions
  on the CPU in eager mode, reads their extent (smallest, largest, one run ``p, p+1, ...`` or
  not); a decode step (up to :data:`FEW_POSITIONS` integer positions) costs one ``tolist``.
* :func:`bounded_positions` stands in for it in a cached or packed forward, whose positions
  the host knows a bound of (:mod:`posenc.sequence.context`): the tables are sized from the
  bound and nothing is read.
* :class:`RotaryTables` owns the float32 ``cos_cached``/``sin_cached`` tables (registered as
  non-persistent buffers of the module, so ``.to()``, ``to_empty``, the meta device and
  ``state_dict`` treat them as buffers), their growth, the rows for given positions, and the
  decode lane (:meth:`RotaryTables.turn_at_rows`: q and k turned by rows of the tables where
  they lie); it falls back to the float64 formula where no table applies (float positions,
  float64 work, rope types whose frequencies move with the length, learned frequencies, far
  positions).

Positions on a GPU are not read on the host (a read would synchronise with the device in
every eager call). Their tables are sized ahead, to the module's maximum
(``max_position_embeddings``, at least :attr:`~posenc.RotaryEmbedding.initial_table_size`
rows), and a position outside them (negative, or past the last row) turns its row of ``q``
and ``k`` by NaN, never by another row. The value checks (negative, past the table, past the
whole numbers float64 holds) run where positions are on the CPU, and on a GPU only under
``POSENC_CHECK_POSITIONS=1`` (read per call), which reads them as on the CPU: the tables then
grow to the largest position and bad values raise. Rope types whose frequencies follow the
longest position (dynamic NTK, LongRoPE) read it wherever it lies, as Hugging Face does.

Neither asks torch whether a graph is being captured: both take ``eager`` (a field of the
:class:`~posenc.encodings.rotary.kernels.select.Plan`) from the caller's
:func:`~posenc.encodings.rotary.kernels.select.select`.

Dimension legend: ``b`` batch, ``n`` sequence, ``r`` rotary dim.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor, nn

from ...errors import MemoryBudgetError, check_bytes
from ..checks import (
    CHECK_VARIABLE,
    MAX_POSITION,
    PositionBound,
    check_position_range,
    on_host,
    resolve_positions,
    wide_integers,
)
from .common import unsqueeze_heads
from .kernels.rotate import pair_node
from .kernels.select import Mode, Plan

__all__ = [
    "FEW_POSITIONS",
    "RotaryTables",
    "bounded_positions",
    "read_positions",
    "reads_values",
]

#: Integer dtypes whose positions :func:`read_positions` validates in one read.
INTEGER = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
#: Up to this many positions are read whole (one transfer), and a run ``p, p+1, ...`` is
#: taken from the table as a view instead of gathered.
FEW_POSITIONS = 16

#: ``(smallest, largest, one run)`` of integer positions; from a bound
#: (:func:`bounded_positions`), ``(0, the bound, False)``: every position lies in between.
Extent = tuple[int, int, bool]


def reads_values(positions: Tensor) -> bool:
    """Whether the values of ``positions`` are read on the host: on the CPU, or anywhere
    under ``POSENC_CHECK_POSITIONS=1``."""
    return on_host(positions) or os.environ.get(CHECK_VARIABLE) == "1"


def _extent(positions: Tensor) -> Extent:
    """The smallest and largest of integer ``positions`` and whether they are one run
    ``lo, lo + 1, ...`` (1-D only), read from the device once."""
    if positions.numel() <= FEW_POSITIONS:
        if positions.dim() == 1:
            values = positions.tolist()
            lo, hi = min(values), max(values)
            return lo, hi, hi - lo == len(values) - 1 and values == list(range(lo, hi + 1))
        values = positions.flatten().tolist()
        return min(values), max(values), False
    lo, hi = torch.aminmax(positions)
    return int(lo), int(hi), False


def read_positions(
    positions: Tensor | None, n: int, batch: int, device: Any, eager: bool
) -> tuple[Tensor | None, Extent | None]:
    """Validated positions (``None`` stays ``None``) and, for integer positions read in eager
    mode, their :func:`_extent`, checked to lie in ``[0, 2**53]``
    (:func:`~posenc.encodings.checks.check_position_range`). The common case (an integer
    tensor of the right shape) costs one read, and a decode step's few 1-D positions one ``tolist``;
    anything else goes through :func:`~posenc.encodings.checks.resolve_positions`, which
    names what is wrong."""
    if positions is None:
        return None, None
    if isinstance(positions, Tensor):
        positions = wide_integers(positions)  # (uint8: rows, never a mask)
    if (  # a GPU's positions, unread: the tables are sized ahead
        type(positions) is Tensor and not reads_values(positions)
    ):
        return resolve_positions(positions, n, batch=batch, device=device, values=False), None
    if (  # a decode step: a few 1-D positions, read in one transfer
        eager
        and type(positions) is Tensor
        and positions.dtype in INTEGER
        and positions.dim() == 1
        and 0 < n <= FEW_POSITIONS
        and positions.shape[0] == n
        and not positions.is_meta
    ):
        values = positions.tolist()
        lo = values[0]
        if n == 1 and 0 <= lo <= MAX_POSITION:
            return positions, (lo, lo, True)
        if values == list(range(lo, lo + n)) and lo >= 0 and lo + n - 1 <= MAX_POSITION:
            return positions, (lo, lo + n - 1, True)
        lo, hi = min(values), max(values)
        check_position_range("positions", lo, hi)
        return positions, (lo, hi, False)
    if (
        eager
        and isinstance(positions, Tensor)
        and positions.dtype in INTEGER
        and positions.dim() in (1, 2)
        and positions.shape[-1] == n
        and (positions.dim() == 1 or positions.shape[0] in (1, batch))
        and positions.numel() > 0
        and not positions.is_meta
    ):
        extent = _extent(positions)
        check_position_range("positions", extent[0], extent[1])
        return positions, extent
    return resolve_positions(positions, n, batch=batch, device=device), None


def bounded_positions(
    positions: Tensor, bound: PositionBound | None, eager: bool
) -> tuple[Tensor, Extent] | None:
    """In place of :func:`read_positions` for the ``(b, n)`` integer ``positions`` of a context
    (validated there), made from the host's ``bound`` on them without reading the device;
    ``None`` where they are to be read (no bound, a captured graph, float positions). The
    tables then grow to cover the bound, so no row gathered lies outside them. The answer
    differs from the read only in what nothing uses: a read of 2-D positions finds no run,
    and the tables' rows do not depend on how many there are."""
    if bound is None or not eager or positions.is_meta or positions.dtype not in INTEGER:
        return None
    return positions, (0, bound.largest, False)


class RotaryTables:
    """cos and sin of a RoPE module's angles ``p * inv_freq`` for positions ``p``, times the
    attention factor (and sin negated for a clockwise turn): cached float32 rows for integer
    positions, the float64 formula cast once for the rest.

    Args:
        owner: the module whose non-persistent buffers ``cos_cached``/``sin_cached`` (and
            ``inv_freq``, the float64 frequencies) these are.
        rotary_dim: ``r``; the tables are ``(positions, r/2)``.
        caches: whether the module reads a table (fixed frequencies); else every call uses
            the formula.
        initial_size: rows built when the tables are first made; they grow by doubling.
        max_positions: the model's context length, up to which tables may grow.
        decode_lane: whether :meth:`turn_at_rows` may turn q and k by rows of the tables
            where they lie (fixed frequencies: not where they move with the length).
    """

    def __init__(
        self,
        owner: nn.Module,
        rotary_dim: int,
        *,
        caches: bool,
        initial_size: int,
        max_positions: int | None,
        decode_lane: bool = False,
        device: Any = None,
    ) -> None:
        empty = torch.empty(0, rotary_dim // 2, dtype=torch.float32, device=device)
        owner.register_buffer("cos_cached", empty, persistent=False)
        owner.register_buffer("sin_cached", empty.clone(), persistent=False)
        self._buffers = owner._buffers  # (the same dict after .to(), to_empty, deepcopy)
        self.half = rotary_dim // 2
        self.caches = caches
        self.initial_size = initial_size
        self.max_positions = max_positions
        self.decode_lane = decode_lane and caches
        #: What cos and sin are multiplied by (the attention factor; sin negated clockwise).
        self.cos_factor = self.sin_factor = 1.0

    def scale(self, attention_factor: float, *, clockwise: bool) -> None:
        """Multiply cos and sin by ``attention_factor``, and negate sin for a clockwise turn
        (``sin(-a) = -sin(a)``; cos is even)."""
        self.cos_factor = attention_factor
        self.sin_factor = -attention_factor if clockwise else attention_factor

    def formula(self, positions: Tensor, freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin of ``positions * freq`` formed in float64 and cast once to ``dtype``:
        ``(n, r/2)`` or ``(b, 1, n, r/2)``; per-head frequencies ``(H, r/2)`` are flattened,
        their tables ``H * r/2`` wide."""
        freq = freq.to(torch.float64).flatten()
        angles = positions.to(torch.float64)[..., None] * freq  # (..., n, r/2)
        cos = (angles.cos() * self.cos_factor).to(dtype)
        sin = (angles.sin() * self.sin_factor).to(dtype)
        return unsqueeze_heads(cos), unsqueeze_heads(sin)

    def build(self, num_positions: int | None = None) -> None:
        """Make the float32 tables on their device from the ``inv_freq`` buffer: rows
        ``0 .. num_positions - 1`` (default: as many as now, and at least ``initial_size``
        where the module reads a table, within the memory budget)."""
        device = self._buffers["cos_cached"].device
        if device.type == "meta":
            return
        n = self._buffers["cos_cached"].shape[0] if num_positions is None else num_positions
        if num_positions is None and self.caches and n < self.initial_size:
            n = self._rows_for(self.initial_size, 0, device) or n
        # tables built under inference_mode would be inference tensors, which a later
        # training step could not save for backward
        with torch.inference_mode(False):
            positions = torch.arange(n, dtype=torch.float64, device=device)
            cos, sin = self.formula(positions, self._buffers["inv_freq"], torch.float32)
            self._buffers["cos_cached"], self._buffers["sin_cached"] = cos, sin

    def _rows_for(self, needed: int, seq_len: int, device: Any) -> int | None:
        """Rows to grow the tables to so that they cover ``needed`` positions for a request
        of ``seq_len``, or ``None`` to compute the angles of the positions given instead (the
        same values). Tables grow by doubling but stay in proportion to the work: at most
        ``initial_size`` rows, the model's context, or four times the request, and within
        the memory budget."""
        limit = max(self.initial_size, self.max_positions or 0, 4 * seq_len)
        if needed > limit:
            return None
        rows = self._buffers["cos_cached"].shape[0]
        rows = min(max(needed, self.initial_size, 2 * rows), limit)
        # float32 cos and sin tables, plus the float64 angles, cos and sin while building
        nbytes = rows * self.half * (2 * 4 + 3 * 8)
        try:
            check_bytes("positions", f"up to {rows - 1}", nbytes, device=device)
        except MemoryBudgetError:
            return None
        return rows

    def read(
        self, positions: Tensor | None, n: int, batch: int, device: Any, eager: bool
    ) -> tuple[Tensor | None, Extent | None]:
        """:func:`read_positions`, with the default ``arange(n)`` as one run from row 0."""
        if positions is None:
            return None, ((0, n - 1, True) if n else None)
        return read_positions(positions, n, batch, device, eager)

    def turn_at_rows(
        self,
        q: Tensor,
        k: Tensor,
        read: tuple[Tensor | None, Extent | None],
        interleaved: bool,
        inplace: bool,
        plan: Plan,
    ) -> tuple[Tensor, Tensor] | None:
        """The decode lane: ``q`` and ``k`` ``(b, h, n, d)`` turned as a pair by the kernel of
        ``plan`` reading rows of the whole tables where they lie, nothing gathered: one run
        ``p, p+1, ...`` in the table (a decode step) by its first row, other integer positions
        by the positions themselves for a kernel that indexes rows on the device (the Triton
        kernel, which turns a row outside the table by NaN). ``None`` where the lane does not
        apply (frequencies that move, another mode, float positions, a kernel refusing the
        data): the caller gathers the rows (:meth:`rows`) and turns q and k by them."""
        mode = plan.mode
        if not self.decode_lane or not (
            mode is Mode.EAGER or (mode is Mode.FUNCTION and not inplace)
        ):
            return None
        positions, extent = read
        device = q.device
        rows: int | Tensor | None = self.first_row(extent, q.shape[2], device)
        if (
            rows is None
            and positions is not None
            and positions.dtype in (torch.int64, torch.int32)
            and positions.device == device
        ):
            if extent is None and plan.kernel is not None and plan.kernel.reads_positions:
                if self.size_ahead(device):  # (positions left unread: the kernel masks the rest)
                    rows = positions
            elif self.in_table(extent, device):
                rows = positions
        if rows is None:
            return None
        cos, sin = self._buffers["cos_cached"], self._buffers["sin_cached"]
        if mode is Mode.EAGER:
            assert plan.kernel is not None
            return plan.kernel.turn_pair(q, k, cos, sin, interleaved, inplace, rows)
        return pair_node(q, k, cos, sin, interleaved, inplace, plan, rows)

    def size_ahead(self, device: Any) -> bool:
        """Grow the tables to the module's maximum (``max_positions``, at least
        ``initial_size`` rows) for positions left unread; ``False`` where the memory budget
        does not allow that many rows (the caller then uses the formula)."""
        table = self._buffers["cos_cached"]
        want = max(self.initial_size, self.max_positions or 0)
        if table.shape[0] >= want:
            return True
        rows = self._rows_for(want, want, device)
        if rows is None:
            return False
        self.build(rows)
        return True

    def _unread_rows(
        self, positions: Tensor, dtype: torch.dtype, freq: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Rows of the tables sized ahead for integer ``positions`` left unread: a position
        outside them takes a NaN row (found on the device: no read)."""
        device = positions.device
        if not self.size_ahead(device):
            return self.formula(positions, freq, dtype)
        table_cos, table_sin = self._buffers["cos_cached"], self._buffers["sin_cached"]
        size = table_cos.shape[0]
        outside = ((positions < 0) | (positions >= size))[..., None]  # (..., n, 1)
        index = positions.clamp(0, size - 1)
        cos = table_cos[index].masked_fill(outside, float("nan")).to(dtype)
        sin = table_sin[index].masked_fill(outside, float("nan")).to(dtype)
        return unsqueeze_heads(cos), unsqueeze_heads(sin)

    def first_row(self, extent: Extent | None, n: int, device: torch.device) -> int | None:
        """Where the float32 table rows (on ``device``) of positions with this extent start,
        where they are one run already in the table (a decode step): a kernel then reads
        them where they lie. ``None`` otherwise."""
        if extent is None or not extent[2] or not self.in_table(extent, device):
            return None
        return extent[0]

    def in_table(self, extent: Extent | None, device: torch.device) -> bool:
        """Whether integer positions with this extent (validated, non-negative) all have rows
        in the float32 table on ``device``: a kernel that indexes rows on the device may then
        read them from the whole table, gathering nothing."""
        table = self._buffers["cos_cached"]
        return (
            extent is not None
            and self.caches
            and extent[1] < table.shape[0]
            and table.dtype is torch.float32
            and table.device == device
        )

    def rows(
        self,
        positions: Tensor | None,
        n: int,
        dtype: torch.dtype,
        device: Any,
        extent: Extent | None,
        eager: bool,
        freq: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """cos and sin for validated ``positions`` (``None``: ``0 .. n - 1``) with their
        :func:`read_positions` extent, ``(n, r/2)`` or ``(b, 1, n, r/2)`` in ``dtype``: rows
        of the tables (grown where ``eager``), or the formula with frequencies ``freq``."""
        buffers = self._buffers  # (nn.Module's __getattr__ costs a microsecond a buffer)
        table_cos = buffers["cos_cached"]
        if (  # the common case first (a decode step): one run of rows already in the table
            extent is not None
            and extent[2]
            and extent[1] < table_cos.shape[0]
            and table_cos.dtype is dtype
            and self.caches
            and not table_cos.is_meta
        ):
            lo = extent[0]
            return table_cos[lo : lo + n], buffers["sin_cached"][lo : lo + n]  # (n, r/2)
        device = table_cos.device if device is None else device
        table_ok = (
            self.caches
            and dtype != torch.float64
            # a meta module has no table to read, and meta positions no largest value
            and not table_cos.is_meta
            and not (positions is not None and positions.is_meta)
        )
        if not eager:  # a captured graph must not grow the tables, only read them
            if table_ok and positions is None and n <= table_cos.shape[0]:
                # rows of the table are one input of the graph; the formula would instead be
                # fused into (and recomputed by) every use, q's and k's rotation alike
                return table_cos[:n].to(dtype), buffers["sin_cached"][:n].to(dtype)
            table_ok = False
        if not table_ok or (positions is not None and positions.is_floating_point()):
            pos = torch.arange(n, device=device) if positions is None else positions
            return self.formula(pos, freq, dtype)
        if positions is None or not positions.numel():
            needed = n
        elif extent is not None:
            needed = extent[1] + 1
        elif reads_values(positions):
            needed = int(positions.max()) + 1
        else:
            return self._unread_rows(positions, dtype, freq)
        if needed > table_cos.shape[0]:
            rows = self._rows_for(needed, n, device)
            if rows is None:
                # a far position (one new token at 10^9 in a long KV cache): the angles of
                # the positions asked for, never a table up to the largest one
                pos = torch.arange(n, device=device) if positions is None else positions
                return self.formula(pos, freq, dtype)
            self.build(rows)
            table_cos = buffers["cos_cached"]
        table_sin = buffers["sin_cached"]
        if positions is None:
            cos, sin = table_cos[:n], table_sin[:n]  # (n, r/2)
        elif extent is not None and extent[2]:  # one run p, p+1, ...: rows of the table, views
            lo = extent[0]
            cos, sin = table_cos[lo : lo + n], table_sin[lo : lo + n]
        else:
            cos, sin = table_cos[positions], table_sin[positions]  # (..., n, r/2)
        if cos.dtype != dtype:
            cos, sin = cos.to(dtype), sin.to(dtype)
        return unsqueeze_heads(cos), unsqueeze_heads(sin)
