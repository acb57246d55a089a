"""The fast rotation as ``torch.library`` custom operators, for ``torch.compile`` and
``torch.export``: ``posenc::rotary`` (out of place, with its fake and autograd kernels: compiled
training keeps the kernel) and ``posenc::rotary_`` (in place, without autograd, on the
tensor's own storage, which it says it mutates). Compilers see one node; its body is the
kernel :func:`~.select.select` chose when the graph was traced (named by ``kernel``,
so that a graph keeps it), on whichever device the tensors are (the C kernel on CPU, Triton
on CUDA, the pure-torch path).

Dimension legend: ``n`` sequence, ``d`` channels of ``x``, ``r`` rotary channels (``r <= d``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .select import KERNELS, turn_or_fallback


@torch.library.custom_op("posenc::rotary_", mutates_args=("x",))
def _rotate_in_place_op(
    x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, kernel: str
) -> None:
    """The kernel in place as one operator, for ``torch.compile``: inductor calls it on
    the tensor's own storage, where the traced formula plus a copy back would write a fresh
    tensor and then copy it (two passes over memory instead of one)."""
    turn_or_fallback(KERNELS[kernel], x, x, cos, sin, interleaved)


@torch.library.custom_op("posenc::rotary", mutates_args=())
def _rotate_op(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, kernel: str) -> Tensor:
    """The kernel out of place as one operator, for ``torch.compile`` and ``torch.export``
    where a kernel other than the pure-torch path takes the tensors: one pass over memory,
    where inductor's fusion of the formula may read a pair's channels more than once
    (``benchmarks/rope.md`` compares them)."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    turn_or_fallback(KERNELS[kernel], x, out, cos, sin, interleaved)
    return out


@_rotate_op.register_fake
def _(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, kernel: str) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _rotate_op_context(ctx: object, inputs: tuple, output: Tensor) -> None:
    _, cos, sin, interleaved, kernel = inputs
    ctx.save_for_backward(cos, sin)  # type: ignore[attr-defined]
    ctx.interleaved, ctx.kernel = interleaved, kernel  # type: ignore[attr-defined]


def _rotate_op_backward(ctx: object, grad: Tensor) -> tuple[Tensor, None, None, None, None]:
    """Eq. 34 is orthogonal: the gradient is the incoming one turned back (``-sin``), by the
    same kernel."""
    cos, sin = ctx.saved_tensors  # type: ignore[attr-defined]
    back = _rotate_op(grad, cos, -sin, ctx.interleaved, ctx.kernel)  # type: ignore[attr-defined]
    return back, None, None, None, None


_rotate_op.register_autograd(_rotate_op_backward, setup_context=_rotate_op_context)
