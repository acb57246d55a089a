"""Sandwich (Chi, Fan, Rudnicky & Ramadge 2023, "Dissecting Transformer Length Extrapolation via
the Lens of Receptive Field Analysis", ACL, §5): a parameter-free bias, the inner product of two
sinusoidal position embeddings, which depends only on the distance ``i - j``:

    p_i · p_j = sum_{k=1}^{d'/2} cos((i - j) / 10000^(2k/d'))

minus its value at distance 0 (``d'/2``), so that a token's bias to itself is 0 and every other
is negative, then divided per head as ALiBi spaces its slopes: head ``h = 1..H`` by ``8h/H``.
``d'`` is the attention head size, as in NeMo's ``SandwichRelativePositionEmbedding`` (whose
frequencies start at ``k = 1``, as here).

Dimension legend: ``h`` heads, ``K = d'/2`` frequencies.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from ...errors import PosencValueError
from ..base import BiasEncoding, ScoreMod
from ..checks import check_positive_float, check_positive_int
from ..registry import register
from .common import DistanceBias, check_bias_bytes, distance_reader

PAPER = "Chi et al. 2023, Dissecting Transformer Length Extrapolation (Sandwich), ACL, §5"


@register("sandwich", "inner product of sinusoidal embeddings of the distance (Sandwich)")
class Sandwich(DistanceBias):
    """Sandwich (Chi et al. 2023, §5): ``bias[h, i, j] = (sum_{k=1}^{K} cos((i - j) ω_k) - K)
    · H / (8h)`` with ``ω_k = base^(-2k/d')``, ``K = d'/2``, heads ``h = 1..H``.

    Checked against a float64 transcription of the formula and of NeMo's
    ``SandwichRelativePositionEmbedding`` (``tests/encodings/bias/test_sandwich.py``). The bias
    is symmetric in ``i - j``, so an encoder and a decoder use the same one; positions may be
    fractional. The cosines are summed in float64 (angles ``(i - j) ω_k`` of long distances
    need it), then cast to the queries' compute dtype.

    Args:
        num_heads: number of heads ``H``.
        head_dim: the embedding size ``d'`` (even), NeMo's per-head ``hidden_size``.
        base: the wavelength base of the frequencies (10000 in the paper).

    >>> Sandwich(2, 64).bias(torch.tensor([0]), torch.arange(4))
    tensor([[[ 0.0000, -0.1559, -0.5700, -1.1057]],
    <BLANKLINE>
            [[ 0.0000, -0.0779, -0.2850, -0.5529]]])
    """

    paper: ClassVar[str] = PAPER

    def __init__(self, num_heads: int, head_dim: int, *, base: float = 10000.0) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        if head_dim % 2:
            raise PosencValueError(f"head_dim must be even for Sandwich, got {head_dim}")
        self.base = check_positive_float("base", base)

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> BiasEncoding:
        return cls(num_heads, kwargs.pop("head_dim", dim // num_heads), **kwargs)

    def frequencies(self, device: Any = None) -> Tensor:
        """``ω_k = base^(-2k/d')`` for ``k = 1..d'/2``, float64 ``(K,)``."""
        k = torch.arange(1, self.head_dim // 2 + 1, dtype=torch.float64, device=device)
        return self.base ** (-2.0 * k / self.head_dim)

    def head_scales(self, device: Any = None) -> Tensor:
        """The divisor of head ``h = 1..H``, ``8h/H``, float64 ``(H,)``."""
        h = torch.arange(1, self.num_heads + 1, dtype=torch.float64, device=device)
        return 8.0 * h / self.num_heads

    def bias(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> Tensor:
        """``(h, nq, nk)`` for 1-D positions, ``(b, h, nq, nk)`` for batched ones."""
        q_pos, k_pos = self._check(q_positions, k_positions)
        # float64 distances, sum and temporaries beside the heads' float64 and cast values
        check_bias_bytes(q_pos, k_pos, 2 * self.num_heads + 5, q)
        return super().bias(q_pos, k_pos, q=q, k=k)

    def _centred_sum(self, d: Tensor, omegas: tuple[Tensor, ...]) -> Tensor:
        """``sum_k cos(d ω_k) - K`` at float64 distances ``d``, in K passes (no ``(..., K)``
        temporary)."""
        total = torch.zeros_like(d)
        for omega in omegas:
            total = total + torch.cos(d * omega)
        return total - self.head_dim // 2

    def distance_bias(self, distance: Tensor) -> Tensor:
        """``(sum_k cos(d ω_k) - K) / (8h/H)`` at ``d = i - j`` -> ``(h, *d.shape)``."""
        d = distance.to(torch.float64)
        total = self._centred_sum(d, self.frequencies(d.device).unbind())
        scales = self.head_scales(d.device).view(-1, *([1] * d.dim()))  # (h, 1, ...)
        return (total / scales).to(distance.dtype)

    def formula_score_mod(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> ScoreMod:
        """:meth:`distance_bias` per score, at ``d = q_pos[i] - k_pos[j]`` formed in the
        kernel (:func:`~posenc.encodings.bias.common.distance_reader`): ``K`` cosines in
        float64 per score, nothing sized, nothing read from the positions."""
        omegas = self.frequencies(q_pos.device).unbind()  # K 0-d float64 tensors
        scales = self.head_scales(q_pos.device)  # (h,)
        distance = distance_reader(q_pos, k_pos, dtype)

        def sandwich(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
            d = distance(b, q_idx, kv_idx).to(torch.float64)
            value = (self._centred_sum(d, omegas) / scales[h]).to(dtype)
            return score + value.to(score.dtype)

        return sandwich

    def extra_repr(self) -> str:
        text = f"num_heads={self.num_heads}, head_dim={self.head_dim}"
        return text if self.base == 10000.0 else text + f", base={self.base:g}"
