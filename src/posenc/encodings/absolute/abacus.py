"""Abacus embeddings (McLeish et al., NeurIPS 2024, "Transformers Can Do Arithmetic with the
Right Embeddings", §3): a learned vector per *digit index*, the 1-based place of a digit inside
its number, added to the token embeddings.

With numbers written least-significant digit first, digit ``i`` of every operand and of the
answer gets the same index ``i``, so the model aligns digits of equal significance by
position alone. Tokens that are not digits get index 0 (a learned vector of their own). In
training one random offset ``k`` in ``[0, max_offset]`` per sequence is added to the index of
every digit (``i + k``), so the rows past the trained lengths are trained too; evaluation uses
``k = 0``. The table has ``max_len`` rows: digit indices from 0 to ``max_len - 1``.

:func:`abacus_positions` computes the indices from a digit mask; the encoding's positions are
those indices (not the tokens' places in the sequence). Dimension legend: ``b`` batch, ``n``
sequence, ``d`` width.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from ...errors import PosencTypeError, PosencValueError, check_bytes
from ..base import AdditiveEncoding
from ..checks import check_input, check_positive_int, take_position_ids
from ..registry import register

__all__ = ["Abacus", "abacus_positions"]


def abacus_positions(is_digit: Tensor) -> Tensor:
    """The Abacus index of each token: ``j - s + 1`` for a digit at ``j`` whose maximal run of
    digits starts at ``s``, 0 for every other token.

    Shapes: is_digit ``(b, n)`` bool -> ``(b, n)`` int64.

    >>> abacus_positions(torch.tensor([[True, True, False, True, True, True, False]]))
    tensor([[1, 2, 0, 1, 2, 3, 0]])
    """
    if not isinstance(is_digit, Tensor) or is_digit.dtype != torch.bool or is_digit.dim() != 2:
        raise PosencTypeError(
            f"is_digit must be a (batch, seq) bool tensor, got {_describe(is_digit)}"
        )
    n = is_digit.shape[1]
    index = torch.arange(n, device=is_digit.device).expand_as(is_digit)  # (b, n)
    # the index of the last non-digit at or before each token (-1 before the first one)
    last_break = torch.where(is_digit, torch.full_like(index, -1), index).cummax(dim=1).values
    return torch.where(is_digit, index - last_break, torch.zeros_like(index))


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a {tuple(value.shape)} {value.dtype} tensor"
    return type(value).__name__


@register("abacus", "learned vector per digit index within its number (McLeish 2024)")
class Abacus(AdditiveEncoding):
    """Abacus embeddings: ``x + E[index + k]`` with ``index`` from :func:`abacus_positions`
    (0 off digits, never offset) and ``k`` the training offset (see the module docstring).

    Args:
        dim: model width.
        max_len: rows of the table: the largest digit index is ``max_len - 1`` (training
            needs the longest trained number plus ``max_offset`` below it).
        max_offset: the largest training offset ``k`` (McLeish et al. use 100 to go from 20
            digits to 100; ``posenc lengthgen`` too); 0 (default) turns the offset off.

    The offsets are drawn from torch's global generator (seed it to reproduce a run).

    >>> pe = Abacus(8, max_len=16, max_offset=4).eval()
    >>> idx = abacus_positions(torch.tensor([[True, True, False, True]]))
    >>> torch.equal(pe(torch.zeros(1, 4, 8), idx)[0, 1], pe.weight[2])
    True
    """

    paper: ClassVar[str] = "McLeish et al. 2024 (NeurIPS), Transformers Can Do Arithmetic"
    integer_positions: ClassVar[bool] = True

    def __init__(self, dim: int, *, max_len: int = 2048, max_offset: int = 0) -> None:
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.max_len = check_positive_int("max_len", max_len)
        if isinstance(max_offset, bool) or not isinstance(max_offset, int) or max_offset < 0:
            raise PosencValueError(f"max_offset must be an int >= 0, got {max_offset!r}")
        if max_offset >= max_len - 1:
            raise PosencValueError(
                f"max_offset ({max_offset}) leaves no row for a digit in a table of "
                f"max_len={max_len} rows: need max_offset <= max_len - 2"
            )
        self.max_offset = max_offset
        itemsize = torch.get_default_dtype().itemsize
        check_bytes("max_len x dim", f"{max_len} x {dim}", max_len * dim * itemsize)
        self.weight = nn.Parameter(torch.empty(max_len, dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=0.02)

    def encode(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        """The rows at ``positions`` (digit indices, no offset) as ``(..., d)``."""
        checkable = not torch.compiler.is_compiling() and positions.device.type != "meta"
        if checkable and positions.numel():
            low, high = int(positions.min()), int(positions.max())
            if low < 0 or high >= self.max_len:
                raise PosencValueError(
                    f"digit index {low if low < 0 else high} is outside the Abacus table "
                    f"[0, max_len={self.max_len})"
                )
        return self.weight[positions.long()].to(dtype)

    def forward(
        self, x: Tensor, positions: Tensor | None = None, *, position_ids: Tensor | None = None
    ) -> Tensor:
        """Shapes: x ``(b, n, d)``, positions (digit indices) ``(n,)`` or ``(b, n)`` ->
        ``(b, n, d)``. In training every digit's index (``positions > 0``) of a row is moved
        by that row's offset ``k``. Without ``positions`` the rows ``0 .. n-1`` are added, as
        for any table (what a digit-blind caller such as ``Encoder(pe="abacus")`` gets).
        ``position_ids`` is ``positions``'s other name."""
        positions = take_position_ids(positions, position_ids)
        check_input(x, self.dim)
        if positions is not None and self.training and self.max_offset > 0:
            b = x.shape[0]
            positions = positions.expand(b, x.shape[1]).long()
            offset = torch.randint(0, self.max_offset + 1, (b, 1), device=positions.device)
            positions = torch.where(positions > 0, positions + offset, positions)  # (b, n)
        return super().forward(x, positions)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, max_len={self.max_len}, max_offset={self.max_offset}"
