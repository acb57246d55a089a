"""Learned relative-position biases: KERPLE, FIRE, dynamic position bias, Shaw et al.'s
relative representations and Transformer-XL's relative encoding.

The first three are functions of the positions only; Shaw and Transformer-XL also read the
queries (and keys), so attention hands them ``q`` and ``k`` (``needs_qk``).

Dimension legend: ``b`` batch, ``h`` heads, ``nq``/``nk`` query/key length, ``d`` head dim,
``R`` distinct distances, ``H`` MLP width.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import PosencTypeError, PosencValueError
from .base import (
    BiasEncoding,
    ScoreMod,
    check_positive_float,
    check_positive_int,
    register,
)
from .bias_common import (
    DistanceBias,
    check_bias_bytes,
    check_pair_positions,
    gather_fn,
    relative_distance,
    require_integral,
    work_dtype,
)
from .sinusoidal import sinusoidal_encode


def _need(name: str, value: Tensor | None, scheme: str) -> Tensor:
    if value is None:
        raise PosencValueError(
            f"{scheme}.bias needs {name}= (the (b, h, n, d) {name} of attention)"
        )
    return value


def _check_qk(
    q: Tensor,
    num_heads: int,
    head_dim: int,
    scheme: str,
    name: str = "q",
    seq: int | None = None,
) -> None:
    """``q`` (or ``k``): a floating ``(b, num_heads, seq, head_dim)`` tensor."""
    if not isinstance(q, Tensor):
        raise PosencTypeError(f"{scheme} needs {name} as a torch.Tensor, got {type(q).__name__}")
    if not q.is_floating_point():
        raise PosencTypeError(f"{scheme} needs a floating-point {name}, got dtype {q.dtype}")
    if seq is not None and q.dim() == 4 and q.shape[2] != seq:
        raise PosencValueError(
            f"{scheme}: {name} has {q.shape[2]} positions but its positions hold {seq}"
        )
    if q.dim() != 4 or q.shape[1] != num_heads or q.shape[-1] != head_dim:
        raise PosencValueError(
            f"{scheme} expects {name} of shape (b, h={num_heads}, n, d={head_dim}), "
            f"got {tuple(q.shape)}"
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

    def distance_bias(self, distance: Tensor) -> Tensor:
        r1, r2 = (
            p.to(distance.dtype).view(-1, *([1] * distance.dim())) for p in self.kernel_parameters()
        )
        d = distance.abs().unsqueeze(0)  # (1, *S)
        if self.kernel == "log":
            return -r1 * torch.log1p(r2 * d)
        # |d| ** r2 with a zero (and a finite gradient for r2) at d = 0
        safe = torch.where(d > 0, d, torch.ones_like(d))
        return -r1 * torch.where(d > 0, torch.exp(r2 * torch.log(safe)), torch.zeros_like(d))

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

    def score_mod(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> ScoreMod | None:
        """The whole bias inside the kernel: the normalised distance, then the MLP with its
        ``H`` hidden units unrolled (``H`` multiply-adds per score), in the queries' compute
        dtype."""
        q_pos, k_pos = check_pair_positions(q_positions, k_positions)
        dtype = work_dtype(q, self)
        at_q, at_k = gather_fn(q_pos.to(dtype)), gather_fn(k_pos.to(dtype))
        c, L = self.c.abs().to(dtype), self.threshold.abs().to(dtype)
        w1 = self.mlp[0].weight[:, 0].to(dtype)  # (H,)
        b1 = self.mlp[0].bias.to(dtype)  # (H,)
        w2 = self.mlp[2].weight.to(dtype)  # (h, H)
        b2 = self.mlp[2].bias.to(dtype)  # (h,)
        hidden = self.mlp_dim

        def fire(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            i, j = at_q(b, q_idx), at_k(b, kv_idx)
            d = i - j
            normaliser = torch.log1p(c * torch.maximum(i, L)).clamp(min=1e-6)
            x = torch.sign(d) * torch.log1p(c * d.abs()) / normaliser
            out = b2[h]
            for m in range(hidden):
                out = out + w2[h, m] * torch.relu(w1[m] * x + b1[m])
            return score + out.to(score.dtype)

        return fire

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, mlp_dim={self.mlp_dim}"


# --------------------------------------------------------------------------- Shaw


@register("shaw", "learned embeddings of the clipped distance on the key side (Shaw 2018)")
class ShawRelativeBias(BiasEncoding):
    """Relative position representations (Shaw, Uszkoreit & Vaswani 2018, "Self-Attention with
    Relative Position Representations", eqs. 3-4 and §3.2):

        e_ij = q_i · (k_j + a^K_ij) / sqrt(d)        ->  bias[b, h, i, j] = q_i · a^K_ij / sqrt(d)
        z_i  = sum_j α_ij (v_j + a^V_ij)             ->  value_term = sum_j α_ij a^V_ij
        a^K_ij = w^K[clip(j - i, -K, K)],  a^V_ij = w^V[clip(j - i, -K, K)]

    The ``2K + 1`` embeddings of size ``d`` are shared by all heads, as in the paper. Checked
    against a float64 transcription that builds ``a^K_ij`` for every pair.

    Args:
        num_heads: number of heads.
        head_dim: ``d``.
        max_distance: the clipping distance ``K``.
        values: also add the value-side term (attention then computes its weights explicitly).

    Positions must be whole numbers. The score_mod reads ``q_i · w^K[r] / sqrt(d)`` for every
    query and clipped distance, ``(b, h, nq, 2K + 1)``, never an ``nq × nk`` table.
    """

    paper: ClassVar[str] = "Shaw et al. 2018, Self-Attention with Relative Position Representations"
    needs_qk: ClassVar[bool] = True

    def __init__(
        self, num_heads: int, head_dim: int, *, max_distance: int = 16, values: bool = False
    ) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.max_distance = check_positive_int("max_distance", max_distance)
        self.key_embeddings = nn.Embedding(2 * max_distance + 1, head_dim)
        nn.init.normal_(self.key_embeddings.weight, std=head_dim**-0.5)
        self.value_embeddings: nn.Embedding | None = None
        if values:
            self.value_embeddings = nn.Embedding(2 * max_distance + 1, head_dim)
            nn.init.normal_(self.value_embeddings.weight, std=head_dim**-0.5)
        self.has_value_term = bool(values)

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> ShawRelativeBias:
        return cls(num_heads, dim // num_heads, **kwargs)

    def clipped_index(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """``clip(j - i, -K, K) + K`` (int64): ``(nq, nk)`` or ``(b, nq, nk)``."""
        q_pos, k_pos = check_pair_positions(q_positions, k_positions)
        # per pair: the index, its embedding row and one logit per head
        check_bias_bytes(q_pos, k_pos, self.head_dim + self.num_heads + 2)
        require_integral("q_positions", q_pos, "ShawRelativeBias")
        require_integral("k_positions", k_pos, "ShawRelativeBias")
        rel = k_pos.long().unsqueeze(-2) - q_pos.long().unsqueeze(-1)  # (..., nq, nk)
        K = self.max_distance
        return rel.clamp(-K, K) + K

    def _query_terms(self, q: Tensor) -> Tensor:
        """``q_i · w^K[r] / sqrt(d)`` for every clipped distance ``r``: ``(b, h, nq, 2K + 1)``."""
        _check_qk(q, self.num_heads, self.head_dim, "ShawRelativeBias")
        work = work_dtype(q, self)
        table = self.key_embeddings.weight.to(work)  # (2K+1, d)
        return q.to(work) @ table.T / math.sqrt(self.head_dim)

    def bias(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> Tensor:
        """``(b, h, nq, nk)``; needs ``q``."""
        q = _need("q", q, "ShawRelativeBias")
        index = self.clipped_index(q_positions, k_positions)  # (nq, nk) | (b, nq, nk)
        _check_qk(q, self.num_heads, self.head_dim, "ShawRelativeBias", seq=index.shape[-2])
        terms = self._query_terms(q)  # (b, h, nq, 2K+1)
        b, h, nq, _ = terms.shape
        index = index.unsqueeze(-3) if index.dim() == 3 else index  # (b|1, 1, nq, nk) | (nq, nk)
        return terms.gather(-1, index.expand(b, h, nq, index.shape[-1]))  # (b, h, nq, nk)

    def score_mod(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> ScoreMod | None:
        if q is None:
            return None
        q_pos, k_pos = check_pair_positions(q_positions, k_positions)
        # per pair: the index, its embedding row and one logit per head
        check_bias_bytes(q_pos, k_pos, self.head_dim + self.num_heads + 2)
        require_integral("q_positions", q_pos, "ShawRelativeBias")
        require_integral("k_positions", k_pos, "ShawRelativeBias")
        terms = self._query_terms(q)  # (b, h, nq, 2K+1)
        at_q, at_k = gather_fn(q_pos.long()), gather_fn(k_pos.long())
        K = torch.tensor(self.max_distance, device=q.device)  # a tensor: no recompile per K

        def shaw(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            r = (at_k(b, kv_idx) - at_q(b, q_idx)).clamp(-K, K) + K
            return score + terms[b, h, q_idx, r].to(score.dtype)

        return shaw

    def value_term(self, weights: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """``sum_j α_ij a^V_ij`` (eq. 3): weights ``(b, h, nq, nk)`` -> ``(b, h, nq, d)``.

        Weights are summed per clipped distance first, ``(b, h, nq, 2K + 1)``, then multiplied
        by the ``2K + 1`` value embeddings."""
        if self.value_embeddings is None:
            raise PosencValueError("value_term needs ShawRelativeBias(..., values=True)")
        index = self.clipped_index(q_positions, k_positions)
        b, h, nq, nk = weights.shape
        index = index.unsqueeze(-3) if index.dim() == 3 else index  # (b|1, 1, nq, nk) | (nq, nk)
        index = index.expand(b, h, nq, nk)
        per_distance = weights.new_zeros(b, h, nq, 2 * self.max_distance + 1)
        per_distance = per_distance.scatter_add(-1, index, weights)  # (b, h, nq, 2K+1)
        return per_distance @ self.value_embeddings.weight.to(weights.dtype)  # (b, h, nq, d)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"max_distance={self.max_distance}, values={self.has_value_term}"
        )


# --------------------------------------------------------------------------- Transformer-XL


@register("xl", "sinusoidal relative embeddings with learned u, v biases (Transformer-XL)")
class TransformerXLRelativeBias(BiasEncoding):
    """Transformer-XL's relative positional encoding (Dai et al. 2019, "Transformer-XL:
    Attentive Language Models Beyond a Fixed-Length Context", §3.3), the "relative" encoding
    of Ruoss et al. 2023 and Delétang et al. 2023:

        A_ij = q_i·k_j  +  q_i·W_R R_{i-j}  +  u·k_j  +  v·W_R R_{i-j}
                 (a)          (b)              (c)        (d)

    scaled by ``1 / sqrt(d)`` as a whole (as in the authors' code). Attention computes (a);
    this module returns ``((b) + (c) + (d)) / sqrt(d)``. ``R_t`` is the sinusoidal encoding of
    the distance ``t`` (width ``rel_dim``; posenc's interleaved layout, which the learned
    ``W_R`` makes equivalent to the paper's ``[sin, cos]`` one), ``W_R`` a learned projection
    to ``h · d`` and ``u``, ``v`` learned ``(h, d)`` biases. Checked against a float64
    transcription of the equation.

    Args:
        num_heads: number of heads.
        head_dim: ``d``.
        rel_dim: width of ``R`` (default ``h · d``, the model width, as in the paper).
        base: the sinusoid base.

    Positions must be whole numbers: ``W_R R_t`` is formed once per distance ``t`` that occurs.
    Terms (b) + (d) need one value per query and distance, ``(b, h, nq, R)``, so this scheme
    has no memory-saving score_mod; attention materialises its bias.
    """

    paper: ClassVar[str] = "Dai et al. 2019, Transformer-XL, §3.3"
    needs_qk: ClassVar[bool] = True

    def __init__(
        self, num_heads: int, head_dim: int, *, rel_dim: int | None = None, base: float = 10000.0
    ) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.rel_dim = check_positive_int(
            "rel_dim", num_heads * head_dim if rel_dim is None else rel_dim
        )
        self.base = check_positive_float("base", base)
        if self.base == 1.0:
            raise PosencValueError("base must not be 1.0 (every frequency would be equal)")
        self.pos_proj = nn.Linear(self.rel_dim, num_heads * head_dim, bias=False)  # W_R
        self.u = nn.Parameter(torch.randn(num_heads, head_dim) * 0.02)
        self.v = nn.Parameter(torch.randn(num_heads, head_dim) * 0.02)

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> TransformerXLRelativeBias:
        return cls(num_heads, dim // num_heads, **kwargs)

    def relative_keys(self, distances: Tensor, dtype: torch.dtype) -> Tensor:
        """``W_R R_t`` for each distance ``t``: ``(R,)`` -> ``(h, R, d)``."""
        table = sinusoidal_encode(distances, self.rel_dim, base=self.base, dtype=dtype)  # (R, rel)
        proj = F.linear(table, self.pos_proj.weight.to(dtype))  # (R, h*d)
        return proj.view(-1, self.num_heads, self.head_dim).transpose(0, 1)

    def bias(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> Tensor:
        """``(b, h, nq, nk)``; needs ``q`` and ``k``."""
        q, k = (
            _need("q", q, "TransformerXLRelativeBias"),
            _need("k", k, "TransformerXLRelativeBias"),
        )
        q_pos, k_pos = check_pair_positions(q_positions, k_positions)
        check_bias_bytes(q_pos, k_pos, 3 * self.num_heads + 2, q)
        scheme = "TransformerXLRelativeBias"
        _check_qk(q, self.num_heads, self.head_dim, scheme, seq=q_pos.shape[-1])
        _check_qk(k, self.num_heads, self.head_dim, scheme, "k", seq=k_pos.shape[-1])
        require_integral("q_positions", q_pos, "TransformerXLRelativeBias")
        require_integral("k_positions", k_pos, "TransformerXLRelativeBias")
        work = work_dtype(q, self)
        q_pos, k_pos = q_pos.long(), k_pos.long()
        if not (q_pos.numel() and k_pos.numel()):
            lo, hi = 0, -1  # no pairs, no distances
        elif q_pos.is_meta or k_pos.is_meta:
            # no values to read: any distance range gives the right shapes
            lo, hi = 1 - k_pos.shape[-1], q_pos.shape[-1] - 1
        else:
            lo = int(q_pos.min()) - int(k_pos.max())
            hi = int(q_pos.max()) - int(k_pos.min())
        r = self.relative_keys(torch.arange(lo, hi + 1, device=q.device), work)  # (h, R, d)
        qv = q.to(work) + self.v.to(work).unsqueeze(1)  # (b, h, nq, d)
        bd = torch.einsum("bhid,hrd->bhir", qv, r)  # (b, h, nq, R): terms (b) + (d)
        c = torch.einsum("hd,bhjd->bhj", self.u.to(work), k.to(work))  # (b, h, nk): term (c)
        index = (q_pos.unsqueeze(-1) - k_pos.unsqueeze(-2)) - lo  # (nq, nk) | (b, nq, nk)
        b, h, nq, _ = bd.shape
        nk = k.shape[2]
        index = (index.unsqueeze(-3) if index.dim() == 3 else index).expand(b, h, nq, nk)
        return (bd.gather(-1, index) + c.unsqueeze(-2)) / math.sqrt(self.head_dim)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, rel_dim={self.rel_dim}"
