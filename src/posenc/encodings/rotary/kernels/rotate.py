"""The rotary arithmetic (Su et al. 2021, "RoFormer", eq. 34): the formula, and the entry
points that run it on a kernel (the C kernel, Triton, or the pure-torch path).

Each pair of channels ``(x1, x2)`` of a query or key turns by its angle ``θ``:

    x1' = x1 cos θ - x2 sin θ,      x2' = x2 cos θ + x1 sin θ                       (eq. 34)

Pairs are ``(x[i], x[i + r/2])`` in the half layout (GPT-NeoX, Llama, Hugging Face) and
``(x[2i], x[2i+1])`` in the interleaved one (GPT-J, RoFormer); channels from ``r`` on pass
through. Callers hand in ``cos`` and ``sin`` of the angles, ``(..., n, r/2)``, already scaled
where a scheme scales them (an attention factor, xPos's decay).

* :func:`rotate_reference` is eq. 34 in torch operations: differentiable in ``x``, ``cos``
  and ``sin``, exact in float64. It runs in an ONNX export (which lowers it to ONNX
  operations), under ``torch.jit.trace`` and ``torch.func`` transforms, and when
  ``cos``/``sin`` require grad (learned frequencies).
* :func:`apply_rotary` (a new tensor) and :func:`apply_rotary_` (in place) check their
  arguments and call :func:`run_plan`, which runs the plan :func:`~.select.select` made: a
  kernel (the C kernel, Triton or the tiled torch path; :mod:`.kernel`) eagerly, under
  autograd as one :class:`torch.autograd.Function` whose backward turns the incoming
  gradient back with the same kernel, inside ``torch.compile`` and ``torch.export`` as one
  custom operator (:mod:`~.ops`), or the formula.
* :func:`run_plan_pair` runs a plan for ``q`` and ``k`` turned by the same tables in one go
  (a kernel's ``turn_pair`` eagerly; under autograd :func:`pair_node`, one node whose
  backward is one ``turn_pair`` clockwise).

Nothing here compiles anything at import or on a call, or keeps global state: no
``torch.compile``, no C compiler, no switch. See ``benchmarks/rope.md`` for the speed of each
path.

Dimension legend: ``n`` sequence, ``d`` channels of ``x``, ``r`` rotary channels (``r <= d``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ....errors import PosencTypeError, PosencValueError
from ...checks import compute_dtype
from .full_width import check_not_batch_first, copies, records_tables
from .kernel import Kernel, Tables, pair_refused
from .ops import _rotate_in_place_op, _rotate_op
from .select import Mode, Plan, select, turn_or_fallback

__all__ = [
    "apply_rotary",
    "apply_rotary_",
    "rotate_reference",
]

# --------------------------------------------------------------------------- the formula


def rotate_reference(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """Eq. 34, computed in ``cos``'s dtype and cast back to ``x``'s once.

    Args:
        x: ``(..., n, d)``.
        cos, sin: ``(..., n, r/2)``, broadcastable against ``x.shape[:-1]``; ``2 * r/2 <= d``.
        interleaved: pairs ``(x[2i], x[2i+1])`` instead of ``(x[i], x[i + r/2])``.

    Returns a new tensor of ``x``'s shape and dtype. Differentiable in all three inputs.
    """
    half = cos.shape[-1]
    r = 2 * half
    work = x.to(cos.dtype)
    # eq. 34 written so that each layout's pair is one contiguous read for inductor's loops:
    # interleaved pairs side by side (stacked on a new last dim), the half layout's halves
    # stacked on a new dim before the pairs (x1 above x2), turned by one broadcast multiply
    if interleaved:
        x1, x2 = work[..., 0:r:2], work[..., 1:r:2]  # (..., n, r/2) each
        turned = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:  # [x1', x2'] = [x1, x2] cos + [x2, x1] [-sin, sin]
        pairs = work[..., :r].unflatten(-1, (2, half))  # (..., n, 2, r/2): x1 above x2
        turned = pairs * cos[..., None, :] + pairs.flip(-2) * torch.stack((-sin, sin), dim=-2)
    rotated = turned.flatten(-2)  # (..., n, r)
    if r < x.shape[-1]:
        rotated = torch.cat((rotated, work[..., r:]), dim=-1)
    return rotated.to(x.dtype)


class _KernelNode(torch.autograd.Function):
    """A kernel's rotation as one autograd node. Eq. 34 is linear in ``x`` with the matrix
    ``[[cos, -sin], [sin, cos]]`` per pair, so the gradient is the incoming one turned by the
    transpose, which is eq. 34 with ``-sin``: the same kernel turning the other way.
    ``cos``/``sin`` get no gradient (callers send those that require one to
    :func:`rotate_reference`)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        interleaved: bool,
        inplace: bool,
        plan: Plan,
    ) -> Tensor:
        out = x if inplace else torch.empty_like(x, memory_format=torch.contiguous_format)
        assert plan.kernel is not None
        plan.kernel.turn(x, out, cos, sin, interleaved)
        if inplace:
            ctx.mark_dirty(x)
        ctx.save_for_backward(cos, sin)
        ctx.interleaved, ctx.kernel = interleaved, plan.kernel  # type: ignore[attr-defined]
        return out

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad: Tensor
    ) -> tuple[Tensor, None, None, None, None, None]:
        cos, sin = ctx.saved_tensors  # type: ignore[attr-defined]
        interleaved = ctx.interleaved  # type: ignore[attr-defined]
        if torch.is_grad_enabled():  # (create_graph: the backward must be differentiable too)
            return apply_rotary(grad, cos, -sin, interleaved=interleaved), *(None,) * 5
        back = torch.empty_like(grad, memory_format=torch.contiguous_format)
        if grad.numel():
            turn_or_fallback(ctx.kernel, grad, back, cos, sin, interleaved, True)  # type: ignore[attr-defined]
        return back, None, None, None, None, None


