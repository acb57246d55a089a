"""Multimodal rotary embeddings (M-RoPE; Wang et al. 2024, "Qwen2-VL", §2.1): RoPE whose
positions have one row per axis, ``(rows, b, n)`` as transformers passes ``position_ids`` to
its vision-language models, each frequency pair turned by one row's position.

Frequencies, tables, scaling and the rotation are :class:`~posenc.RotaryEmbedding`'s own:
the cos/sin of every row are read from the same float32 tables (or the float64 formula) as
1-D positions would be, and each pair's column is taken from its row's table (a gather, no
arithmetic); the rotation is then the parent's, in place or not, with its native kernel. Text
positions, ``(n,)`` or ``(b, n)``, are the parent's call unchanged, and ``(rows, b, n)``
positions with equal rows give the same tables, so both rotate exactly as plain RoPE (a
decode step whose rows are equal, text being generated, is handed to the parent as such, to
rotate on its decode lane).

Which row turns which pair is the layout (:mod:`~posenc.encodings.rotary.mrope_layouts`):
``blocked`` (Qwen2-VL),
``interleaved`` (Qwen3-VL's MRoPE-I), ``alternating`` (ERNIE-4.5-VL) and ``blocked-channels``
(HunYuan-VL, where the two channels of a pair may take different rows' angles: then ``q`` is
turned by each row set in turn and the second channels taken from the second turn).

Dimension legend: ``R`` rows, ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim,
``r`` rotary dim, ``p = r/2`` pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from ...errors import PosencValueError
from ..checks import check_bool, compute_dtype, take_position_ids
from ..state import RotaryState
from .common import TableRotation, apply_tables, apply_tables_qk, check_qk
from .kernels.select import Plan, select
from .layouts import Layout, stated_layout
from .mrope_layouts import check_mrope, pair_rows
from .rope import RotaryEmbedding
from .rope_build import HF_CLASSES
from .tables import FEW_POSITIONS, read_positions, reads_values

__all__ = ["MultimodalRotaryEmbedding"]

Tables = tuple[Tensor, Tensor]


class MultimodalRotaryEmbedding(RotaryEmbedding):
    """Multimodal RoPE (M-RoPE): :class:`~posenc.RotaryEmbedding` taking positions with one
    row per axis (Qwen2-VL's temporal, height, width), each pair of channels turned by the
    position of the row the layout assigns it.

    Checked against transformers' rotary modules and apply functions of Qwen2-VL,
    Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4V, ERNIE-4.5-VL, HunYuan-VL and the other families of
    ``MROPE_LAYOUTS`` (built with :meth:`from_hf_config`), and against a float64 transcription
    of the layouts (``tests/encodings/rotary/test_multimodal.py``).

    Args:
        head_dim: channels per head ``d``.
        mrope_section: one count per position row, in row order: how many frequency pairs
            each row takes (see :mod:`posenc.encodings.rotary.mrope_layouts` for each layout's
            rule).
        mrope_layout: ``"blocked"`` (default; Qwen2-VL), ``"interleaved"`` (Qwen3-VL),
            ``"alternating"`` (ERNIE-4.5-VL) or ``"blocked-channels"`` (HunYuan-VL).
        **kwargs: :class:`~posenc.RotaryEmbedding`'s (``base``, ``rotary_dim``,
            ``interleaved``, ``scaling``, ...).

    Positions: ``(rows, b, n)`` or ``(rows, 1, n)`` with ``rows = len(mrope_section)``,
    integer or float; ``(n,)`` and ``(b, n)`` (text: every row the same) and ``None``
    rotate as :class:`~posenc.RotaryEmbedding` does. Length-dependent scaling (dynamic NTK,
    LongRoPE) follows the largest position of every row, as transformers'
    ``dynamic_rope_update`` does.

    >>> rope = MultimodalRotaryEmbedding(16, mrope_section=[2, 3, 3])
    >>> positions = torch.stack((torch.zeros(1, 5), torch.arange(5.0)[None], torch.ones(1, 5)))
    >>> q, k = rope(torch.randn(1, 4, 5, 16), torch.randn(1, 2, 5, 16), positions)
    >>> q.shape, k.shape
    (torch.Size([1, 4, 5, 16]), torch.Size([1, 2, 5, 16]))
    """

    paper: ClassVar[str] = "Wang et al. 2024, Qwen2-VL, §2.1 (Multimodal Rotary Position Embedding)"
    row_of_pair: Tensor

    def __init__(
        self,
        head_dim: int,
        *,
        mrope_section: Sequence[int] | None = None,
        mrope_layout: str = "blocked",
        **kwargs: Any,
    ) -> None:
        if mrope_section is None:
            raise PosencValueError(
                "mrope_section is required: one count of frequency pairs per position row, "
                "e.g. [16, 24, 24] (Qwen2-VL); a config of 1-D RoPE names none (build "
                "RotaryEmbedding.from_hf_config(config) for it)"
            )
        check_mrope(mrope_section, mrope_layout, None)  # the types, before any work
        super().__init__(head_dim, **kwargs)
        if not self.heads.trivial:  # (its own rotations turn every head by one table)
            given = {
                key: kwargs[key] for key in ("rotary_heads", "base", "inv_freq") if key in kwargs
            }
            raise PosencValueError(
                f"MultimodalRotaryEmbedding turns every head by one table; got {given}"
            )
        section = check_mrope(mrope_section, mrope_layout, self.rotary_dim)
        #: Pairs each position row takes, in row order (see
        #: :mod:`~posenc.encodings.rotary.mrope_layouts`).
        self.mrope_section: tuple[int, ...] = section
        #: How the pairs are assigned to rows: one of
        #: :data:`~posenc.encodings.rotary.mrope_layouts.LAYOUTS`.
        self.mrope_layout: str = mrope_layout
        #: Rows of the positions this module takes: ``len(mrope_section)``.
        self.rows = len(section)
        first, second = pair_rows(mrope_layout, section, self.rotary_dim // 2)
        #: Whether a pair's two channels can take different rows (``blocked-channels``).
        self.split_pairs = first != second
        rows = torch.tensor([first, second], dtype=torch.long, device=self.inv_freq.device)
        self.register_buffer("row_of_pair", rows, persistent=False)  # (2, p)

    # ----------------------------------------------------------------------- positions

    def _rows_of(self, positions: Tensor, batch: int, n: int) -> Tensor:
        """``positions`` checked as ``(rows, b, n)`` or ``(rows, 1, n)``."""
        shape = tuple(positions.shape)
        if shape[0] != self.rows or shape[2] != n or shape[1] not in (1, batch):
            raise PosencValueError(
                f"positions must have shape (rows, batch, seq) = ({self.rows}, {batch} or 1, "
                f"{n}) for mrope_section={list(self.mrope_section)}, got {shape}"
            )
        return positions

    def _check_text(self, positions: Tensor | None, batch: int) -> None:
        """Text positions ``(b, n)`` whose first size is the rows' count but not the batch's
        are M-RoPE positions missing their batch axis: say so, not "wrong batch size"."""
        if (
            isinstance(positions, Tensor)
            and positions.dim() == 2
            and positions.shape[0] == self.rows != batch
        ):
            raise PosencValueError(
                f"positions of shape {tuple(positions.shape)} are text positions (batch, "
                f"seq), but the input has batch size {batch}; multimodal positions have "
                f"shape (rows, batch, seq) = ({self.rows}, {batch}, {positions.shape[1]})"
            )

    def _text_rows(self, positions: Tensor, plan: Plan) -> Tensor | None:
        """A decode step's few checked positions whose rows are all equal (text tokens, as
        while generating), as 1-D RoPE's ``(n,)`` or ``(b, n)``: the same rotation, which the
        parent then turns on its decode lane. ``None`` otherwise (read only eagerly)."""
        if (
            not plan.eager
            or type(positions) is not Tensor
            or positions.is_meta
            or positions.numel() > FEW_POSITIONS * self.rows
            or not reads_values(positions)  # (a GPU's positions are not read)
        ):
            return None
        rows = positions.tolist()
        if any(row != rows[0] for row in rows[1:]):
            return None
        return positions[0, 0] if positions.shape[1] == 1 else positions[0]

    def _row_tables(
        self, positions: Tensor, batch: int, n: int, dtype: torch.dtype, device: Any, plan: Plan
    ) -> tuple[Tables, Tables]:
        """cos and sin of each pair at its row's position, for the pairs' first channels and
        for their second (the same tensors unless :attr:`split_pairs`): ``(n, p)`` for
        ``(rows, 1, n)`` positions, ``(b, 1, n, p)`` for ``(rows, b, n)``."""
        positions = self._rows_of(positions, batch, n)
        rows, pb, pairs = positions.shape[0], positions.shape[1], self.rotary_dim // 2
        flat = positions.reshape(rows * pb, n)  # one table read for every row
        flat, extent = read_positions(flat, n, rows * pb, device, plan.eager)
        assert flat is not None
        # the largest position of any row sets a length-dependent type's frequencies
        self._follow_length(flat, n, plan.eager)
        freq = self.freq if self.learned_freq else self._buffers["inv_freq"]
        cos, sin = self._tables.rows(flat, n, dtype, device, extent, plan.eager, freq)
        cos, sin = cos.reshape(rows, pb, n, pairs), sin.reshape(rows, pb, n, pairs)
        out_shape = (n, pairs) if pb == 1 else (pb, 1, n, pairs)

        def pick(table: Tensor, which: Tensor) -> Tensor:  # column i from row which[i]
            index = which.to(table.device).view(1, 1, 1, pairs).expand(1, pb, n, pairs)
            return table.gather(0, index).reshape(out_shape)

        first = (pick(cos, self.row_of_pair[0]), pick(sin, self.row_of_pair[0]))
        if not self.split_pairs:
            return first, first
        return first, (pick(cos, self.row_of_pair[1]), pick(sin, self.row_of_pair[1]))

    # ----------------------------------------------------------------------- rotation

    def _second_channels(self, x: Tensor) -> Tensor:
        """The view of ``x``'s channels that are the second of their pair."""
        r = self.rotary_dim
        return x[..., 1:r:2] if self.interleaved else x[..., r // 2 : r]

    def _apply_split_tables(
        self,
        q: Tensor,
        k: Tensor,
        tables: tuple[Tables, Tables],
        inplace: bool,
        plan: Plan | None,
    ) -> tuple[Tensor, Tensor]:
        """Rotate ``q``, ``k`` with the first channels' tables and the second channels'
        (``blocked-channels``): each by both, keeping the channels each was made for."""
        first, second = tables
        if not self.split_pairs:
            return apply_tables_qk(q, k, first, first, self.interleaved, inplace, plan)
        other_q, other_k = apply_tables_qk(q, k, second, second, self.interleaved, False)
        q, k = apply_tables_qk(q, k, first, first, self.interleaved, inplace, plan)
        self._second_channels(q).copy_(self._second_channels(other_q))
        self._second_channels(k).copy_(self._second_channels(other_k))
        return q, k

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        positions: Tensor | None = None,
        *,
        position_ids: Tensor | None = None,
        inplace: bool = False,
        layout: Layout = "bhsd",
        cu_seqlens: Tensor | None = None,
        seqlen_offsets: int | Tensor = 0,
        max_seqlen: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Rotate queries and keys by their positions.

        Shapes:
            q: ``(b, hq, n, d)``; k: ``(b, hk, n, d)``; positions: ``(rows, b, n)``,
            ``(rows, 1, n)``, or, for text, ``(n,)`` / ``(b, n)``. Returns ``(q, k)`` rotated
            as :meth:`RotaryEmbedding.forward` does (with ``inplace=True``, in their storage),
            ``position_ids``, ``layout`` and the packing arguments included.
        """
        positions = take_position_ids(positions, position_ids)
        stated = stated_layout(q, k, positions, layout, cu_seqlens, seqlen_offsets, max_seqlen)
        if stated is not None:
            return stated.pair(self(stated.q, stated.k, stated.positions, inplace=inplace))
        if not (isinstance(positions, Tensor) and positions.dim() == 3):
            self._check_text(positions, q.shape[0])
            return super().forward(q, k, positions, inplace=inplace)
        q, k = check_qk(q, k, self.head_dim)
        inplace = check_bool("inplace", inplace)
        plan = select(q, inplace=inplace, learned=self.learned_freq, pair=k, positions=positions)
        b, _, n, _ = q.shape
        text = self._text_rows(self._rows_of(positions, b, n), plan)
        if text is not None:
            return super().forward(q, k, text, inplace=inplace)
        work = compute_dtype(q.dtype)
        if k.dtype != q.dtype:
            work = torch.promote_types(work, compute_dtype(k.dtype))
        tables = self._row_tables(positions, b, n, work, q.device, plan)
        return self._apply_split_tables(q, k, tables, inplace, plan)

    def rotate(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        *,
        position_ids: Tensor | None = None,
        inplace: bool = False,
        layout: Layout = "bhsd",
        cu_seqlens: Tensor | None = None,
        seqlen_offsets: int | Tensor = 0,
        max_seqlen: int | None = None,
    ) -> Tensor:
        """Rotate one tensor ``(b, h, n, d)`` (queries, or keys for a KV cache) by positions
        of any shape :meth:`forward` takes; with ``inplace=True`` in its own storage;
        ``position_ids`` is ``positions``'s other name; ``layout`` and the packing arguments
        as for :meth:`RotaryEmbedding.forward` (:mod:`~.layouts`)."""
        positions = take_position_ids(positions, position_ids)
        stated = stated_layout(x, None, positions, layout, cu_seqlens, seqlen_offsets, max_seqlen)
        if stated is not None:
            return stated.one(self.rotate(stated.q, stated.positions, inplace=inplace))
        if not (isinstance(positions, Tensor) and positions.dim() == 3):
            self._check_text(positions, x.shape[0])
            return super().rotate(x, positions, inplace=inplace)
        x, _ = check_qk(x, x, self.head_dim)
        inplace = check_bool("inplace", inplace)
        plan = select(x, inplace=inplace, learned=self.learned_freq, positions=positions)
        text = self._text_rows(self._rows_of(positions, x.shape[0], x.shape[2]), plan)
        if text is not None:
            return super().rotate(x, text, inplace=inplace)
        work = compute_dtype(x.dtype)
        first, second = self._row_tables(positions, x.shape[0], x.shape[2], work, x.device, plan)
        if not self.split_pairs:
            return apply_tables(x, first, self.interleaved, inplace, "x", plan)
        other = apply_tables(x, second, self.interleaved, False, "x")
        x = apply_tables(x, first, self.interleaved, inplace, "x", plan)
        self._second_channels(x).copy_(self._second_channels(other))
        return x

    def cos_sin(
        self, positions: Tensor | None, seq_len: int, *, dtype: torch.dtype, device: Any = None
    ) -> tuple[Tensor, Tensor]:
        """cos and sin (times the attention factor) that :meth:`forward` would rotate by:
        ``(n, r/2)`` or ``(b, 1, n, r/2)``; for ``(rows, b, n)`` positions, each pair's column
        at its row's position. The ``blocked-channels`` layout, whose two channels of a pair
        may take different rows, has no single table for such positions: refused."""
        if not (isinstance(positions, Tensor) and positions.dim() == 3):
            return super().cos_sin(positions, seq_len, dtype=dtype, device=device)
        if self.split_pairs:
            raise PosencValueError(
                "cos_sin: with mrope_layout='blocked-channels' the two channels of a pair take "
                "different rows' angles, so (rows, batch, seq) positions have no single cos/sin "
                "table; rotate with forward(), rotate() or position_state()"
            )
        plan = select(
            self.inv_freq,
            inplace=False,
            learned=self.learned_freq,
            positions=positions,
            kernel=False,
        )
        first, _ = self._row_tables(positions, positions.shape[1], seq_len, dtype, device, plan)
        return first

    def position_state(self, positions: Tensor | None, x: Tensor) -> RotaryState:
        """cos and sin computed once for every layer of a forward, ``x`` being ``(b, n, dim)``
        (see :class:`RotaryState`); positions of any shape :meth:`forward` takes."""
        if not (isinstance(positions, Tensor) and positions.dim() == 3):
            return super().position_state(positions, x)
        plan = select(
            x, inplace=False, learned=self.learned_freq, positions=positions, kernel=False
        )
        work = compute_dtype(x.dtype)
        tables = self._row_tables(positions, x.shape[0], x.shape[1], work, x.device, plan)
        if not self.split_pairs:
            return TableRotation(self.interleaved, tables[0], tables[0])
        return SplitPairRotation(self, tables)

    def read_state(
        self,
        key_positions: Tensor | None,
        x: Tensor,
        memo: dict[str, Any],
        *,
        queries: int,
        keys: int,
        bound: Any = None,
    ) -> RotaryState:
        """Refused: multimodal positions are N-D (rows per section), and a StreamingCache
        places tokens on one axis."""
        raise PosencValueError(
            "MultimodalRotaryEmbedding (mrope) cannot be used with a StreamingCache: its "
            "positions are N-D (one row per section), the cache's in-cache positions 1-D"
        )

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, mrope_section={list(self.mrope_section)}, "
            f"mrope_layout={self.mrope_layout!r}"
        )


class SplitPairRotation(RotaryState):
    """The per-forward state of the ``blocked-channels`` layout: each layer's ``q`` and ``k``
    turned by the first and the second channels' tables (:meth:`~MultimodalRotaryEmbedding.
    _apply_split_tables`)."""

    def __init__(self, module: MultimodalRotaryEmbedding, tables: tuple[Tables, Tables]) -> None:
        super().__init__()
        self.module, self.tables = module, tables

    def rotate(self, q: Tensor, k: Tensor, inplace: bool) -> tuple[Tensor, Tensor]:
        return self.module._apply_split_tables(q, k, self.tables, inplace, None)


HF_CLASSES["mrope"] = MultimodalRotaryEmbedding
