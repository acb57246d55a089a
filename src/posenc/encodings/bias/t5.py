"""T5 relative position bias (Raffel et al. 2020, "Exploring the Limits of Transfer Learning
with a Unified Text-to-Text Transformer", §2.1).

Each head learns one scalar per *bucket* of relative position ``r = key_pos - query_pos``.
With ``B`` buckets per direction (half of ``num_buckets`` when bidirectional, the first half
for ``r <= 0`` and the second for ``r > 0``), distances ``|r| < B/2`` get a bucket each and
larger ones share logarithmically spaced buckets up to ``max_distance``, beyond which all fall
in the last bucket:

    bucket(|r|) = |r|                                                  if |r| < B/2
                = min(B - 1, B/2 + floor(log(|r| / (B/2)) / log(max_distance / (B/2))
                                        · (B - B/2)))                  otherwise

The logarithm is taken in float32, as in the Mesh TensorFlow and Hugging Face code, so the
bucket of every distance, including those on a boundary, matches the trained models.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ...errors import PosencTypeError, PosencValueError
from ..checks import check_positive_int
from ..registry import register
from .common import DistanceBias

PAPER = "Raffel et al. 2020, Exploring the Limits of Transfer Learning (T5), §2.1"


def check_bucket_args(num_buckets: object, max_distance: object, bidirectional: object) -> None:
    check_positive_int("num_buckets", num_buckets)
    check_positive_int("max_distance", max_distance)
    if not isinstance(bidirectional, bool):
        raise PosencTypeError(f"bidirectional must be a bool, got {type(bidirectional).__name__}")
    assert isinstance(num_buckets, int) and isinstance(max_distance, int)
    if num_buckets < 2:
        raise PosencValueError(f"num_buckets must be >= 2, got {num_buckets}")
    if bidirectional and num_buckets % 2:
        raise PosencValueError(
            f"num_buckets must be even with bidirectional=True (half per direction), "
            f"got {num_buckets}"
        )
    if max_distance < num_buckets:
        raise PosencValueError(
            f"max_distance ({max_distance}) must be >= num_buckets ({num_buckets})"
        )


def t5_relative_position_bucket(
    relative_position: Tensor,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    """The T5 bucket (int64, same shape) of each ``relative_position = key_pos - query_pos``.

    >>> t5_relative_position_bucket(torch.tensor([-200, -9, -1, 0, 1, 9, 200]))
    tensor([15,  8,  1,  0, 17, 24, 31])
    """
    check_bucket_args(num_buckets, max_distance, bidirectional)
    if not isinstance(relative_position, Tensor):
        raise PosencTypeError(
            f"relative_position must be a torch.Tensor, got {type(relative_position).__name__}"
        )
    if relative_position.is_floating_point() or relative_position.dtype == torch.bool:
        raise PosencTypeError(
            f"relative_position must be an integer tensor, got {relative_position.dtype}"
        )
    rel = relative_position.long()
    if bidirectional:
        per_side = num_buckets // 2
        offset = torch.where(rel > 0, per_side, 0)  # keys after the query use the upper half
        distance = rel.abs()
    else:
        per_side = num_buckets
        offset = torch.zeros_like(rel)
        distance = (-rel).clamp(min=0)  # only keys at or before the query are told apart
    exact = per_side // 2
    if exact == 0:  # one bucket per side: everything shares it
        return offset
    # float32 logarithm, as in the reference implementations (decides boundary distances)
    ratio = distance.float().clamp(min=1) / exact
    log_part = torch.log(ratio) / math.log(max_distance / exact) * (per_side - exact)
    far = (exact + log_part.to(torch.long)).clamp(max=per_side - 1)
    return offset + torch.where(distance < exact, distance, far)


@register("t5", "learned per-head bias over log-spaced relative-distance buckets (T5)")
class T5RelativeBias(DistanceBias):
    """T5's bucketed relative position bias (Raffel et al. 2020, §2.1).

    ``bias[h, i, j] = table[bucket(k_pos[j] - q_pos[i]), h]``. Buckets checked against Hugging
    Face ``T5Attention._relative_position_bucket`` for many settings and both directions.

    Args:
        num_heads: number of heads.
        num_buckets: buckets in total (split between the two directions when bidirectional;
            must then be even); at least 2.
        max_distance: distance from which every position shares the last bucket; at least
            ``num_buckets``. A model trained on sequences shorter than ``max_distance`` never
            sees the buckets of the distances between its training length and
            ``max_distance``: evaluated on longer sequences, those distances read buckets
            that were never trained (their initial values). For training short and testing
            long, choose ``max_distance`` at most the training length, so that every
            distance past it falls in the last, trained bucket.
        bidirectional: tell keys before and after the query apart (encoders); ``False`` for
            decoders, where every key after the query shares bucket 0. A causal
            :class:`~posenc.Encoder` builds ``bidirectional=False`` unless told otherwise
            (:attr:`causal_defaults`), as T5's decoder does.

    The table is an ``nn.Embedding(num_buckets, num_heads)`` initialised from N(0, 0.02²)
    (Hugging Face's layout, so its weights load directly). Positions must be whole numbers.

    >>> T5RelativeBias(4).bias(torch.arange(5), torch.arange(5)).shape
    torch.Size([4, 5, 5])
    """

    paper: ClassVar[str] = PAPER
    integer_positions = True
    causal_defaults: ClassVar[dict[str, Any]] = {"bidirectional": False}

    def __init__(
        self,
        num_heads: int,
        *,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        check_bucket_args(num_buckets, max_distance, bidirectional)
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.saturates_at = max_distance  # every distance from here on shares the last bucket
        self.bidirectional = bidirectional
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)
        nn.init.normal_(self.relative_attention_bias.weight, std=0.02)

    def relative_position_bucket(self, relative_position: Tensor) -> Tensor:
        """Buckets of ``relative_position = key_pos - query_pos`` with this module's settings."""
        return t5_relative_position_bucket(
            relative_position,
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )

    def distance_bias(self, distance: Tensor) -> Tensor:
        """``table[bucket(-d)]`` at ``d = q_pos - k_pos`` -> ``(h, *d.shape)``."""
        buckets = self.relative_position_bucket((-distance).round().long())
        values = self.relative_attention_bias(buckets).to(distance.dtype)  # (*S, h)
        return values.movedim(-1, 0)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )
