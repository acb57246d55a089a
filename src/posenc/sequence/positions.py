"""Position tensors made for a model rather than by an encoding: the positions of a padded
batch's real tokens, and randomized positions (Ruoss et al. 2023), drawn for each training
sequence.

Every function returns an explicit integer tensor that any registered scheme takes as its
``positions``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..encodings.checks import check_positive_int, resolve_positions
from ..errors import PosencTypeError, PosencValueError
from .masks import check_key_padding_mask

__all__ = ["positions_from_padding", "randomize_positions"]


def positions_from_padding(key_padding_mask: Tensor) -> Tensor:
    """The positions of a padded batch: each row's real tokens get ``0, 1, 2, ...`` in order,
    wherever its padding is (left, right, or between), and padding tokens get 0 (their
    outputs mean nothing; 0 is inside every table).

    ``key_padding_mask`` is ``(b, n)`` bool with True marking padding, posenc's convention
    (from a transformers ``attention_mask``: ``attention_mask == 0``). Pass the result as
    ``positions=`` with the same mask, and each row's real tokens are encoded as that row
    alone, unpadded, would be.

    >>> padding = torch.tensor([[1, 1, 0, 0, 0], [0, 0, 0, 1, 1]]).bool()  # True: padding
    >>> positions_from_padding(padding).tolist()
    [[0, 0, 0, 1, 2], [0, 1, 2, 0, 0]]
    """
    if not isinstance(key_padding_mask, Tensor):
        raise PosencTypeError(
            f"key_padding_mask must be a torch.Tensor, got {type(key_padding_mask).__name__}"
        )
    if key_padding_mask.dim() != 2:
        raise PosencValueError(
            f"key_padding_mask must have shape (batch, seq), got {tuple(key_padding_mask.shape)}"
        )
    check_key_padding_mask(key_padding_mask, *key_padding_mask.shape)
    real = (~key_padding_mask).long()  # (b, n)
    return (real.cumsum(-1) - 1).clamp_(min=0) * real  # (b, n): 0, 1, ... at the real tokens


def randomize_positions(
    positions: Tensor | None,
    seq_len: int,
    max_positions: int,
    *,
    device: torch.device | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Randomized positions (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
    Generalization of Transformers", §3): ``positions`` (default ``arange(seq_len)``; whole,
    non-negative, ``(n,)`` or ``(b, n)``) mapped through ``m`` sorted distinct positions drawn
    uniformly from ``[0, max_positions)``, one draw per row, where ``m = max(positions) + 1``.

    Order and ties are kept (``p < p'`` gives ``r[p] < r[p']``), so positions that share a
    value (coupled ones) still share it, while the gaps are those of a longer sequence.

    Shapes: returns ``(n,)`` for default or 1-D positions, else ``(b, n)``; int64.

    >>> randomize_positions(None, 4, 10, generator=torch.Generator().manual_seed(0)).tolist()
    [1, 5, 7, 9]
    """
    check_positive_int("max_positions", max_positions)
    if positions is None:
        count = seq_len
        positions = torch.arange(seq_len, device=device)
    else:
        positions = resolve_positions(positions, seq_len, device=device, integer=True).long()
        count = int(positions.max()) + 1 if positions.numel() else 0  # one host sync
    if count > max_positions:
        raise PosencValueError(
            f"randomized positions: {count} distinct positions need max_positions >= {count}, "
            f"got {max_positions}"
        )
    rows = 1 if positions.dim() == 1 else positions.shape[0]
    keys = torch.rand(rows, max_positions, generator=generator, device=positions.device)
    chosen = keys.topk(count, dim=-1).indices.sort(dim=-1).values  # (rows, m), sorted
    mapped = chosen.gather(-1, positions.expand(rows, -1))  # (rows, n)
    return mapped[0] if positions.dim() == 1 else mapped
