"""The Triton rotation of ``q`` and ``k`` as one operator for ``torch.compile``: a
``torch.library.triton_op`` whose launch inductor sees (:func:`torch.library.wrap_triton`)
and makes from its own generated code, planned as an eager launch is
(:func:`~.triton_launch.plan_launch`).

Dimension legend: ``n`` sequence, ``r`` rotary channels.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.library import triton_op, wrap_triton

from .triton_kernel import rotary_kernel
from .triton_launch import plan_launch

__all__ = ["rotary_pair_op"]


@triton_op("posenc::rotary_pair_triton", mutates_args=())
def rotary_pair_op(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, clockwise: bool
) -> tuple[Tensor, Tensor]:
    """``q`` and ``k`` turned by ``cos``/``sin`` (broadcasting against ``q.shape[:-1]``) into
    new contiguous tensors, one launch, as an operator whose launch ``torch.compile`` sees
    (:func:`torch.library.wrap_triton`): inductor launches the kernel itself, from its own
    generated code. Run eagerly, it launches the kernel; on fake tensors, it only makes the
    outputs. Its gradient is the same operator turning the other way (``clockwise``)."""
    out_q = torch.empty_like(q, memory_format=torch.contiguous_format)
    out_k = torch.empty_like(k, memory_format=torch.contiguous_format)
    plan = plan_launch(q, out_q, k, out_k, cos, sin, None, interleaved, clockwise)
    if plan.grid is not None:
        tensors = (q, out_q, k, out_k, cos, sin, cos)
        wrap_triton(rotary_kernel)[plan.grid](
            *tensors, *plan.tail, num_warps=plan.num_warps, enable_fp_fusion=True
        )
    return out_q, out_k


def _pair_op_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    _, _, cos, sin, interleaved, clockwise = inputs
    ctx.save_for_backward(cos, sin)
    ctx.interleaved, ctx.clockwise = interleaved, clockwise


def _pair_op_backward(ctx: Any, grad_q: Tensor, grad_k: Tensor) -> tuple:
    """Eq. 34 is orthogonal: the gradients turned the other way by the same operator."""
    cos, sin = ctx.saved_tensors
    back_q, back_k = rotary_pair_op(grad_q, grad_k, cos, sin, ctx.interleaved, not ctx.clockwise)
    return back_q, back_k, None, None, None, None


rotary_pair_op.register_autograd(_pair_op_backward, setup_context=_pair_op_context)
