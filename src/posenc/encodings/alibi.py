"""ALiBi: attention with linear biases (Press, Smith & Lewis 2022, "Train Short, Test Long:
Attention with Linear Biases Enables Input Length Extrapolation", §3).

Head ``h`` adds ``-m_h · |i - j|`` to the logit of query ``i`` and key ``j``. The slopes are a
geometric sequence: for ``n`` heads, a power of two, ``m_h = 2^(-8h/n)`` for ``h = 1..n``;
for other counts, the slopes of the closest power of two ``p < n`` followed by every other
slope of ``2p`` heads (the paper's footnote, as in its fairseq code and Hugging Face BLOOM's
``_get_alibi_slopes``).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from ..errors import PosencTypeError
from .base import ScoreMod, check_positive_int, register
from .bias_common import DistanceBias, check_pair_positions, gather_fn, work_dtype

PAPER = "Press et al. 2022, Train Short, Test Long (ALiBi), §3"


def alibi_slopes(
    num_heads: int, *, dtype: torch.dtype = torch.float64, device: Any = None
) -> Tensor:
    """The ALiBi slope of each head, ``(num_heads,)``.

    >>> alibi_slopes(4)
    tensor([0.2500, 0.0625, 0.0156, 0.0039], dtype=torch.float64)
    """
    check_positive_int("num_heads", num_heads)

    def geometric(n: int) -> list[float]:  # n a power of two: ratio and start 2^(-8/n)
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    p = 2 ** math.floor(math.log2(num_heads))
    slopes = geometric(p) + geometric(2 * p)[0::2][: num_heads - p]
    return torch.tensor(slopes, dtype=dtype, device=device)


@register("alibi", "linear distance penalty per head (ALiBi)")
class ALiBi(DistanceBias):
    """Attention with linear biases (Press et al. 2022, §3): ``bias[h, i, j] = -m_h · |i - j|``.

    Checked against a float64 transcription of the formula and Hugging Face BLOOM's slopes
    for 1 to 64 heads.

    Args:
        num_heads: number of heads (any count; see :func:`alibi_slopes`).
        causal: use the paper's decoder form ``-m_h · (i - j)``, which equals the symmetric
            one on every key a causal mask keeps (``j <= i``) and is positive on the keys it
            removes; the default symmetric form ``-m_h · |i - j|`` suits encoders.

    Positions may be fractional (interpolated). ``slopes`` is a float64 buffer (not saved in
    checkpoints) that keeps float64 after ``.to(dtype)``; the bias is formed in the queries'
    compute dtype.

    >>> ALiBi(2).bias(torch.arange(3), torch.arange(3))[1]
    tensor([[ 0.0000, -0.0039, -0.0078],
            [-0.0039,  0.0000, -0.0039],
            [-0.0078, -0.0039,  0.0000]])
    """

    paper: ClassVar[str] = PAPER
    slopes: Tensor

    def __init__(self, num_heads: int, *, causal: bool = False) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        if not isinstance(causal, bool):
            raise PosencTypeError(f"causal must be a bool, got {type(causal).__name__}")
        self.causal = causal
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def reset_slopes(self) -> None:
        """Rebuild ``slopes`` in float64 on the current device (after ``to_empty``/``.to()``)."""
        self.slopes = alibi_slopes(self.num_heads, device=self.slopes.device)

    def _apply(self, fn: Any, recurse: bool = True) -> ALiBi:
        super()._apply(fn, recurse)
        if self.slopes.device.type != "meta":
            self.reset_slopes()
        return self

    def distance_bias(self, distance: Tensor) -> Tensor:
        """``-m_h · |d|`` (or ``-m_h · d`` when causal) at ``d = i - j`` -> ``(h, *d.shape)``."""
        d = distance if self.causal else distance.abs()
        slopes = self.slopes.to(distance.dtype).view(-1, *([1] * distance.dim()))  # (h, 1, ...)
        # 0 - m·d in one pass over the (h, ...) output; 0 - x, not -x: no -0.0 on the diagonal
        zero = torch.zeros((), dtype=distance.dtype, device=distance.device)
        return torch.addcmul(zero, slopes, d, value=-1)

    def score_mod(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> ScoreMod | None:
        """The bias computed inside the kernel: no table, so fractional positions work too."""
        q_pos, k_pos = check_pair_positions(q_positions, k_positions)
        dtype = work_dtype(q, self)
        at_q, at_k = gather_fn(q_pos.to(dtype)), gather_fn(k_pos.to(dtype))
        slopes = self.slopes.to(dtype)
        causal = self.causal

        def alibi(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            d = at_q(b, q_idx) - at_k(b, kv_idx)
            d = d if causal else d.abs()
            return score - (slopes[h] * d).to(score.dtype)

        return alibi

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, causal={self.causal}"