def _rows_tables(cos: Tensor, sin: Tensor, rows: int | Tensor | None, n: int) -> Tables:
    """The tables ``rows`` names in whole ``(positions, r/2)`` tables, broadcasting against
    ``(b, h, n)`` (``cos``, ``sin`` themselves without ``rows``)."""
    if rows is None:
        return cos, sin
    if isinstance(rows, int):
        return cos[rows : rows + n], sin[rows : rows + n]
    if rows.dim() == 2:  # (b, n) -> (b, 1, n, r/2)
        return cos[rows][:, None], sin[rows][:, None]
    return cos[rows], sin[rows]


def _turn_pair_or_each(
    kernel: Kernel,
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
    inplace: bool,
    rows: int | Tensor | None,
    clockwise: bool,
) -> tuple[Tensor, Tensor]:
    """``kernel.turn_pair``, or (where it refuses the data, e.g. an address the C kernel
    does not take, or gradients laid out otherwise) one turn each."""
    if kernel.takes(q, k, (cos, sin)):
        pair = kernel.turn_pair(q, k, cos, sin, interleaved, inplace, rows, clockwise)
        if pair is not None:
            return pair
    tables = _rows_tables(cos, sin, rows, q.shape[-2])
    outs = []
    for x in (q, k):
        out = x if inplace else torch.empty_like(x, memory_format=torch.contiguous_format)
        turn_or_fallback(kernel, x, out, *tables, interleaved, clockwise)
        outs.append(out)
    return outs[0], outs[1]


