"""The rotary call the ecosystem settled on: half-width cos/sin tables indexed by position ids
(PyTorch's proposed ``torch.nn.functional.rotary_embedding``, pytorch PR 187286; ONNX opset
23's ``RotaryEmbedding``; vLLM's and TensorRT's rotary ops), and flash-attention's packed
``(total, heads, dim)`` layout with ``cu_seqlens``, each with its own layout stated, never
guessed.

:func:`rotary_embedding` takes ``x`` in one of three layouts:

* ``"bhsd"`` (default, as SDPA takes it): ``x (B, H, S, D)``. With ``position_ids (B, S)``,
  ``cos``/``sin`` are tables ``(N, D/2)`` whose rows the ids pick; without, any shape that
  broadcasts against ``(B, H, S, D/2)`` (e.g. ``(S, D/2)``): PyTorch PR 187286's semantics.
* ``"bshd"`` (flash-attention, torchtune): ``x (B, S, H, D)``. With ``position_ids (B, S)``
  as above; without, the tables ``(N, D/2)`` are read at rows ``seqlen_offsets + 0 … S-1``
  (flash-attention's ``apply_rotary_emb``: ``seqlen_offsets`` an int or a ``(B,)`` tensor).
* ``"thd"`` (packed varlen: flash-attention, vLLM, torchtitan): ``x (T, H, D)``, ``T`` tokens
  of ``B`` sequences laid end to end, ``cu_seqlens (B + 1,)`` their boundaries; token ``t`` of
  sequence ``b`` reads row ``t - cu_seqlens[b] + seqlen_offsets[b]``. ``position_ids`` is
  refused there: the positions come from ``cu_seqlens`` and ``seqlen_offsets``.

Beyond the PR: a table narrower than ``D/2`` rotates the leading ``2 · width`` channels and
copies the rest (partial rotation); a full-width table in transformers' form (``D`` wide:
``cat(freqs, freqs)`` for the half layout, each angle twice for the interleaved one) is
accepted where its two copies are equal (checked on the rows read) and refused by name
otherwise; transformers' own ``(b, n, D)`` tables with ``b > 1`` are refused against
``(B, H, S, D)`` (broadcast as they are they would be read per head: pass
``cos.unsqueeze(1)``, as its ``apply_rotary_pos_emb`` does); ``out=x`` rotates in place;
:func:`rotary_embedding_qk` turns q and k with one gather of the tables (in place, q and k
must not overlap). ``position_ids`` and ``seqlen_offsets`` are one or the other.
The rotation itself is :func:`~posenc.encodings.rotary.kernels.rotate.apply_rotary` (the
C kernel on the CPU, Triton on CUDA), which takes every layout as the strided view it is.

Dimension legend: ``B`` batch, ``H`` heads, ``S`` sequence, ``T`` packed tokens, ``D`` head
dim, ``N`` table rows, ``w`` table width (``D/2`` for a full rotation).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...errors import PosencTypeError, PosencValueError
from ..checks import check_bool, reads_values, wide_integers
from .kernels.full_width import check_not_batch_first, check_not_partial, half_width
from .kernels.kernel import overlap
from .kernels.rotate import apply_rotary, apply_rotary_
from .layouts import LAYOUTS, Layout, is_zero, offset_rows, packed_rows

__all__ = ["rotary_embedding", "rotary_embedding_qk"]


def rotary_embedding(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    position_ids: Tensor | None = None,
    *,
    interleaved: bool = False,
    layout: Layout = "bhsd",
    cu_seqlens: Tensor | None = None,
    seqlen_offsets: int | Tensor = 0,
    max_seqlen: int | None = None,
    out: Tensor | None = None,
) -> Tensor:
    """Rotate ``x`` by the angles whose cosines and sines ``cos`` and ``sin`` hold (RoFormer eq.
    34), PyTorch PR 187286's ``rotary_embedding`` with layouts and packing stated.

    Args:
        x: ``(B, H, S, D)``, ``(B, S, H, D)`` or ``(T, H, D)`` as ``layout`` says.
        cos, sin: half-width tables (see the module docstring for their shapes per layout);
            float32 tables rotate half-precision ``x`` in float32, rounded once.
        position_ids: ``(B, S)`` integer rows of the tables (``bhsd``, ``bshd``).
        interleaved: pairs ``(x[2i], x[2i+1])`` (GPT-J) instead of ``(x[i], x[i + D/2])``.
        layout: ``"bhsd"``, ``"bshd"`` or ``"thd"``.
        cu_seqlens: ``(B + 1,)`` integer boundaries of the packed sequences (``thd`` only).
        seqlen_offsets: each sequence's first row: an int or a ``(B,)`` integer tensor
            (``bshd`` without ids, ``thd``).
        max_seqlen: the longest packed sequence (``thd``), as flash-attention takes it: checked
            against ``cu_seqlens``.
        out: ``None`` (a new tensor) or ``x`` itself (rotated in its own storage).

    Returns the rotated tensor, shaped like ``x``.

    >>> cos, sin = torch.tensor([[1.0], [0.0]]), torch.tensor([[0.0], [1.0]])  # 0 and 90 degrees
    >>> x = torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]]])  # (1, 1, 2, 2)
    >>> rotary_embedding(x, cos, sin, torch.tensor([[1, 0]]))[0, 0]
    tensor([[0., 1.],
            [1., 0.]])
    """
    cos, sin = _gathered(
        x, cos, sin, position_ids, interleaved, layout, cu_seqlens, seqlen_offsets, max_seqlen
    )
    if out is None:
        return apply_rotary(x, cos, sin, interleaved=interleaved)
    if out is not x:
        raise PosencValueError("out must be None or x itself (rotate in place)")
    return apply_rotary_(x, cos, sin, interleaved=interleaved)


def rotary_embedding_qk(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    position_ids: Tensor | None = None,
    *,
    interleaved: bool = False,
    layout: Layout = "bhsd",
    cu_seqlens: Tensor | None = None,
    seqlen_offsets: int | Tensor = 0,
    max_seqlen: int | None = None,
    inplace: bool = False,
) -> tuple[Tensor, Tensor]:
    """:func:`rotary_embedding` of queries and keys at the same positions (their head counts may
    differ: grouped-query attention), the tables gathered once; ``inplace`` rotates both in
    their own storage."""
    if not isinstance(k, Tensor) or not isinstance(q, Tensor):
        raise PosencTypeError("q and k must be tensors")
    if q.dim() != k.dim() or _without_heads(q, layout) != _without_heads(k, layout):
        raise PosencValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} (layout={layout!r}) must agree in "
            "every dim but their heads"
        )
    if check_bool("inplace", inplace) and overlap(q, k) is not False:
        raise PosencValueError(
            f"q and k share memory (q of shape {tuple(q.shape)}, strides {tuple(q.stride())}; "
            f"k of shape {tuple(k.shape)}, strides {tuple(k.stride())}): rotating both in "
            "place would turn the shared elements twice; pass tensors that do not overlap or "
            "rotate out of place"
        )
    cos, sin = _gathered(
        q, cos, sin, position_ids, interleaved, layout, cu_seqlens, seqlen_offsets, max_seqlen
    )
    if inplace:
        return (
            apply_rotary_(q, cos, sin, interleaved=interleaved),
            apply_rotary_(k, cos, sin, interleaved=interleaved),
        )
    return (
        apply_rotary(q, cos, sin, interleaved=interleaved),
        apply_rotary(k, cos, sin, interleaved=interleaved),
    )


def _without_heads(x: Tensor, layout: str) -> tuple[int, ...]:
    heads = {"bhsd": 1, "bshd": 2, "thd": 1}.get(layout, 1)
    return tuple(s for i, s in enumerate(x.shape) if i != heads)


def _gathered(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    position_ids: Tensor | None,
    interleaved: bool,
    layout: str,
    cu_seqlens: Tensor | None,
    seqlen_offsets: int | Tensor,
    max_seqlen: int | None,
) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` as :func:`apply_rotary` takes them for ``x`` in ``layout``: half
    width, one row per token, broadcasting against ``x.shape[:-1]``."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise PosencTypeError(f"x must be a floating-point tensor, got {getattr(x, 'dtype', x)!r}")
    if layout not in LAYOUTS:
        raise PosencValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    if x.dim() != LAYOUTS[layout]:
        names = {"bhsd": "(B, H, S, D)", "bshd": "(B, S, H, D)", "thd": "(T, H, D)"}
        raise PosencValueError(
            f"x of shape {tuple(x.shape)} cannot be layout={layout!r}, which is {names[layout]}"
        )
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise PosencTypeError(f"{name} must be a floating-point tensor, got {t!r:.60}")
    if cos.shape != sin.shape:
        raise PosencValueError(
            f"cos and sin differ in shape: {tuple(cos.shape)} vs {tuple(sin.shape)}"
        )
    if cu_seqlens is not None and layout != "thd":
        raise PosencValueError(f"cu_seqlens is for layout='thd'; got layout={layout!r}")
    if max_seqlen is not None and layout != "thd":
        raise PosencValueError(f"max_seqlen is for layout='thd'; got layout={layout!r}")
    interleaved = check_bool("interleaved", interleaved)
    # full-width tables are cut to half width on the rows read (the check of their two
    # copies then costs what the rotation does, not the whole table)
    if layout == "thd":
        if position_ids is not None:
            raise PosencValueError(
                "position_ids cannot be given with layout='thd': the positions come from "
                "cu_seqlens and seqlen_offsets"
            )
        rows = packed_rows(x.shape[0], cu_seqlens, seqlen_offsets, max_seqlen, x.device)
        cos, sin = _gather(cos, sin, rows, "the packed positions")  # (T, w)
        cos, sin = _halves(cos, sin, x.shape[-1], interleaved)
        return cos[:, None], sin[:, None]  # (T, 1, w)
    batch, seq = (x.shape[0], x.shape[2]) if layout == "bhsd" else (x.shape[0], x.shape[1])
    if position_ids is not None and not is_zero(seqlen_offsets):
        raise PosencValueError(
            f"position_ids and seqlen_offsets (got {seqlen_offsets!r:.40}) are two ways to "
            "give the positions; give one of the two"
        )
    if position_ids is None:
        if layout == "bhsd":
            if not is_zero(seqlen_offsets):
                raise PosencValueError(
                    "seqlen_offsets is for layout='bshd' or 'thd' (flash-attention's); with "
                    "'bhsd' pass position_ids or tables already at the positions"
                )
            if cos.dim() and cos.shape[-1] == x.shape[-1]:
                check_not_batch_first(x, cos)
            # PyTorch's: broadcast against (B, H, S, w), checked by the kernel
            return _halves(cos, sin, x.shape[-1], interleaved)
        if cos.dim() != 2:
            raise PosencValueError(
                f"with layout='bshd' and no position_ids, cos and sin are flash-attention's "
                f"tables (N, D/2), read at rows seqlen_offsets + 0..S-1; got shape "
                f"{tuple(cos.shape)}. Tables already at the tokens' positions, e.g. (B, S, 1, "
                "D/2) or transformers' (B, S, D) with unsqueeze(2), go to posenc.apply_rotary"
            )
        rows, what = offset_rows(batch, seq, seqlen_offsets, x.device), "seqlen_offsets"
    else:
        rows, what = _check_ids(position_ids, batch, seq), "position_ids"
    cos, sin = _gather(cos, sin, rows, what)  # (B, S, w)
    cos, sin = _halves(cos, sin, x.shape[-1], interleaved)
    heads = 1 if layout == "bhsd" else 2
    return cos.unsqueeze(heads), sin.unsqueeze(heads)  # (B, 1, S, w) | (B, S, 1, w)


def _halves(cos: Tensor, sin: Tensor, d: int, interleaved: bool) -> tuple[Tensor, Tensor]:
    """:func:`half_width`'s tables (full width kept where autograd records them), refused
    where they are transformers' tables of a partial rotation (:func:`check_not_partial`)."""
    cos, sin = half_width(cos, sin, d, interleaved)
    check_not_partial(cos, sin, d, interleaved)
    return cos, sin


