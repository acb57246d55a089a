"""Axial N-D rotary embeddings (Heo et al. 2024, "Rotary Position Embedding for Vision
Transformer", RoPE-Axial): each group of channel pairs rotates with one axis's coordinate of
an image patch (2-D) or a video patch (3-D).

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim, ``r`` rotary dim,
``a`` number of axes.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ...errors import PosencTypeError, PosencValueError
from ..base import RotaryEncoding
from ..checks import check_finite, check_positive_int, compute_dtype, take_position_ids
from ..registry import register
from ..rope_types.builtin import default_inv_freq
from ..state import RotaryState
from .common import (
    TableRotation,
    apply_tables,
    apply_tables_qk,
    check_base,
    check_qk,
    check_rotary_dim,
    unsqueeze_heads,
)
from .layouts import Layout, stated_layout

__all__ = ["AxialRotaryEmbedding", "Rotary2DEmbedding", "Rotary3DEmbedding"]
#: Why ``layout="thd"`` is refused: packed sequences give 1-D positions, not coordinates.
THD_REFUSED = (
    "layout='thd' packs 1-D sequences: axial coordinates (n, a) cannot come from "
    "cu_seqlens; give bhsd or bshd tensors with their coordinates"
)


class AxialRotaryEmbedding(RotaryEncoding):
    """Axial N-D RoPE for image patches (2-D) and video (3-D): the rotary channels are split
    into ``ndim`` equal groups of pairs, and the pairs of group ``a`` rotate by the token's
    coordinate on axis ``a`` times that group's frequencies ``base^(-2i/(r/ndim))``
    (Heo et al. 2024, "Rotary Position Embedding for Vision Transformer", RoPE-Axial, eq. 12).
    Scores then depend only on the coordinate differences. In the interleaved layout this is
    rotary-embedding-torch's ``get_axial_freqs`` layout (checked equal in float32).

    Args:
        head_dim: channels per head; ``rotary_dim`` (default ``head_dim``) must be divisible
            by ``2 * ndim``.
        ndim: number of axes.
        base: the wavelength base of every axis.
        interleaved: pair layout, as for :class:`RotaryEmbedding`.
        learned_freq: make the per-axis frequencies trainable (RoPE-Mixed style learning
            per pair; initialised to the axial frequencies).

    Positions are coordinates, ``(n, ndim)`` or ``(b, n, ndim)``, integer or float; with
    ``ndim > 1`` they are required (:meth:`grid` makes a grid's), as a flattened input has no
    coordinates to guess.
    """

    paper: ClassVar[str] = "Heo et al. 2024, Rotary Position Embedding for Vision Transformer"

    def __init__(
        self,
        head_dim: int,
        *,
        ndim: int = 2,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        learned_freq: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.ndim = check_positive_int("ndim", ndim)
        self.head_dim = head_dim
        self.rotary_dim = check_rotary_dim(head_dim, rotary_dim, multiple=2 * ndim)
        self.base = check_base(base)
        self.interleaved = bool(interleaved)
        self.learned_freq = bool(learned_freq)
        per_axis = self.rotary_dim // ndim
        freq = default_inv_freq(per_axis, self.base, device=device).repeat(ndim)  # (r/2,)
        axis = torch.arange(ndim, device=device).repeat_interleave(per_axis // 2)  # (r/2,)
        self.register_buffer("axis_of_pair", axis, persistent=False)
        if self.learned_freq:
            self.freq = nn.Parameter(freq.float())
        else:
            self.register_buffer("inv_freq", freq, persistent=False)

    def reset_tables(self) -> None:
        """Rebuild the fixed buffers (the axis of each pair and, unless learned, the float64
        frequencies) on the module's device; used after ``to_empty``/``.to()``."""
        device = self.axis_of_pair.device
        if device.type == "meta":
            return
        per_axis = self.rotary_dim // self.ndim
        axis = torch.arange(self.ndim, device=device).repeat_interleave(per_axis // 2)
        self.axis_of_pair = axis
        if not self.learned_freq:
            self.inv_freq = default_inv_freq(per_axis, self.base, device=device).repeat(self.ndim)

    def _apply(self, fn: Any, recurse: bool = True) -> AxialRotaryEmbedding:
        super()._apply(fn, recurse)
        self.reset_tables()
        return self

    def coordinates(self, positions: Tensor | None, n: int, batch: int, device: Any) -> Tensor:
        """Validate coordinates ``(n, ndim)`` / ``(b, n, ndim)``; without them only one axis
        has a default (``arange``): N-D coordinates are refused rather than guessed, as the
        N-D sinusoidal encodings refuse a flattened input without them."""
        if positions is None:
            if self.ndim > 1:
                raise PosencValueError(
                    f"{type(self).__name__} needs positions: coordinates of shape "
                    f"(seq, {self.ndim}) or (batch, seq, {self.ndim}) with seq={n} (e.g. "
                    f"AxialRotaryEmbedding.grid(...) for a grid); without them every token "
                    "would sit on one row"
                )
            return torch.arange(n, device=device, dtype=torch.float32).unsqueeze(-1)  # (n, 1)
        if not isinstance(positions, Tensor):
            raise PosencTypeError(
                f"positions must be a torch.Tensor, got {type(positions).__name__}"
            )
        if positions.dtype == torch.bool or positions.is_complex():
            raise PosencTypeError(
                f"positions must be an integer or float tensor, got {positions.dtype}"
            )
        shape = tuple(positions.shape)
        if positions.dim() not in (2, 3) or shape[-2:] != (n, self.ndim):
            raise PosencValueError(
                f"positions must be coordinates of shape (seq, {self.ndim}) or "
                f"(batch, seq, {self.ndim}) with seq={n}, got {shape}"
            )
        if positions.dim() == 3 and shape[0] not in (1, batch):
            raise PosencValueError(f"positions has batch size {shape[0]} but the input has {batch}")
        return check_finite("positions", positions)

    @staticmethod
    def grid(*shape: int, device: Any = None) -> Tensor:
        """Row-major coordinates of every point of a grid: ``(prod(shape), len(shape))``."""
        for axis, size in enumerate(shape):
            check_positive_int(f"shape[{axis}]", size)
        axes = torch.meshgrid(*(torch.arange(s, device=device) for s in shape), indexing="ij")
        return torch.stack(axes, dim=-1).reshape(-1, len(shape))

    def cos_sin(self, coords: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin of the per-pair angles: ``(n, r/2)`` or ``(b, 1, n, r/2)``."""
        freq = self.freq if self.learned_freq else self.inv_freq
        axis = self.axis_of_pair.to(coords.device)
        picked = coords.to(torch.float64)[..., axis]  # (..., n, r/2): each pair's coordinate
        angles = picked * freq.to(coords.device, torch.float64)
        return unsqueeze_heads(angles.cos().to(dtype)), unsqueeze_heads(angles.sin().to(dtype))

    def position_state(self, positions: Tensor | None, x: Tensor) -> RotaryState:
        """cos and sin of the coordinates, computed once for every layer of a forward."""
        coords = self.coordinates(positions, x.shape[1], x.shape[0], x.device)
        cos_sin = self.cos_sin(coords, compute_dtype(x.dtype))
        return TableRotation(self.interleaved, cos_sin, cos_sin)

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
        ``inplace=True`` in its own storage;
        ``position_ids`` is ``positions``'s other name; ``layout`` and the packing arguments
        as for :meth:`RotaryEmbedding.forward` (:mod:`~.layouts`). ``thd`` is refused."""
        positions = take_position_ids(positions, position_ids)
        if layout == "thd":
            raise PosencValueError(THD_REFUSED)
        stated = stated_layout(
            x, None, positions, layout, cu_seqlens, seqlen_offsets, max_seqlen, coordinates=True
        )
        if stated is not None:
            return stated.one(self.rotate(stated.q, stated.positions, inplace=inplace))
        x, _ = check_qk(x, x, self.head_dim)
        coords = self.coordinates(positions, x.shape[2], x.shape[0], x.device)
        tables = self.cos_sin(coords, compute_dtype(x.dtype))
        return apply_tables(x, tables, self.interleaved, inplace)

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
        ``(b, n, a)``; ``inplace`` as for :meth:`RotaryEmbedding.forward` (not with learned
        frequencies under autograd);
        ``position_ids`` is ``positions``'s other name; ``layout`` and the packing arguments
        as for :meth:`RotaryEmbedding.forward` (:mod:`~.layouts`). ``thd`` is refused."""
        positions = take_position_ids(positions, position_ids)
        if layout == "thd":
            raise PosencValueError(THD_REFUSED)
        stated = stated_layout(
            q, k, positions, layout, cu_seqlens, seqlen_offsets, max_seqlen, coordinates=True
        )
        if stated is not None:
            return stated.pair(self(stated.q, stated.k, stated.positions, inplace=inplace))
        q, k = check_qk(q, k, self.head_dim)
        b, _, n, _ = q.shape
        coords = self.coordinates(positions, n, b, q.device)
        work = torch.promote_types(compute_dtype(q.dtype), compute_dtype(k.dtype))
        tables = self.cos_sin(coords, work)
        return apply_tables_qk(q, k, tables, tables, self.interleaved, inplace)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, ndim={self.ndim}, rotary_dim={self.rotary_dim}, "
            f"base={self.base:g}, interleaved={self.interleaved}, learned_freq={self.learned_freq}"
        )


@register("rope2d", "axial 2-D rotary embedding on (row, col) coordinates (images)")
class Rotary2DEmbedding(AxialRotaryEmbedding):
    """:class:`AxialRotaryEmbedding` with ``ndim=2``; positions ``(n, 2)`` or ``(b, n, 2)``."""

    axes: ClassVar[int] = 2

    def __init__(self, head_dim: int, **kwargs: Any) -> None:
        super().__init__(head_dim, ndim=2, **kwargs)


@register("rope3d", "axial 3-D rotary embedding on (t, row, col) coordinates (video)")
class Rotary3DEmbedding(AxialRotaryEmbedding):
    """:class:`AxialRotaryEmbedding` with ``ndim=3``; positions ``(n, 3)`` or ``(b, n, 3)``."""

    axes: ClassVar[int] = 3

    def __init__(self, head_dim: int, **kwargs: Any) -> None:
        super().__init__(head_dim, ndim=3, **kwargs)
