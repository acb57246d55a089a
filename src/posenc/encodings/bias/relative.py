"""Learned relative-position biases that are functions of the positions only: KERPLE, FIRE and
dynamic position bias. Shaw et al.'s relative representations and Transformer-XL's relative
encoding, which also read the queries (and keys), are in ``bias/relative_qk.py``.

Dimension legend: ``b`` batch, ``h`` heads, ``nq``/``nk`` query/key length, ``d`` head dim,
``R`` distinct distances, ``H`` MLP width.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from ...errors import PosencValueError
from ..base import BiasEncoding, ScoreMod
from ..checks import check_positive_float, check_positive_int
from ..registry import register
from .common import (
    DistanceBias,
    check_bias_bytes,
    check_pair_positions,
    distance_reader,
    gather_fn,
    is_integral,
    relative_distance,
    table_reader,
    work_dtype,
)

# --------------------------------------------------------------------------- KERPLE


@register("kerple", "learned log or power kernel of the distance per head (KERPLE)")
class KERPLE(DistanceBias):
    """Kernelized relative positional embedding (Chi et al. 2022, "KERPLE: Kernelized Relative
    Positional Embedding for Length Extrapolation", the logarithmic and power variants):

        logarithmic:  bias[h, i, j] = -r1_h · log(1 + r2_h · |i - j|)
        power:        bias[h, i, j] = -r1_h · |i - j| ** r2_h,   0 < r2_h <= 2

    Checked against a float64 transcription of both equations.

    Args:
        num_heads: number of heads.
        kernel: ``"log"`` (the paper's best) or ``"power"``.
        eps: the smallest value ``r1`` and ``r2`` take.

    ``r1`` and ``r2`` are learned per head, initialised uniformly in ``(0, 2)`` and ``(0, 1)``;
    :meth:`kernel_parameters` clamps them to ``[eps, ∞)`` (and ``r2``
    to ``<= 2`` for the power kernel) on every use, without editing the stored values.
    """

    paper: ClassVar[str] = "Chi et al. 2022, KERPLE (NeurIPS), arXiv:2205.09921"

    def __init__(
        self, num_heads: int, *, kernel: Literal["log", "power"] = "log", eps: float = 1e-2
    ) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        if kernel not in ("log", "power"):
            raise PosencValueError(f"kernel must be 'log' or 'power', got {kernel!r}")
        self.kernel = kernel
        self.eps = check_positive_float("eps", eps)
        self.r1 = nn.Parameter(torch.rand(num_heads) * 2)
        self.r2 = nn.Parameter(torch.rand(num_heads))

    def kernel_parameters(self) -> tuple[Tensor, Tensor]:
        """The ``(r1, r2)`` used by the kernel, ``(h,)`` each, after clamping."""
        r1 = self.r1.clamp(min=self.eps)
        r2 = self.r2.clamp(min=self.eps, max=2.0 if self.kernel == "power" else None)
        return r1, r2

    def _kernel_at(self, r1: Tensor, r2: Tensor, d: Tensor) -> Tensor:
        """The kernel at distances ``d >= 0``, ``r1`` and ``r2`` broadcasting against them."""
        if self.kernel == "log":
            return -r1 * torch.log1p(r2 * d)
        # |d| ** r2 with a zero (and a finite gradient for r2) at d = 0
        safe = torch.where(d > 0, d, torch.ones_like(d))
        return -r1 * torch.where(d > 0, torch.exp(r2 * torch.log(safe)), torch.zeros_like(d))

    def distance_bias(self, distance: Tensor) -> Tensor:
        r1, r2 = (
            p.to(distance.dtype).view(-1, *([1] * distance.dim())) for p in self.kernel_parameters()
        )
        return self._kernel_at(r1, r2, distance.abs().unsqueeze(0))  # (h, *S)

    def formula_score_mod(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> ScoreMod:
        """The kernel's equation per score, at ``d = q_pos[i] - k_pos[j]`` formed in the
        kernel (:func:`~posenc.encodings.bias.common.distance_reader`): nothing sized,
        nothing read from the positions, ``r1[h]`` and ``r2[h]`` read once per score."""
        r1, r2 = (p.to(dtype) for p in self.kernel_parameters())  # (h,) each
        distance = distance_reader(q_pos, k_pos, dtype)

        def kerple(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
            value = self._kernel_at(r1[h], r2[h], distance(b, q_idx, kv_idx).abs())
            return score + value.to(score.dtype)

        return kerple

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, kernel={self.kernel!r}"


# --------------------------------------------------------------------------- DPB


@register("dpb", "MLP of the relative distance, one output per head (dynamic position bias)")
class DynamicPositionBias(DistanceBias):
    """Dynamic position bias: an MLP maps the distance ``i - j`` to one bias per head
    (Wang et al. 2021, CrossFormer, §3.3; the layout of x-transformers'
    ``DynamicPositionBias``, checked against it with shared weights).

        bias[:, i, j] = W_out σ(... σ(W_1 x + b_1) ...) + b_out,   x = i - j
        (x = sign(i - j) · log(1 + |i - j|) with ``log_distance``; σ = SiLU, after an optional
        LayerNorm)

    Args:
        num_heads: number of heads.
        mlp_dim: hidden width ``H``.
        depth: number of hidden layers (>= 1).
        log_distance: feed the log-scaled signed distance.
        norm: LayerNorm before each activation.
    """

    paper: ClassVar[str] = "Wang et al. 2021, CrossFormer, §3.3 (dynamic position bias)"
    integer_positions = False

    def __init__(
        self,
        num_heads: int,
        *,
        mlp_dim: int = 64,
        depth: int = 2,
        log_distance: bool = False,
        norm: bool = False,
    ) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.mlp_dim = check_positive_int("mlp_dim", mlp_dim)
        self.depth = check_positive_int("depth", depth)
        self.log_distance, self.norm = bool(log_distance), bool(norm)
        layers: list[nn.Module] = []
        for i in range(depth):
            layers.append(nn.Linear(1 if i == 0 else mlp_dim, mlp_dim))
            if norm:
                layers.append(nn.LayerNorm(mlp_dim))
            layers.append(nn.SiLU())
        layers.append(nn.Linear(mlp_dim, num_heads))
        self.mlp = nn.Sequential(*layers)

    def distance_bias(self, distance: Tensor) -> Tensor:
        x = distance
        if self.log_distance:
            x = torch.sign(x) * torch.log1p(x.abs())
        mlp_dtype = self.mlp[0].weight.dtype
        out = self.mlp(x.unsqueeze(-1).to(mlp_dtype)).to(distance.dtype)  # (*S, h)
        return out.movedim(-1, 0)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, mlp_dim={self.mlp_dim}, depth={self.depth}, "
            f"log_distance={self.log_distance}, norm={self.norm}"
        )


# --------------------------------------------------------------------------- FIRE


@register("fire", "MLP of the log-scaled, progressively normalised distance (FIRE)")
class FIRE(BiasEncoding):
    """Functional interpolation for relative positions (Li et al. 2024, "Functional
    Interpolation for Relative Positions Improves Long Context Transformers", arXiv:2310.04418):

        bias[:, i, j] = f_θ( ψ(i - j) / ψ(max(L, i)) ),   ψ(x) = log(c·x + 1)

    with ``f_θ`` an MLP (one ReLU hidden layer of width ``H``, one output per head), ``c > 0``
    and the threshold ``L > 0`` learned. Checked against a float64 transcription.

    The paper defines the bias for causal attention (``i >= j``). For keys after the query this
    class feeds ``-ψ(j - i) / ψ(max(L, i))``, so the MLP can tell the two directions apart;
    on ``j <= i`` it is exactly the paper's formula. ``c`` and ``L`` enter through their absolute
    values, and the normaliser is kept ``>= 1e-6`` so ``L -> 0`` at ``i = 0`` cannot divide by 0.

    Args:
        num_heads: number of heads.
        mlp_dim: hidden width ``H``.
        c: initial ``c`` (a default chosen here, not taken from the paper).
        threshold: initial ``L`` (likewise).
    """

    paper: ClassVar[str] = "Li et al. 2024, FIRE (ICLR), arXiv:2310.04418"
    has_score_mod: ClassVar[bool] = True  # at any positions (fractional ones in the kernel)
    reads_distance_bound: ClassVar[bool] = True

    def __init__(
        self, num_heads: int, *, mlp_dim: int = 32, c: float = 1.0, threshold: float = 512.0
    ) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.mlp_dim = check_positive_int("mlp_dim", mlp_dim)
        self.c = nn.Parameter(torch.tensor(check_positive_float("c", c)))
        self.threshold = nn.Parameter(torch.tensor(check_positive_float("threshold", threshold)))
        self.mlp = nn.Sequential(nn.Linear(1, mlp_dim), nn.ReLU(), nn.Linear(mlp_dim, num_heads))

    def normalized_distance(
        self, q_positions: Tensor, k_positions: Tensor, dtype: torch.dtype
    ) -> Tensor:
        """The MLP input ``sign(i - j) · ψ(|i - j|) / ψ(max(L, i))``: ``(nq, nk)`` or
        ``(b, nq, nk)``."""
        c, L = self.c.abs().to(dtype), self.threshold.abs().to(dtype)
        distance = relative_distance(q_positions, k_positions, dtype)  # i - j

        def psi(x: Tensor) -> Tensor:
            return torch.log1p(c * x)

        query = q_positions.to(dtype).unsqueeze(-1)  # (..., nq, 1)
        normaliser = psi(torch.maximum(query, L)).clamp(min=1e-6)
        return torch.sign(distance) * psi(distance.abs()) / normaliser

    def bias(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> Tensor:
        q_pos, k_pos = check_pair_positions(q_positions, k_positions)
        # per pair: the distance, the MLP's hidden layer, one output per head
        check_bias_bytes(q_pos, k_pos, self.mlp[0].out_features + self.num_heads + 2, q)
        dtype = work_dtype(q, self)
        x = self.normalized_distance(q_pos, k_pos, dtype)
        out = self.mlp(x.unsqueeze(-1).to(self.c.dtype)).to(dtype)  # (..., nq, nk, h)
        return out.movedim(-1, -3)  # (h, nq, nk) | (b, h, nq, nk)

    def mlp_segments(self, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """The MLP as the piecewise-linear function it is: ``f(x) = A[:, s] + B[:, s] · x``
        on segment ``s``, the ``x`` with exactly ``s`` of the sorted ``kinks`` at or below it.

        A hidden unit ``relu(w1 x + b1)`` bends once, at ``x = -b1 / w1``, so the ``H`` kinks
        split the line into ``H + 1`` segments on each of which the set of active units, hence
        ``f``, is affine: ``A = b2 + Σ_active w2 · b1``, ``B = Σ_active w2 · w1``. Exact (the
        same function, and the same gradients for the weights and for ``x``, up to the order
        of the float sums); ``A`` and ``B`` are differentiable in the weights, the kinks are
        not (they only choose the segment).

        Returns ``(A (h, H+1), B (h, H+1), kinks (P - 1,))``: the kinks sorted, detached and
        padded with ``+inf`` to one less than a power of two ``P > H``, for a binary search
        of ``log2 P`` steps.
        """
        # in ``dtype`` (fp32 for half-precision weights): the sums are formed once, exactly
        w1, b1 = self.mlp[0].weight[:, 0].to(dtype), self.mlp[0].bias.to(dtype)  # (H,)
        w2, b2 = self.mlp[2].weight.to(dtype), self.mlp[2].bias.to(dtype)  # (h, H), (h,)
        slope = w1.detach()
        flat = slope == 0  # such a unit never bends: active everywhere or nowhere
        kink = torch.where(flat, torch.inf, -b1.detach() / torch.where(flat, 1.0, slope))
        kinks, order = kink.sort()  # (H,)
        rank = torch.empty_like(order).scatter_(
            0, order, torch.arange(len(order), device=order.device)
        )
        segment = torch.arange(len(order) + 1, device=w1.device).unsqueeze(-1)  # (H+1, 1)
        rising = (slope > 0) & (rank < segment)  # active right of its kink
        falling = (slope < 0) & (rank >= segment)  # active left of it
        active = (rising | falling | (flat & (b1.detach() > 0))).to(w2.dtype)  # (H+1, H)
        intercept = b2.unsqueeze(-1) + w2 @ (active * b1).T  # (h, H+1)
        gradient = w2 @ (active * w1).T  # (h, H+1)
        size = 1 << len(order).bit_length()  # P > H
        padded = kinks.new_full((size - 1,), torch.inf)
        padded[: len(order)] = kinks
        return intercept, gradient, padded

    def score_mod(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
        distance_bound: int | None = None,
    ) -> ScoreMod | None:
        """The whole bias inside the kernel, exactly, with every tensor that carries a
        gradient read once per score (what compiled flex_attention's backward requires):

        * the normaliser ``ψ(max(L, i))`` from a per-query table ``(nq,)``/``(b, nq)``;
        * ``sign(d) · ψ(|d|)`` from a table over ``-distance_bound .. distance_bound`` (a
          host bound on ``|d|``, ``d = i - j`` at integer positions; NaN past it), else
          computed in the kernel from ``c`` (read once): nothing is read from the positions;
        * the MLP as its :meth:`mlp_segments`: a binary search over the ``H`` kinks (``log2
          H`` reads of a detached tensor), then ``A[h, s] + B[h, s] · x``.

        The segments replace ``H`` multiply-adds per score by ``log2 H`` comparisons. All in
        the queries' compute dtype.
        """
        q_pos, k_pos = check_pair_positions(q_positions, k_positions)
        if not (q_pos.numel() and k_pos.numel()):
            return None
        dtype = work_dtype(q, self)
        c, L = self.c.abs().to(dtype), self.threshold.abs().to(dtype)
        query = q_pos.to(dtype)
        normaliser = table_reader(torch.log1p(c * torch.maximum(query, L)).clamp(min=1e-6))
        intercept, gradient, kinks = self.mlp_segments(dtype)
        steps = [1 << e for e in reversed(range(kinks.shape[0].bit_length()))]
        signed_psi: Callable[[Tensor, Tensor, Tensor], Tensor]
        whole = is_integral(q_pos) and is_integral(k_pos)
        if whole and distance_bound is not None:
            bound = distance_bound
            d = torch.arange(-bound, bound + 1, device=q_pos.device).to(dtype)
            table = torch.sign(d) * torch.log1p(c * d.abs())  # (2 bound + 1,)
            # (two tensors even where the positions are one: flex's guards break on aliases)
            at_q, at_k = gather_fn(q_pos.long()), gather_fn(k_pos.long().clone())

            def signed_psi(b: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                distance = at_q(b, q_idx) - at_k(b, kv_idx)
                inside = table[distance.clamp(-bound, bound) + bound]
                return torch.where(distance.abs() <= bound, inside, float("nan"))

        else:  # integer positions subtracted exactly, then converted
            kind = torch.long if whole else dtype
            at_q, at_k = gather_fn(q_pos.to(kind)), gather_fn(k_pos.to(kind).clone())
            c_once = c.reshape(1)

            def signed_psi(b: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                d = (at_q(b, q_idx) - at_k(b, kv_idx)).to(dtype)
                return torch.sign(d) * torch.log1p(c_once[0] * d.abs())

        def fire(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            x = signed_psi(b, q_idx, kv_idx) / normaliser(b, q_idx)
            s = torch.zeros_like(q_idx)  # how many kinks lie at or below x
            for step in steps:
                s = torch.where(kinks[s + (step - 1)] <= x, s + step, s)
            return score + (intercept[h, s] + gradient[h, s] * x).to(score.dtype)

        return fire

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, mlp_dim={self.mlp_dim}"
