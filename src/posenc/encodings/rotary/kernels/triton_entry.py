"""The Triton kernel (:mod:`.triton_kernel`, launched by :mod:`.triton_launch`) behind the
kernel interface (:mod:`.kernel`): ``takes`` answers without importing triton; ``turn`` and
``turn_pair`` import it on their first call, so ``import posenc`` and the CLI never do.

It takes bfloat16, float16 and float32 tensors with at most three leading dims on CUDA (on
the CPU too while Triton's interpreter runs, ``TRITON_INTERPRET=1``), with float32 tables on
the same device, where triton is installed.
"""

from __future__ import annotations

import importlib.util
import os

import torch
from torch import Tensor

from .kernel import Kernel, Tables, pair_refused

#: The dtypes the kernel rotates (float32 arithmetic, one rounding to the output dtype).
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: The most dims (leading dims and the channels) of a tensor it takes.
MAX_DIMS = 4


#: Whether triton can be imported: its module spec is looked up once, at import, which finds
#: the package without importing it (importing triton would load its compiler and drivers).
INSTALLED = importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton's interpreter runs kernels (``TRITON_INTERPRET=1``), which takes CPU
    tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _tensor_ok(x: Tensor) -> bool:
    return (
        x.dtype in DTYPES
        and 1 <= x.dim() <= MAX_DIMS
        and (x.is_cuda or (x.is_cpu and interpreting()))
    )


def takes(x: Tensor, pair: Tensor | None, tables: Tables | None) -> bool:
    """Whether the Triton kernel can rotate ``x`` (and ``pair``) with ``tables``."""
    if not (_tensor_ok(x) and INSTALLED):
        return False
    if pair is not None and not (_tensor_ok(pair) and pair.device == x.device):
        return False
    return tables is None or all(
        t.dtype is torch.float32 and t.device == x.device and t.dim() <= MAX_DIMS for t in tables
    )


def turn(
    x: Tensor, out: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, clockwise: bool = False
) -> None:
    """One launch: ``x`` into ``out`` (``x`` itself, or a fresh tensor)."""
    from .triton_launch import launch

    if x.numel():
        launch(x, out, None, None, cos, sin, None, interleaved, clockwise, True)


def turn_pair(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
    inplace: bool,
    rows: int | Tensor | None = None,
    clockwise: bool = False,
) -> tuple[Tensor, Tensor] | None:
    """``q`` and ``k`` in one launch (``None`` where :func:`~.kernel.pair_refused`); ``rows``
    as positions are read by the kernel on the device, never gathered into a table."""
    if pair_refused(q, k, cos, inplace):
        return None
    from .triton_launch import launch

    positions = None
    if isinstance(rows, int):  # one run of rows of the whole tables, as views
        n = q.shape[-2]
        cos, sin = cos[rows : rows + n], sin[rows : rows + n]
    elif rows is not None:
        positions = rows
    if inplace:
        out_q, out_k = q, k
    else:
        out_q = torch.empty_like(q, memory_format=torch.contiguous_format)
        out_k = torch.empty_like(k, memory_format=torch.contiguous_format)
    launch(q, out_q, k, out_k, cos, sin, positions, interleaved, clockwise, True)
    return out_q, out_k


def compiled_pair(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool
) -> tuple[Tensor, Tensor] | None:
    """``q`` and ``k`` out of place as the operator ``posenc::rotary_pair_triton``
    (:func:`~.triton_op.rotary_pair_op`), for ``torch.compile``: inductor sees the Triton
    kernel and launches it from its own code; autograd runs the same operator clockwise.
    ``None`` under Triton's interpreter (tracing runs the operator on fake tensors, which the
    interpreter would read) and where :func:`~.kernel.pair_refused`."""
    if interpreting() or pair_refused(q, k, cos, False):
        return None
    from .triton_op import rotary_pair_op

    return rotary_pair_op(q, k, cos, sin, interleaved, False)


TRITON = Kernel("triton", takes, turn, turn_pair, reads_positions=True, compiled_pair=compiled_pair)
