"""The tail every training step shares: cross-entropy over the scored tokens, in the run's
precision, then one optimiser step on the global mean.

Each experiment draws its own batch and slices out its rank's share (lengthgen: task
examples with a loss mask; extrapolate: windows of text, every next token scored), then
hands :func:`scored_step` a ``forward`` that returns this slice's scored logits and targets.
:func:`scored_step` runs that forward and the loss under the precision's autocast
(:func:`~posenc.runs.device.autocast`), computes the loss in float32 whatever the logits'
dtype, scales it so that DDP's gradient average is the gradient of the global batch's mean
(:func:`~posenc.runs.distributed.global_mean`), takes the optimiser step outside autocast,
and reports the global mean loss and this slice's token accuracy as device tensors, without
waiting for the device (no host synchronisation per step).

Dimension legend: ``t`` scored tokens on this rank, ``V`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .device import autocast, model_device
from .distributed import all_reduce_sum, global_mean
from .trainer import optimizer_step

#: ``forward() -> (logits (t, V), targets (t,))`` of this rank's scored tokens.
ScoredForward = Callable[[], tuple[Tensor, Tensor]]


def to_device(batch: Tensor, device: torch.device) -> Tensor:
    """``batch`` (on the CPU) on ``device`` without the host waiting for the device: on a
    GPU the copy goes through pinned memory and is queued behind the step before it (a plain
    ``.to("cuda")`` from pageable memory waits for the queue to drain); elsewhere a plain
    copy."""
    if device.type != "cuda":
        return batch.to(device)
    return batch.pin_memory().to(device, non_blocking=True)


def scored_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    forward: ScoredForward,
    *,
    total: int,
    grad_clip: float,
    world_size: int = 1,
    precision: str = "fp32",
) -> tuple[float, float]:
    """One optimiser step on the summed cross-entropy of the tokens ``forward`` scores.

    Args:
        model: the (possibly DDP-wrapped) model ``forward`` runs; its parameters are stepped.
        forward: this rank's scored logits ``(t, V)`` and targets ``(t,)``.
        total: scored tokens in the global batch (every rank's), the mean's denominator.
        grad_clip: global gradient-norm clip (0: none).
        world_size: processes sharing the batch.
        precision: ``fp32``, or ``bf16`` (forward and loss under bfloat16 autocast).

    Returns the global mean loss per scored token (nats, a float64 0-d tensor) and this
    slice's token accuracy (float32 0-d), on the model's device and not yet read: the host
    does not wait for the step (the trainer reads many steps' numbers at once).
    """
    with autocast(model_device(model), precision):
        logits, targets = forward()  # (t, V), (t,)
        loss_sum = F.cross_entropy(logits.float(), targets, reduction="sum")
    optimizer_step(model, optimizer, scheduler, global_mean(loss_sum, total, world_size), grad_clip)
    summed = all_reduce_sum(loss_sum.detach(), world_size)
    accuracy = (logits.detach().argmax(-1) == targets).float().mean()
    return summed.double() / total, accuracy  # (= float(summed) / total, read later)
