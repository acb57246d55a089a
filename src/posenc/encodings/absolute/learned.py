"""Learned absolute position embeddings: one trained vector per position.

Used by BERT and GPT-2 (Radford et al. 2019 initialise with normal(0, 0.02)); the seed
tutorials initialise with Xavier-uniform. A table has ``max_len`` rows and cannot say
anything about positions past them: asking for one is an error naming both lengths.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from ...errors import PosencValueError, check_bytes
from ..base import AdditiveEncoding
from ..checks import (
    check_input,
    check_positive_int,
    check_probability,
    compute_dtype,
    take_position_ids,
)
from ..registry import register
from ..tiles import add_encoding

Init = Literal["xavier", "normal"]


@register("learned", "trained table of one vector per position (BERT, GPT-2)")
class LearnedPositionalEncoding(AdditiveEncoding):
    """A learned ``(max_len, dim)`` table added to the input.

    Args:
        dim: model width.
        max_len: number of positions the table holds.
        init: ``"xavier"`` (Xavier-uniform, as the seed does) or ``"normal"`` (normal(0, 0.02),
            as GPT-2 does).
        dropout: dropout on the sum.

    >>> pe = LearnedPositionalEncoding(8, max_len=4)
    >>> pe(torch.zeros(1, 5, 8))
    Traceback (most recent call last):
    ...
    posenc.errors.PosencValueError: input has 5 positions but the learned table has max_len=4
    """

    paper: ClassVar[str] = "Gehring et al. 2017; Devlin et al. 2019 (BERT); Radford et al. 2019"
    integer_positions: ClassVar[bool] = True

    def __init__(
        self,
        dim: int,
        *,
        max_len: int = 2048,
        init: Init = "normal",
        dropout: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.max_len = check_positive_int("max_len", max_len)
        if init not in ("xavier", "normal"):
            raise PosencValueError(f"init must be 'xavier' or 'normal', got {init!r}")
        self.init = init
        self.dropout = nn.Dropout(check_probability("dropout", dropout))
        itemsize = (dtype or torch.get_default_dtype()).itemsize
        check_bytes("max_len x dim", f"{max_len} x {dim}", max_len * dim * itemsize, device=device)
        self.weight = nn.Parameter(torch.empty(max_len, dim, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.init == "xavier":
            nn.init.xavier_uniform_(self.weight)
        else:
            nn.init.normal_(self.weight, mean=0.0, std=0.02)

    def encode(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        checkable = not torch.compiler.is_compiling() and positions.device.type != "meta"
        if checkable and positions.numel() and int(positions.max()) >= self.max_len:
            raise PosencValueError(
                f"position {int(positions.max())} is past the learned table "
                f"(max_len={self.max_len})"
            )
        return self.weight[positions.long()].to(dtype)

    def forward(
        self, x: Tensor, positions: Tensor | None = None, *, position_ids: Tensor | None = None
    ) -> Tensor:
        """Shapes: x ``(b, n, d)``, positions ``(n,)`` or ``(b, n)`` -> ``(b, n, d)``."""
        positions = take_position_ids(positions, position_ids)
        check_input(x, self.dim)
        if x.shape[1] > self.max_len:
            raise PosencValueError(
                f"input has {x.shape[1]} positions but the learned table has max_len={self.max_len}"
            )
        if positions is None:  # the first n rows: no position to check, no host sync
            pe = self.weight[: x.shape[1]].to(compute_dtype(x.dtype))  # (n, d)
            return add_encoding(x, pe, self.dropout)
        return super().forward(x, positions)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, max_len={self.max_len}, init={self.init!r}"
