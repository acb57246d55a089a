"""posenc.hf.patch on copies and kinds of model beyond one text model: a deepcopy stays
patched with tables of its own (dynamic NTK's state included), a pickled patched model loads
unpatched and patches again, and a vision-language model patches its text model and leaves
its vision tower."""

from __future__ import annotations

import copy
import io

import pytest
import torch

transformers = pytest.importorskip("transformers")

import posenc.hf  # noqa: E402
from posenc.hf.patch import patched_modules  # noqa: E402
from tests.hf import tiny  # noqa: E402
from tests.hf.test_patch import IDS, TOLERANCE, _llama, _logits, _relative  # noqa: E402


def test_a_copy_stays_patched_and_a_pickled_model_loads_unpatched_to_patch_again() -> None:
    # pickling keeps a bound method as getattr(module, "forward"), read back as the class's
    # own forward: the loaded model rotates as transformers does, and patch must not take
    # its leftover marks for a patch (it returned [] and changed nothing)
    model = _llama()
    want = _logits(model, IDS)
    changed = posenc.hf.patch(model)
    patched = _logits(model, IDS)
    twin = copy.deepcopy(model)
    assert posenc.hf.patch(twin) == []
    assert sorted(patched_modules(twin)) == sorted(changed)
    torch.testing.assert_close(_logits(twin, IDS), patched, rtol=0, atol=0)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert list(patched_modules(loaded)) == []
    torch.testing.assert_close(_logits(loaded, IDS), want, rtol=0, atol=0)
    assert sorted(posenc.hf.patch(loaded)) == sorted(changed)
    torch.testing.assert_close(_logits(loaded, IDS), patched, rtol=0, atol=0)
    assert sorted(posenc.hf.unpatch(loaded)) == sorted(changed)
    assert not any("forward" in m.__dict__ for m in loaded.modules())


def test_a_copy_of_a_patched_dynamic_ntk_model_follows_its_own_lengths() -> None:
    # dynamic NTK's frequencies depend on the lengths a rotary module has seen; a copy made
    # after the patch must not read the original's (it read 1.5e-3 off)
    rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    model = _llama(max_position_embeddings=32, rope_parameters=rope)
    reference = copy.deepcopy(model)
    posenc.hf.patch(model)
    twin = copy.deepcopy(model)
    long, middle = IDS.repeat(1, 2)[:, :60], IDS.repeat(1, 2)[:, 3:43]
    _logits(model, long)  # the original goes past the context: its frequencies follow
    assert _relative(_logits(twin, middle), _logits(reference, middle)) <= TOLERANCE


def test_a_vision_language_model_patches_its_text_and_leaves_its_vision_tower() -> None:
    # the vision tower's rotary module (rope_type 'axial') and its attentions
    # (apply_rotary_pos_emb_vision) refused the whole model, as loaded for inference
    vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "out_hidden_size": 64}
    config = tiny.tiny_config(transformers.Qwen2_5_VLConfig, {"vision_config": vision})
    config.text_config = tiny.tiny_config(transformers.Qwen2_5_VLTextConfig)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    modules = dict(model.named_modules())
    tower = [
        n for n, m in modules.items() if n.startswith("model.visual") and "forward" in m.__dict__
    ]
    want = _logits(model, IDS)
    changed = posenc.hf.patch(model)
    assert changed == [
        "model.language_model.rotary_emb",
        "model.language_model.layers.0.self_attn",
        "model.language_model.layers.1.self_attn",
    ]
    assert [
        n for n, m in modules.items() if n.startswith("model.visual") and "forward" in m.__dict__
    ] == tower
    assert _relative(_logits(model, IDS), want) <= TOLERANCE
