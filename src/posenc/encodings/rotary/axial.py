"""Axial N-D rotary embeddings (Heo et al. 2024, "Rotary Position Embedding for Vision
Transformer", RoPE-Axial): each group of channel pairs rotates with one axis's coordinate of
an image patch (2-D) or a video patch (3-D).

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim, ``r`` rotary dim,
``a`` number of axes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from ...errors import PosencTypeError, PosencValueError
from ..base import RotaryEncoding
from ..checks import (
    check_finite,
    check_grid_positions,
    check_positive_float,
    check_positive_int,
    compute_dtype,
    take_position_ids,
)
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


#: rotary-embedding-torch's default ``max_freq`` for ``freqs_for="pixel"``.
DEFAULT_MAX_FREQ = 10.0
DEFAULT_BASE = 10000.0


def _sizes(name: str, value: object, ndim: int, *, even: bool = False) -> tuple[int, ...]:
    """``value`` as a tuple of ``ndim`` positive ints (even ones with ``even``), or raise
    naming ``name`` and the value."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise PosencTypeError(
            f"{name} must be a tuple of {ndim} ints, got {type(value).__name__} ({value!r})"
        )
    sizes = tuple(check_positive_int(f"{name}[{a}]", v) for a, v in enumerate(value))
    if len(sizes) != ndim:
        raise PosencValueError(f"{name} must give one size per axis ({ndim}), got {value!r}")
    if even and any(v % 2 for v in sizes):
        raise PosencValueError(f"{name} must hold even sizes (channel pairs), got {sizes}")
    return sizes


def _bases(base: object, ndim: int) -> float | tuple[float, ...]:
    """One base for every axis, or a tuple of one per axis; each finite, > 0 and not 1."""
    if isinstance(base, (str, bytes)) or not isinstance(base, Sequence):
        return check_base(base)
    if len(base) != ndim:
        raise PosencValueError(f"base must be a number or one per axis ({ndim}), got {base!r}")
    bases = tuple(check_positive_float(f"base[{a}]", b) for a, b in enumerate(base))
    if 1.0 in bases:
        raise PosencValueError(f"base must not hold 1.0 (every frequency would be equal): {base}")
    return bases


