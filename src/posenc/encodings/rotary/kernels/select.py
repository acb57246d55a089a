"""Where a rotation runs, decided in one place: the mode, and the kernel that runs it.

A rotation of ``x`` by ``cos``/``sin`` (RoFormer eq. 34) runs in one of six modes, each right
for some calls and wrong for others:

=====================  ===================================================================
:class:`Mode`          what runs, and when
=====================  ===================================================================
``EAGER``              a kernel, eagerly: nothing for autograd to record
``FUNCTION``           a kernel as one autograd node (``_Rotation``; q and k by the same
                       tables as one ``_PairRotation``): eager, ``x`` requires grad and
                       the tables do not
``FORMULA``            :func:`~.rotate.rotate_reference` in eager mode: the tables require
                       grad (learned frequencies), which only the formula differentiates
``OPERATOR``           ``posenc::rotary`` under ``torch.compile``/``torch.export``, out of
                       place, where a kernel takes the tensors and the tables need no grad
``OPERATOR_INPLACE``   ``posenc::rotary_`` under ``torch.compile``, in place, no grad
``TRACED``             the formula as torch operations in a captured graph: ONNX export, a
                       ``torch.jit.trace``, ``torch.func`` transforms, tensor subclasses,
                       and compiled calls where no operator applies
=====================  ===================================================================

and the four modes that run a kernel run one of three (:class:`~.kernel.Kernel`), the
first that takes the tensors:

==========  ==========================================================================
kernel      what it takes
==========  ==========================================================================
``native``  the C kernel (:mod:`.native`): float32/bfloat16 CPU tensors with contiguous
            channels (where it was built)
``triton``  the Triton kernel (:mod:`.triton_entry`, :mod:`.triton_launch`):
            bfloat16/float16/float32 CUDA tensors, at most four dims (where triton is
            installed)
``torch``   the tiled pure-torch path (:mod:`.pytorch`): anything else
==========  ==========================================================================

``POSENC_ROTARY_KERNEL=auto|native|torch|triton`` forces a kernel (``auto``, or unset: the
table above). It is read on every call of eager code; under ``torch.compile`` when the graph
is traced (a compiled graph keeps the kernel it was traced with: recompile, e.g. after
``torch._dynamo.reset()``, to change it). A forced kernel must take the tensors, and the
call must run a kernel: forcing one where the formula is needed (learned frequencies, ONNX
export, a trace, ``torch.func``) raises :class:`~posenc.errors.PosencValueError`, as does a
value outside the four.

:func:`select` reads everything that decides it: whether dynamo is compiling (and for ONNX),
whether a trace or a functorch transform is running, autograd, the tensors' types, dtypes,
devices and layout, and the variable; autocast changes nothing (every mode computes in the
tables' dtype and returns ``x``'s). It is the only function of the rotary modules that asks
torch which of these modes is on, and the only place that names a kernel:
:func:`~.rotate.run_plan`, :func:`~.rotate.run_plan_pair` and the modules act on its
:class:`Plan`, and the modules' position reader and tables take :attr:`Plan.eager` (whether
values may be read and tables grown) from it.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

import torch
from torch import Tensor

from ....errors import PosencValueError
from . import native, pytorch
from .kernel import Kernel, Tables
from .triton_entry import TRITON

__all__ = [
    "KERNELS",
    "Mode",
    "Plan",
    "eager_plain",
    "native_eager",
    "native_eager_pair",
    "select",
    "turn_or_fallback",
    "turn_prepared_pair",
]

#: The variable that forces a kernel.
KERNEL_VARIABLE = "POSENC_ROTARY_KERNEL"


class _OnnxRotaryOp:
    """Whether an ONNX export keeps each rotation as one ``posenc::rotary`` node, translated to
    opset 23's ``RotaryEmbedding`` (:func:`posenc.export_onnx` with ``rotary_op=True`` sets
    it while it exports), instead of lowering the formula to elementary operations."""

    on = False


ONNX_ROTARY_OP = _OnnxRotaryOp()


class Mode(enum.Enum):
    """The ways a rotation can run; see the table in this module's docstring. ``eager``:
    whether the call runs eagerly on plain tensors, so that its callers may read values (the
    positions) and grow their tables; ``False`` inside a captured graph."""

    EAGER = ("eager", True)
    FUNCTION = ("function", True)
    FORMULA = ("formula", True)
    OPERATOR = ("operator", False)
    OPERATOR_INPLACE = ("operator_", False)
    TRACED = ("traced", False)

    def __init__(self, label: str, eager: bool) -> None:
        self.label = label
        self.eager = eager  # (plain attributes: read in every decode step)
        self.index = 0  # (its place in the class, set below: the plans' index)


for _place, _mode_member in enumerate(Mode):
    _mode_member.index = _place


@dataclass(frozen=True)
class Plan:
    """The selector's answer: the mode, and the kernel that runs it (``None`` for the modes
    that run the formula, and where the caller asked only for the mode). ``eager`` is the
    mode's (a plain attribute: read in every decode step)."""

    mode: Mode
    kernel: Kernel | None
    eager: bool

    def __repr__(self) -> str:
        kernel = "" if self.kernel is None else f", {self.kernel.name}"
        return f"Plan({self.mode.name}{kernel})"


