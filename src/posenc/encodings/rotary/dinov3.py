"""DINOv3's 2-D RoPE (Siméoni et al. 2025, "DINOv3"; transformers ``dinov3_vit``
``DINOv3ViTRopePositionEmbedding``, timm ``RotaryEmbeddingDinoV3``): patch coordinates are
centred and scaled to ``[-1, 1]`` over the grid's extent, so a model sees the same range of
angles at any resolution, and each pair turns by ``2π · c / period`` with periods
``base^(4i/d)``, rows on the first ``d/4`` pairs and columns on the next, in the half layout.
In training, the coordinates can be shifted, jittered per axis and rescaled by one random draw
per forward (DINOv3's ``pos_embed_shift``/``jitter``/``rescale``).

Dimension legend: ``b`` batch, ``n`` tokens, ``d`` head dim.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from ...errors import PosencValueError
from ..checks import check_positive_float, check_positive_int
from ..registry import register
from ..rope_types.builtin import default_inv_freq
from .grid import GridRotaryEmbedding, axial_frequencies

__all__ = ["DINOv3RotaryEmbedding"]


def _optional_positive(name: str, value: Any) -> float | None:
    return None if value is None else check_positive_float(name, value)


@register("rope-dinov3", "DINOv3's 2-D RoPE: coordinates centred in [-1, 1], train-time jitter")
class DINOv3RotaryEmbedding(GridRotaryEmbedding):
    """DINOv3's RoPE on ``(row, col)`` patch coordinates.

    Each coordinate ``c`` becomes ``(2c + 1) / extent - 1`` on its axis (the patch centre in
    ``[-1, 1]``), the extent being ``grid`` when given, else the largest coordinate + 1 of the
    positions (per batch row). Tokens with a negative coordinate (class and register tokens;
    put them at ``(-1, -1)``) are not rotated, as DINOv3 leaves its prefix tokens.

    In training mode (``module.train()``), before the rotation, with torch's random generator
    (so ``torch.manual_seed`` fixes them) and in transformers' order and float32 draws:
    ``shift``: add ``U(-shift, shift)`` per axis; ``jitter``: multiply by ``exp(U(±log
    jitter))`` per axis; ``rescale``: multiply both axes by ``exp(U(±log rescale))``. One draw
    per :meth:`position_state` (per forward of a model) or per direct call. Off in eval mode.

    Args:
        head_dim: channels per head, a multiple of 4.
        base: the period base (DINOv3's ``rope_theta``, 100).
        grid: ``(h, w)``, the extent to normalise by; ``None``: from the positions.
        shift, jitter, rescale: the training-time augmentation (``None``: off; transformers'
            DINOv3 config sets ``rescale=2.0``).
    """

    paper: ClassVar[str] = "Siméoni et al. 2025, DINOv3"
    axes: ClassVar[int] = 2

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 100.0,
        grid: tuple[int, int] | None = None,
        shift: float | None = None,
        jitter: float | None = None,
        rescale: float | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        check_positive_int("head_dim", head_dim)
        if head_dim % 4:
            raise PosencValueError(f"head_dim ({head_dim}) must be divisible by 4 for rope-dinov3")
        self.base = check_positive_float("base", base)
        k = head_dim // 4
        f = 2 * math.pi * default_inv_freq(head_dim // 2, self.base, device="cpu")
        super().__init__(
            head_dim, axial_frequencies([0] * k + [1] * k, torch.cat([f, f]), 2), device=device
        )
        if grid is not None:
            if not isinstance(grid, (tuple, list)) or len(grid) != 2:
                raise PosencValueError(f"grid must be (h, w), got {grid!r}")
            grid = (check_positive_int("grid[0]", grid[0]), check_positive_int("grid[1]", grid[1]))
        self.extent = grid
        self.shift = _optional_positive("shift", shift)
        self.jitter = _optional_positive("jitter", jitter)
        self.rescale = _optional_positive("rescale", rescale)
        for name, value in (("jitter", self.jitter), ("rescale", self.rescale)):
            if value is not None and value < 1:
                raise PosencValueError(f"{name} must be >= 1 (a log-uniform range), got {value}")

    def coordinates(self, positions: Tensor | None, n: int, batch: int, device: Any) -> Tensor:
        """The validated ``(row, col)`` positions as DINOv3's normalised (and, in training,
        augmented) coordinates, float64; negative ones (prefix tokens) at 0."""
        coords = super().coordinates(positions, n, batch, device).to(torch.float64)
        prefix = (coords < 0).any(dim=-1, keepdim=True)
        if self.extent is not None:
            extent = torch.tensor(self.extent, dtype=torch.float64, device=coords.device)
        else:
            extent = coords.amax(dim=-2, keepdim=True).clamp(min=0) + 1  # (..., 1, 2)
        coords = (2 * coords + 1) / extent - 1
        if self.training:
            coords = self._augment(coords)
        return coords.masked_fill(prefix, 0.0)

    def _augment(self, coords: Tensor) -> Tensor:
        device = coords.device
        if self.shift is not None:
            draw = torch.empty(1, 2, device=device).uniform_(-self.shift, self.shift)
            coords = coords + draw.double()
        if self.jitter is not None:
            span = math.log(self.jitter)
            coords = coords * torch.empty(1, 2, device=device).uniform_(-span, span).exp().double()
        if self.rescale is not None:
            span = math.log(self.rescale)
            coords = coords * torch.empty(1, device=device).uniform_(-span, span).exp().double()
        return coords

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, base={self.base:g}, grid={self.extent}, "
            f"shift={self.shift}, jitter={self.jitter}, rescale={self.rescale}"
        )
