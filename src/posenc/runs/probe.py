"""The probe: before training, the untrained model runs once on the longest input it will
be evaluated on, so that an encoding that cannot reach it (a learned table too short, a
position past a limit) fails in seconds with a message, not after the training."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import PosencValueError
from .device import autocast, model_device


def probe(
    model: nn.Module,
    tokens: Tensor,
    *,
    positions: Tensor | None = None,
    precision: str = "fp32",
    failure: str,
) -> None:
    """Run ``model(tokens, positions=...)`` once (``(b, n)`` inputs, moved to the model's
    device) in eval mode, without gradients, under ``precision``; the model's mode is
    restored. A ``ValueError``, ``IndexError`` or ``RuntimeError`` becomes a
    :class:`~posenc.errors.PosencValueError` reading ``"{failure}: {error}"``."""
    device = model_device(model)
    tokens = tokens.to(device)
    positions = None if positions is None else positions.to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast(device, precision):
            model(tokens, positions=positions)
    except (ValueError, IndexError, RuntimeError) as exc:
        raise PosencValueError(f"{failure}: {exc}") from exc
    finally:
        model.train(was_training)