def _native_takes(x: Tensor, pair: Tensor | None, tables: Tables | None) -> bool:
    """Whether the C kernel is built and takes ``x``, ``pair`` and the tables (dtype, device,
    layout; :mod:`.native` checks the addresses when it runs)."""
    return (
        native._native is not None
        and native._native_tensor(x)
        and (pair is None or native._native_tensor(pair))
        and (tables is None or native._native_tables(*tables))
    )


def _torch_takes(x: Tensor, pair: Tensor | None, tables: Tables | None) -> bool:
    return True


def _no_pair(*args: object) -> None:
    return None


NATIVE = Kernel("native", _native_takes, native.turn, native.turn_pair)
TORCH = Kernel("torch", _torch_takes, pytorch.turn, _no_pair, pairs=False)
#: Every kernel by the name ``POSENC_ROTARY_KERNEL`` gives it.
KERNELS = {kernel.name: kernel for kernel in (NATIVE, TORCH, TRITON)}
#: One plan per mode and kernel, made once (a decode step allocates none): by kernel
#: (identity), then :attr:`Mode.index` (an Enum member hashes in Python; a list index does not).
_PLANS = {
    kernel: [Plan(mode, kernel, mode.eager) for mode in Mode]
    for kernel in (None, *KERNELS.values())
}
#: The environment as bytes where CPython keeps it (POSIX): one dict lookup per call, where
#: ``os.environ.get`` of an unset name raises and catches a KeyError (a decode step's cost).
_ENVIRON = getattr(os.environ, "_data", None)
_KEY = os.environ.encodekey(KERNEL_VARIABLE) if hasattr(os.environ, "encodekey") else None  # type: ignore[attr-defined]


def turn_or_fallback(
    kernel: Kernel,
    x: Tensor,
    out: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
    clockwise: bool = False,
) -> None:
    """``kernel.turn`` where it takes ``x`` and the tables, else the pure-torch path: for
    tensors torch laid out after the plan was made (a gradient in a backward, an operator's
    input at run time), which the caller cannot choose."""
    chosen = kernel if kernel.takes(x, None, (cos, sin)) else TORCH
    chosen.turn(x, out, cos, sin, interleaved, clockwise)


def forced_kernel(compiling: bool = False) -> Kernel | None:
    """The kernel ``POSENC_ROTARY_KERNEL`` forces (``None``: unset or ``auto``);
    ``compiling``: dynamo is tracing the call (it traces ``os.environ``, not CPython's
    dict)."""
    if _ENVIRON is not None and _KEY is not None and not compiling:
        value = _ENVIRON.get(_KEY)
        if value is None:  # (the common case: one dict lookup)
            return None
        name = os.environ.decodevalue(value)  # type: ignore[attr-defined]
    else:
        name = os.environ.get(KERNEL_VARIABLE)
    if name is None or name == "auto" or name == "":
        return None
    kernel = KERNELS.get(name)
    if kernel is None:
        raise PosencValueError(
            f"{KERNEL_VARIABLE} must be one of auto, {', '.join(KERNELS)}, got {name!r}"
        )
    return kernel


