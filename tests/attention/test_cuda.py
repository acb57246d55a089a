"""Attention on a GPU (skipped where torch sees no CUDA device; ``benchmarks/gpu_attention.sh``
runs it): the differential grid of ``tests/test_differential.py`` on CUDA, every learned
``score_mod`` training through *compiled* flex attention (its backward included) with
gradients equal to the float64 math backend's, bf16 inputs staying bf16 in the kernels, and
the bounded number of compilations.

TF32 is switched off for the float32 cells: the tolerances are those of IEEE float32.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.utils import counters

import posenc
from posenc.attention import flex
from posenc.attention.backends import Backend
from tests.schemes import BIAS, FACTS
from tests.test_differential import (
    ATTENTION,
    BACKENDS,
    CASES,
    DTYPES,
    TOLERANCE,
    check,
    check_gradients,
    run_case,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
FUSED = [name for name in BIAS if FACTS[name].score_mod]


@pytest.fixture(autouse=True)
def _no_tf32() -> object:
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", FUSED)
def test_learned_score_mods_train_through_compiled_flex(name: str, dtype: str) -> None:
    """A training forward and backward at 256 tokens on compiled flex (no fallback: a failed
    compilation warns, and warnings are errors here): output and every gradient (the
    projections' and the scheme's own) against the math backend in float64."""
    torch.manual_seed(0)
    pe = posenc.build_for_model(name, 64, 4)
    fused = posenc.MultiHeadAttention(64, 4, pe=pe, causal=True, backend="flex")
    fused = fused.cuda().to(DTYPES[dtype])
    x = torch.randn(2, 256, 64, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out = fused(x.to(DTYPES[dtype]))
    assert fused.last_backend == "flex"
    weight = torch.randn_like(x)
    (out.double() * weight).sum().backward()
    grads = {n: p.grad.double().clone() for n, p in fused.named_parameters() if p.requires_grad}
    fused.zero_grad(set_to_none=True)
    reference = copy_for_reference(fused)
    want = reference(x.double())
    (want * weight).sum().backward()
    check(out, want.detach(), TOLERANCE[("cuda", DTYPES[dtype])], f"{name} flex {dtype} output")
    wants = {n: p.grad for n, p in reference.named_parameters()}
    assert all(g is not None for g in wants.values())
    check_gradients(grads, wants, DTYPES[dtype], f"{name} flex {dtype}")


def copy_for_reference(module: posenc.MultiHeadAttention) -> posenc.MultiHeadAttention:
    """The module with its (possibly bf16-rounded) weights in float64 on the math backend."""
    import copy

    reference = copy.deepcopy(module).double()
    reference.backend = Backend.MATH
    return reference


def test_bf16_stays_bf16_in_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """flex and SDPA receive bf16 q, k, v on CUDA (no upcast of the whole inputs)."""
    seen: list[torch.dtype] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        seen.append(q.dtype)
        return real(q, *args, **kwargs)

    real_compiled = flex._compiled_flex

    def spy_compiled(key: tuple) -> object:
        compiled = real_compiled(key)

        def run(q: torch.Tensor, *args: object) -> torch.Tensor:
            seen.append(q.dtype)
            return compiled(q, *args)

        return run

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(flex, "_compiled_flex", spy_compiled)
    x = torch.randn(1, 300, 64, device="cuda", dtype=torch.bfloat16)
    for backend in ("sdpa", "flex"):
        seen.clear()
        attn = posenc.MultiHeadAttention(64, 4, pe=posenc.ALiBi(4), causal=True, backend=backend)
        attn = attn.cuda().to(torch.bfloat16)
        with torch.no_grad():
            attn(x)
        assert attn.last_backend == backend
        assert seen == [torch.bfloat16], backend


def test_four_lengths_compile_at_most_twice_on_cuda() -> None:
    flex.flex_cache_clear()
    torch._dynamo.reset()
    attn = posenc.MultiHeadAttention(64, 4, pe=posenc.ALiBi(4), causal=True, backend="flex")
    attn = attn.cuda().to(torch.bfloat16).eval()
    counters.clear()
    reference = copy_for_reference(attn)
    with torch.no_grad():
        for n in (128, 384, 1024, 2048):  # each length's numbers too (the symbolic kernel's)
            x = torch.randn(1, n, 64, device="cuda", dtype=torch.bfloat16)
            out = attn(x)
            assert attn.last_backend == "flex"
            want = reference(x.double())
            check(out, want, TOLERANCE[("cuda", torch.bfloat16)], f"alibi flex at n = {n}")
    assert 1 <= counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])


# the grid last: its ~50 compilations take longest, and a timeout then cuts nothing above
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ATTENTION)
def test_every_backend_matches_float64_math_on_cuda(name: str, dtype: str, case: str) -> None:
    for backend in BACKENDS:
        out, want, used = run_case(name, backend, DTYPES[dtype], case, "cuda", compile_flex=True)
        what = f"{name}, {backend} (ran {used}), {dtype} weights, {case}, cuda"
        check(out, want, TOLERANCE[("cuda", DTYPES[dtype])], what)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sinks_train_through_compiled_flex_lse(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sinks on CUDA's compiled flex run through the log-sum-exp it returns
    (``out · sigmoid(lse - sink)``), so the backward goes through the lse too: a training
    forward and backward at 256 tokens (ALiBi's score_mod, a soft-cap and a softmax scale
    composed; a left-padded row whose first queries see no key), output and every gradient,
    the sinks' included, against the math backend in float64; nothing NaN."""
    torch.manual_seed(0)
    fused = posenc.MultiHeadAttention(
        64, 4, pe=posenc.ALiBi(4), causal=True, backend="flex", sinks=True, softcap=5.0,
        softmax_scale=0.2,
    )  # fmt: skip
    with torch.no_grad():
        fused.sinks.copy_(torch.tensor([-1.0, 0.5, 2.0, 0.0]))
    fused = fused.cuda().to(DTYPES[dtype])
    x = torch.randn(2, 256, 64, device="cuda")
    padding = torch.zeros(2, 256, dtype=torch.bool, device="cuda")
    padding[1, :5] = True
    seen: list[int] = []
    real = flex.with_sinks

    def spy(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
        seen.append(lse.shape[-1])
        return real(out, lse, sinks)

    monkeypatch.setattr(flex, "with_sinks", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out = fused(x.to(DTYPES[dtype]), key_padding_mask=padding)
    assert fused.last_backend == "flex" and seen == [256]  # the lse route, no sink key
    weight = torch.randn_like(x)
    (out.double() * weight).sum().backward()
    grads = {n: p.grad.double().clone() for n, p in fused.named_parameters() if p.requires_grad}
    assert all(torch.isfinite(g).all() for g in grads.values())
    fused.zero_grad(set_to_none=True)
    reference = copy_for_reference(fused)
    want = reference(x.double(), key_padding_mask=padding)
    (want * weight).sum().backward()
    check(out, want.detach(), TOLERANCE[("cuda", DTYPES[dtype])], f"sinks flex {dtype} output")
    wants = {n: p.grad for n, p in reference.named_parameters()}
    check_gradients(grads, wants, DTYPES[dtype], f"sinks flex {dtype}")
    sink_want = wants["sinks"].double()
    assert sink_want.abs().max() > 0
    bound = (1e-4 if dtype == "fp32" else 0.1) * sink_want.abs().max().item()
    assert (grads["sinks"] - sink_want).abs().max().item() <= bound, (grads["sinks"], sink_want)
