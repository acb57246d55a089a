"""The ecosystem's argument names, read into posenc's at the entry of a forward.

* ``position_ids=`` (transformers', Liger's, PyTorch's and ONNX's name) is ``positions=``;
* ``attention_mask=`` is a tokenizer's mask, ``(batch, seq)`` bool or 0/1 integers with 1 (or
  True) where a token is attended to, the opposite of posenc's ``key_padding_mask=`` (True
  marks padding, as in ``torch.nn.MultiheadAttention``): ``key_padding_mask =
  attention_mask == 0``. transformers' expanded 4-D masks and additive float masks are refused
  by name: they say more than which tokens are padding.

A forward takes one of each pair; both given is an error naming the two.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import PosencTypeError, PosencValueError

__all__ = ["padding_from_attention_mask", "positions_or_ids"]


def positions_or_ids(positions: Tensor | None, position_ids: Tensor | None) -> Tensor | None:
    """``positions``, or ``position_ids`` where it was given instead (the same tensor under
    transformers' name); both given: :class:`~posenc.errors.PosencValueError`."""
    if position_ids is None:
        return positions
    if positions is not None:
        raise PosencValueError(
            "pass positions or position_ids (the same positions under transformers' name), "
            f"not both: got positions of shape {_shape(positions)} and position_ids of shape "
            f"{_shape(position_ids)}"
        )
    return position_ids


def padding_from_attention_mask(
    attention_mask: object, key_padding_mask: Tensor | None, batch: int, seq: int
) -> Tensor | None:
    """``key_padding_mask`` (True = padding), or the one a tokenizer's ``attention_mask``
    (1 = attend) gives, ``attention_mask == 0``, checked to be ``(batch, seq)`` bool or 0/1
    integers first (its values read once for an integer mask). Both given, a float or 4-D
    mask, another shape or other integers: an error naming ``attention_mask`` and its value."""
    if attention_mask is None:
        return key_padding_mask
    if key_padding_mask is not None:
        raise PosencValueError(
            "pass attention_mask (1 = attend, a tokenizer's) or key_padding_mask (True = "
            "padding), not both"
        )
    if not isinstance(attention_mask, Tensor):
        raise PosencTypeError(
            "attention_mask must be a (batch, seq) bool or 0/1 integer tensor (1 = attend), "
            f"got {type(attention_mask).__name__}"
        )
    mask = attention_mask
    if mask.is_floating_point() or mask.is_complex():
        raise PosencTypeError(
            f"attention_mask must be bool or 0/1 integers (1 = attend), got dtype {mask.dtype}: "
            "an additive float mask is not taken; pass the tokenizer's mask"
        )
    if mask.dim() != 2:
        hint = " (transformers' expanded 4-D mask is not taken)" if mask.dim() == 4 else ""
        raise PosencValueError(
            f"attention_mask must be (batch, seq) = ({batch}, {seq}), got a {mask.dim()}-D "
            f"tensor of shape {_shape(mask)}{hint}; pass the tokenizer's (batch, seq) mask"
        )
    if tuple(mask.shape) != (batch, seq):
        raise PosencValueError(
            f"attention_mask must be (batch, seq) = ({batch}, {seq}), got shape {_shape(mask)}"
        )
    if mask.dtype == torch.bool:
        return ~mask
    bad = mask[(mask != 0) & (mask != 1)]
    if bad.numel():
        shown = torch.unique(bad)[:5].tolist()
        raise PosencValueError(
            f"attention_mask must hold 0 (padding) and 1 (attend) only, got values {shown}"
        )
    return mask == 0


def _shape(tensor: object) -> object:
    return tuple(tensor.shape) if isinstance(tensor, Tensor) else type(tensor).__name__
