"""Position-dependent query scaling: attention's temperature growing with the log of the
position (or of the number of keys a query reads), as long-context models apply it.

* Llama 4's ``attn_temperature_tuning`` (Nakanishi 2025, "Scalable-Softmax Is Superior for
  Attention", arXiv:2501.19399), on its NoPE layers: ``q · (1 + attn_scale · log(1 +
  floor((p + 1) / floor_scale)))``;
* Ministral 3's ``llama_4_scaling_beta``, on every layer after the rotation:
  ``q · (1 + β · log(1 + floor(p / original_max_position_embeddings)))``.

Both are ``1 + scale · log(1 + floor((p + offset) / floor))``: :class:`QueryScale`, form
``"floor"``. Two more forms:

* ``"ssmax"``, Scalable-Softmax itself (Nakanishi 2025, eq. 2): ``q · s_h · log n_i``, with
  ``s_h`` a learned scalar per head (the attention's ``ssmax_scale`` parameter) and ``n_i``
  the number of keys query ``i`` may attend to under the layer's mask (its causal prefix,
  its own document under packing, its window or chunk, the cached keys, less padding);
* ``"logn"``, Qwen's ``use_logn_attn``: ``q · max(1, log_L (p + 1))``, with ``L`` the
  training length (``seq_length``) and ``p + 1`` the 1-based position.

"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import PosencTypeError, PosencValueError

__all__ = ["FORMS", "QueryScale", "visible_keys"]


#: The forms of :class:`QueryScale` (see the module docstring).
FORMS: tuple[str, ...] = ("floor", "ssmax", "logn")


@dataclass(frozen=True)
class QueryScale:
    """Queries scaled by a factor per position (float32, as transformers computes it, then
    cast to the queries' dtype). ``form="floor"`` (default): ``1 + scale · log(1 + floor((p
    + offset) / floor))``; ``"ssmax"``: ``s_h · log n_i`` with ``s_h`` learned, starting at
    ``scale``; ``"logn"``: ``max(1, log(p + 1) / log(length))``. Build the last two with
    :meth:`ssmax` and :meth:`logn`.

    >>> QueryScale.llama4(attn_scale=0.1, floor_scale=8192).factor(torch.tensor([0, 8191]))
    tensor([1.0000, 1.0693])
    >>> QueryScale.logn(4).factor(torch.tensor([0, 3, 15]))
    tensor([1., 1., 2.])
    """

    scale: float  # the coefficient of the log (``ssmax``: the initial s of every head)
    floor: float  # positions per step of the floor
    offset: float = 0.0  # added to the position first (Llama 4 counts from 1)
    form: str = "floor"  # "floor", "ssmax" or "logn"
    length: int | None = None  # logn: the training length L, the base of the log

    def __post_init__(self) -> None:
        for name in ("scale", "floor", "offset"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise PosencTypeError(f"QueryScale {name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise PosencValueError(f"QueryScale {name} must be finite, got {value!r}")
        if self.floor <= 0:
            raise PosencValueError(f"QueryScale floor must be > 0, got {self.floor!r}")
        if self.form not in FORMS:
            raise PosencValueError(
                f"QueryScale form must be one of {', '.join(FORMS)}; got {self.form!r}"
            )
        if self.form == "logn":
            length = self.length
            if isinstance(length, bool) or not isinstance(length, int) or length < 2:
                raise PosencValueError(
                    f"QueryScale length (logn's training length) must be an int >= 2, got "
                    f"{length!r}"
                )
        elif self.length is not None:
            raise PosencValueError(
                f"QueryScale length is logn's training length; form {self.form!r} takes none, "
                f"got {self.length!r}"
            )

    @classmethod
    def llama4(cls, attn_scale: float, floor_scale: float) -> QueryScale:
        """Llama 4's ``attn_temperature_tuning`` (config ``attn_scale``, ``floor_scale``)."""
        return cls(scale=attn_scale, floor=floor_scale, offset=1.0)

    @classmethod
    def ministral3(cls, beta: float, original_max_position_embeddings: int) -> QueryScale:
        """Ministral 3's ``llama_4_scaling_beta`` over its original context."""
        return cls(scale=beta, floor=original_max_position_embeddings)

    @classmethod
    def ssmax(cls, init: float) -> QueryScale:
        """Scalable-Softmax (Nakanishi 2025): ``q · s_h · log n_i``, every head's ``s_h``
        starting at ``init`` (``s_h · log n_i = 1`` at ``n_i = exp(1 / init)`` keys)."""
        return cls(scale=init, floor=1.0, form="ssmax")

    @classmethod
    def logn(cls, trained_length: int) -> QueryScale:
        """Qwen's ``use_logn_attn`` with ``seq_length = trained_length``."""
        return cls(scale=1.0, floor=1.0, form="logn", length=trained_length)

    @property
    def counts_keys(self) -> bool:
        """Whether the factor reads how many keys each query sees (``ssmax``)."""
        return self.form == "ssmax"

    def factor(self, positions: Tensor) -> Tensor:
        """The factor at each position, float32, the shape of ``positions`` (not for
        ``ssmax``, whose factor is :meth:`ssmax_factor`)."""
        if self.form == "ssmax":
            raise PosencValueError("an ssmax QueryScale reads key counts: use ssmax_factor")
        if self.form == "logn":
            assert self.length is not None
            ratio = torch.log1p(positions.float()) / math.log(self.length)
            return ratio.clamp(min=1.0)
        steps = torch.floor((positions.float() + self.offset) / self.floor)
        return 1.0 + self.scale * torch.log1p(steps)

    @staticmethod
    def ssmax_factor(keys: Tensor, weight: Tensor) -> Tensor:
        """``s_h · log n_i`` ``(b, h, n, 1)`` float32 from the key counts ``keys`` ``(b, n)``
        (a query that sees none counts as one) and ``weight`` = ``s`` ``(h,)``."""
        log_n = torch.log(keys.float().clamp(min=1.0))  # (b, n)
        return weight.float().view(1, -1, 1, 1) * log_n[:, None, :, None]

    def apply(
        self,
        q: Tensor,
        positions: Tensor,
        *,
        keys: Tensor | None = None,
        weight: Tensor | None = None,
    ) -> Tensor:
        """``q`` ``(b, h, n, d)`` scaled at ``positions`` ``(n,)`` or ``(b, n)``; ``ssmax``
        reads ``keys`` (the keys each query sees, ``(b, n)``) and ``weight`` (``s``,
        ``(h,)``) instead."""
        if self.form == "ssmax":
            if keys is None or weight is None:
                raise PosencValueError("an ssmax QueryScale needs keys= and weight=")
            return (q * self.ssmax_factor(keys, weight)).to(q.dtype)
        factor = self.factor(positions)  # (n,) | (b, n)
        factor = factor.view(-1, 1, q.shape[2], 1)  # (b|1, 1, n, 1)
        return (q * factor).to(q.dtype)


def visible_keys(mask: Tensor | None, batch: int, nq: int, nk: int, device: torch.device) -> Tensor:
    """The keys each query may attend to, ``(b, nq)`` int64: the True entries of each row of
    the boolean ``mask`` ``(b, 1, nq, nk)`` (True = may attend), or ``nk`` without a mask."""
    if mask is None:
        return torch.full((batch, nq), nk, dtype=torch.long, device=device)
    return mask.sum(dim=-1, dtype=torch.long).view(mask.shape[0], nq).expand(batch, nq)
