"""The differential grid of attention, against the math backend in float64: every scheme that
acts inside attention (rotary, bias, none) × every backend × float32 and bf16 *weights* (the
model itself in bfloat16, no autocast) × a sliding window and a cached decode (a prompt, then
one token at a time through a :class:`~posenc.KVCache`), within a tolerance per device and
dtype (:data:`TOLERANCE`). ``tests/test_autocast.py`` holds the autocast grid (masks,
training); ``tests/attention/test_cuda.py`` runs this grid on a GPU.

The reference is the same model, its weights as the case holds them (rounded to bfloat16 for
the bf16 cases) in float64 on the math backend, run over the whole sequence at once: what is
measured is the backend's arithmetic, not the weights' rounding.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import posenc
from tests.schemes import SEQUENCE

#: max |out - reference| / max |reference| allowed, per (device type, dtype). float32: the
#: order of summation; bf16: products in bfloat16 (8 bits of mantissa) over a width-24 model,
#: the bias rounded to bf16 in SDPA's mask on a GPU, the output rounded once.
TOLERANCE: dict[tuple[str, torch.dtype], float] = {
    ("cpu", torch.float32): 2e-6,
    ("cpu", torch.bfloat16): 2e-2,
    ("cuda", torch.float32): 2e-6,  # TF32 off (see the CUDA file)
    ("cuda", torch.bfloat16): 3e-2,
}
#: The schemes that act inside attention.
ATTENTION = [n for n in SEQUENCE if posenc.entry(n).family in ("rotary", "bias", "none")]
BACKENDS = ["auto", "sdpa", "math", "flex"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CASES = ["window", "decode"]
DIM, HEADS, N, PROMPT = 24, 2, 9, 7


@functools.cache
def _weights(name: str, case: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return _encoder(name, case, "math").state_dict()


def _encoder(name: str, case: str, backend: str) -> posenc.Encoder:
    window = 3 if case == "window" else None
    return posenc.Encoder(DIM, 1, HEADS, pe=name, causal=True, window=window, backend=backend)


def run_case(
    name: str, backend: str, dtype: torch.dtype, case: str, device: str, *, compile_flex: bool
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``(output, float64 math reference, backend the last call used)`` for one cell."""
    model = _encoder(name, case, backend)
    model.load_state_dict(_weights(name, case))
    for layer in model.layers:
        layer.attn.compile_flex = compile_flex
    model = model.to(device=device, dtype=dtype).eval()
    reference = copy.deepcopy(model).double()  # the rounded weights, exactly
    for layer in reference.layers:
        layer.attn.backend = posenc.attention.module.Backend.MATH
    x = torch.randn(2, N, DIM, generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        want = reference(x.double())
        if case == "decode":
            cache = posenc.KVCache()
            steps = [x[:, :PROMPT]] + [x[:, i : i + 1] for i in range(PROMPT, N)]
            out = torch.cat([model(step.to(dtype), cache=cache) for step in steps], dim=1)
        else:
            out = model(x.to(dtype))
    return out, want, model.layers[0].attn.last_backend or ""


def check(out: torch.Tensor, want: torch.Tensor, tolerance: float, what: str) -> None:
    assert out.shape == want.shape, what
    error = (out.double() - want).abs().max().item()
    scale = want.abs().max().item()
    assert error <= tolerance * scale, f"{what}: max error {error:.3g} > {tolerance} x {scale:.3g}"


#: Gradients: max error over the module's largest gradient.
GRAD_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 0.1}
#: Each gradient at least this fraction of the module's largest must point the reference's
#: way (cosine at least :data:`GRAD_COSINE`): the bound above alone would pass a scheme whose
#: parameters got no gradient at all (FIRE's, T5's and Shaw's are 0.002-0.05 of the largest,
#: the output projection's, at 256 tokens).
GRAD_CHECKED = {torch.float32: 1e-4, torch.bfloat16: 1e-2}
GRAD_COSINE = {torch.float32: 0.999, torch.bfloat16: 0.9}


def check_gradients(
    grads: dict[str, torch.Tensor], wants: dict[str, torch.Tensor], dtype: torch.dtype, what: str
) -> None:
    """Each gradient in ``grads`` against the float64 reference's: within
    :data:`GRAD_TOLERANCE` of the module's largest gradient (the output biases' are zero under
    softmax and a bias's sums over n² pairs cancel, so no per-tensor scale), and, where not
    negligible, in the reference's direction."""
    assert set(grads) <= set(wants), what
    scale = max(g.abs().max().item() for g in wants.values())
    for n, grad in grads.items():
        want = wants[n].double()
        error = (grad.double() - want).abs().max().item()
        bound = GRAD_TOLERANCE[dtype] * scale
        assert error <= bound, f"{what}: gradient of {n}: {error:.3g} > {bound:.3g}"
        if want.abs().max().item() >= GRAD_CHECKED[dtype] * scale:
            cosine = torch.nn.functional.cosine_similarity(
                grad.double().flatten(), want.flatten(), dim=0
            ).item()
            assert cosine >= GRAD_COSINE[dtype], f"{what}: gradient of {n}: cosine {cosine:.4f}"


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ATTENTION)
def test_every_backend_matches_float64_math(name: str, dtype: str, case: str) -> None:
    for backend in BACKENDS:
        out, want, used = run_case(name, backend, DTYPES[dtype], case, "cpu", compile_flex=False)
        what = f"{name}, {backend} (ran {used}), {dtype} weights, {case}"
        check(out, want, TOLERANCE[("cpu", DTYPES[dtype])], what)
        if backend == "flex" and case == "window":  # the eager reference, not a fallback
            assert used == "flex", what


def test_the_gradient_check_refuses_a_scheme_left_without_gradients() -> None:
    """What the CUDA training test (``tests/attention/test_cuda.py``) checks compiled flex's
    backward with, on the CPU: FIRE's gradients from the float32 math backend pass it, and
    the same with FIRE's own parameters' gradients dropped (zero), which the bound over the
    module's largest gradient alone lets through in bf16, fail it."""
    torch.manual_seed(0)
    pe = posenc.build_for_model("fire", 32, 4)
    module = posenc.MultiHeadAttention(32, 4, pe=pe, causal=True, backend="math")
    x = torch.randn(1, 64, 32)
    weight = torch.randn_like(x)
    (module(x) * weight).sum().backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    module.zero_grad(set_to_none=True)
    reference = copy.deepcopy(module).double()
    (reference(x.double()) * weight.double()).sum().backward()
    wants = {n: p.grad for n, p in reference.named_parameters()}
    for dtype in GRAD_TOLERANCE:
        check_gradients(grads, wants, dtype, "fire, math, float32")
    dropped = {n: torch.zeros_like(g) if n.startswith("pe.") else g for n, g in grads.items()}
    scale = max(g.abs().max().item() for g in wants.values())
    assert all(  # what the bound alone let through
        (dropped[n] - wants[n]).abs().max() <= GRAD_TOLERANCE[torch.bfloat16] * scale for n in grads
    )
    for dtype in GRAD_TOLERANCE:
        with pytest.raises(AssertionError, match=r"gradient of pe\."):
            check_gradients(dropped, wants, dtype, "fire, pe's gradients dropped")
