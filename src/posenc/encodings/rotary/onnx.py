"""Exporting posenc's rotations to ONNX as opset 23's ``RotaryEmbedding`` operator.

By default an ONNX export lowers each rotation to elementary operations (gathers, products,
sums): any runtime runs them. :func:`export_onnx` with ``rotary_op=True`` keeps each rotation
as one ``posenc::rotary`` node while the model is traced and translates it to
``RotaryEmbedding(X, cos_cache, sin_cache; interleaved, rotary_embedding_dim)`` (ONNX opset
23), so a runtime with a fused kernel for it (onnxruntime 1.22 and later) runs that. The tables
posenc made (float32, from float64 angles, already at the tokens' positions) become the
operator's ``(B, S, r/2)`` caches; half-precision inputs are rotated in float32 and cast back,
one rounding, as posenc does. Learned frequencies and in-place rotations keep the formula.

Dimension legend: ``B`` batch, ``H`` heads, ``S`` sequence, ``D`` head dim, ``r`` rotated
channels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ...errors import PosencValueError
from .kernels import ops  # noqa: F401  (registers posenc::rotary, the node translated here)
from .kernels.select import ONNX_ROTARY_OP

__all__ = ["ROTARY_OPSET", "export_onnx", "rotary_translation_table"]

#: The first ONNX opset with ``RotaryEmbedding``.
ROTARY_OPSET = 23


@contextlib.contextmanager
def _rotations_as_nodes() -> Iterator[None]:
    before = ONNX_ROTARY_OP.on
    ONNX_ROTARY_OP.on = True
    try:
        yield
    finally:
        ONNX_ROTARY_OP.on = before


def rotary_translation_table() -> dict[Any, Any]:
    """``{torch.ops.posenc.rotary.default: function}`` for ``torch.onnx.export``'s
    ``custom_translation_table``: the node as opset 23's ``RotaryEmbedding``."""
    from onnxscript import opset23 as op

    def rotary(x: Any, cos: Any, sin: Any, interleaved: bool, kernel: str) -> Any:
        # the tables broadcast against x (B, H, S, D) from the left: (S, r/2) or (B, 1, S, r/2)
        half = op.Shape(cos, start=-1)
        seq = op.Shape(x, start=2, end=3)
        caches = op.Concat(op.Shape(x, start=0, end=1), seq, half, axis=0)  # (B, S, r/2)
        flat = op.Concat(op.Constant(value_ints=[-1]), seq, half, axis=0)
        cos3 = op.Expand(op.Reshape(cos, flat), caches)
        sin3 = op.Expand(op.Reshape(sin, flat), caches)
        width, rotated = x.shape[-1], 2 * cos.shape[-1]
        if not (isinstance(width, int) and isinstance(rotated, int)):
            raise PosencValueError(
                "export_onnx(rotary_op=True) needs static head and table widths, got "
                f"x {x.shape} and cos {cos.shape}"
            )
        attributes = {
            "interleaved": int(interleaved),
            "rotary_embedding_dim": 0 if rotated == width else rotated,
        }
        if x.dtype == cos.dtype:
            return op.RotaryEmbedding(x, cos3, sin3, **attributes)
        wide = op.RotaryEmbedding(op.CastLike(x, cos3), cos3, sin3, **attributes)
        return op.CastLike(wide, x)  # (rotated in float32, one rounding)

    return {torch.ops.posenc.rotary.default: rotary}


def export_onnx(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    f: Any = None,
    *,
    rotary_op: bool = False,
    **kwargs: Any,
) -> Any:
    """``torch.onnx.export(model, args, f, dynamo=True, **kwargs)``; with ``rotary_op`` each
    rotation becomes opset 23's ``RotaryEmbedding`` (``opset_version`` at least 23, the
    default then), else it is lowered to elementary operations (any runtime). Returns what
    ``torch.onnx.export`` returns (an ``ONNXProgram``).

    Raises :class:`~posenc.errors.PosencValueError` for ``rotary_op`` with an opset older
    than 23."""
    if not isinstance(rotary_op, bool):
        raise PosencValueError(f"rotary_op must be a bool, got {rotary_op!r}")
    kwargs.setdefault("dynamo", True)
    if not rotary_op:
        return torch.onnx.export(model, args, f, **kwargs)
    opset = kwargs.setdefault("opset_version", ROTARY_OPSET)
    if opset is None or opset < ROTARY_OPSET:
        raise PosencValueError(
            f"rotary_op=True needs opset_version >= {ROTARY_OPSET} (RotaryEmbedding's first), "
            f"got {opset}"
        )
    given = kwargs.pop("custom_translation_table", None) or {}
    table = {**given, **rotary_translation_table()}
    with _rotations_as_nodes():
        return torch.onnx.export(model, args, f, custom_translation_table=table, **kwargs)
