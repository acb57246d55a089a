"""CoPE: contextual position encoding (Golovneva, Wang, Weston & Sukhbaatar 2024, "Contextual
Position Encoding: Learning to Count What's Important", §3, eqs. 3-5).

Positions are counted by the context instead of by tokens. Query ``i`` opens a gate on every
key, the position of key ``j`` is the sum of the gates between them, and since that sum is
fractional its embedding is interpolated between the two nearest integer ones:

    g_ij = σ(q_i · k_j)                                   (eq. 3)
    p_ij = sum_{t=j}^{i} g_it                             (eq. 4)
    e[p] = (p - ⌊p⌋) e[⌈p⌉] + (1 - p + ⌊p⌋) e[⌊p⌋]          (eq. 5)
    a_ij = softmax_j( q_i · (k_j + e[p_ij]) / sqrt(d) )

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim, ``P`` positions.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ...errors import PosencTypeError, PosencValueError
from ..base import BiasEncoding
from ..checks import check_positive_int
from ..registry import register
from .common import check_bias_bytes, check_pair_positions, work_dtype


@register("cope", "positions counted by sigmoid gates over the context (CoPE)")
class CoPE(BiasEncoding):
    """Contextual position encoding (Golovneva et al. 2024, eqs. 3-5).

    Returns ``bias[b, h, i, j] = q_i · e[p_ij] / sqrt(d)``; attention adds ``q_i · k_j /
    sqrt(d)``. Checked against a float64 transcription that sums the gates of every pair in a
    loop.

    Args:
        num_heads: number of heads.
        head_dim: ``d``.
        max_positions: ``P``, the number of integer position embeddings; counts are clamped to
            ``P - 1`` (the paper's ``p_max``).

    The gates use the unscaled ``q · k`` (eq. 3). The embeddings ``e`` (``(d, P)``) are shared by
    all heads as in the authors' code, but initialised from N(0, 0.02²) instead of zeros so the
    scheme acts from the first step. The paper counts keys at or before the query (``j <= i``);
    for keys after it (non-causal attention) this class counts ``sum_{t=i}^{j} g_it``, the
    same sum in the other direction. A count runs between the query's own index and the key's,
    so this is self-attention only (``nq == nk``); padding should sit at either end of a
    sequence (padding in between would be counted). CoPE reads every ``q_i · k_j``, so it has
    no score_mod: attention materialises its bias.
    """

    paper: ClassVar[str] = "Golovneva et al. 2024, Contextual Position Encoding (CoPE), eqs. 3-5"
    needs_qk: ClassVar[bool] = True
    has_score_mod: ClassVar[bool] = False  # counts are cumulative sums over the keys

    def __init__(self, num_heads: int, head_dim: int, *, max_positions: int = 64) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.max_positions = check_positive_int("max_positions", max_positions)
        self.embeddings = nn.Parameter(torch.randn(head_dim, max_positions) * 0.02)  # e, (d, P)

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> CoPE:
        return cls(num_heads, dim // num_heads, **kwargs)

    def counts(self, q: Tensor, k: Tensor) -> Tensor:
        """The contextual positions ``p_ij`` (eq. 4, clamped to ``P - 1``): ``(b, h, nq, nk)``.
        With fewer queries than keys (a cached call) the queries are the last ``nq`` tokens
        of the ``nk``: query ``i`` sits at key index ``i + nk - nq``. ``k`` may hold grouped
        heads, ``g`` dividing ``h`` (key head ``i // (h / g)`` serves query head ``i``): the
        query groups are folded into the query axis, so the keys are read in place."""
        b, h, nq, d = q.shape
        g = k.shape[1]
        folded = q.reshape(b, g, h // g * nq, d)  # (b, g, G·nq, d)
        gates = torch.sigmoid(folded @ k.transpose(-2, -1)).view(b, h, nq, -1)  # eq. 3
        nq, nk = gates.shape[-2:]
        at = torch.ones(nq, nk, dtype=torch.bool, device=gates.device)
        keep_past = at.tril(nk - nq)  # key j at or before query i
        from_self = at.triu(nk - nq)  # key j at or after query i
        # sum over t = j..i of g_it: a reverse cumulative sum along the keys
        to_query = (gates * keep_past).flip(-1).cumsum(-1).flip(-1)
        # keys after the query: sum over t = i..j, a forward cumulative sum
        from_query = (gates * from_self).cumsum(-1)
        counts = torch.where(keep_past, to_query, from_query)
        return counts.clamp(max=self.max_positions - 1)

    def bias(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> Tensor:
        """``(b, h, nq, nk)``; needs ``q`` and ``k`` (``(b, h, n, d)``). Positions only fix the
        shapes: CoPE's positions come from the context."""
        q_pos, k_pos = check_pair_positions(q_positions, k_positions)
        if q is None or k is None:
            raise PosencValueError("CoPE.bias needs q= and k= (the (b, h, n, d) queries and keys)")
        for name, t in (("q", q), ("k", k)):
            if not isinstance(t, Tensor) or not t.is_floating_point():
                raise PosencTypeError(
                    f"CoPE needs {name} as a floating-point torch.Tensor, "
                    f"got {getattr(t, 'dtype', type(t).__name__)}"
                )
            heads = t.dim() == 4 and (
                t.shape[1] == self.num_heads
                or (name == "k" and t.shape[1] and self.num_heads % t.shape[1] == 0)
            )
            if not heads or t.shape[-1] != self.head_dim:
                grouped = " or g dividing h" if name == "k" else ""
                raise PosencValueError(
                    f"CoPE expects {name} of shape (b, h={self.num_heads}{grouped}, n, "
                    f"d={self.head_dim}), got {tuple(t.shape)}"
                )
        nq, nk = q.shape[2], k.shape[2]
        if nq > nk or q_positions.shape[-1] != nq or k_positions.shape[-1] != nk:
            raise PosencValueError(
                f"CoPE counts between a query and the keys of its sequence (the queries being "
                f"the last nq of the nk keys): needs nq <= nk and positions of those lengths, "
                f"got nq={nq}, nk={nk}, q_positions {tuple(q_positions.shape)}, k_positions "
                f"{tuple(k_positions.shape)}"
            )
        # per pair and head: the gate, its cumulative sum, the two interpolation weights
        check_bias_bytes(q_pos, k_pos, 4 * self.num_heads, q)
        work = work_dtype(q, self)
        q, k = q.to(work), k.to(work)
        p = self.counts(q, k)  # (b, h, n, n)
        per_position = q @ self.embeddings.to(work)  # (b, h, n, P): q_i · e[p] for integer p
        low, high = p.floor(), p.ceil()
        at_low = per_position.gather(-1, low.long())  # (b, h, n, n)
        at_high = per_position.gather(-1, high.long())
        frac = p - low
        return (frac * at_high + (1 - frac) * at_low) / math.sqrt(self.head_dim)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"max_positions={self.max_positions}"
        )
