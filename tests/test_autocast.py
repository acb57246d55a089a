"""Mixed precision: the validation loop of a mixed-precision training script,
``torch.no_grad()`` or ``torch.inference_mode()`` around ``torch.autocast``, for every
registered scheme, eagerly and (one scheme per family) compiled; and every scheme on every
CPU backend (``auto``, ``sdpa``, ``math``, ``flex``) with every kind of mask, in evaluation,
with the attention weights, and in a training step.

Autocast runs the projections in the low precision and keeps the rest in float32; the
encoder's no-grad fast path (in-place GEMMs, which autocast does not convert) must step
aside. Each output must be within 2% (of its largest value) of the float32 output.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
import torch

import posenc
from tests.schemes import FACTS, NAMES, coordinates

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
    if axes > 1:  # N-D schemes need coordinates
        positions = torch.stack([torch.arange(8) % 3 + a for a in range(axes)], dim=-1)
        positions = coordinates(name, 8, positions)
    x = torch.randn(2, 8, 24)
    padding = torch.zeros(2, 8, dtype=torch.bool)
    if not FACTS[name].full_grid:  # (a grid's tokens cannot be padding: test_padding)
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


# --------------------------------------------------------------------------- every backend

#: The backends a CPU has; ``flex`` runs its eager reference (``compile_flex=False``), which
#: posenc runs below 128 tokens, and becomes SDPA under autograd (no CPU backward).
BACKENDS = ["auto", "sdpa", "math", "flex"]
#: The masks: none (bidirectional), causal, padding (causal, right and left: the first queries
#: of a left-padded row read no key), packed documents (causal).
MASKS = ["none", "causal", "padding", "packed"]


@functools.cache
def _grid_model(name: str, backend: str, causal: bool) -> posenc.Encoder:
    """A one-layer encoder, the same weights on every backend (shared by the grid's cases)."""
    torch.manual_seed(0)
    encoder = posenc.Encoder(24, 1, 2, pe=name, causal=causal, backend=backend)
    for layer in encoder.layers:
        layer.attn.compile_flex = False
    return encoder


def _grid_inputs(name: str, mask: str) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 8, 24, generator=generator)
    axes = posenc.entry(name).cls.axes
    kwargs: dict[str, torch.Tensor | None] = {}
    if axes > 1:  # N-D schemes need coordinates
        coords = torch.stack([torch.arange(8) % 3 + a for a in range(axes)], dim=-1)
        kwargs["positions"] = coordinates(name, 8, coords)
    if mask == "padding":
        padding = torch.zeros(2, 8, dtype=torch.bool)
        padding[0, 6:] = True  # right padding
        padding[1, :2] = True  # left padding
        kwargs["key_padding_mask"] = padding
    elif mask == "packed":
        kwargs["document_ids"] = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [5, 5, 5, 5, 5, 2, 2, 2]])
    return x, kwargs


def _grid_cases(name: str, backend: str, *, training: bool = False):
    """``(mask, model, x, kwargs, float32 output)`` for every mask the scheme takes, the model
    in training or evaluation mode (and autograd on or off: on a CPU flex falls back to SDPA
    under autograd, whose fully masked rows read uniform weights where flex's are zero).
    Packing needs 1-D positions: an N-D scheme refuses it, and a scheme on a full grid refuses
    padding, which is checked here instead."""
    for mask in MASKS:
        model = _grid_model(name, backend, causal=mask != "none").train(training)
        x, kwargs = _grid_inputs(name, mask)
        if mask == "packed" and posenc.entry(name).cls.axes > 1:
            with pytest.raises(posenc.PosencValueError, match="1-D positions"):
                model(x, **kwargs)
            continue
        if mask == "padding" and FACTS[name].full_grid:  # padding of a grid's tokens: refused
            with pytest.raises(posenc.PosencValueError, match="key_padding_mask"):
                model(x, **kwargs)
            continue
        try:
            yield mask, model, x, kwargs, _grid_reference(name, backend, mask, training)
        finally:
            model.eval()


