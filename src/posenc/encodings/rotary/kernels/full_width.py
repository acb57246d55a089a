"""Transformers' full-width cos/sin tables (``cat(a, a)``, or each angle twice for the
interleaved layout) as posenc's rotations read them: checked to hold two equal copies of each
angle where the host reads their values (:func:`copies`), cut to half width
(:func:`half_width`), and refused where they are transformers' per-batch-row tables broadcast
along the heads (:func:`check_not_batch_first`); and transformers' tables of a partial
rotation, which have a half-width table's shape, refused (:func:`check_not_partial`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ....errors import PosencValueError
from ...checks import reads_values

__all__ = [
    "check_not_batch_first",
    "check_not_partial",
    "copies",
    "half_width",
    "records_tables",
    "two_copies",
]


def two_copies(t: Tensor, interleaved: bool) -> tuple[Tensor, Tensor]:
    """The two halves of a table that holds each angle twice, as views: the even and odd
    channels (``interleaved``: ``[a0, a0, a1, a1, ...]``), or the first and second half
    (``cat(a, a)``)."""
    return (t[..., 0::2], t[..., 1::2]) if interleaved else t.split(t.shape[-1] // 2, dim=-1)


def half_width(cos: Tensor, sin: Tensor, d: int, interleaved: bool) -> tuple[Tensor, Tensor]:
    """A full-width table (``d`` wide, transformers' form) cut to its half, after checking that
    its two copies of each angle agree; narrower tables are returned as they are, and so are
    full-width ones whose gradient autograd records (checked): :func:`~.rotate.apply_rotary` then
    turns each channel by its own copy, as transformers' formula does."""
    width = cos.shape[-1] if cos.dim() else 0
    if width <= d // 2:
        return cos, sin
    (cos_half, _), (sin_half, _) = copies(cos, sin, d, interleaved)
    if records_tables(cos, sin):
        return cos, sin
    return cos_half.contiguous(), sin_half.contiguous()  # (a kernel reads contiguous channels)


def copies(
    cos: Tensor, sin: Tensor, d: int, interleaved: bool
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """The two copies of each angle of full-width ``cos`` and ``sin`` (``(first, second)``
    each), after checking that they are ``d`` wide and, where their values are read
    (:func:`~posenc.encodings.checks.reads_values`: on the CPU, or under
    ``POSENC_CHECK_POSITIONS=1``; on a GPU the comparison would synchronise every call),
    that the copies agree."""
    width = cos.shape[-1] if cos.dim() else 0
    if width != d:
        raise PosencValueError(
            f"cos/sin of width {width} fit neither a half-width table (at most D/2 = {d // 2}) "
            f"nor a full-width one (D = {d}) for x with D = {d}"
        )
    pairs = []
    for name, t in (("cos", cos), ("sin", sin)):
        first, second = two_copies(t, interleaved)
        if reads_values(t) and not torch.equal(first, second):
            form = "each angle twice, [a0, a0, a1, a1, ...]" if interleaved else "cat(a, a)"
            raise PosencValueError(
                f"{name} is full width ({d}) but not in transformers' form ({form}) for "
                f"interleaved={interleaved}: its two copies differ; pass the half-width table"
            )
        pairs.append((first, second))
    return pairs[0], pairs[1]


def records_tables(cos: Tensor, sin: Tensor) -> bool:
    """Whether autograd records the gradient of the tables ``cos``, ``sin``."""
    return torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad)


def check_not_batch_first(x: Tensor, cos: Tensor) -> None:
    """Refuse full-width tables ``(b, n, D)`` against ``x`` ``(B, H, S, D)`` with ``b > 1``:
    that is the form transformers' rotary modules return (per batch row, its
    ``apply_rotary_pos_emb`` unsqueezes them at the heads axis), and broadcast as they are
    they would be read per head, along the wrong axis."""
    if x.dim() == 4 and cos.dim() == 3 and cos.shape[0] > 1 and cos.shape[-1] == x.shape[-1]:
        raise PosencValueError(
            f"cos/sin of shape {tuple(cos.shape)} are full-width (batch, seq, D) tables, "
            f"transformers' form, for x of shape {tuple(x.shape)}: broadcast as they are "
            "they would be read per head; pass cos.unsqueeze(1), sin.unsqueeze(1) for x "
            "(B, H, S, D), as apply_rotary_pos_emb reads them (unsqueeze(2) for x "
            "(B, S, H, D)), or unsqueeze(0) for tables per head"
        )


def check_not_partial(cos: Tensor, sin: Tensor, d: int, interleaved: bool) -> None:
    """Refuse, where their values are read (:func:`~posenc.encodings.checks.reads_values`),
    tables at most ``D/2`` wide whose two copies of each angle agree: transformers' full-width
    form of a partial rotation (``cat(f, f)`` of ``w/2`` angles, for ``rotary_dim = w``), which
    has the shape of a half-width table of ``w`` angles and would turn ``2w`` channels by the
    wrong angles. Tables of a real rotation never repeat every angle at every row (their sines
    differ by frequency)."""
    w = cos.shape[-1] if cos.dim() else 0
    if w < 2 or w % 2 or w > d // 2 or not cos.numel() or not reads_values(cos):
        return
    halves = [two_copies(t, interleaved) for t in (cos, sin)]
    if all(torch.equal(a, b) for a, b in halves) and bool(halves[1][0].ne(0).any()):
        form = "each angle twice" if interleaved else "cat(f, f)"
        raise PosencValueError(
            f"cos/sin of width {w} repeat every angle ({form}, interleaved={interleaved}): "
            f"transformers' tables of a partial rotation of {w} channels, where a half-width "
            f"table of width {w} turns {2 * w}; pass their first copy, "
            f"cos[..., {'::2' if interleaved else f': {w // 2}'}] (and sin alike)"
        )