def _gather(cos: Tensor, sin: Tensor, rows: Tensor, what: str) -> tuple[Tensor, Tensor]:
    """``cos[rows]`` and ``sin[rows]`` (tables of one shape) after checking that the tables are
    ``(N, w)`` and that every row exists (one read of the rows' extremes, where the host
    reads them: :func:`~..checks.reads_values`; elsewhere a row outside the table fails in
    the gather itself)."""
    if cos.dim() != 2:
        raise PosencValueError(
            f"cos must be a table (N, D/2) to be indexed by positions, got shape {tuple(cos.shape)}"
        )
    if rows.numel() and reads_values(rows):
        low, high = torch.aminmax(rows)
        low, high = int(low), int(high)
        if low < 0 or high >= cos.shape[0]:
            raise PosencValueError(
                f"{what} reach rows {low}..{high} but the tables have {cos.shape[0]} rows"
            )
    # index_select, not cos[rows]: a negative row is an error (a device-side one on a GPU,
    # where the range is not read), never counted from the table's end
    flat = rows.to(cos.device).flatten()
    shape = (*rows.shape, cos.shape[-1])
    return cos.index_select(0, flat).view(shape), sin.index_select(0, flat).view(shape)


def _check_ids(position_ids: Tensor, batch: int, seq: int) -> Tensor:
    if (
        not isinstance(position_ids, Tensor)
        or position_ids.is_floating_point()
        or (position_ids.dtype is torch.bool or position_ids.is_complex())
    ):
        raise PosencTypeError(
            f"position_ids must be an integer tensor (B, S), got {position_ids!r:.60}"
        )
    position_ids = wide_integers(position_ids)  # (uint8: a row, never a mask)
    if position_ids.dim() == 1 and position_ids.shape[0] == seq:
        position_ids = position_ids.expand(batch, seq)
    if tuple(position_ids.shape) not in ((batch, seq), (1, seq)):
        raise PosencValueError(
            f"position_ids must be (B, S) = ({batch}, {seq}) for x, got {tuple(position_ids.shape)}"
        )
    return position_ids.expand(batch, seq)