@functools.cache
def _grid_reference(name: str, backend: str, mask: str, training: bool) -> torch.Tensor:
    """The float32 output of :func:`_grid_model` for a case (shared by both dtypes)."""
    model = _grid_model(name, backend, causal=mask != "none")
    x, kwargs = _grid_inputs(name, mask)
    with torch.set_grad_enabled(training):
        return model(x, **kwargs).detach()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
def test_autocast_every_backend_and_mask_evaluation(name: str, backend: str, dtype: str) -> None:
    """Evaluation under autocast on every backend and mask, and ``need_weights`` (the math
    path on every backend): within 2% of float32, the weights too."""
    for mask, model, x, kwargs, want in _grid_cases(name, backend):
        what = f"{name} on {backend}, {mask} mask, autocast({dtype})"
        with torch.no_grad(), torch.autocast("cpu", dtype=DTYPES[dtype]):
            out = model(x, **kwargs)
        _check_close(out, want, what)
        attn = model.layers[0].attn
        if backend == "flex":  # its eager reference ran, not a fallback
            assert attn.last_backend == "flex", what
        if mask == "packed":  # attend without a context takes no documents
            continue
        state = None
        if model.pe.family != "additive":
            state = model.pe.position_state(kwargs.get("positions"), x)
        padding = kwargs.get("key_padding_mask")
        with torch.no_grad():
            want_weights = attn.attend(x, state, key_padding_mask=padding, need_weights=True)[1]
        with torch.no_grad(), torch.autocast("cpu", dtype=DTYPES[dtype]):
            weights = attn.attend(x, state, key_padding_mask=padding, need_weights=True)[1]
        _check_close(weights, want_weights, what + ", weights")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
def test_autocast_every_backend_and_mask_training(name: str, backend: str, dtype: str) -> None:
    """A training forward and backward under autocast on every backend and mask: the output
    within 2% of float32, and every gradient finite."""
    for mask, model, x, kwargs, want in _grid_cases(name, backend, training=True):
        what = f"{name} on {backend}, {mask} mask, autocast({dtype}), training"
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=DTYPES[dtype]):
            out = model(x, **kwargs)
        _check_close(out.detach(), want, what)
        out.float().square().mean().backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert grads and all(g is not None and torch.isfinite(g).all() for g in grads), what


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_an_input_in_another_dtype_is_refused_before_work_outside_autocast(
    dtype: torch.dtype,
) -> None:
    """A float32 Encoder, MultiHeadAttention or EncoderLayer given bfloat16 or float64 ``x``
    names both dtypes before any work (torch would fail deep inside a Linear); under autocast
    a bfloat16 ``x`` is taken (within 2% of the float32 forward), while float64, which
    autocast never casts, is still refused."""
    torch.manual_seed(0)
    modules = {
        "Encoder": posenc.Encoder(16, 2, 2, pe="rope"),
        "MultiHeadAttention": posenc.MultiHeadAttention(16, 2, pe="alibi"),
        "EncoderLayer": posenc.EncoderLayer(16, 2),
    }
    x = torch.randn(2, 5, 16).to(dtype)
    for owner, module in modules.items():
        module.eval()
        message = rf"x has dtype {dtype} but the parameters of {owner} are torch.float32"
        for grad in (False, True):
            with torch.set_grad_enabled(grad), pytest.raises(posenc.PosencTypeError, match=message):
                module(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if dtype is torch.float64:
                with pytest.raises(posenc.PosencTypeError, match=message):
                    module(x)
            else:
                got = module(x)
        if dtype is not torch.float64:  # within autocast's 2% of the float32 forward
            want = module(x.float())
            assert torch.isfinite(got).all()
            assert (got.float() - want).abs().max() <= TOLERANCE * want.abs().max()
    double = posenc.Encoder(16, 1, 2).double()  # float64 parameters refuse float32 x too
    message = r"torch\.float32 but the parameters of Encoder are torch\.float64"
    with pytest.raises(posenc.PosencTypeError, match=message):
        double(torch.randn(1, 3, 16))