def _kernel(
    x: Tensor, pair: Tensor | None, tables: Tables | None, forced: Kernel | None
) -> Kernel | None:
    """The kernel that rotates these tensors: the forced one (``None`` where it cannot take
    them), else the first of native (CPU), Triton (CUDA) and torch that takes them."""
    if forced is not None:
        return forced if forced.takes(x, pair, tables) else None
    if _native_takes(x, pair, tables):
        return NATIVE
    if x.is_cuda and TRITON.takes(x, pair, tables):
        return TRITON
    return TORCH


def _refuse(forced: Kernel, why: str) -> PosencValueError:
    return PosencValueError(
        f"{KERNEL_VARIABLE}={forced.name}: {why}; unset it (or set auto) for this call"
    )


def select(
    x: Tensor,
    tables: Tables | None = None,
    *,
    inplace: bool,
    learned: bool = False,
    pair: Tensor | None = None,
    positions: object = None,
    kernel: bool = True,
) -> Plan:
    """The :class:`Plan` of rotating ``x`` (and ``pair``, by the same tables).

    Args:
        x: the tensor rotated, ``(..., n, d)``.
        tables: ``(cos, sin)``; ``None`` for tables the caller has yet to make, in ``x``'s
            work dtype with contiguous channels (a rotary module's own).
        inplace: whether ``x`` turns in its own storage.
        learned: the tables will be made from trainable frequencies (they require grad
            where autograd is on).
        pair: a second tensor rotated by the same tables (the keys of ``x``'s queries); the
            answer holds for both.
        positions: the positions the tables are made from, read by the caller where the
            answer is eager; a tensor subclass among them means a graph.
        kernel: ``False`` where the caller only needs the mode (``x`` then only stands for
            the call's device and autograd state): no kernel is chosen or checked.

    Raises :class:`~posenc.errors.PosencValueError` where ``POSENC_ROTARY_KERNEL`` forces a
    kernel that cannot take the tensors, or forces one on a call that needs the formula.
    """
    mode = _mode(x, tables, inplace, learned, pair, positions)
    if not kernel:
        if mode is Mode.OPERATOR and _kernel(x, pair, tables, None) is TORCH and not _onnx_node():
            mode = Mode.TRACED  # (as below)
        return _PLANS[None][mode.index]
    forced = forced_kernel(not mode.eager)
    if mode is Mode.FORMULA or mode is Mode.TRACED:
        if forced is not None:
            raise _refuse(forced, _why_formula(mode, learned, tables))
        return _PLANS[None][mode.index]
    chosen = _kernel(x, pair, tables, forced)
    if chosen is None:
        assert forced is not None
        devices = x.device if pair is None else f"{x.device} and {pair.device}"
        dtypes = x.dtype if pair is None else f"{x.dtype} and {pair.dtype}"
        raise _refuse(
            forced,
            f"that kernel cannot take these tensors ({dtypes} on {devices}, shape "
            f"{tuple(x.shape)}, strides {tuple(x.stride())})",
        )
    if mode is Mode.OPERATOR and chosen is TORCH and forced is None and not _onnx_node():
        mode = Mode.TRACED  # (no fast kernel: inductor's fusion of the formula is faster)
        return _PLANS[None][mode.index]
    return _PLANS[chosen][mode.index]


def eager_plain(*tensors: Tensor) -> bool:
    """Whether a call on ``tensors`` runs eagerly on plain tensors: no ``torch.compile`` or
    ``torch.export`` trace, no ``torch.jit.trace``, no ``torch.func`` transform, no tensor
    subclass (the calls :func:`select` answers with an eager mode, ``EAGER``, ``FUNCTION``
    or ``FORMULA``, by autograd alone)."""
    return _untraced() and all(type(t) is Tensor for t in tensors)


def untraced() -> bool:
    """Whether this call runs eagerly: no ``torch.compile`` or ``torch.export`` trace, no
    ``torch.jit.trace``, no ``torch.func`` transform."""
    return (
        not torch.compiler.is_compiling()
        and torch._C._get_tracing_state() is None
        and not torch._C._are_functorch_transforms_active()
    )


_untraced = untraced


