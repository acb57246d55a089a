"""Attention masks: the causal and key-padding mask as one boolean tensor, and the check of a
``key_padding_mask`` (posenc's convention: True marks padding, as in
``torch.nn.MultiheadAttention``; transformers' ``attention_mask`` is the opposite).

Dimension legend: ``b`` batch, ``nq``/``nk`` query and key lengths.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import PosencTypeError, PosencValueError

__all__ = ["attention_mask", "check_key_padding_mask"]


def attention_mask(
    batch: int,
    nq: int,
    nk: int,
    *,
    causal: bool,
    key_padding_mask: Tensor | None,
    device: torch.device,
    q_documents: Tensor | None = None,
    k_documents: Tensor | None = None,
    q_positions: Tensor | None = None,
    k_positions: Tensor | None = None,
    window: int | None = None,
    chunk: int | None = None,
) -> Tensor | None:
    """Boolean ``(b, 1, nq, nk)`` mask, True where attending is allowed; ``None`` if all is.

    ``key_padding_mask`` is ``(b, nk)`` with True marking padding (as in
    ``torch.nn.MultiheadAttention``). Causal masking aligns the last query with the last key
    (the queries of a cached call are the newest keys). ``q_documents`` ``(b, nq)`` and
    ``k_documents`` ``(b, nk)`` keep each query to the keys of its own document.

    ``window`` and ``chunk`` read positions, ``q_positions`` ``(b, nq)`` and ``k_positions``
    ``(b, nk)``: a sliding window keeps the keys less than ``window`` positions from the query
    (``i - w < j <= i`` with causal masking), a chunk the keys whose ``position // chunk``
    is the query's (Llama 4's chunked attention).
    """
    mask = None
    if causal and nq > 1:  # one query, the newest, reads every key
        mask = torch.ones(nq, nk, dtype=torch.bool, device=device).tril(nk - nq)
        mask = mask.view(1, 1, nq, nk)
    if key_padding_mask is not None:
        keep = ~key_padding_mask.view(batch, 1, 1, nk)
        mask = keep if mask is None else mask & keep
    if q_documents is not None and k_documents is not None:
        same = q_documents.view(batch, 1, nq, 1) == k_documents.view(batch, 1, 1, nk)
        mask = same if mask is None else mask & same
    if window is not None or chunk is not None:
        assert q_positions is not None and k_positions is not None
        qp, kp = q_positions.view(batch, 1, nq, 1), k_positions.view(batch, 1, 1, nk)
        if window is not None:
            near = (qp - kp).abs() < window
            mask = near if mask is None else mask & near
        if chunk is not None:
            same_chunk = torch.div(qp, chunk, rounding_mode="floor") == torch.div(
                kp, chunk, rounding_mode="floor"
            )
            mask = same_chunk if mask is None else mask & same_chunk
    return mask


#: How a transformers ``attention_mask`` (1 = keep) becomes posenc's ``key_padding_mask``.
_FROM_TRANSFORMERS = (
    "posenc's key_padding_mask marks padding with True (as torch.nn.MultiheadAttention); "
    "from a transformers attention_mask (1 = keep) use key_padding_mask = attention_mask == 0"
)


def check_key_padding_mask(
    mask: object, batch: int, seq: int, *, read_values: bool = False
) -> Tensor | None:
    """``mask`` checked to be a ``(batch, seq)`` bool tensor (True = padding), or ``None``.

    ``read_values`` also reads it (one transfer from its device) and refuses a row that is
    padding throughout: no real token is left to attend to, which is almost always a mask
    with the opposite convention (transformers' ``attention_mask.bool()``). The entry points
    (``Encoder.forward``, ``MultiHeadAttention.forward``) read it once per forward; the layers
    only check its type and shape.
    """
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise PosencTypeError(f"key_padding_mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise PosencTypeError(
            f"key_padding_mask must be a bool tensor, got {mask.dtype}; {_FROM_TRANSFORMERS}"
        )
    if tuple(mask.shape) != (batch, seq):
        raise PosencValueError(
            f"key_padding_mask must have shape (batch, seq) = {(batch, seq)}, "
            f"got {tuple(mask.shape)}"
        )
    if read_values and mask.numel() and not mask.is_meta and not torch.compiler.is_compiling():
        empty = mask.all(dim=-1)  # (b,)
        if bool(empty.any()):
            rows = empty.nonzero().flatten().tolist()
            raise PosencValueError(
                f"key_padding_mask marks every token of row(s) {rows[:8]} as padding, leaving "
                f"nothing to attend to; {_FROM_TRANSFORMERS}"
            )
    return mask
