"""Inkling's relative position bias (Thinking Machines' Inkling, 2026; transformers ``inkling2``,
``Inkling2RelativePositionBias``; x-transformers ``RelativeProjPositionalBias``): a learned bank
of ``r`` bias-against-distance profiles ``P`` ``(r, R)``, mixed per query token and head by the
token's own hidden state,

    b_h(i, j) = [clip(s_h ⊙ W_h x_i)]ᵀ P[:, i - j]   for 0 ≤ i - j < R,   0 elsewhere,

``W_h x_i`` the head's ``r`` "relative states" of the attention layer's input, ``s_h`` a learned
scale, ``clip(v) = v · min(1, c / (|v| + 10⁻⁶))`` an L2 clip at ``c``. ``R`` is the window of
distances (Inkling: 1024 in its global layers, the sliding window in its local ones). Inkling's
global layers multiply the clipped states by a log-position temperature,
``τ(p_i) = 1 + α log(max((p_i + 1) / n_floor, 1))``, which grows once the query passes
``n_floor``.

Only the query's hidden state is read, so a cached step needs nothing of the cached tokens;
inside flex the bias is one read of a per-query tile ``(b, h, nq, R)`` per score.

Dimension legend: ``b`` batch, ``h`` heads, ``nq``/``nk`` query/key length, ``D`` model width,
``r`` relative states per head, ``R`` window of distances (``m ≤ R`` the distances read).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ...errors import PosencTypeError, PosencValueError
from ..base import BiasEncoding, ScoreMod
from ..checks import (
    check_bool,
    check_positive_float,
    check_positive_int,
    compute_dtype,
    reads_values,
)
from ..registry import register
from .common import (
    check_bias_bytes,
    check_pair_positions,
    distance_range,
    gather_fn,
    relative_distance,
    require_integral,
)

__all__ = ["Inkling"]


@register("inkling", "a distance basis mixed by each query's hidden state (Inkling)")
class Inkling(BiasEncoding):
    """Inkling's data-dependent relative bias: ``b_h(i, j) = [clip(s_h ⊙ W_h x_i)]ᵀ
    P[:, i - j]`` for ``0 ≤ i - j < R`` (see the module docstring), ``x`` the attention layer's
    input.

    Checked against transformers' ``Inkling2RelativePositionBias`` (global and local layers,
    ``(b, h, i, j)``, values and gradients) and, with ``clip=None`` and ``linear_bias=True``,
    against x-transformers' ``RelativeProjPositionalBias`` (``tests/encodings/bias/
    test_inkling.py``). The states are scaled, clipped and tempered in the work dtype (float32
    for half inputs), as transformers does; positions must be whole numbers.

    Args:
        dim: the width ``D`` of the attention layer's input.
        num_heads: number of heads ``H``.
        extent: the window ``R`` of distances ``0 .. R - 1`` that get a bias.
        states: relative states per head ``r`` (transformers' ``d_rel``).
        clip: the L2 bound ``c`` of each head's scaled states (transformers'
            ``rel_l2_clip_threshold``); ``None``: no clip.
        log_scaling: Inkling's global layers: the states times ``τ(p_i)``.
        log_scaling_alpha: ``α`` of ``τ``.
        log_scaling_n_floor: ``n_floor`` of ``τ``.
        linear_bias: an additive bias in ``W`` (x-transformers has one; Inkling has none).
    """

    paper: ClassVar[str] = "Thinking Machines 2026, Inkling (transformers inkling2)"
    needs_x: ClassVar[bool] = True
    has_score_mod: ClassVar[bool] = True
    reads_distance_bound: ClassVar[bool] = True

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        extent: int = 1024,
        states: int = 16,
        clip: float | None = 8.0,
        log_scaling: bool = False,
        log_scaling_alpha: float = 0.1,
        log_scaling_n_floor: int = 128000,
        linear_bias: bool = False,
    ) -> None:
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.extent = check_positive_int("extent", extent)
        self.states = check_positive_int("states", states)
        self.clip = None if clip is None else check_positive_float("clip", clip)
        self.log_scaling = check_bool("log_scaling", log_scaling)
        if isinstance(log_scaling_alpha, bool) or not isinstance(log_scaling_alpha, int | float):
            raise PosencTypeError(
                f"log_scaling_alpha must be a number, got {type(log_scaling_alpha).__name__}"
            )
        if not math.isfinite(log_scaling_alpha):
            raise PosencValueError(f"log_scaling_alpha must be finite, got {log_scaling_alpha}")
        self.log_scaling_alpha = float(log_scaling_alpha)
        self.log_scaling_n_floor = check_positive_int("log_scaling_n_floor", log_scaling_n_floor)
        self.linear_bias = check_bool("linear_bias", linear_bias)
        #: ``W``: ``D`` -> ``H · r`` relative states.
        self.linear = nn.Linear(dim, num_heads * states, bias=linear_bias)
        #: ``s_h``, the scale of each head's states ``(H, r)``.
        self.scale = nn.Parameter(torch.ones(num_heads, states))
        #: ``P``, the bank of profiles against distance ``(r, R)``.
        self.proj = nn.Parameter(torch.randn(states, extent) * 0.02)

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> Inkling:
        return cls(dim, num_heads, **kwargs)

    def relative_states(self, x: Tensor, q_positions: Tensor) -> Tensor:
        """``clip(s ⊙ W x) · τ`` ``(b, h, n, r)`` in the work dtype, for ``x`` ``(b, n, D)``
        at ``q_positions`` ``(n,)`` or ``(b, n)``."""
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise PosencTypeError(
                f"Inkling needs x= as a floating-point (b, n, D) tensor, got {type(x).__name__}"
            )
        if x.dim() != 3 or x.shape[-1] != self.dim or x.shape[1] != q_positions.shape[-1]:
            raise PosencValueError(
                f"Inkling expects x of shape (b, n={q_positions.shape[-1]}, D={self.dim}), "
                f"got {tuple(x.shape)}"
            )
        b, n, _ = x.shape
        mixed = self.linear(x.to(self.linear.weight.dtype)).view(b, n, self.num_heads, -1)
        work = compute_dtype(x.dtype)  # (float64 inputs keep float64, as other biases do)
        states = mixed.to(work) * self.scale.to(work)  # (b, n, h, r)
        if self.clip is not None:
            norm = torch.linalg.vector_norm(states, dim=-1, keepdim=True)
            states = states * (self.clip / (norm + 1e-6)).clamp(max=1.0)
        if self.log_scaling:
            ratio = (q_positions.to(work) + 1.0) / self.log_scaling_n_floor
            tau = 1.0 + self.log_scaling_alpha * torch.log(ratio.clamp(min=1.0))  # (n,) | (b, n)
            states = states * tau[..., None, None]
        return states.transpose(1, 2)  # (b, h, n, r)

    def _tile(
        self,
        q_positions: object,
        k_positions: object,
        x: Tensor | None,
        distance_bound: int | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, int]:
        """Checked positions, and the tile ``states · P[:, :m]`` ``(b, h, nq, m)`` over the
        ``m = min(R, largest distance + 1)`` distances that occur (``distance_bound``: a
        host bound on the largest, read nowhere; without it the largest is read where the
        host reads the positions' values, and elsewhere ``m = R``)."""
        q_pos, k_pos = check_pair_positions(q_positions, k_positions)
        require_integral("q_positions", q_pos, "Inkling")
        require_integral("k_positions", k_pos, "Inkling")
        if x is None:
            raise PosencValueError("Inkling.bias needs x= (the (b, n, D) input of attention)")
        states = self.relative_states(x, q_pos)
        m = self.extent  # every distance the window holds; on the host only those that occur
        readable = reads_values(q_pos) and reads_values(k_pos)
        if distance_bound is not None:
            m = max(1, min(m, distance_bound + 1))
        elif readable and q_pos.numel() and k_pos.numel():  # (a read elsewhere would sync)
            m = max(1, min(m, distance_range(q_pos, k_pos)[1] + 1))
        tile = states @ self.proj[:, :m].to(states.dtype)  # (b, h, nq, m)
        return q_pos, k_pos, tile, m

    def bias(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        x: Tensor | None = None,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> Tensor:
        """``(b, h, nq, nk)`` for the queries' input ``x`` ``(b, nq, D)``."""
        q_pos, k_pos, tile, m = self._tile(q_positions, k_positions, x)
        b, h, nq, _ = tile.shape
        check_bias_bytes(q_pos, k_pos, h + 3, tile[:, 0, 0])
        distance = relative_distance(q_pos, k_pos, torch.float64).long()  # (nq, nk) | (b', nq, nk)
        inside = (distance >= 0) & (distance < self.extent)
        index = distance.clamp(0, m - 1).expand(b, nq, -1)[:, None].expand(b, h, nq, -1)
        values = tile.gather(-1, index)
        return values.masked_fill(~inside.expand(b, nq, -1)[:, None], 0.0)

    def score_mod(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        x: Tensor | None = None,
        q: Tensor | None = None,
        k: Tensor | None = None,
        distance_bound: int | None = None,
    ) -> ScoreMod | None:
        """Adds ``tile[b, h, i, i - j]`` inside the kernel where ``0 ≤ i - j < R`` (the
        tile over ``min(R, distance_bound + 1)`` distances where that bound is known; a
        distance inside ``R`` past the tile reads NaN)."""
        q_pos, k_pos, tile, m = self._tile(q_positions, k_positions, x, distance_bound)
        # two tensors even when the queries' and keys' positions are one (flex's guards on
        # captured tensors break on aliases)
        at_q, at_k = gather_fn(q_pos.long()), gather_fn(k_pos.long().clone())
        extent = self.extent

        def inkling(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
            d = at_q(b, q_idx) - at_k(b, kv_idx)
            value = tile[b, h, q_idx, d.clamp(0, m - 1)]
            value = torch.where(d < m, value, float("nan"))  # (past a broken bound)
            inside = (d >= 0) & (d < extent)
            return score + torch.where(inside, value, torch.zeros_like(value)).to(score.dtype)

        return inkling

    def extra_repr(self) -> str:
        text = f"dim={self.dim}, num_heads={self.num_heads}, extent={self.extent}"
        text += f", states={self.states}, clip={self.clip}"
        return text + (", log_scaling=True" if self.log_scaling else "")
