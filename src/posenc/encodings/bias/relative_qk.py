"""Relative-position schemes that read the queries (and keys), so attention hands them ``q`` and
``k`` (``needs_qk``): Shaw et al.'s relative representations (2018) and Transformer-XL's
relative encoding (Dai et al. 2019). The schemes that are functions of the positions only are
in ``bias/relative.py``.

Dimension legend: ``b`` batch, ``h`` heads, ``nq``/``nk`` query/key length, ``d`` head dim,
``R`` distinct distances.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import PosencTypeError, PosencValueError, check_bytes
from ..absolute.sinusoidal import inverse_frequencies, sinusoidal_encode
from ..base import BiasEncoding, ScoreMod
from ..checks import check_positive_float, check_positive_int, reads_values
from ..registry import register
from .common import (
    check_bias_bytes,
    check_pair_positions,
    gather_fn,
    require_integral,
    work_dtype,
)


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
    """``q`` (or ``k``): a floating ``(b, num_heads, seq, head_dim)`` tensor (``k`` may hold
    grouped heads: any number ``g`` dividing ``num_heads``)."""
    if not isinstance(q, Tensor):
        raise PosencTypeError(f"{scheme} needs {name} as a torch.Tensor, got {type(q).__name__}")
    if not q.is_floating_point():
        raise PosencTypeError(f"{scheme} needs a floating-point {name}, got dtype {q.dtype}")
    if seq is not None and q.dim() == 4 and q.shape[2] != seq:
        raise PosencValueError(
            f"{scheme}: {name} has {q.shape[2]} positions but its positions hold {seq}"
        )
    heads_ok = q.dim() == 4 and (
        q.shape[1] == num_heads or (name == "k" and q.shape[1] and num_heads % q.shape[1] == 0)
    )
    if not heads_ok or q.shape[-1] != head_dim:
        grouped = " or g dividing h" if name == "k" else ""
        raise PosencValueError(
            f"{scheme} expects {name} of shape (b, h={num_heads}{grouped}, n, d={head_dim}), "
            f"got {tuple(q.shape)}"
        )


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
    has_score_mod: ClassVar[bool] = True  # given the queries, as attention always gives them

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
        # (two tensors even where the positions are one: flex's guards break on aliases)
        at_q, at_k = gather_fn(q_pos.long()), gather_fn(k_pos.long().clone())
        # a tensor: no recompile per K; filled on the device, not copied from the host
        K = torch.full((), self.max_distance, device=q.device)

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

    Positions must be whole numbers where their values are read (the CPU): ``W_R R_t`` is
    formed once per distance ``t`` that occurs. On a GPU, without a host bound on the
    distances, terms (b) + (d) come from angle sums instead, for any real positions.
    Terms (b) + (d) need one value per query and distance, ``(b, h, nq, R)``, so this scheme
    has no memory-saving score_mod; attention materialises its bias.
    """

    paper: ClassVar[str] = "Dai et al. 2019, Transformer-XL, §3.3"
    needs_qk: ClassVar[bool] = True
    has_score_mod: ClassVar[bool] = False  # terms (b) + (d): one value per query and distance
    #: :meth:`bias` takes ``distance_bound=`` (see :class:`~posenc.encodings.state.BiasState`).
    bias_reads_distance_bound: ClassVar[bool] = True

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
        distance_bound: int | None = None,
    ) -> Tensor:
        """``(b, h, nq, nk)``; needs ``q`` and ``k`` (``k`` with ``h`` heads, or grouped: ``g``
        dividing ``h``, key head ``i // (h / g)`` serving query head ``i``).

        ``W_R R_t`` is formed over the distances ``t`` that occur, their range read where the
        host reads the positions' values (:func:`~posenc.encodings.checks.reads_values`);
        elsewhere over ``-distance_bound .. distance_bound`` (a host bound on ``|t|``: nothing
        read, NaN past it), and without that bound by angle sums
        (:meth:`_angle_sum_bias`: nothing read)."""
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
        unread = not (reads_values(q_pos) and reads_values(k_pos))  # (a GPU's positions)
        if unread and distance_bound is None and q_pos.numel() and k_pos.numel():
            return self._angle_sum_bias(q_pos, k_pos, q, k, work)  # (nothing to size a table by)
        q_pos, k_pos = q_pos.long(), k_pos.long()
        if not (q_pos.numel() and k_pos.numel()):
            lo, hi = 0, -1  # no pairs, no distances
        elif q_pos.is_meta or k_pos.is_meta:
            # no values to read: any distance range gives the right shapes
            lo, hi = 1 - k_pos.shape[-1], q_pos.shape[-1] - 1
        elif unread:
            assert distance_bound is not None  # (else the angle sums above)
            lo, hi = -distance_bound, distance_bound
        else:
            lo = int(q_pos.min()) - int(k_pos.max())
            hi = int(q_pos.max()) - int(k_pos.min())
        r = self.relative_keys(torch.arange(lo, hi + 1, device=q.device), work)  # (h, R, d)
        qv = q.to(work) + self.v.to(work).unsqueeze(1)  # (b, h, nq, d)
        bd = torch.einsum("bhid,hrd->bhir", qv, r)  # (b, h, nq, R): terms (b) + (d)
        c = self._term_c(k, work)  # (b, h, nk): term (c)
        index = (q_pos.unsqueeze(-1) - k_pos.unsqueeze(-2)) - lo  # (nq, nk) | (b, nq, nk)
        b, h, nq, _ = bd.shape
        nk = k.shape[2]
        index = (index.unsqueeze(-3) if index.dim() == 3 else index).expand(b, h, nq, nk)
        inside = (index >= 0) & (index <= hi - lo)  # (all, but where a bound was broken)
        terms = bd.gather(-1, index.clamp(0, max(hi - lo, 0)))
        terms = torch.where(inside, terms, float("nan"))
        return (terms + c.unsqueeze(-2)) / math.sqrt(self.head_dim)

    def _term_c(self, k: Tensor, work: torch.dtype) -> Tensor:
        """Term (c), ``u·k_j`` per query head: ``(b, h, nk)``; grouped key heads read in
        place, never repeated."""
        g = k.shape[1]
        u = self.u.to(work).view(g, self.num_heads // g, self.head_dim)  # (g, G, d)
        return torch.einsum("gGd,bgjd->bgGj", u, k.to(work)).flatten(1, 2)

    def _angle_sum_bias(
        self, q_pos: Tensor, k_pos: Tensor, q: Tensor, k: Tensor, work: torch.dtype
    ) -> Tensor:
        """:meth:`bias` for positions whose distances have no host bound and whose values are
        not read (whole numbers or not: nothing is indexed by them): terms (b) + (d) by the
        angle sums ``sin(tω) = sin(iω) cos(jω) - cos(iω)
        sin(jω)``, ``cos(tω) = cos(iω) cos(jω) + sin(iω) sin(jω)`` (``t = i - j``), so that
        ``(q_i + v)·W_R R_t`` is one product of a feature per query with one per key:
        ``Σ_f cos(jω_f) (a_f sin(iω_f) + c_f cos(iω_f)) + sin(jω_f) (c_f sin(iω_f) - a_f
        cos(iω_f))``, with ``a_f``, ``c_f`` the query's product with ``W_R``'s sine and
        cosine columns. Angles in float64, rounded once to the work dtype (each off by up to
        ``|p| · 2**-53`` where a distance's own angle would not be: 1e-7 at ``p = 10**9``,
        below float32's rounding); cost ``b · h · nq · nk · rel_dim``, never growing with a
        position's value."""
        b, h, nq, d = q.shape
        check_bytes(
            "q_positions x rel_dim",
            f"{nq} x {self.rel_dim} (batch {b}, {h} heads)",
            b * h * nq * self.rel_dim * torch.empty((), dtype=work).element_size(),
            device=q.device,
        )
        weight = self.pos_proj.weight.to(work).view(h, d, self.rel_dim)  # W_R per head
        qv = q.to(work) + self.v.to(work).unsqueeze(1)  # (b, h, nq, d)
        proj = torch.einsum("bhid,hdr->bhir", qv, weight)  # (b, h, nq, rel)
        a = proj[..., 0::2]  # (b, h, nq, F): sine columns
        c = F.pad(proj[..., 1::2], (0, a.shape[-1] - proj[..., 1::2].shape[-1]))  # cosine
        inv_freq = inverse_frequencies(self.rel_dim, self.base, device=q.device)  # (F,)

        def sin_cos(pos: Tensor) -> tuple[Tensor, Tensor]:
            angles = pos.to(torch.float64).unsqueeze(-1) * inv_freq  # (..., n, F)
            return angles.sin().to(work), angles.cos().to(work)

        sin_i, cos_i = sin_cos(q_pos)  # (nq, F) | (b, nq, F)
        sin_j, cos_j = sin_cos(k_pos)
        if sin_i.dim() == 3:
            sin_i, cos_i = sin_i.unsqueeze(1), cos_i.unsqueeze(1)  # (b, 1, nq, F)
        left = torch.cat((a * sin_i + c * cos_i, c * sin_i - a * cos_i), -1)  # (b, h, nq, 2F)
        right = torch.cat((cos_j, sin_j), -1)  # (nk, 2F) | (b, nk, 2F)
        if right.dim() == 2:
            bd = torch.einsum("bhif,jf->bhij", left, right)
        else:
            bd = torch.einsum("bhif,bjf->bhij", left, right)
        return (bd + self._term_c(k, work).unsqueeze(-2)) / math.sqrt(self.head_dim)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, rel_dim={self.rel_dim}"
