"""The rows of posenc's cos and sin tables that the patched rotary module (:mod:`~.patch`)
returns for the position ids transformers gives it, once per forward (every layer then rotates
by them):

* :func:`gathered`, the common case: integer CPU positions and frequencies that do not move
  (no dynamic NTK, no LongRoPE, no multimodal rows); one ``index_select`` from a table made
  once from the rope's own rows;
* :func:`lean`, the same rows for a decode step's caller that holds a joint table already
  made, with the C kernel's mark, and nothing else per call;
* :func:`read`, everything else: :meth:`~posenc.RotaryEmbedding.cos_sin`, which checks the
  positions, follows the length and grows the tables.

Both give the same float32 values: the rope's table rows, formed in float64 and rounded once.

Dimension legend: ``b`` batch, ``n`` positions, ``r`` rotated channels.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..encodings.rotary.kernels.native import prepare_joint_halves
from ..encodings.rotary.kernels.select import untraced
from ..encodings.rotary.multimodal import MultimodalRotaryEmbedding
from ..encodings.rotary.rope import RotaryEmbedding
from .rotations import PREPARED

#: What :func:`gathered` keeps per rope: (the rope's cos table it was made from, the joint table)
Joints = dict[object, tuple[Tensor, Tensor]]


def gathered(
    rope: RotaryEmbedding, position_ids: Tensor, joints: Joints, key: object, full: bool
) -> tuple[Tensor, Tensor] | None:
    """cos and sin ``(b, n, w)`` for integer CPU ``position_ids`` ``(b, n)``: the rows of
    ``rope``'s float32 tables (those :meth:`~posenc.RotaryEmbedding.cos_sin` reads: the same
    values), full width (``full``: ``cat(freqs, freqs)``, ``w = r``) or half (``w = r/2``).
    One ``index_select`` from a joint table, ``[cos, cos, sin, sin]`` or ``[cos, sin]`` per
    position, made once from the rope's tables (again when they grow) and kept in
    ``joints[key]``; its bounds check is the positions' (one outside the tables, negative ones
    included, raises there). cos and sin are views of one fresh tensor. For plain tensors in
    eager mode (the caller checks:
    :func:`~posenc.encodings.rotary.kernels.select.eager_plain`). ``None`` where this does not
    apply (frequencies that follow the length or are learned, multimodal RoPE, no positions,
    a position outside the tables, another device or dtype): :func:`read` then does."""
    spec = rope.rope_spec
    if (
        position_ids.dim() != 2
        or position_ids.dtype not in (torch.int64, torch.int32)
        or not position_ids.is_cpu
        or not spec.caches_table
        or spec.uses_length
        or rope.learned_freq
        or isinstance(rope, MultimodalRotaryEmbedding)
    ):
        return None
    table = rope._buffers["cos_cached"]  # (the module's own dict: no __getattr__ per call)
    joint = joints.get(key)
    if joint is None or joint[0] is not table:
        if not table.is_cpu or table.dtype is not torch.float32:
            return None
        sin = rope._buffers["sin_cached"]
        parts = (table, table, sin, sin) if full else (table, sin)
        joint = joints[key] = (table, torch.cat(parts, -1))  # (positions, 2w)
    b, n = position_ids.shape
    ids = position_ids.reshape(-1)  # (b * n,)
    if not ids.numel():
        return None
    try:
        rows = joint[1].index_select(0, ids)  # (b * n, 2w)
    except IndexError:
        return None
    cos, sin = rows.view(b, n, 2, -1).unbind(2)
    return cos, sin


def lean(
    rope: RotaryEmbedding, position_ids: Tensor, joint: tuple[Tensor, Tensor] | None
) -> tuple[Tensor, Tensor] | None:
    """What :func:`gathered` (``full``) then :func:`~.rotations.prepare` give, for ``joint``
    the full-width joint table :func:`gathered` made for ``rope`` (``None``: not made yet),
    with the checks that depend on the call alone: plain int64 CPU ``position_ids`` ``(b,
    n)`` in eager mode, ``rope``'s table still the one ``joint`` was made from, positions
    inside it. One ``index_select`` (as ``torch.embedding``), two views, and the C kernel's
    description of their halves made from the rows' address
    (:func:`~posenc.encodings.rotary.kernels.native.prepare_joint_halves`: the same as
    :func:`~.rotations.prepare`'s). ``None`` where any of that does not hold (the caller then
    takes :func:`gathered`'s path)."""
    if (
        joint is None
        or type(position_ids) is not Tensor
        or position_ids.dtype is not torch.int64
        or position_ids.dim() != 2
        or not position_ids.is_cpu
        or joint[0] is not rope._buffers["cos_cached"]
        or not untraced()
    ):
        return None
    b, n = position_ids.shape
    if not b * n:
        return None
    try:
        rows = torch.embedding(joint[1], position_ids)  # (b, n, 2w): index_select, viewed
    except IndexError:
        return None
    cos, sin = rows.chunk(2, -1)
    halves = prepare_joint_halves(rows, b, n)
    if halves is not None:
        setattr(cos, PREPARED, (sin, halves))
    return cos, sin


def read(rope: RotaryEmbedding, position_ids: Tensor) -> tuple[Tensor, Tensor]:
    """cos and sin ``(b, n, r/2)`` from :meth:`~posenc.RotaryEmbedding.cos_sin` (which checks
    the positions, follows the length and grows the tables); ``position_ids`` ``(b, n)``, or
    ``(rows, b, n)`` for multimodal RoPE (a text rope reads the first row)."""
    device = position_ids.device
    if rope.inv_freq.device != device:
        rope.to(device)
    if position_ids.dim() == 3 and not isinstance(rope, MultimodalRotaryEmbedding):
        position_ids = position_ids[0]  # rows of one position each (text)
    n = position_ids.shape[-1]
    cos, sin = rope.cos_sin(position_ids, n, dtype=torch.float32, device=device)
    if cos.dim() == 2:  # M-RoPE rows of batch 1: (n, r/2) -> (1, n, r/2)
        return cos[None], sin[None]
    return cos[:, 0], sin[:, 0]  # (b, 1, n, r/2) -> (b, n, r/2)
