"""Where a rotation runs, decided in one place.

A rotation of ``x`` by ``cos``/``sin`` (RoFormer eq. 34) can run six ways, each right for
some calls and wrong for others:

=====================  ===================================================================
:class:`Route`          what runs, and when
=====================  ===================================================================
``NATIVE``             the C kernel (:mod:`.native`): eager, nothing for autograd
                       to record, a float32/bfloat16 CPU tensor with contiguous channels
``TORCH``              the blocked pure-torch path: eager, nothing for autograd to record,
                       any other dtype, device or layout (or no kernel built)
``FUNCTION``           the fast path as one autograd node (``_Rotation``): eager, ``x``
                       requires grad and the tables do not
``FORMULA``            :func:`~.rotate.rotate_reference` in eager mode: the tables require
                       grad (learned frequencies), which only the formula differentiates
``OPERATOR``           ``posenc::rotary`` under ``torch.compile``/``torch.export``, out of
                       place, where the kernel takes the tensors and the tables need no grad
``OPERATOR_INPLACE``   ``posenc::rotary_`` under ``torch.compile``, in place, no grad
``TRACED``             the formula as torch operations in a captured graph: ONNX export, a
                       ``torch.jit.trace``, ``torch.func`` transforms, tensor subclasses,
                       and compiled calls where no operator applies
=====================  ===================================================================

:func:`select` reads everything that decides it: whether dynamo is compiling (and for ONNX),
whether a trace or a functorch transform is running, autograd, and the tensors' types,
dtypes, devices and layout; autocast changes nothing (every path computes in the tables'
dtype and returns ``x``'s, which is what the rotation means under autocast too). It is the
only function of the rotary modules that asks torch which of these modes is on:
:func:`~.rotate.rotate`, :func:`~.rotate.rotate_pair` and the modules' forwards act on its
answer, and the modules' position reader and tables take :attr:`Route.eager` (whether values
may be read and tables grown) from it.
"""

from __future__ import annotations

import enum

import torch
from torch import Tensor

from . import native, pytorch

__all__ = ["Route", "select"]


class Route(enum.Enum):
    """The ways a rotation can run; see the table in this module's docstring. ``eager``:
    whether the call runs eagerly on plain tensors, so that its callers may read values (the
    positions) and grow their tables; ``False`` inside a captured graph."""

    NATIVE = ("native", True)
    TORCH = ("torch", True)
    FUNCTION = ("function", True)
    FORMULA = ("formula", True)
    OPERATOR = ("operator", False)
    OPERATOR_INPLACE = ("operator_", False)
    TRACED = ("traced", False)

    def __init__(self, label: str, eager: bool) -> None:
        self.label = label
        self.eager = eager  # (a plain attribute: read in every decode step)


def _native(x: Tensor, pair: Tensor | None, tables: tuple[Tensor, Tensor] | None) -> bool:
    """Whether the kernel is built and takes ``x``, ``pair`` and the tables (dtype, device,
    layout; :mod:`.native` checks the addresses when it runs)."""
    return (
        native._native is not None
        and native._native_tensor(x)
        and (pair is None or native._native_tensor(pair))
        and (tables is None or native._native_tables(*tables))
    )


def select(
    x: Tensor,
    tables: tuple[Tensor, Tensor] | None = None,
    *,
    inplace: bool,
    learned: bool = False,
    pair: Tensor | None = None,
    positions: object = None,
) -> Route:
    """The :class:`Route` of rotating ``x`` (and ``pair``, by the same tables).

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
            answer is :attr:`Route.eager`; a tensor subclass among them means a graph.
    """
    grad_on = torch.is_grad_enabled()
    tables_grad = tables is not None and (tables[0].requires_grad or tables[1].requires_grad)
    if torch.compiler.is_compiling():
        grad = grad_on and (
            tables_grad or learned or x.requires_grad or (pair is not None and pair.requires_grad)
        )
        if torch.compiler.is_exporting() and torch.onnx.is_in_onnx_export():
            return Route.TRACED  # (an ONNX export lowers the formula to ONNX operations)
        if inplace and not grad:
            return Route.OPERATOR_INPLACE
        if not inplace and not (tables_grad or (learned and grad_on)) and _native(x, pair, tables):
            return Route.OPERATOR
        return Route.TRACED
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
        return Route.TRACED
    if grad_on:
        tables_grad = tables_grad or learned
        if tables_grad or x.requires_grad or (pair is not None and pair.requires_grad):
            return Route.FORMULA if tables_grad else Route.FUNCTION
    return Route.NATIVE if _native(x, pair, tables) else Route.TORCH


def _rotate_fast(x: Tensor, out: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> None:
    """Write the rotation of ``x`` into ``out`` (``x`` itself, or a fresh tensor of its
    shape): the native kernel where it takes the tensors, else the pure-torch path."""
    if x.numel() == 0:
        return
    # ``out`` is x or contiguous: every caller makes it so
    if not (
        native._native_takes(x, cos, sin) and native._rotate_native(x, out, cos, sin, interleaved)
    ):
        pytorch._rotate_torch(x, out, cos, sin, interleaved)
