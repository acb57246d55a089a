"""Position-dependent query scaling: attention's temperature growing with the log of the
position, as long-context models apply it.

* Llama 4's ``attn_temperature_tuning`` (Nakanishi 2025, "Scalable-Softmax Is Superior for
  Attention", arXiv:2501.19399), on its NoPE layers: ``q · (1 + attn_scale · log(1 +
  floor((p + 1) / floor_scale)))``;
* Ministral 3's ``llama_4_scaling_beta``, on every layer after the rotation:
  ``q · (1 + β · log(1 + floor(p / original_max_position_embeddings)))``.

Both are ``1 + scale · log(1 + floor((p + offset) / floor))``: :class:`QueryScale`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import PosencTypeError, PosencValueError

__all__ = ["QueryScale"]


@dataclass(frozen=True)
class QueryScale:
    """Queries at position ``p`` multiplied by ``1 + scale · log(1 + floor((p + offset) /
    floor))`` (computed in float32, as transformers does, then cast to the queries' dtype).

    >>> QueryScale.llama4(attn_scale=0.1, floor_scale=8192).factor(torch.tensor([0, 8191]))
    tensor([1.0000, 1.0693])
    """

    scale: float  # the coefficient of the log
    floor: float  # positions per step of the floor
    offset: float = 0.0  # added to the position first (Llama 4 counts from 1)

    def __post_init__(self) -> None:
        for name in ("scale", "floor", "offset"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise PosencTypeError(f"QueryScale {name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise PosencValueError(f"QueryScale {name} must be finite, got {value!r}")
        if self.floor <= 0:
            raise PosencValueError(f"QueryScale floor must be > 0, got {self.floor!r}")

    @classmethod
    def llama4(cls, attn_scale: float, floor_scale: float) -> QueryScale:
        """Llama 4's ``attn_temperature_tuning`` (config ``attn_scale``, ``floor_scale``)."""
        return cls(scale=attn_scale, floor=floor_scale, offset=1.0)

    @classmethod
    def ministral3(cls, beta: float, original_max_position_embeddings: int) -> QueryScale:
        """Ministral 3's ``llama_4_scaling_beta`` over its original context."""
        return cls(scale=beta, floor=original_max_position_embeddings)

    def factor(self, positions: Tensor) -> Tensor:
        """The factor at each position, float32, the shape of ``positions``."""
        steps = torch.floor((positions.float() + self.offset) / self.floor)
        return 1.0 + self.scale * torch.log1p(steps)

    def apply(self, q: Tensor, positions: Tensor) -> Tensor:
        """``q`` ``(b, h, n, d)`` scaled at ``positions`` ``(n,)`` or ``(b, n)``."""
        factor = self.factor(positions)  # (n,) | (b, n)
        factor = factor.view(-1, 1, q.shape[2], 1)  # (b|1, 1, n, 1)
        return (q * factor).to(q.dtype)
