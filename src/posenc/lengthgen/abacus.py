"""Abacus positions beside any scheme (``--pe NAME+abacus``; ``--pe abacus`` is NoPE with
them): a :class:`~posenc.TransformerModel` whose token embeddings get
:class:`~posenc.Abacus` vectors at the digits' indices within their numbers before its encoder
runs, as McLeish et al. 2024 add them (the scheme ``NAME`` still acts inside attention at
the tokens' positions).

Dimension legend: ``b`` batch, ``n`` sequence, ``D`` model width, ``V`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..encodings.absolute.abacus import Abacus, abacus_positions
from ..errors import PosencValueError
from ..model.transformer import TransformerModel

__all__ = ["AbacusModel", "check_digit_tokens"]


def check_digit_tokens(task: object) -> tuple[int, ...]:
    """The task's ``digit_tokens`` (non-empty ints), or an error naming the task."""
    digits = getattr(task, "digit_tokens", None)
    name = getattr(task, "name", type(task).__name__)
    if not digits or not all(isinstance(t, int) and not isinstance(t, bool) for t in digits):
        raise PosencValueError(
            f"Abacus positions need a task with digit_tokens (the tokens that are digits); "
            f"task {name!r} has none"
        )
    return tuple(digits)


class AbacusModel(nn.Module):
    """``model``'s forward with ``abacus`` added to its scaled token embeddings:
    ``head(encoder(embed(t) · sqrt(D) + abacus(index(t)), positions, mask))``, where
    ``index`` is :func:`~posenc.abacus_positions` of the tokens in ``digit_tokens``.

    >>> base = TransformerModel(12, 16, 1, 2, pe=None, causal=True)
    >>> model = AbacusModel(base, Abacus(16, max_len=8, max_offset=2), digit_tokens=range(10))
    >>> model(torch.tensor([[1, 2, 10, 3]])).shape
    torch.Size([1, 4, 12])
    """

    def __init__(self, model: TransformerModel, abacus: Abacus, digit_tokens: Sequence[int]):
        super().__init__()
        self.model, self.abacus = model, abacus
        digits = torch.zeros(model.vocab_size, dtype=torch.bool)
        digits[list(digit_tokens)] = True
        self.register_buffer("digits", digits, persistent=False)  # (V,) True at a digit

    def forward(
        self,
        tokens: Tensor,
        *,
        positions: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Shapes: tokens ``(b, n)`` -> logits ``(b, n, V)``; ``positions`` and
        ``key_padding_mask`` as :class:`~posenc.TransformerModel` takes them."""
        model = self.model
        x = model.embed(tokens) * model.scale  # (b, n, D)
        x = self.abacus(x, abacus_positions(self.digits[tokens]))
        x = model.encoder(x, positions=positions, key_padding_mask=key_padding_mask)
        return model.head(x)
