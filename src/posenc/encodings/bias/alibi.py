"""ALiBi: attention with linear biases (Press, Smith & Lewis 2022, "Train Short, Test Long:
Attention with Linear Biases Enables Input Length Extrapolation", §3).

Head ``h`` adds ``-m_h · |i - j|`` to the logit of query ``i`` and key ``j``. The slopes are a
geometric sequence: for ``n`` heads, a power of two, ``m_h = 2^(-8h/n)`` for ``h = 1..n``;
for other counts, the slopes of the closest power of two ``p < n`` followed by every other
slope of ``2p`` heads (the paper's footnote, as in its fairseq code and Hugging Face BLOOM's
``_get_alibi_slopes``).

MPT generalises the 8 to a maximum ``B`` (``alibi_bias_max``): ``m_h = 2^(-B·h/n)``. For a
head count that is not a power of two it pads to the next power ``2p``, computes those slopes
and keeps the odd-numbered ones, then the even-numbered ones, up to ``n`` — the same slopes in
the same order as the paper's rule above with 8 replaced by ``B`` (``max_bias`` here; checked
against transformers' ``build_mpt_alibi_tensor``). ``B = 8`` gives the paper's slopes.

``alibi_heads`` puts the bias on the first heads only (x-transformers' ``alibi_num_heads``):
those heads get the slopes of that many heads, the others no bias. ``slopes`` gives the
slopes of those heads outright.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from ...errors import PosencTypeError, PosencValueError
from ..base import ScoreMod
from ..checks import check_positive_float, check_positive_int
from ..registry import register
from .common import DistanceBias, check_pair_positions, gather_fn, work_dtype

PAPER = "Press et al. 2022, Train Short, Test Long (ALiBi), §3"


def alibi_slopes(
    num_heads: int,
    *,
    max_bias: float = 8.0,
    dtype: torch.dtype = torch.float64,
    device: Any = None,
) -> Tensor:
    """The ALiBi slope of each head, ``(num_heads,)``: ``2^(-max_bias·h/p)`` for the ``p``
    heads of the largest power of two ``p <= num_heads``, then every other slope of ``2p``
    heads for the rest. ``max_bias=8`` is the paper's sequence; other values are MPT's
    ``alibi_bias_max``.

    >>> alibi_slopes(4)
    tensor([0.2500, 0.0625, 0.0156, 0.0039], dtype=torch.float64)
    >>> alibi_slopes(4, max_bias=4.0)
    tensor([0.5000, 0.2500, 0.1250, 0.0625], dtype=torch.float64)
    """
    check_positive_int("num_heads", num_heads)
    max_bias = check_positive_float("max_bias", max_bias)

    def geometric(n: int) -> list[float]:  # n a power of two: ratio and start 2^(-max_bias/n)
        return [2.0 ** (-max_bias * h / n) for h in range(1, n + 1)]

    p = 2 ** math.floor(math.log2(num_heads))
    slopes = geometric(p) + geometric(2 * p)[0::2][: num_heads - p]
    return torch.tensor(slopes, dtype=dtype, device=device)


@register("alibi", "linear distance penalty per head (ALiBi)")
class ALiBi(DistanceBias):
    """Attention with linear biases (Press et al. 2022, §3): ``bias[h, i, j] = -m_h · |i - j|``.

    Checked against a float64 transcription of the formula, Hugging Face BLOOM's slopes for 1
    to 64 heads and MPT's ``build_mpt_alibi_tensor`` for several maxima (``docs/peers.md``
    says how BLOOM's, Falcon's and MPT's bias tensors relate to this one).

    Args:
        num_heads: number of heads (any count; see :func:`alibi_slopes`).
        max_bias: the largest exponent ``B`` of the slopes ``2^(-B·h/n)``; 8 (default) is the
            paper's sequence, other values MPT's ``alibi_bias_max``.
        alibi_heads: bias only the first this many heads, with the slopes of that many heads
            (x-transformers' ``alibi_num_heads``); the other heads get no bias. Default: all.
        slopes: the slopes of the biased heads, one float each, instead of the geometric
            sequence (``max_bias`` is then unused).
        causal: use the paper's decoder form ``-m_h · (i - j)``, which equals the symmetric
            one on every key a causal mask keeps (``j <= i``) and is positive on the keys it
            removes; the default symmetric form ``-m_h · |i - j|`` suits encoders.

    Positions may be fractional (interpolated). ``slopes`` (every head's, zero past
    ``alibi_heads``) is a float64 buffer (not saved in checkpoints) that keeps float64 after
    ``.to(dtype)``; the bias is formed in the queries' compute dtype.

    >>> ALiBi(2).bias(torch.arange(3), torch.arange(3))[1]
    tensor([[ 0.0000, -0.0039, -0.0078],
            [-0.0039,  0.0000, -0.0039],
            [-0.0078, -0.0039,  0.0000]])
    """

    paper: ClassVar[str] = PAPER
    slopes: Tensor

    def __init__(
        self,
        num_heads: int,
        *,
        causal: bool = False,
        max_bias: float = 8.0,
        alibi_heads: int | None = None,
        slopes: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        if not isinstance(causal, bool):
            raise PosencTypeError(f"causal must be a bool, got {type(causal).__name__}")
        self.causal = causal
        self.max_bias = check_positive_float("max_bias", max_bias)
        if alibi_heads is not None:
            check_positive_int("alibi_heads", alibi_heads)
            if alibi_heads > num_heads:
                raise PosencValueError(
                    f"alibi_heads ({alibi_heads}) must be at most num_heads ({num_heads})"
                )
        self.alibi_heads = num_heads if alibi_heads is None else alibi_heads
        self.given_slopes = None if slopes is None else _check_slopes(slopes, self.alibi_heads)
        self.register_buffer("slopes", self._slopes(None), persistent=False)

    def _slopes(self, device: Any) -> Tensor:
        """Every head's slope, float64 ``(num_heads,)``: zero past ``alibi_heads``."""
        if self.given_slopes is None:
            head = alibi_slopes(self.alibi_heads, max_bias=self.max_bias, device=device)
        else:
            head = torch.tensor(self.given_slopes, dtype=torch.float64, device=device)
        rest = torch.zeros(self.num_heads - self.alibi_heads, dtype=torch.float64, device=device)
        return torch.cat([head, rest])

    def reset_slopes(self) -> None:
        """Rebuild ``slopes`` in float64 on the current device (after ``to_empty``/``.to()``)."""
        self.slopes = self._slopes(self.slopes.device)

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

    #: the fused form computes ``-m_h · |d|`` in the kernel: any positions, no table
    table_score_mod: ClassVar[bool] = False
    reads_distance_bound: ClassVar[bool] = False

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
        at_q, at_k = gather_fn(q_pos.to(dtype)), gather_fn(k_pos.to(dtype).clone())  # no alias
        slopes = self.slopes.to(dtype)
        causal = self.causal

        def alibi(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            d = at_q(b, q_idx) - at_k(b, kv_idx)
            d = d if causal else d.abs()
            return score - (slopes[h] * d).to(score.dtype)

        return alibi

    def extra_repr(self) -> str:
        text = f"num_heads={self.num_heads}, causal={self.causal}"
        if self.max_bias != 8.0:
            text += f", max_bias={self.max_bias:g}"
        if self.alibi_heads != self.num_heads:
            text += f", alibi_heads={self.alibi_heads}"
        return text if self.given_slopes is None else text + f", slopes={list(self.given_slopes)}"


def _check_slopes(slopes: object, count: int) -> tuple[float, ...]:
    """``slopes`` as a tuple of ``count`` finite floats."""
    if isinstance(slopes, (str, bytes, Tensor)) or not isinstance(slopes, Sequence):
        raise PosencTypeError(f"slopes must be a sequence of floats, got {type(slopes).__name__}")
    values = []
    for value in slopes:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PosencTypeError(f"slopes must hold floats, got {value!r}")
        if not math.isfinite(value):
            raise PosencValueError(f"slopes must be finite, got {value!r}")
        values.append(float(value))
    if len(values) != count:
        raise PosencValueError(
            f"slopes must give one slope per ALiBi head ({count}), got {len(values)}"
        )
    return tuple(values)