def native_eager() -> bool:
    """Whether the call's state lets :func:`select` answer ``Plan(EAGER, native)`` for plain
    tensors turned in place: autograd off, no trace or transform (:func:`untraced`), no other
    kernel forced, the C kernel built. What the tensors themselves must be (plain, on the
    CPU, a dtype and layout the kernel takes) is :func:`native_eager_pair`'s, or the C
    kernel's own check where a caller hands it the tensors (:func:`turn_prepared_pair`)."""
    if torch.is_grad_enabled() or not _untraced() or native._native is None:
        return False
    forced = forced_kernel()
    return forced is None or forced is NATIVE


def turn_prepared_pair(
    q: Tensor, k: Tensor, tables: tuple[tuple, tuple], interleaved: bool
) -> bool:
    """``q`` and ``k`` turned in place by the C kernel where :func:`select` would have it turn
    them eagerly (:func:`native_eager`, plain tensors), by the tables ``(cos, sin)`` that
    :func:`~.native.prepare_tables` described (or views of them), broadcast against the
    leading dims of each (:func:`~.native.turn_pair_prepared`); ``False``, with nothing
    written, wherever that does not hold. One call per layer of a decode step of
    :mod:`posenc.hf`'s patched attention."""
    if type(q) is not Tensor or type(k) is not Tensor or not native_eager():
        return False
    return native.turn_pair_prepared(q, k, tables, interleaved)


def native_eager_pair(x: Tensor, pair: Tensor) -> bool:
    """Whether :func:`select` answers ``Plan(EAGER, native)`` for ``x`` and ``pair`` turned in
    place by float32 tables with contiguous channels: :func:`native_eager`, plain tensors the
    C kernel takes. A few attribute reads, for a caller that holds tables it made for the C
    kernel, where :func:`select` itself would cost more than the rotation."""
    if type(x) is not Tensor or type(pair) is not Tensor or not native_eager():
        return False
    return _native_takes(x, pair, None)


def _onnx_node() -> bool:
    """Whether this call is traced by an ONNX export that keeps rotations as one node."""
    return ONNX_ROTARY_OP.on and torch.onnx.is_in_onnx_export()


def _why_formula(mode: Mode, learned: bool, tables: Tables | None) -> str:
    if mode is Mode.FORMULA:
        return "learned frequencies (tables that require grad) need the formula, not a kernel"
    if torch.compiler.is_compiling():
        return (
            "this compiled call runs the formula (an ONNX export, an in-place rotation under "
            "autograd, learned frequencies, or no operator for these tensors)"
        )
    return "a trace, a torch.func transform or a tensor subclass runs the formula"


def _mode(
    x: Tensor,
    tables: Tables | None,
    inplace: bool,
    learned: bool,
    pair: Tensor | None,
    positions: object,
) -> Mode:
    """The :class:`Mode` of :func:`select` (see its arguments)."""
    grad_on = torch.is_grad_enabled()
    tables_grad = tables is not None and (tables[0].requires_grad or tables[1].requires_grad)
    if torch.compiler.is_compiling():
        grad = grad_on and (
            tables_grad or learned or x.requires_grad or (pair is not None and pair.requires_grad)
        )
        if torch.compiler.is_exporting() and torch.onnx.is_in_onnx_export():
            # an ONNX export lowers the formula to ONNX operations, or, asked to, keeps one
            # node that becomes opset 23's RotaryEmbedding (not in place, fixed tables)
            keep = ONNX_ROTARY_OP.on and not inplace and not (tables_grad or learned)
            return Mode.OPERATOR if keep else Mode.TRACED
        if inplace and not grad:
            return Mode.OPERATOR_INPLACE
        if not inplace and not (tables_grad or (learned and grad_on)):
            return Mode.OPERATOR
        return Mode.TRACED
    # a torch.func transform is active wherever one of its wrapped tensors exists
    if (
        torch._C._get_tracing_state() is not None
        or torch._C._are_functorch_transforms_active()
        or type(x) is not Tensor
        or (pair is not None and type(pair) is not Tensor)
        or (
            positions is not None
            and isinstance(positions, Tensor)
            and type(positions) is not Tensor
        )
        or (tables is not None and not (type(tables[0]) is Tensor and type(tables[1]) is Tensor))
    ):
        return Mode.TRACED
    if grad_on:
        tables_grad = tables_grad or learned
        if tables_grad or x.requires_grad or (pair is not None and pair.requires_grad):
            return Mode.FORMULA if tables_grad else Mode.FUNCTION
    return Mode.EAGER
