"""Where a run computes and in what precision: ``--device`` and ``--precision``.

- :func:`resolve_device` turns ``auto`` (CUDA when available, else the CPU), ``cpu``,
  ``cuda``, ``cuda:N`` or ``mps`` into a :class:`torch.device`, refusing one this machine
  does not have, by name, before any work. Under ``torchrun`` each process takes
  ``cuda:LOCAL_RANK`` (the GPU of its place on the node).
- :func:`check_precision` and :func:`autocast`: ``fp32`` computes in float32; ``bf16`` runs
  forward and loss under ``torch.autocast(device_type, dtype=torch.bfloat16)`` while the
  parameters, their gradients and the optimiser's state stay float32 (mixed precision).
- :func:`model_device`: the device a model's weights are on, so that evaluation code moves
  its inputs there without being told.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from typing import Any

import torch
from torch import nn

from ..errors import PosencTypeError, PosencValueError

#: What ``--device`` accepts.
DEVICES = ("auto", "cpu", "cuda", "cuda:N", "mps")
#: What ``--precision`` accepts, and the autocast dtype of each (``None``: no autocast).
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}

DEVICE_HELP = (
    "auto (default: CUDA when available, else the CPU), cpu, cuda, cuda:N or mps; "
    "under torchrun each process takes cuda:LOCAL_RANK"
)
PRECISION_HELP = (
    "fp32, or bf16: forward and loss under bfloat16 autocast, parameters and optimiser in fp32"
)

_SPEC = re.compile(r"(auto|cpu|mps|cuda)(?::(\d+))?")


def _launch() -> tuple[int, int, int]:
    """``(WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE)`` as ``torchrun`` sets them (1, 0, 1
    outside it)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    return world, local_rank, local_world


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _cuda(index: int, text: str) -> torch.device:
    count = _gpus()
    if count == 0:
        raise PosencValueError(
            f"device {text!r}: CUDA is not available here (torch {torch.__version__}, "
            "no GPU visible); use --device cpu or auto"
        )
    if index >= count:
        visible = ", ".join(f"cuda:{i}" for i in range(count))
        raise PosencValueError(
            f"device {text!r}: only {count} CUDA device(s) are visible ({visible})"
        )
    return torch.device("cuda", index)


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """The device ``spec`` names, checked against this machine.

    ``auto`` is CUDA when available (under ``torchrun`` only if this node has a GPU for every
    local process), else the CPU; ``cuda`` is ``cuda:LOCAL_RANK`` under ``torchrun`` and the
    current GPU otherwise. A :class:`torch.device` is taken as an exact placement (checked,
    not remapped). Raises :class:`~posenc.errors.PosencValueError` naming the device for a
    malformed string, a GPU that is not there, or ``cuda:N``/``mps`` under ``torchrun``.

    >>> resolve_device("cpu")
    device(type='cpu')
    """
    exact = isinstance(spec, torch.device)
    if exact:
        text = str(spec)
    elif isinstance(spec, str):
        text = spec.strip()
    else:
        raise PosencTypeError(
            f"device must be a string such as 'cpu' or 'cuda:0', got {type(spec).__name__} {spec!r}"
        )
    match = _SPEC.fullmatch(text)
    if match is None or (match[2] is not None and match[1] != "cuda"):
        raise PosencValueError(f"device must be one of {', '.join(DEVICES)}, got {spec!r}")
    kind, index = match[1], None if match[2] is None else int(match[2])
    world, local_rank, local_world = _launch()
    distributed = world > 1 and not exact
    if kind == "auto":
        usable = _gpus() >= (local_world if world > 1 else 1)
        if not usable:
            return torch.device("cpu")
        kind = "cuda"
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "mps":
        if world > 1:
            raise PosencValueError(
                f"device {text!r} cannot be used under torchrun (no process-group backend "
                "for MPS); use --device cpu"
            )
        if not torch.backends.mps.is_available():
            raise PosencValueError(f"device {text!r}: MPS (Apple GPU) is not available here")
        return torch.device("mps")
    if index is not None and distributed:
        raise PosencValueError(
            f"device {text!r} under torchrun: each process takes cuda:LOCAL_RANK; "
            "use --device cuda (or auto)"
        )
    if index is None:
        index = local_rank if world > 1 else (torch.cuda.current_device() if _gpus() else 0)
    return _cuda(index, text)


def _known(precision: str) -> torch.dtype | None:
    if precision not in PRECISIONS:
        raise PosencValueError(
            f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
        )
    return PRECISIONS[precision]


def check_precision(precision: str, device: torch.device) -> None:
    """Refuse a precision posenc does not know, or ``bf16`` on a GPU without bfloat16
    (before Ampere), naming it."""
    _known(precision)
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name(device)
        raise PosencValueError(
            f"precision 'bf16' needs bfloat16 support, which {device} ({name}) lacks; "
            "use --precision fp32"
        )


def placement(spec: str | torch.device, precisions: Any = ("fp32",)) -> torch.device:
    """:func:`resolve_device` of ``spec``, with every precision in ``precisions`` checked
    on it: what a command calls once, before any work."""
    device = resolve_device(spec)
    for precision in dict.fromkeys(precisions):
        check_precision(precision, device)
    return device


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    """The context that forward and loss run in: nothing for ``fp32``, else
    ``torch.autocast(device.type, dtype=...)`` (matrix products in bfloat16, reductions
    such as softmax and the loss kept in float32 by autocast's own rules).

    >>> with autocast(torch.device("cpu"), "bf16"):
    ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
    torch.bfloat16
    """
    dtype = _known(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter or buffer (the CPU for a module with
    neither)."""
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    return torch.device("cpu") if first is None else first.device
