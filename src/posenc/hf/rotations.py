"""posenc's rotation with the signature of a transformers family's apply function, for
:mod:`~.patch`: the function the patched attention calls in place of its modeling file's.

Three forms of table reach those functions, and :func:`form_of` tells them by the function's
parameters:

* ``"cos_sin"``: ``(q, k, cos, sin[, position_ids], unsqueeze_dim=1)`` or ``(x, cos, sin,
  unsqueeze_dim=1)`` with full-width tables ``(b, n, r)`` (``cat(freqs, freqs)``, or each
  frequency twice for an interleaved family): Llama and most families;
* ``"sin_cos"``: ``(x, sin, cos)`` with one value per pair ``(b, n, r/2)``, sine first (GPT-J,
  CodeGen);
* ``"complex"``: ``(xq, xk, freqs_cis)`` with ``cos + i sin`` per pair ``(b, n, r/2)``
  (Llama 4, DeepSeek-V2), interleaved pairs.

The last two broadcast their tables against one layout of ``x``, ``(b, h, n, d)`` or ``(b, n,
h, d)``, which :func:`rotation` learns by calling the family's function once on a few zeros.
Every rotation is posenc's kernel (C on CPU, Triton on CUDA) in the tables' float32, rounded
once to ``x``'s dtype, in ``x``'s own storage where autograd and its memory allow.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` positions, ``d`` head size, ``r`` rotated
channels.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..encodings.rotary.kernels.native import prepare_tables
from ..encodings.rotary.kernels.rotate import apply_rotary, apply_rotary_
from ..encodings.rotary.kernels.rotate import run_plan_pair as rotate_both
from ..encodings.rotary.kernels.select import select, turn_prepared_pair
from ..errors import PosencValueError

__all__ = ["FORMS", "form_of", "prepare", "rotation"]

#: The forms of table a family's apply function takes (see the module docstring).
FORMS = ("cos_sin", "sin_cos", "complex")
#: The attribute of a full-width ``cos`` table :func:`prepare` marks: ``(sin, the C kernel's
#: description of their first halves)``.
PREPARED = "_posenc_prepared"


def prepare(cos: Tensor, sin: Tensor) -> None:
    """Mark full-width tables ``(b, n, r)`` in the ``cat(freqs, freqs)`` layout, fresh from
    the patched rotary module, for the C kernel: their first halves, ``(b, 1, n, r/2)`` as
    the attentions' apply function broadcasts them (``unsqueeze_dim=1``), described once for
    every layer that rotates by them. The mark lives and dies with ``cos`` (it holds ``sin``),
    and the descriptions point into ``cos`` and ``sin`` themselves, so a rotation reads what
    they hold. For plain tensors in eager mode (the caller checks, by
    :func:`~posenc.encodings.rotary.kernels.select.eager_plain`); nothing is marked off the
    CPU, or where the kernel is not built."""
    if not cos.is_cpu or cos.dim() != 3 or sin.shape != cos.shape:
        return
    tables = prepare_tables(cos, sin)
    if tables is not None:
        setattr(cos, PREPARED, (sin, (_first_half(tables[0]), _first_half(tables[1]))))


def _first_half(at: tuple) -> tuple:
    """The C kernel's description of ``t[:, None, :, : r/2]`` from that of a ``(b, n, r)``
    table ``t`` (:func:`~posenc.encodings.rotary.kernels.native.prepare_tables`), without
    making the view: the same storage and offset, a size-1 head dim, half the channels."""
    address, nbytes, offset, (b, n, r), (stride_b, stride_n, stride_r) = at
    return address, nbytes, offset, (b, 1, n, r // 2), (stride_b, 0, stride_n, stride_r)


def form_of(family: str, theirs: Any, name: str) -> str:
    """The form of table the family's function ``name`` (``theirs``) reads, from its
    parameters; raise naming it where it is none of :data:`FORMS`."""
    if theirs is None:
        raise PosencValueError(f"cannot patch {family}: its modeling module has no {name}")
    names = list(inspect.signature(theirs).parameters)
    if names[2:4] == ["cos", "sin"] or (names[1:3] == ["cos", "sin"] and len(names) <= 4):
        return "cos_sin"
    if names[1:3] == ["sin", "cos"] and len(names) == 3:
        return "sin_cos"
    if len(names) == 3 and names[2] == "freqs_cis":
        return "complex"
    raise PosencValueError(
        f"cannot patch {family}: its {name}{inspect.signature(theirs)} is not "
        "(q, k, cos, sin, ...), (x, cos, sin, ...), (x, sin, cos) or (xq, xk, freqs_cis)"
    )


def rotation(
    family: str, theirs: Any, name: str, *, tables_interleaved: bool, pairs_interleaved: bool
) -> Callable[..., Any]:
    """posenc's rotation with the signature of ``theirs`` (the family's function ``name``),
    reading tables laid out as :class:`~.patch._Tables` gives them (``tables_interleaved``:
    each frequency twice, else ``cat(freqs, freqs)``) and turning pairs ``(2i, 2i+1)``
    (``pairs_interleaved``) or ``(i, i + r/2)``. The function has an attribute ``layout``,
    ``"bhsd"`` or ``"bshd"``: the layout of ``x`` it takes."""
    parameters = inspect.signature(theirs).parameters
    names = list(parameters)
    form = form_of(family, theirs, name)
    if form == "cos_sin":
        k_optional = parameters[names[1]].default is None
        return _cos_sin(names, tables_interleaved, pairs_interleaved, k_optional)
    layout = _layout(family, theirs, name, form)
    if form == "sin_cos":

        def rotate_sin_cos(x: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
            x = x.transpose(1, 2) if layout == "bshd" else x
            x = _turn(x, cos[:, None], sin[:, None], pairs_interleaved, inplace=True)
            return x.transpose(1, 2) if layout == "bshd" else x

        rotate_sin_cos.layout = layout  # type: ignore[attr-defined]
        return rotate_sin_cos

    def rotate_complex(xq: Tensor, xk: Tensor, freqs_cis: Tensor) -> tuple[Tensor, Tensor]:
        # (b, 1, n, r/2), each in its own storage: the kernels read tables of unit stride
        cos, sin = freqs_cis.real.contiguous()[:, None], freqs_cis.imag.contiguous()[:, None]
        if layout == "bshd":
            xq, xk = xq.transpose(1, 2), xk.transpose(1, 2)
        xq, xk = _turn_both(xq, xk, cos, sin, pairs_interleaved)
        if layout == "bshd":
            return xq.transpose(1, 2), xk.transpose(1, 2)
        return xq, xk

    rotate_complex.layout = layout  # type: ignore[attr-defined]
    return rotate_complex


def _cos_sin(
    names: list[str], tables: bool, pairs: bool, k_optional: bool = False
) -> Callable[..., Any]:
    """The rotations of the ``"cos_sin"`` form (tables broadcast by ``unsqueeze_dim``); where
    the family's ``k`` defaults to ``None`` (Qwen4-Exp), a call without it returns ``q``
    rotated into a new tensor, as theirs does."""
    if names[2:4] == ["cos", "sin"]:

        def rotate_pair(
            q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
        ) -> tuple[Tensor, Tensor]:
            prepared = getattr(cos, PREPARED, None)  # (tables the patch made)
            if (
                prepared is not None
                and prepared[0] is sin
                and unsqueeze_dim == 1
                and not tables
                and turn_prepared_pair(q, k, prepared[1], pairs)
            ):
                return q, k
            c, s = _half(cos, unsqueeze_dim, tables), _half(sin, unsqueeze_dim, tables)
            return _turn_both(q, k, c, s, pairs)

        rotate_pair.layout = "bhsd"  # type: ignore[attr-defined]
        if k_optional and "position_ids" not in names:

            def rotate_optional(
                q: Tensor,
                k: Tensor | None = None,
                cos: Any = None,
                sin: Any = None,
                unsqueeze_dim: int = 1,
            ) -> Any:
                if k is not None:
                    return rotate_pair(q, k, cos, sin, unsqueeze_dim)
                c, s = _half(cos, unsqueeze_dim, tables), _half(sin, unsqueeze_dim, tables)
                return _turn(q, c, s, pairs, inplace=False)

            rotate_optional.layout = "bhsd"  # type: ignore[attr-defined]
            return rotate_optional
        if "position_ids" not in names:
            return rotate_pair

        def rotate_pair_ids(
            q: Tensor,
            k: Tensor,
            cos: Tensor,
            sin: Tensor,
            position_ids: Any = None,
            unsqueeze_dim: int = 1,
        ) -> tuple[Tensor, Tensor]:
            return rotate_pair(q, k, cos, sin, unsqueeze_dim)

        rotate_pair_ids.layout = "bhsd"  # type: ignore[attr-defined]
        return rotate_pair_ids

    def rotate_one(x: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1) -> Tensor:
        c, s = _half(cos, unsqueeze_dim, tables), _half(sin, unsqueeze_dim, tables)
        return _turn(x, c, s, pairs, inplace=True)

    rotate_one.layout = "bhsd"  # type: ignore[attr-defined]
    return rotate_one


def _layout(family: str, theirs: Any, name: str, form: str) -> str:
    """The layout of ``x`` that ``theirs`` broadcasts its one-value-per-pair tables against:
    called on zeros with 3 heads and 5 positions, each way."""
    cos, sin = torch.ones(1, 5, 2), torch.zeros(1, 5, 2)
    tables = (torch.complex(cos, sin),) if form == "complex" else (sin, cos)
    for layout, shape in (("bhsd", (1, 3, 5, 4)), ("bshd", (1, 5, 3, 4))):
        x = torch.zeros(shape)
        try:
            theirs(x, x, *tables) if form == "complex" else theirs(x, *tables)
        except RuntimeError:
            continue
        return layout
    raise PosencValueError(
        f"cannot patch {family}: its {name} takes neither (b, h, n, d) nor (b, n, h, d) "
        "tensors with tables of one value per pair (b, n, r/2)"
    )


def _half(table: Tensor, unsqueeze_dim: int, interleaved: bool) -> Tensor:
    """One value per pair from a full-width table ``(b, n, r)``, as the family's apply would
    broadcast it (``unsqueeze(unsqueeze_dim)``)."""
    half = table[..., 0::2] if interleaved else table[..., : table.shape[-1] // 2]
    return half.unsqueeze(unsqueeze_dim)


def _turn_both(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool
) -> tuple[Tensor, Tensor]:
    done = _turn_pair(q, k, cos, sin, interleaved)
    if done is not None:
        return done
    q = _turn(q, cos, sin, interleaved, inplace=True)
    return q, _turn(k, cos, sin, interleaved, inplace=k.data_ptr() != q.data_ptr())


def _turn_pair(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool
) -> tuple[Tensor, Tensor] | None:
    """``q`` and ``k`` rotated in place in one kernel call where no autograd runs (a decode
    step above all, where checks and calls cost more than the arithmetic; q and k are fresh
    projections nothing else reads before the rotation); ``None`` where that does not apply."""
    if torch.is_grad_enabled() or k.data_ptr() == q.data_ptr():
        return None
    plan = select(q, (cos, sin), inplace=True, pair=k)
    return rotate_both(q, k, cos, sin, interleaved, True, plan)


def _turn(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, *, inplace: bool) -> Tensor:
    """``x`` rotated in its own storage where autograd and its memory allow, else into a new
    tensor; in the tables' float32, one rounding to ``x``'s dtype."""
    if inplace and not (torch.is_grad_enabled() and x.requires_grad):
        try:
            return apply_rotary_(x, cos, sin, interleaved=interleaved)
        except PosencValueError:
            pass  # an inference tensor, overlapping memory, ...: out of place
    return apply_rotary(x, cos, sin, interleaved=interleaved)
