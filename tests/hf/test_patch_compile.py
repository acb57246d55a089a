"""A patched transformers model under ``torch.compile``: every layer's attention runs one
patched function with a code object of its own, so torch's compiled-code cache (kept per
code object, the compiled graph put in the globals of the frame it compiled) serves each
layer, and the unpatched model compiled in the same process, from the right globals."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import posenc.hf  # noqa: E402
from tests.hf.test_patch import IDS, TOLERANCE, _llama, _logits, _relative  # noqa: E402


def _attention_forwards(model: torch.nn.Module) -> list:
    attention = transformers.models.llama.modeling_llama.LlamaAttention
    return [m.forward.__func__ for m in model.modules() if isinstance(m, attention)]


def test_every_layer_runs_one_patched_function_with_its_own_code() -> None:
    model = _llama()
    posenc.hf.patch(model)
    forwards = _attention_forwards(model)
    assert len(forwards) == 2 and forwards[0] is forwards[1]
    inner = forwards[0]
    while hasattr(inner, "__wrapped__"):
        inner = inner.__wrapped__
    original = transformers.models.llama.modeling_llama.LlamaAttention.forward
    while hasattr(original, "__wrapped__"):
        original = original.__wrapped__
    assert inner.__code__ is not original.__code__ and inner.__code__ == original.__code__


@pytest.mark.slow
def test_compiled_patched_model_beside_the_unpatched_one() -> None:
    """Two layers, and the unpatched model compiled first: before, the patched layers read
    the compiled graph from globals that did not hold it (``NameError``)."""
    model, patched = _llama(), _llama()
    want = _logits(model, IDS)
    posenc.hf.patch(patched)
    torch._dynamo.reset()
    try:
        compiled = _logits(torch.compile(model), IDS)
        torch.testing.assert_close(compiled, want, rtol=1e-5, atol=1e-5)
        assert _relative(_logits(torch.compile(patched), IDS), want) <= TOLERANCE
    finally:
        torch._dynamo.reset()