class _PairNode(torch.autograd.Function):
    """:class:`_KernelNode` for ``q`` and ``k`` turned by the same tables: one node, whose
    forward is the kernel's ``turn_pair`` (one Triton launch for both) and whose backward is
    the same call turning the incoming gradients clockwise (the kernel's switch: no ``-sin``
    table is made on the Triton path). ``rows``: as ``turn_pair``'s (:mod:`.kernel`)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        q: Tensor,
        k: Tensor,
        cos: Tensor,
        sin: Tensor,
        interleaved: bool,
        inplace: bool,
        kernel: Kernel,
        rows: int | Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        out_q, out_k = _turn_pair_or_each(kernel, q, k, cos, sin, interleaved, inplace, rows, False)
        if inplace:
            ctx.mark_dirty(q, k)
        ctx.save_for_backward(cos, sin)
        ctx.interleaved, ctx.kernel, ctx.rows = interleaved, kernel, rows  # type: ignore[attr-defined]
        return out_q, out_k

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_q: Tensor, grad_k: Tensor
    ) -> tuple[Tensor | None, ...]:
        cos, sin = ctx.saved_tensors  # type: ignore[attr-defined]
        interleaved, rows = ctx.interleaved, ctx.rows  # type: ignore[attr-defined]
        if torch.is_grad_enabled():  # (create_graph: the backward must be differentiable too)
            cos, sin = _rows_tables(cos, sin, rows, grad_q.shape[-2])
            back_q = apply_rotary(grad_q, cos, -sin, interleaved=interleaved)
            back_k = apply_rotary(grad_k, cos, -sin, interleaved=interleaved)
            return back_q, back_k, *(None,) * 6
        kernel = ctx.kernel  # type: ignore[attr-defined]
        back_q, back_k = _turn_pair_or_each(
            kernel, grad_q, grad_k, cos, sin, interleaved, False, rows, True
        )
        return back_q, back_k, *(None,) * 6


def pair_node(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
    inplace: bool,
    plan: Plan,
    rows: int | Tensor | None = None,
) -> tuple[Tensor, Tensor] | None:
    """``q`` and ``k`` as one autograd node (:class:`_PairNode`) where ``plan`` runs a
    kernel under autograd (:attr:`Mode.FUNCTION`) and the kernel can turn them as a pair;
    ``None`` otherwise (the caller turns each), in place on views too (autograd lets a
    Function that changes a view in place return one tensor only). In place, the caller has
    run :func:`check_inplace` on each."""
    kernel = plan.kernel
    if plan.mode is not Mode.FUNCTION or kernel is None or not kernel.pairs:
        return None
    if pair_refused(q, k, cos, inplace) or not kernel.takes(q, k, (cos, sin)):
        return None
    if rows is not None and not isinstance(rows, int) and not kernel.reads_positions:
        return None
    if inplace and (q._is_view() or k._is_view()):
        return None  # autograd: a Function changing a view in place returns one tensor only
    return _PairNode.apply(q, k, cos, sin, interleaved, inplace, kernel, rows)


# --------------------------------------------------------------------------- entry points


def _turn_each_copy(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """:func:`apply_rotary` by full-width tables whose gradient autograd records: each output
    channel turned by its own copy of the angle (two half-width rotations, their channels
    stitched), so each copy gets the gradient transformers' formula gives it, not the first
    copy both."""
    check_not_batch_first(x, cos)
    d = x.shape[-1]
    (cos_a, cos_b), (sin_a, sin_b) = copies(cos, sin, d, interleaved)
    a = apply_rotary(x, cos_a, sin_a, interleaved=interleaved)
    b = apply_rotary(x, cos_b, sin_b, interleaved=interleaved)
    if interleaved:
        return torch.stack((a[..., 0::2], b[..., 1::2]), -1).flatten(-2)
    return torch.cat((a[..., : d // 2], b[..., d // 2 :]), -1)


def _checked_tables(
    x: object, cos: object, sin: object, interleaved: bool
) -> tuple[Tensor, Tensor]:
    """Check the arguments of :func:`apply_rotary`; return ``cos, sin`` in the work dtype, cut
    to half width where they are full-width in transformers' form (checked: :func:`copies`)."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise PosencTypeError(
            f"x must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}"
        )
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            got = getattr(t, "dtype", type(t).__name__)
            raise PosencTypeError(f"{name} must be a floating-point tensor, got {got}")
    assert isinstance(cos, Tensor) and isinstance(sin, Tensor)
    shape = cos.shape
    if shape != sin.shape:
        raise PosencValueError(f"cos and sin differ in shape: {tuple(shape)} vs {tuple(sin.shape)}")
    if shape and x.dim() and shape[-1] == x.shape[-1] > 1:  # transformers' full-width form
        check_not_batch_first(x, cos)
        (cos, _), (sin, _) = copies(cos, sin, x.shape[-1], interleaved)
        cos, sin = cos.contiguous(), sin.contiguous()  # (a kernel reads contiguous channels)
        shape = cos.shape
    lead, table_lead = x.shape[:-1], shape[:-1]
    half = shape[-1] if shape else 0
    if x.dim() < 1 or half < 1 or 2 * half > x.shape[-1]:
        raise PosencValueError(
            f"cos/sin of shape {tuple(shape)} need x with at least 2 * {half} channels, "
            f"got x of shape {tuple(x.shape)}"
        )
    if table_lead != lead[len(lead) - len(table_lead) :] and (
        len(table_lead) > len(lead)
        or any(t not in (1, s) for t, s in zip(reversed(table_lead), reversed(lead), strict=False))
    ):
        raise PosencValueError(
            f"cos/sin of shape {tuple(shape)} do not broadcast against x of shape "
            f"{tuple(x.shape)}: their leading dims must broadcast to x.shape[:-1]"
        )
    work = compute_dtype(x.dtype)
    if cos.dtype != work or sin.dtype != work:
        work = torch.promote_types(torch.promote_types(cos.dtype, sin.dtype), work)
        cos, sin = cos.to(work), sin.to(work)
    return cos, sin


