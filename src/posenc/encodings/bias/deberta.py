"""DeBERTa's disentangled attention (He, Liu, Gao & Chen 2021, "DeBERTa: Decoding-enhanced BERT with
Disentangled Attention", ICLR, eq. 4): beside content-to-content ``q_i · k_j``, the query reads
the relative position of the key (c2p) and the key the relative position of the query (p2c),

    Ã_ij = (q_i · k_j + q_i · K^r_{δ(i,j)} + k_j · Q^r_{δ(i,j)}) / sqrt(3d)

with ``K^r = P W_{k,r}`` and ``Q^r = P W_{q,r}`` projections of ``2k`` learned relative
embeddings ``P`` and ``δ(i, j) = clip(i - j, -k, k - 1) + k`` (transformers' index for both
terms). DeBERTa-v2 (and SEW-D) buckets ``i - j`` logarithmically first: distances under
``b/2`` stay, longer ones take ``sign · (ceil(log(|i - j| / (b/2)) / log((L - 1) / (b/2)) ·
(b/2 - 1)) + b/2)`` (``position_buckets = b``, ``max_relative_positions = L``), and then
``k = b``.

The scheme adds c2p and p2c, each divided by ``sqrt(s d)``, ``s`` = 1 + the number of terms
(3 with both); the content term's ``1 / sqrt(3d)`` is attention's ``softmax_scale``
(:attr:`DeBERTa.softmax_scale`).

Dimension legend: ``b`` batch, ``h`` heads, ``nq``/``nk`` query/key length, ``d`` head dim,
``D`` the embeddings' width, ``m`` relative embeddings read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ...errors import PosencTypeError, PosencValueError
from ..base import BiasEncoding, ScoreMod
from ..checks import check_bool, check_positive_int, reads_values
from ..registry import register
from .common import (
    check_bias_bytes,
    check_pair_positions,
    distance_range,
    gather_fn,
    require_integral,
    work_dtype,
)
from .relative_qk import _check_qk, _need

__all__ = ["DeBERTa", "log_bucket_position"]

TERMS = ("c2p", "p2c")


def _log_top(buckets: int, max_position: int) -> float:
    """``log((max_position - 1) / (buckets / 2))`` rounded to float32, as transformers forms it,
    held as a Python float (a compiled score_mod then makes no tensor)."""
    return float(torch.log(torch.tensor((max_position - 1) / (buckets // 2))))


def log_bucket_position(
    relative: Tensor, buckets: int, max_position: int, *, log_top: float | None = None
) -> Tensor:
    """DeBERTa-v2's log buckets of ``relative`` (int64): distances under ``buckets / 2`` kept,
    longer ones on a log scale that reaches ``buckets / 2 - 1`` more at ``max_position``.
    ``log_top``: :func:`_log_top` of the two sizes, when already known."""
    sign = torch.sign(relative)
    mid = buckets // 2
    near = (relative < mid) & (relative > -mid)
    size = torch.where(near, torch.full_like(relative, mid - 1), relative.abs())
    # in float32, as transformers computes it: a bucket edge rounds as there
    top = _log_top(buckets, max_position) if log_top is None else log_top
    ratio = torch.log(size.float() / mid) / top
    far = torch.ceil(ratio * (mid - 1)) + mid
    return torch.where(size <= mid, relative.float(), far * sign).long()


@register("deberta", "content-to-position and position-to-content terms (DeBERTa)")
class DeBERTa(BiasEncoding):
    """DeBERTa's disentangled attention bias (He et al. 2021, eq. 4; see the module docstring):
    ``bias[b, h, i, j] = (q_i · K^r_δ + k_j · Q^r_δ) / sqrt(3d)``.

    Checked with the weights copied against transformers' ``DebertaV2`` self-attention
    (clipped and log-bucketed distances, c2p alone, DeBERTa-v3's shared keys with a
    layer-normed ``P``) and ``Deberta``'s (v1: no bias on the key projection), outputs and
    gradients, through :class:`~posenc.MultiHeadAttention` with
    ``softmax_scale=pe.softmax_scale`` (``tests/encodings/bias/test_deberta.py``). It reads
    ``q`` and ``k``; its flex ``score_mod`` reads one per-query and one per-key tile of the
    relative terms. Positions must be whole numbers.

    Args:
        num_heads: number of heads ``H``.
        head_dim: ``d``.
        dim: the relative embeddings' width ``D`` (DeBERTa: the model's hidden size);
            default ``H · d``.
        max_relative_positions: ``k`` of the clipped distances (v1), or ``L`` of the buckets.
        position_buckets: ``b > 0``: DeBERTa-v2's log buckets, ``k = b``; ``-1``: none.
        terms: which of ``"c2p"`` and ``"p2c"`` to add (transformers' ``pos_att_type``).
        key_bias: a bias in ``W_{k,r}`` (v2's ``pos_key_proj``; v1's ``pos_proj`` has none).
        norm: a LayerNorm on ``P`` before the projections (v2's ``norm_rel_ebd="layer_norm"``).
        layer_norm_eps: that LayerNorm's epsilon.
        share_att_key: project ``P`` with each attention layer's own query and key projections
            (DeBERTa-v2's ``share_att_key``, as in DeBERTa-v3) instead of ``W_{q,r}`` and
            ``W_{k,r}``: the bias then reads the layer (``needs_layer``; ``D`` must be the
            layer's width, without grouped key/value heads).
    """

    paper: ClassVar[str] = "He et al. 2021, DeBERTa: disentangled attention, ICLR"
    needs_qk: ClassVar[bool] = True
    has_score_mod: ClassVar[bool] = True
    reads_distance_bound: ClassVar[bool] = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        dim: int | None = None,
        max_relative_positions: int = 512,
        position_buckets: int = -1,
        terms: Sequence[str] = TERMS,
        key_bias: bool = True,
        norm: bool = False,
        layer_norm_eps: float = 1e-7,
        share_att_key: bool = False,
    ) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.dim = num_heads * head_dim if dim is None else check_positive_int("dim", dim)
        self.max_relative_positions = check_positive_int(
            "max_relative_positions", max_relative_positions
        )
        if isinstance(position_buckets, bool) or not isinstance(position_buckets, int):
            raise PosencTypeError(
                f"position_buckets must be an int, got {type(position_buckets).__name__}"
            )
        if position_buckets > 0 and (position_buckets < 4 or max_relative_positions <= 2):
            raise PosencValueError(
                f"position_buckets must be at least 4 with max_relative_positions > 2, got "
                f"position_buckets={position_buckets}"
            )
        self.position_buckets = position_buckets
        self._log_top = (
            _log_top(position_buckets, max_relative_positions) if position_buckets > 0 else 0.0
        )
        if isinstance(terms, str) or not set(terms) <= set(TERMS) or not terms:
            raise PosencValueError(f"terms must be a non-empty subset of {TERMS}, got {terms!r}")
        self.terms = tuple(t for t in TERMS if t in terms)
        self.key_bias = check_bool("key_bias", key_bias)
        #: ``k``: distances index ``2k`` embeddings.
        self.span = position_buckets if position_buckets > 0 else max_relative_positions
        #: ``P``, the relative embeddings ``(2k, D)``.
        self.rel_embeddings = nn.Parameter(torch.randn(2 * self.span, self.dim) * 0.02)
        self.norm = nn.LayerNorm(self.dim, eps=layer_norm_eps) if norm else None
        self.share_att_key = check_bool("share_att_key", share_att_key)
        self.needs_layer = self.share_att_key
        width = num_heads * head_dim
        own = not self.share_att_key
        self.pos_key = (
            nn.Linear(self.dim, width, bias=key_bias) if own and "c2p" in self.terms else None
        )
        self.pos_query = nn.Linear(self.dim, width) if own and "p2c" in self.terms else None

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> DeBERTa:
        return cls(num_heads, kwargs.pop("head_dim", dim // num_heads), **kwargs)

    @property
    def softmax_scale(self) -> float:
        """DeBERTa's scale of every logit term, ``1 / sqrt(s d)``: attention's
        ``softmax_scale`` for DeBERTa's content term."""
        return 1.0 / math.sqrt(self.head_dim * (1 + len(self.terms)))

    def index(self, relative: Tensor) -> Tensor:
        """``δ`` of ``relative = i - j`` (int64): bucketed (v2) and clipped to ``0 .. 2k - 1``."""
        if self.position_buckets > 0:
            relative = log_bucket_position(
                relative, self.position_buckets, self.max_relative_positions, log_top=self._log_top
            )
        return (relative + self.span).clamp(0, 2 * self.span - 1)

    def _projections(
        self, table: Tensor, layer: nn.Module | None
    ) -> tuple[Tensor | None, Tensor | None]:
        """``K^r`` and ``Q^r`` of the rows ``table`` ``(m, D)``, each ``(h, m, d)`` (``None``
        for a term not used): the scheme's own projections, or ``layer``'s."""
        h, d = self.num_heads, self.head_dim
        if not self.share_att_key:
            keys = queries = None
            if self.pos_key is not None:
                keys = self.pos_key(table.to(self.pos_key.weight.dtype))
            if self.pos_query is not None:
                queries = self.pos_query(table.to(self.pos_query.weight.dtype))
        else:
            qkv = getattr(layer, "qkv", None)
            if not isinstance(qkv, nn.Linear):
                raise PosencValueError(
                    "DeBERTa(share_att_key=True) needs layer= (the MultiHeadAttention whose "
                    f"query and key projections it shares), got {type(layer).__name__}"
                )
            sizes = (layer.dim, layer.num_heads, layer.num_kv_heads, layer.head_dim)  # type: ignore[union-attr]
            if sizes != (self.dim, h, h, d):
                raise PosencValueError(
                    f"DeBERTa(share_att_key=True) with dim={self.dim}, {h} heads of {d} needs "
                    f"a layer of that width without grouped heads, got (dim, heads, kv heads, "
                    f"head_dim) = {sizes}"
                )
            w, b = qkv.weight, qkv.bias
            rows = table.to(w.dtype)
            qb, kb = (None, None) if b is None else (b[: h * d], b[h * d : 2 * h * d])
            queries = nn.functional.linear(rows, w[: h * d], qb) if "p2c" in self.terms else None
            keys = nn.functional.linear(rows, w[h * d : 2 * h * d], kb)
            keys = keys if "c2p" in self.terms else None
        split = [None if t is None else t.view(-1, h, d).transpose(0, 1) for t in (keys, queries)]
        return split[0], split[1]

    def _tiles(
        self,
        q_positions: object,
        k_positions: object,
        q: Tensor | None,
        k: Tensor | None,
        layer: nn.Module | None = None,
        every_row: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, int]:
        """Checked positions; ``q · K^r`` ``(b, h, nq, m)`` and ``k · Q^r`` ``(b, h, nk, m)``
        (scaled; ``None`` for a term not used) over the rows ``lo .. lo + m - 1`` of ``P``
        that the pairs read (where the host reads the positions' values:
        :func:`~posenc.encodings.checks.reads_values`; every row elsewhere, or with
        ``every_row``), and ``lo``."""
        q_pos, k_pos = check_pair_positions(q_positions, k_positions)
        require_integral("q_positions", q_pos, "DeBERTa")
        require_integral("k_positions", k_pos, "DeBERTa")
        q, k = _need("q", q, "DeBERTa"), _need("k", k, "DeBERTa")
        _check_qk(q, self.num_heads, self.head_dim, "DeBERTa", seq=q_pos.shape[-1])
        _check_qk(k, self.num_heads, self.head_dim, "DeBERTa", "k", seq=k_pos.shape[-1])
        lo, hi = 0, 2 * self.span - 1  # every row of P; on the host only the rows read
        readable = reads_values(q_pos) and reads_values(k_pos) and not every_row
        if readable and q_pos.numel() and k_pos.numel():  # (a read elsewhere would sync)
            q_long, k_long = q_pos.long(), k_pos.long()
            ends = torch.stack(  # the smallest and largest i - j, then their indices
                [
                    (q_long.amin(-1) - k_long.amax(-1)).min(),
                    (q_long.amax(-1) - k_long.amin(-1)).max(),
                ]
            )
            lo, hi = self.index(ends).tolist()
        work = work_dtype(q, self)
        table = self.rel_embeddings[lo : hi + 1]
        if self.norm is not None:
            table = self.norm(table)
        scale = self.softmax_scale
        keys, queries = self._projections(table, layer)  # (h, m, d) each
        c2p = p2c = None
        if keys is not None:
            c2p = q.to(work) @ keys.to(work).transpose(-1, -2) * scale  # (b, h, nq, m)
        if queries is not None:  # grouped keys read in place: each serves its G query heads
            g = k.shape[1]
            rows = queries.to(work).reshape(g, -1, *queries.shape[1:]).transpose(-1, -2)
            p2c = k.to(work).unsqueeze(2) @ rows * scale  # (b, g, G, nk, m)
            p2c = p2c.flatten(1, 2)  # (b, h, nk, m)
        return q_pos, k_pos, c2p, p2c, lo

    def bias(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
        layer: nn.Module | None = None,
    ) -> Tensor:
        """``(b, h, nq, nk)``; needs ``q`` and ``k`` (and ``layer`` with ``share_att_key``)."""
        q_pos, k_pos, c2p, p2c, lo = self._tiles(q_positions, k_positions, q, k, layer)
        assert q is not None
        b, h, nq, nk = q.shape[0], self.num_heads, q_pos.shape[-1], k_pos.shape[-1]
        check_bias_bytes(q_pos, k_pos, 2 * h + 3, q)
        relative = q_pos.long().unsqueeze(-1) - k_pos.long().unsqueeze(-2)  # (..., nq, nk)
        index = (self.index(relative) - lo).expand(b, nq, nk)[:, None].expand(b, h, nq, nk)
        total = torch.zeros(())
        if c2p is not None:
            total = c2p.gather(-1, index)
        if p2c is not None:  # k_j · Q^r[δ(i, j)]: rows by key, gathered then transposed
            total = total + p2c.gather(-1, index.transpose(-1, -2)).transpose(-1, -2)
        return total

    def score_mod(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
        layer: nn.Module | None = None,
        distance_bound: int | None = None,
    ) -> ScoreMod | None:
        """Adds ``c2p[b, h, i, δ] + p2c[b, h, j, δ]`` inside the kernel, ``δ`` read from a
        table over the distances ``i - j`` (bucketed as :meth:`index` does): those within
        ``distance_bound`` (a host bound on ``|i - j|``: nothing read; NaN past it), else
        the range that occurs, read once where the host reads the positions' values
        (:func:`~posenc.encodings.checks.reads_values`); elsewhere ``δ`` is :meth:`index`
        of each score's distance, formed in the kernel (nothing read: the buckets are at
        most ``2k``, whatever the distance)."""
        bounded = distance_bound is not None
        readable = reads_values(q_positions) and reads_values(k_positions)
        q_pos, k_pos, c2p, p2c, lo = self._tiles(
            q_positions, k_positions, q, k, layer, every_row=bounded or not readable
        )
        if not (q_pos.numel() and k_pos.numel()):
            return None
        if not bounded and not readable:
            return self._bucket_score_mod(q_pos, k_pos, c2p, p2c)
        if distance_bound is not None:
            near, far = -distance_bound, distance_bound
        else:
            near, far = distance_range(q_pos, k_pos)
        distances = torch.arange(near, far + 1, device=q_pos.device)
        lookup = self.index(distances) - lo  # (R,): the tiles' column of each distance
        at_q, at_k = gather_fn(q_pos.long() - near), gather_fn(k_pos.long())
        last = far - near

        def disentangled(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
            # (clamped: a kernel may evaluate padded indices outside every real pair's range)
            shifted = at_q(b, q_idx) - at_k(b, kv_idx)
            delta = lookup[shifted.clamp(0, last)]
            term = torch.zeros_like(score)
            if c2p is not None:
                term = term + c2p[b, h, q_idx, delta].to(score.dtype)
            if p2c is not None:
                term = term + p2c[b, h, kv_idx, delta].to(score.dtype)
            if bounded:  # a distance past the bound: NaN, never another distance's value
                term = torch.where((shifted >= 0) & (shifted <= last), term, float("nan"))
            return score + term

        return disentangled

    def _bucket_score_mod(
        self, q_pos: Tensor, k_pos: Tensor, c2p: Tensor | None, p2c: Tensor | None
    ) -> ScoreMod:
        """:meth:`score_mod` with ``δ = index(i - j)`` per score over every row of ``P``."""
        # (two tensors even where the positions are one: flex's guards break on aliases)
        at_q, at_k = gather_fn(q_pos.long()), gather_fn(k_pos.long().clone())

        def disentangled(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
            delta = self.index(at_q(b, q_idx) - at_k(b, kv_idx))
            term = torch.zeros_like(score)
            if c2p is not None:
                term = term + c2p[b, h, q_idx, delta].to(score.dtype)
            if p2c is not None:
                term = term + p2c[b, h, kv_idx, delta].to(score.dtype)
            return score + term

        return disentangled

    def extra_repr(self) -> str:
        text = f"num_heads={self.num_heads}, head_dim={self.head_dim}, dim={self.dim}"
        text += f", max_relative_positions={self.max_relative_positions}"
        if self.position_buckets > 0:
            text += f", position_buckets={self.position_buckets}"
        if self.share_att_key:
            text += ", share_att_key=True"
        return text + f", terms={self.terms}"
