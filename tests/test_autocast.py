"""Mixed-precision evaluation: the validation loop of a mixed-precision training script,
``torch.no_grad()`` or ``torch.inference_mode()`` around ``torch.autocast``, for every
registered scheme, eagerly and (one scheme per family) compiled.

Autocast runs the projections in the low precision and keeps the rest in float32; the
encoder's no-grad fast path (in-place GEMMs, which autocast does not convert) must step
aside. Each output must be within 2% (of its largest value) of the float32 output.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
import torch

import posenc
from tests.schemes import NAMES

MODES: dict[str, Callable[[], AbstractContextManager]] = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
}
#: On a CPU autocast takes bfloat16 and float16.
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: One scheme per family, for the compiled path.
REPRESENTATIVES = ["sinusoidal", "rope", "alibi", "none"]
TOLERANCE = 0.02


def _encoder_and_inputs(name: str):
    torch.manual_seed(0)
    encoder = posenc.Encoder(24, 2, 2, pe=name, causal=True).eval()
    positions = None
    axes = posenc.entry(name).cls.axes
    if axes > 1 and encoder.pe.family == "additive":  # N-D tables need coordinates
        positions = torch.stack([torch.arange(8) % 3 + a for a in range(axes)], dim=-1)
    x = torch.randn(2, 8, 24)
    padding = torch.zeros(2, 8, dtype=torch.bool)
    padding[1, 6:] = True
    return encoder, x, {"positions": positions, "key_padding_mask": padding}


def _check_close(out: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert out.shape == want.shape, what
    assert torch.isfinite(out).all(), what
    error = (out.float() - want).abs().max().item()
    assert error <= TOLERANCE * want.abs().max().item(), f"{what}: max |out - out_fp32| {error}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_autocast_evaluation_is_close_to_float32(name: str, mode: str, dtype: str) -> None:
    encoder, x, kwargs = _encoder_and_inputs(name)
    with torch.no_grad():
        want = encoder(x, **kwargs)
    with MODES[mode](), torch.autocast("cpu", dtype=DTYPES[dtype]):
        out = encoder(x, **kwargs)
    _check_close(out, want, f"{name} under {mode} and autocast({dtype})")


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_autocast_whole_model_and_training_step(name: str) -> None:
    """TransformerModel's logits under autocast, and a training step under autocast (autograd
    on: the path that never took the fast path) gives finite gradients."""
    torch.manual_seed(0)
    model = posenc.TransformerModel(50, 24, 2, 2, pe=name, causal=True).eval()
    tokens = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        want = model(tokens)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(tokens)
    _check_close(out, want, f"{name} model")
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(tokens).float().logsumexp(-1).mean()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.slow
@pytest.mark.parametrize("name", REPRESENTATIVES)
def test_compiled_autocast_evaluation_is_close_to_float32(name: str) -> None:
    torch._dynamo.reset()
    encoder, x, kwargs = _encoder_and_inputs(name)
    with torch.no_grad():
        want = encoder(x, **kwargs)
    compiled = torch.compile(encoder, fullgraph=True)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = compiled(x, **kwargs)
    _check_close(out, want, f"{name} compiled under autocast")
    torch._dynamo.reset()