class AxialRotaryEmbedding(RotaryEncoding):
    """Axial N-D RoPE for image patches (2-D) and video (3-D): the rotary channels are split
    into ``ndim`` groups of pairs, and the pairs of group ``a`` rotate by the token's
    coordinate on axis ``a`` times that group's frequencies (Heo et al. 2024, "Rotary Position
    Embedding for Vision Transformer", RoPE-Axial, eq. 12): by default ``ndim`` equal groups
    with ``base^(-2i/(r/ndim))``. Scores then depend only on the coordinate differences. In
    the interleaved layout this is rotary-embedding-torch's ``get_axial_freqs`` layout.

    Three options follow the models people run (each checked in
    ``tests/encodings/rotary/test_axial_options.py``):

    * ``axes_dim=(c_0, ..., c_{a-1})``: unequal groups, ``c_a / 2`` pairs on axis ``a`` with
      ``f_i = base_a^(-2i/c_a)`` (Flux, Black Forest Labs 2024, and Qwen-Image: ``(16, 56,
      56)`` over ``(t, row, col)`` with head dim 128 and base 10000 on every axis, interleaved
      pairs; diffusers' ``FluxPosEmbed``). ``base`` may give one base per axis.
    * ``freqs_for="pixel"``: ``f_i = π · (1 + i · (max_freq/2 − 1) / (k − 1))``, ``i < k``,
      ``k = c_a / 2`` (``linspace(1, max_freq/2, k) · π``; rotary-embedding-torch's
      ``freqs_for="pixel"``, timm's linear pixel bands with ``max_res = max_freq``), meant for
      coordinates in ``[-1, 1]`` (:meth:`pixel_grid`). ``base`` is not used.
    * ``ref_feat_shape=(H_0, ...)``: EVA's resolution rescaling (Fang et al. 2023, EVA-02;
      timm ``RotaryEmbeddingCat(ref_feat_shape=)``): before the rotation each coordinate
      becomes ``c_a · H_a / F_a``, ``F`` the grid the positions come from, so a model trained
      on an ``H`` grid keeps its range of angles on another. ``F`` is ``feat_shape`` when
      given, else the largest coordinate + 1 on each axis (per batch row; coordinates from 0,
      as :meth:`grid` makes them). timm's ``grid_offset`` is a shift of the coordinates (give
      ``feat_shape`` then) and its ``grid_indexing="xy"`` is ``(col, row)`` coordinates with
      both shapes given as ``(w, h)``.

    Args:
        head_dim: channels per head; ``rotary_dim`` (default ``head_dim``) must be divisible
            by ``2 * ndim``, or be ``sum(axes_dim)`` when ``axes_dim`` is given.
        ndim: number of axes.
        base: the wavelength base, of every axis or one per axis (a tuple of ``ndim``).
        interleaved: pair layout, as for :class:`RotaryEmbedding`.
        learned_freq: make the per-axis frequencies trainable (RoPE-Mixed style learning
            per pair; initialised to the axial frequencies).
        axes_dim: rotary channels per axis (even, summing to ``rotary_dim``); ``None``: equal.
        freqs_for: ``"lang"`` (``base``'s geometric frequencies) or ``"pixel"``.
        max_freq: the pixel frequencies' top (default 10, rotary-embedding-torch's); only with
            ``freqs_for="pixel"``.
        ref_feat_shape: the grid the model was trained on, one size per axis; ``None``: off.
        feat_shape: the grid the positions come from (with ``ref_feat_shape``; required with
            pixel frequencies, whose coordinates do not give it).

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
        base: float | Sequence[float] = DEFAULT_BASE,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        learned_freq: bool = False,
        axes_dim: Sequence[int] | None = None,
        freqs_for: Literal["lang", "pixel"] = "lang",
        max_freq: float | None = None,
        ref_feat_shape: Sequence[int] | None = None,
        feat_shape: Sequence[int] | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.ndim = check_positive_int("ndim", ndim)
        self.axes = self.ndim  # type: ignore[misc]  # the instance's, whatever the class says
        self.head_dim = head_dim
        multiple = 2 if axes_dim is not None else 2 * ndim
        self.rotary_dim = check_rotary_dim(head_dim, rotary_dim, multiple=multiple)
        if axes_dim is None:
            self.axes_dim = (self.rotary_dim // ndim,) * ndim
        else:
            self.axes_dim = _sizes("axes_dim", axes_dim, ndim, even=True)
            if sum(self.axes_dim) != self.rotary_dim:
                raise PosencValueError(
                    f"axes_dim {self.axes_dim} must sum to rotary_dim ({self.rotary_dim}), "
                    f"got {sum(self.axes_dim)}"
                )
        self.custom_split = axes_dim is not None
        self.base = _bases(base, ndim)
        if freqs_for not in ("lang", "pixel"):
            raise PosencValueError(f"freqs_for must be 'lang' or 'pixel', got {freqs_for!r}")
        self.freqs_for = freqs_for
        if freqs_for == "pixel":
            if self.base != DEFAULT_BASE:
                raise PosencValueError(
                    f"base ({base!r}) is not used with freqs_for='pixel'; leave it unset"
                )
            self.max_freq = check_positive_float(
                "max_freq", DEFAULT_MAX_FREQ if max_freq is None else max_freq
            )
        elif max_freq is not None:
            raise PosencValueError(
                f"max_freq ({max_freq!r}) is used only with freqs_for='pixel', not 'lang'"
            )
        else:
            self.max_freq = None
        self.ref_feat_shape = (
            None if ref_feat_shape is None else _sizes("ref_feat_shape", ref_feat_shape, ndim)
        )
        self.feat_shape = None if feat_shape is None else _sizes("feat_shape", feat_shape, ndim)
        if self.feat_shape is not None and self.ref_feat_shape is None:
            raise PosencValueError(
                f"feat_shape ({feat_shape!r}) is read only with ref_feat_shape; give both"
            )
        if freqs_for == "pixel" and self.ref_feat_shape is not None and self.feat_shape is None:
            raise PosencValueError(
                "ref_feat_shape with freqs_for='pixel' needs feat_shape: coordinates in "
                "[-1, 1] do not give the grid's size"
            )
        self.interleaved = bool(interleaved)
        self.learned_freq = bool(learned_freq)
        axis, freq = self.pair_tables(device)  # (r/2,) each
        self.register_buffer("axis_of_pair", axis, persistent=False)
        if self.learned_freq:
            self.freq = nn.Parameter(freq.float())
        else:
            self.register_buffer("inv_freq", freq, persistent=False)

    def pair_tables(self, device: Any = None) -> tuple[Tensor, Tensor]:
        """The axis of every rotated pair and its float64 frequency, ``(r/2,)`` each, in pair
        order: axis 0's pairs first."""
        axes, freqs = [], []
        for a, size in enumerate(self.axes_dim):
            k = size // 2
            axes.append(torch.full((k,), a, dtype=torch.long, device=device))
            if self.freqs_for == "pixel":
                top = self.max_freq / 2
                line = torch.linspace(1.0, top, k, dtype=torch.float64, device=device)
                freqs.append(line * math.pi)
            else:
                base = self.base[a] if isinstance(self.base, tuple) else self.base
                freqs.append(default_inv_freq(size, base, device=device))
        return torch.cat(axes), torch.cat(freqs)

    def reset_tables(self) -> None:
        """Rebuild the fixed buffers (the axis of each pair and, unless learned, the float64
        frequencies) on the module's device; used after ``to_empty``/``.to()``."""
        device = self.axis_of_pair.device
        if device.type == "meta":
            return
        axis, freq = self.pair_tables(device)
        self.axis_of_pair = axis
        if not self.learned_freq:
            self.inv_freq = freq

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
        check_grid_positions(positions, n, self.ndim, batch)
        return check_finite("positions", positions)

    @staticmethod
    def grid(*shape: int, device: Any = None) -> Tensor:
        """Row-major coordinates of every point of a grid: ``(prod(shape), len(shape))``."""
        for axis, size in enumerate(shape):
            check_positive_int(f"shape[{axis}]", size)
        axes = torch.meshgrid(*(torch.arange(s, device=device) for s in shape), indexing="ij")
        return torch.stack(axes, dim=-1).reshape(-1, len(shape))

    @staticmethod
    def pixel_grid(*shape: int, device: Any = None) -> Tensor:
        """Row-major float32 coordinates of every point of a grid, each axis spaced evenly over
        ``[-1, 1]`` (``linspace(-1, 1, size)``; rotary-embedding-torch's ``get_axial_freqs``
        with ``freqs_for="pixel"``): ``(prod(shape), len(shape))``."""
        for axis, size in enumerate(shape):
            check_positive_int(f"shape[{axis}]", size)
        lines = (torch.linspace(-1.0, 1.0, s, device=device) for s in shape)
        axes = torch.meshgrid(*lines, indexing="ij")
        return torch.stack(axes, dim=-1).reshape(-1, len(shape))

    def rescale(self, coords: Tensor) -> Tensor:
        """EVA's rescaling of float64 coordinates ``(..., n, a)``: ``c_a · H_a / F_a`` with
        ``H = ref_feat_shape`` and ``F = feat_shape`` or, without it, the largest coordinate
        + 1 per axis and batch row (a constant: no gradient flows through it). Unchanged
        without ``ref_feat_shape``."""
        if self.ref_feat_shape is None:
            return coords
        ref = torch.tensor(self.ref_feat_shape, dtype=torch.float64, device=coords.device)
        if self.feat_shape is not None:
            feat = torch.tensor(self.feat_shape, dtype=torch.float64, device=coords.device)
        else:
            feat = coords.detach().amax(dim=-2, keepdim=True).clamp(min=0) + 1  # (..., 1, a)
        return coords * (ref / feat)

    def cos_sin(self, coords: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin of the per-pair angles: ``(n, r/2)`` or ``(b, 1, n, r/2)``."""
        freq = self.freq if self.learned_freq else self.inv_freq
        axis = self.axis_of_pair.to(coords.device)
        coords = self.rescale(coords.to(torch.float64))
        picked = coords[..., axis]  # (..., n, r/2): each pair's coordinate
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
        if self.freqs_for == "pixel":
            freqs = f"freqs_for='pixel', max_freq={self.max_freq:g}"
        elif isinstance(self.base, tuple):
            freqs = f"base=({', '.join(f'{b:g}' for b in self.base)})"
        else:
            freqs = f"base={self.base:g}"
        text = (
            f"head_dim={self.head_dim}, ndim={self.ndim}, rotary_dim={self.rotary_dim}, "
            f"{freqs}, interleaved={self.interleaved}, learned_freq={self.learned_freq}"
        )
        if self.custom_split:
            text += f", axes_dim={self.axes_dim}"
        if self.ref_feat_shape is not None:
            text += f", ref_feat_shape={self.ref_feat_shape}, feat_shape={self.feat_shape}"
        return text


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