def run_plan_pair(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
    inplace: bool,
    plan: Plan,
    rows: int | Tensor | None = None,
) -> tuple[Tensor, Tensor] | None:
    """``q`` and ``k`` turned by the same tables in one go where ``plan`` (the selector's
    answer for the pair) runs a kernel eagerly: the common eager call, a decode step above
    all, where checks and calls cost more than the arithmetic. ``rows``: ``cos`` and ``sin``
    are whole cached tables ``(positions, r/2)`` and ``q``/``k`` sit at positions ``rows,
    rows + 1, ...`` (an ``int``) or at the positions a tensor names (see
    :mod:`~.kernel`), read from the tables where they lie. ``None`` where
    this does not apply (another mode, or data the kernel rules out: see
    :func:`~.kernel.pair_refused`): the caller then rotates each through
    :func:`run_plan`."""
    if plan.mode is Mode.FUNCTION and not inplace:
        return pair_node(q, k, cos, sin, interleaved, inplace, plan, rows)
    if plan.mode is not Mode.EAGER:
        return None
    assert plan.kernel is not None
    return plan.kernel.turn_pair(q, k, cos, sin, interleaved, inplace, rows)


def run_plan(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
    inplace: bool,
    plan: Plan | None = None,
) -> Tensor:
    """The rotation behind :func:`apply_rotary` and :func:`apply_rotary_` once their arguments
    are checked (``cos``/``sin`` in the work dtype and broadcasting against ``x``; for in
    place, :func:`check_inplace` passed), run the way ``plan`` says (``None``: ask
    :func:`~.select.select`). The rotary modules call it with the tables they made and
    the plan they selected, so a forward pays for no check twice."""
    if plan is None:
        plan = select(x, (cos, sin), inplace=inplace)
    mode, kernel = plan.mode, plan.kernel
    if mode is Mode.EAGER:
        assert kernel is not None
        out = x if inplace else torch.empty_like(x, memory_format=torch.contiguous_format)
        kernel.turn(x, out, cos, sin, interleaved)
        return out
    if mode is Mode.FUNCTION:
        return _KernelNode.apply(x, cos, sin, interleaved, inplace, plan)
    if mode is Mode.OPERATOR_INPLACE:
        assert kernel is not None
        _rotate_in_place_op(x, cos, sin, interleaved, kernel.name)
        return x
    if mode is Mode.OPERATOR:
        assert kernel is not None
        return _rotate_op(x, cos, sin, interleaved, kernel.name)
    rotated = rotate_reference(x, cos, sin, interleaved=interleaved)  # FORMULA, TRACED
    return x.copy_(rotated) if inplace else rotated


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """Rotate the first ``r = 2 * cos.shape[-1]`` channels of ``x`` pairwise (RoFormer eq. 34)
    into a new tensor.

    Args:
        x: ``(..., n, d)`` queries or keys, any float dtype; ``d >= r``.
        cos, sin: ``(..., n, r/2)`` cos and sin of the angles (one per pair), broadcastable
            against ``x.shape[:-1]``; e.g. ``(n, r/2)`` or ``(b, 1, n, r/2)`` for ``x`` of
            shape ``(b, h, n, d)``, and ``(n, 1, r/2)`` for a heads-last ``(b, n, h, d)``.
            Full-width ``(..., n, d)`` tables in transformers' form (``cat(a, a)``; each
            angle twice for ``interleaved``) are taken where their two copies are equal
            (checked; one comparison of the tables) and refused by name otherwise; where
            their gradient is recorded, each copy gets its own, as transformers' formula
            gives it (two half-width rotations).
            They set the work dtype: half-precision ``x`` is rotated in the tables' dtype
            (float32) and cast back once.
        interleaved: pairs ``(x[2i], x[2i+1])`` (GPT-J) instead of ``(x[i], x[i+r/2])``
            (GPT-NeoX / Llama).

    Returns a new contiguous tensor like ``x``; channels ``r:`` are copied unchanged.
    Differentiable in ``x``, ``cos`` and ``sin``.

    >>> x = torch.tensor([[1.0, 0.0, 2.0, 5.0]])  # one position, d = 4, r = 2
    >>> apply_rotary(x, torch.tensor([[0.0]]), torch.tensor([[1.0]]))  # rotate by 90 degrees
    tensor([[0., 1., 2., 5.]])
    """
    if (
        isinstance(x, Tensor)
        and isinstance(cos, Tensor)
        and isinstance(sin, Tensor)
        and x.dim()
        and cos.dim()
        and cos.shape == sin.shape
        and cos.shape[-1] == x.shape[-1] > 1
        and records_tables(cos, sin)
    ):
        return _turn_each_copy(x, cos, sin, interleaved)
    cos, sin = _checked_tables(x, cos, sin, interleaved)
    return run_plan(x, cos, sin, interleaved, False, select(x, (cos, sin), inplace=False))


