"""Rotary embeddings over N-D coordinates with a frequency vector per rotated pair: pair ``p``
turns by ``angle_p = sum_a coords[a] * frequencies[p, a]``. Axial RoPE (Heo et al. 2024) is the
case where every row of ``frequencies`` has one nonzero entry; the vision towers of
transformers differ from one another only in which axis each pair follows, its frequency, and
where the pair's two channels sit (:mod:`posenc.hf.vision` writes each family's table), and a
learned dense table is LightGlue's keypoint rotation.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim, ``r`` rotary dim,
``p = r/2`` rotated pairs, ``a`` axes.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ...errors import PosencTypeError, PosencValueError
from ..base import RotaryEncoding
from ..checks import check_bool, check_positive_int, compute_dtype, take_position_ids
from ..state import RotaryState
from .axial import AxialRotaryEmbedding
from .common import apply_tables, apply_tables_qk, check_qk, check_rotary_dim, unsqueeze_heads
from .layouts import Layout, stated_layout

__all__ = ["GridRotaryEmbedding", "axial_frequencies"]


def axial_frequencies(axes: list[int], freqs: Tensor | list[float], ndim: int) -> Tensor:
    """The ``(p, ndim)`` float64 table of an axial rotation: row ``p`` holds ``freqs[p]`` in
    column ``axes[p]`` and zeros elsewhere."""
    freqs = torch.as_tensor(freqs, dtype=torch.float64, device="cpu")
    if freqs.dim() != 1 or len(axes) != freqs.numel():
        raise PosencValueError(
            f"axes ({len(axes)} entries) and freqs ({tuple(freqs.shape)}) must list one axis "
            "and one frequency per rotated pair"
        )
    if any(not 0 <= a < ndim for a in axes):
        raise PosencValueError(f"axes must lie in [0, {ndim}), got {sorted(set(axes))}")
    table = torch.zeros(len(axes), ndim, dtype=torch.float64, device="cpu")
    rows = torch.arange(len(axes), device="cpu")
    table[rows, torch.tensor(axes, dtype=torch.long, device="cpu")] = freqs
    return table


class GridRotaryEmbedding(RotaryEncoding):
    """RoPE over coordinates ``(n, a)``: pair ``p`` rotates by ``coords @ frequencies[p]``.

    Scores depend only on coordinate differences, as for any RoPE whose angle is linear in
    the position. Angles are formed in float64 and rounded once to the work dtype.

    Args:
        head_dim: channels per head; the first ``2 * p`` are rotated, the rest pass through.
        frequencies: ``(p, a)`` angular frequency of each pair along each axis.
        interleaved: pairs ``(2i, 2i+1)`` (GPT-J layout) instead of ``(i, i + r/2)``.
        blocks: split the rotated channels into this many equal contiguous blocks, each with
            its own half layout (Gemma 4's vision tower rotates each axis's block apart);
            ``1`` is the plain half layout. Only with ``interleaved=False``.
        learned: make ``frequencies`` a trainable float32 parameter (LightGlue's keypoint
            projection, RoPE-Mixed); otherwise a fixed float64 table.

    Positions are coordinates, ``(n, a)`` or ``(b, n, a)``, integer or float, required when
    ``a > 1`` (:meth:`grid` makes a grid's). A token at the origin is not rotated.
    """

    paper: ClassVar[str] = "Heo et al. 2024, Rotary Position Embedding for Vision Transformer"

    coordinates = AxialRotaryEmbedding.coordinates
    grid = staticmethod(AxialRotaryEmbedding.grid)

    def __init__(
        self,
        head_dim: int,
        frequencies: Tensor,
        *,
        interleaved: bool = False,
        blocks: int = 1,
        learned: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(frequencies, Tensor):
            raise PosencTypeError(
                f"frequencies must be a torch.Tensor of shape (pairs, axes), got "
                f"{type(frequencies).__name__}"
            )
        if frequencies.is_meta:
            raise PosencValueError("frequencies must hold values, not be on the meta device")
        if frequencies.dim() != 2 or 0 in frequencies.shape:
            raise PosencValueError(
                f"frequencies must have shape (pairs, axes), got {tuple(frequencies.shape)}"
            )
        if not torch.isfinite(frequencies).all():
            raise PosencValueError("frequencies must be finite")
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.ndim = frequencies.shape[1]
        self.axes = self.ndim  # (the registry's class attribute, per module here)
        self.interleaved = check_bool("interleaved", interleaved)
        self.blocks = check_positive_int("blocks", blocks)
        self.learned = check_bool("learned", learned)
        if self.blocks > 1 and self.interleaved:
            raise PosencValueError(
                f"blocks={blocks} needs interleaved=False (interleaved pairs are already local)"
            )
        self.rotary_dim = check_rotary_dim(head_dim, 2 * frequencies.shape[0], 2 * self.blocks)
        self._table = frequencies.detach().to("cpu", torch.float64).clone()
        device = torch.empty(0, device=device).device  # the ambient one (meta in a context)
        if self.learned:
            self.frequencies = nn.Parameter(self._table.to(device, torch.float32))
        else:
            self.register_buffer("frequencies", self._table.to(device), persistent=False)
        self.register_buffer("order", self._block_order(device), persistent=False)

    def _block_order(self, device: Any) -> Tensor:
        """Channel ``order[j]`` of the blocked layout sits at ``j`` of the plain half layout
        (``arange`` for one block)."""
        r, c = self.rotary_dim, self.rotary_dim // self.blocks
        pair = torch.arange(r // 2, device=device)
        first = (pair // (c // 2)) * c + pair % (c // 2)
        return torch.cat([first, first + c // 2])

    def reset_tables(self) -> None:
        """Rebuild the fixed float64 frequencies and the channel order on the module's device
        (after ``.to()``/``.float()``/``to_empty``)."""
        device = self.order.device
        if device.type == "meta":
            return
        if not self.learned:
            self.frequencies = self._table.to(device)
        self.order = self._block_order(device)

    def _apply(self, fn: Any, recurse: bool = True) -> GridRotaryEmbedding:
        super()._apply(fn, recurse)
        self.reset_tables()
        return self

    def cos_sin(self, coords: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin of the per-pair angles: ``(n, p)`` or ``(b, 1, n, p)``."""
        freq = self.frequencies.to(coords.device, torch.float64)
        angles = coords.to(torch.float64) @ freq.T  # (..., n, p)
        return unsqueeze_heads(angles.cos().to(dtype)), unsqueeze_heads(angles.sin().to(dtype))

    def _to_half(self, x: Tensor) -> Tensor:
        """The blocked layout's channels in the plain half layout (``x`` itself for one
        block)."""
        if self.blocks == 1:
            return x
        r = self.rotary_dim
        return torch.cat([x[..., :r].index_select(-1, self.order), x[..., r:]], dim=-1)

    def _from_half(self, x: Tensor) -> Tensor:
        if self.blocks == 1:
            return x
        r = self.rotary_dim
        back = torch.empty_like(x)
        back[..., r:] = x[..., r:]
        back[..., self.order] = x[..., :r]
        return back

    def _rotate_pair(
        self, q: Tensor, k: Tensor, tables: tuple[Tensor, Tensor], inplace: bool
    ) -> tuple[Tensor, Tensor]:
        if self.blocks == 1:
            return apply_tables_qk(q, k, tables, tables, self.interleaved, inplace)
        q, k = apply_tables_qk(self._to_half(q), self._to_half(k), tables, tables, False, False)
        return self._from_half(q), self._from_half(k)

    def position_state(self, positions: Tensor | None, x: Tensor) -> RotaryState:
        """cos and sin of the coordinates, computed once for every layer of a forward."""
        coords = self.coordinates(positions, x.shape[1], x.shape[0], x.device)
        tables = self.cos_sin(coords, compute_dtype(x.dtype))
        return RotaryState(lambda q, k, inplace: self._rotate_pair(q, k, tables, inplace))

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
        """Rotate one tensor ``(b, h, n, d)`` by coordinates ``(n, a)`` / ``(b, n, a)``; with
        ``inplace=True`` (one block only) in its own storage; ``position_ids`` and
        ``layout`` as for :meth:`forward`."""
        positions = take_position_ids(positions, position_ids)
        stated = stated_layout(
            x, None, positions, layout, cu_seqlens, seqlen_offsets, max_seqlen, coordinates=True
        )
        if stated is not None:
            return stated.one(self.rotate(stated.q, stated.positions, inplace=inplace))
        x, _ = check_qk(x, x, self.head_dim)
        coords = self.coordinates(positions, x.shape[2], x.shape[0], x.device)
        tables = self.cos_sin(coords, compute_dtype(x.dtype))
        if self.blocks == 1:
            return apply_tables(x, tables, self.interleaved, inplace)
        return self._from_half(apply_tables(self._to_half(x), tables, False, False))

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
        """Shapes: q ``(b, hq, n, d)``, k ``(b, hk, n, d)``, positions ``(n, a)`` or
        ``(b, n, a)``; ``inplace`` as for :meth:`RotaryEmbedding.forward` (a request, ignored
        for several blocks); ``position_ids`` is ``positions``'s other name; ``layout`` as
        for :meth:`RotaryEmbedding.forward` (:mod:`~.layouts`), ``thd`` and
        ``seqlen_offsets`` refused (they give 1-D positions, not coordinates)."""
        positions = take_position_ids(positions, position_ids)
        stated = stated_layout(
            q, k, positions, layout, cu_seqlens, seqlen_offsets, max_seqlen, coordinates=True
        )
        if stated is not None:
            return stated.pair(self(stated.q, stated.k, stated.positions, inplace=inplace))
        q, k = check_qk(q, k, self.head_dim)
        b, _, n, _ = q.shape
        coords = self.coordinates(positions, n, b, q.device)
        work = torch.promote_types(compute_dtype(q.dtype), compute_dtype(k.dtype))
        return self._rotate_pair(q, k, self.cos_sin(coords, work), inplace)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, ndim={self.ndim}, rotary_dim={self.rotary_dim}, "
            f"interleaved={self.interleaved}, blocks={self.blocks}, learned={self.learned}"
        )
