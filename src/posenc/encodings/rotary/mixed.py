"""RoPE-Mixed (Heo et al. 2024, "Rotary Position Embedding for Vision Transformer", eq. 13;
timm ``RotaryEmbeddingMixed``, naver-ai/rope-vit): every head of a layer owns learned 2-D
frequency vectors, so a pair turns by ``x · fx + y · fy``, mixing the two axes. They start at
the axial magnitudes ``temperature^(-4i/d)`` in a random direction per head: the first ``d/4``
pairs along ``θ``, the next ``d/4`` along ``θ + π/2``. Pairs are interleaved ``(2i, 2i+1)``.

One module is one layer's frequencies: give a model one per layer (:meth:`per_layer`) to train
them per layer as the paper does; ``Encoder(pe="rope-mixed")`` shares one across layers.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` tokens, ``d`` head dim, ``p = d/2`` pairs.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ...errors import PosencValueError
from ..base import RotaryEncoding
from ..checks import (
    check_bool,
    check_positive_float,
    check_positive_int,
    compute_dtype,
    take_position_ids,
)
from ..registry import register
from ..state import RotaryState
from .axial import AxialRotaryEmbedding
from .common import check_qk
from .layouts import Layout, stated_layout

__all__ = ["RotaryMixed", "mixed_frequencies"]


def mixed_frequencies(
    head_dim: int, num_heads: int, *, temperature: float = 10.0, rotate: bool = True
) -> Tensor:
    """``(2, h, d/2)`` float32 starting frequencies (``[fx, fy]``), drawn with torch's random
    generator as timm's ``init_random_2d_freqs`` draws one layer's: ``mag = temperature^(-4i/d)``
    for ``i < d/4``, a direction ``θ ~ U(0, 2π)`` per head (0 with ``rotate=False``),
    ``fx = [mag·cos θ, mag·cos(θ + π/2)]``, ``fy = [mag·sin θ, mag·sin(θ + π/2)]``."""
    mag = 1.0 / temperature ** (torch.arange(0, head_dim, 4, dtype=torch.float32) / head_dim)
    angles = torch.rand(num_heads, 1) * 2 * torch.pi if rotate else torch.zeros(num_heads, 1)
    fx = torch.cat([mag * torch.cos(angles), mag * torch.cos(angles + torch.pi / 2)], dim=-1)
    fy = torch.cat([mag * torch.sin(angles), mag * torch.sin(angles + torch.pi / 2)], dim=-1)
    return torch.stack([fx, fy])


@register("rope-mixed", "RoPE-Mixed: learned 2-D frequencies per head mixing rows and columns")
class RotaryMixed(RotaryEncoding):
    """RoPE-Mixed on ``(row, col)`` coordinates: pair ``i`` of head ``h`` turns by
    ``col · freqs[0, h, i] + row · freqs[1, h, i]`` (timm's ``t_x``, ``t_y``).

    Args:
        head_dim: channels per head, a multiple of 4.
        num_heads: heads of the layer; each has its own frequencies, so q and k must have this
            many heads.
        temperature: the magnitude base (timm's default 10).
        rotate: random initial directions (``False``: every head starts axial, ``θ = 0``).

    Attributes:
        freqs: the ``(2, h, d/2)`` learned parameter (timm's layout for one layer).

    Positions are coordinates ``(n, 2)`` or ``(b, n, 2)``, required.
    """

    paper: ClassVar[str] = "Heo et al. 2024, Rotary Position Embedding for Vision Transformer"
    axes: ClassVar[int] = 2
    ndim = 2

    coordinates = AxialRotaryEmbedding.coordinates
    grid = staticmethod(AxialRotaryEmbedding.grid)

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        *,
        temperature: float = 10.0,
        rotate: bool = True,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = check_positive_int("head_dim", head_dim)
        if head_dim % 4:
            raise PosencValueError(f"head_dim ({head_dim}) must be divisible by 4 for rope-mixed")
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.temperature = check_positive_float("temperature", temperature)
        self.rotate_init = check_bool("rotate", rotate)
        start = mixed_frequencies(head_dim, num_heads, temperature=self.temperature, rotate=rotate)
        self.freqs = nn.Parameter(start.to(device))

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> RotaryMixed:
        return cls(dim // num_heads, num_heads, **kwargs)

    @classmethod
    def per_layer(cls, depth: int, head_dim: int, num_heads: int, **kwargs: Any) -> list:
        """``depth`` modules, one per layer, each with its own frequencies (``Encoder(...,
        pe=RotaryMixed.per_layer(depth, ...))``)."""
        check_positive_int("depth", depth)
        return [cls(head_dim, num_heads, **kwargs) for _ in range(depth)]

    def cos_sin(self, coords: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin of every head's angles: ``(h, n, p)`` or ``(b, h, n, p)``."""
        freqs = self.freqs.to(coords.device, torch.float64)  # (2, h, p)
        coords = coords.to(torch.float64).unsqueeze(-3)  # (..., 1, n, 2): (row, col)
        angles = coords[..., 1:2] * freqs[0, :, None, :] + coords[..., 0:1] * freqs[1, :, None, :]
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def _rotate(self, x: Tensor, cos: Tensor, sin: Tensor, name: str) -> Tensor:
        if x.shape[1] != self.num_heads:
            raise PosencValueError(
                f"{name} has {x.shape[1]} heads but rope-mixed has frequencies for "
                f"{self.num_heads}; each head turns by its own"
            )
        work = x.to(cos.dtype)
        even, odd = work[..., 0::2], work[..., 1::2]  # (b, h, n, p)
        turned = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1)
        return turned.flatten(-2).to(x.dtype)

    def _pair(self, q: Tensor, k: Tensor, tables: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        return self._rotate(q, *tables, "q"), self._rotate(k, *tables, "k")

    def position_state(self, positions: Tensor | None, x: Tensor) -> RotaryState:
        coords = self.coordinates(positions, x.shape[1], x.shape[0], x.device)
        tables = self.cos_sin(coords, compute_dtype(x.dtype))
        return RotaryState(lambda q, k, inplace: self._pair(q, k, tables))

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
        """Rotate one tensor ``(b, h, n, d)`` by coordinates ``(n, 2)`` / ``(b, n, 2)``;
        ``inplace`` is accepted and ignored (a new tensor is returned); ``position_ids`` and
        ``layout`` as for :meth:`forward`."""
        positions = take_position_ids(positions, position_ids)
        stated = stated_layout(
            x, None, positions, layout, cu_seqlens, seqlen_offsets, max_seqlen, coordinates=True
        )
        if stated is not None:
            return stated.one(self.rotate(stated.q, stated.positions))
        x, _ = check_qk(x, x, self.head_dim)
        coords = self.coordinates(positions, x.shape[2], x.shape[0], x.device)
        return self._rotate(x, *self.cos_sin(coords, compute_dtype(x.dtype)), "x")

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
        """Shapes: q, k ``(b, h, n, d)`` with ``h = num_heads``; positions ``(n, 2)`` or
        ``(b, n, 2)``. ``inplace`` is accepted and ignored (new tensors are returned);
        ``position_ids`` is ``positions``'s other name; ``layout`` as for
        :meth:`RotaryEmbedding.forward` (:mod:`~.layouts`), ``thd`` and ``seqlen_offsets``
        refused (they give 1-D positions, not coordinates)."""
        positions = take_position_ids(positions, position_ids)
        stated = stated_layout(
            q, k, positions, layout, cu_seqlens, seqlen_offsets, max_seqlen, coordinates=True
        )
        if stated is not None:
            return stated.pair(self(stated.q, stated.k, stated.positions))
        q, k = check_qk(q, k, self.head_dim)
        coords = self.coordinates(positions, q.shape[2], q.shape[0], q.device)
        work = torch.promote_types(compute_dtype(q.dtype), compute_dtype(k.dtype))
        return self._pair(q, k, self.cos_sin(coords, work))

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, "
            f"temperature={self.temperature:g}, rotate={self.rotate_init}"
        )