def check_inplace(
    x: Tensor, cos: Tensor, sin: Tensor, *, name: str = "x", plan: Plan | None = None
) -> None:
    """Raise a :class:`~posenc.errors.PosencValueError` naming ``name`` where ``x`` cannot be
    rotated in its own storage: under autograd with ``cos``/``sin`` requiring grad (their
    gradient needs ``x`` before the rotation) or ``x`` a leaf requiring grad, or a view that
    autograd forbids changing; an inference tensor outside ``torch.inference_mode``; ``x``
    with elements sharing memory (``expand``). ``plan``: the selector's answer (``None``: ask);
    in a captured graph torch's own checks apply instead."""
    grad = torch.is_grad_enabled()
    if grad and (cos.requires_grad or sin.requires_grad):
        raise PosencValueError(
            f"cannot rotate {name} in place while cos or sin require grad (learned "
            "frequencies: their gradient needs the input before the rotation); rotate "
            "out of place, or under torch.no_grad()"
        )
    if plan is None:
        plan = select(x, (cos, sin), inplace=True, kernel=False)
    if not plan.eager:  # compiling, tracing, torch.func, subclasses: torch's own checks
        return  # apply (and reading x's autograd state under compile replays changed views)
    if grad and x.requires_grad and x.is_leaf:
        raise PosencValueError(
            f"cannot rotate {name} in place: it is a leaf tensor that requires grad; "
            "rotate out of place, or rotate a tensor computed from it"
        )
    if grad and x.requires_grad and x._is_view():
        try:  # autograd refuses in-place changes to some views (unbind, split outputs)
            x[..., :0].mul_(1)
        except RuntimeError as error:
            raise PosencValueError(
                f"cannot rotate {name} in place under autograd: {error} (index the "
                "fused tensor instead, e.g. qkv[:, :, 0], or rotate out of place)"
            ) from None
    if x.is_inference() and not torch.is_inference_mode_enabled():
        raise PosencValueError(
            f"cannot rotate {name} in place: it is an inference tensor (made under "
            "torch.inference_mode) and torch forbids changing it outside inference mode"
        )
    if torch._debug_has_internal_overlap(x) == 1:
        raise PosencValueError(
            f"cannot rotate {name} in place: several of its elements share memory "
            f"(strides {tuple(x.stride())}, e.g. from expand), so they would turn more than "
            "once; rotate out of place or pass a copy"
        )


def apply_rotary_(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """:func:`apply_rotary` in ``x``'s own storage; returns ``x``, as torch's in-place
    operations return self.

    ``x`` may be any strided view, e.g. queries sliced from a fused projection,
    ``qkv.view(b, n, 3, h, d)[:, :, 0]`` (heads-last, with cos/sin ``(n, 1, r/2)``) or its
    ``.transpose(1, 2)`` (with ``(n, r/2)``). Under autograd the gradient flows to ``x``'s
    earlier value (the backward turns the incoming gradient back); ``cos`` and ``sin`` must
    not require grad then. Raises :class:`~posenc.errors.PosencValueError` where ``x`` cannot
    change in place (:func:`check_inplace` lists the cases).

    >>> x = torch.tensor([[1.0, 0.0, 2.0, 5.0]])
    >>> apply_rotary_(x, torch.tensor([[0.0]]), torch.tensor([[1.0]])) is x, x
    (True, tensor([[0., 1., 2., 5.]]))
    """
    cos, sin = _checked_tables(x, cos, sin, interleaved)
    plan = select(x, (cos, sin), inplace=True)
    check_inplace(x, cos, sin, plan=plan)
    return run_plan(x, cos, sin, interleaved, True, plan)
