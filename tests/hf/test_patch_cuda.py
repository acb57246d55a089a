"""``posenc.hf.patch`` on a GPU (issue #44, item 6): the patched transformers model is the same
model on CUDA, where the rotation is posenc's Triton kernel, in float32 (logits within 2e-5 of
the unpatched model's, the same greedy tokens) and in bfloat16 (rotated q and k closer to the
float64 rotation than transformers' own). ``benchmarks/gpu_patch.sh`` runs this file on a
CUDA machine. Without one (or with ``POSENC_PATCH_TEST_DEVICE=cpu``) it runs on the CPU, where
every rotation the selector plans must be the C kernel's.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` positions, ``d`` head size.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

import posenc.hf  # noqa: E402
from tests.hf import tiny  # noqa: E402
from tests.hf.test_patch import (  # noqa: E402
    IDS,
    TOLERANCE,
    _llama,
    _logits,
    _relative,
    _rotation_errors,
)

DEVICE = os.environ.get("POSENC_PATCH_TEST_DEVICE", "cuda" if torch.cuda.is_available() else "cpu")
#: The kernel the patched rotation must run on the device.
KERNEL = "triton" if DEVICE == "cuda" else "native"
if KERNEL == "native":
    from tests.native import NEEDS_KERNEL

    pytestmark = NEEDS_KERNEL
#: Families of each rotation form the patch reads: half layout, partial rotation, local and
#: global RoPE, GPT-J's pairs, complex products, multi-head latent attention, M-RoPE.
FAMILIES = ("llama", "phi", "gemma2", "gptj", "llama4_text", "deepseek_v2", "qwen2_vl_text")


def _plans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The kernels the patched rotation's selector picks, one entry per call."""
    rotations = importlib.import_module("posenc.hf.rotations")
    picked: list[str] = []
    inner = rotations.select

    def recorded(*args: object, **kwargs: object) -> object:
        plan = inner(*args, **kwargs)
        picked.append("formula" if plan.kernel is None else plan.kernel.name)
        return plan

    monkeypatch.setattr(rotations, "select", recorded)
    return picked


@pytest.mark.parametrize("family", FAMILIES)
def test_the_patched_family_is_the_same_model_on_the_device(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Float32 logits within 2e-5 of the unpatched model's and the same 16 greedy tokens, on
    the device. Under no_grad with tables the C kernel prepared (the CPU) the rotation may
    skip the selector; where the selector runs, it picks the device's kernel."""
    model = tiny.tiny_model(transformers.CONFIG_MAPPING[family]).to(DEVICE)
    ids, prompt = IDS.to(DEVICE), IDS[:1, :8].to(DEVICE)
    kwargs = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
    generate = getattr(model, "generate", lambda *a, **k: None)  # (M-RoPE: a text model)
    with torch.no_grad():
        want, want_tokens = _logits(model, ids), generate(prompt, **kwargs)
        posenc.hf.patch(model)
        picked = _plans(monkeypatch)
        got, got_tokens = _logits(model, ids), generate(prompt, **kwargs)
    assert got.device.type == torch.device(DEVICE).type
    assert _relative(got, want) <= TOLERANCE
    assert got_tokens is want_tokens is None or torch.equal(got_tokens, want_tokens)
    print(family, sorted(set(picked)))
    assert set(picked) <= {KERNEL}, picked
    if DEVICE == "cuda":
        assert picked  # (on CUDA every patched rotation goes through the selector)


def test_training_on_the_device_gives_the_same_gradients() -> None:
    """Under autograd the rotation is out of place and differentiable on the device too."""
    grads = []
    for patched in (False, True):
        model = _llama().to(DEVICE).train()
        if patched:
            posenc.hf.patch(model)
        ids = IDS.to(DEVICE)
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append(model.model.layers[0].self_attn.q_proj.weight.grad)
    assert _relative(grads[1], grads[0]) <= 1e-4


def test_bfloat16_rotation_on_the_device_is_closer_to_float64(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bfloat16 Llama on the device: the patched rotation rounds once from float32 (within
    half an ulp of the largest value), transformers' rounds after each product."""
    measured = {}
    for patched in (False, True):
        model = _llama(attn_implementation="eager").to(DEVICE, torch.bfloat16)
        errors, hooks = _rotation_errors(model, monkeypatch)
        if patched:
            posenc.hf.patch(model)
        _logits(model, IDS.to(DEVICE))
        for hook in hooks:
            hook.remove()
        assert len(errors) == 2 * 2
        measured[patched] = max(errors)
        monkeypatch.undo()
    print(f"bf16 on {DEVICE}: unpatched {measured[False]:.2e}, patched {measured[True]:.2e}")
    assert measured[True] < measured[False]
    assert measured[True] <= 2.0**-8
