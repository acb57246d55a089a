"""MultimodalRotaryEmbedding (M-RoPE) against transformers' own code, one family at a time.

For every ``model_type`` of ``MROPE_MODEL_TYPES`` a tiny config is built in code, read by
``RotaryEmbedding.from_hf_config``, and the family's own rotary module and
``apply_rotary_pos_emb`` are run on random q (4 heads) and k (2 heads) at random positions
whose rows (temporal, height, width, ...) all differ; the whole rotated tensors must agree to
float32 rounding, out of place and in place, for float32 and bfloat16 inputs. Then: the
config fields each family reads or refuses (the formulas and the errors are
``test_multimodal_formula.py``'s).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.testing import assert_close

transformers = pytest.importorskip("transformers")
importlib.import_module("transformers.models.qwen2_vl.modeling_qwen2_vl")  # pay at collection

from posenc import MultimodalRotaryEmbedding, RotaryEmbedding  # noqa: E402
from posenc.errors import PosencTypeError, PosencValueError  # noqa: E402
from posenc.hf.model_types import MROPE_MODEL_TYPES  # noqa: E402
from posenc.hf.mrope_layouts import MROPE_LAYOUTS, read_multimodal  # noqa: E402
from tests.encodings.rotary.mrope_families import (  # noqa: E402
    FAMILIES,
    TINY,
    Family,
    _configuration,
    _rope,
    reference,
)
from tests.encodings.rotary.test_multimodal_formula import _inputs  # noqa: E402
from tests.misuse import MISSING, Misuse, cases, check  # noqa: E402

transformers.logging.set_verbosity_error()

# transformers forms the angles in float32, posenc in float64: at positions < 128 they differ
# by ~128 * 2**-24 rad, times |q| of a few units
ATOL = RTOL = 2e-5


@pytest.mark.parametrize("family", FAMILIES, ids=[f.id for f in FAMILIES])
def test_rotated_qk_match_the_familys_own_code(family: Family) -> None:
    config, text_config = family.make()
    ours = RotaryEmbedding.from_hf_config(config, layer_type=family.layer_type)
    assert isinstance(ours, MultimodalRotaryEmbedding)
    head_dim, rotary_dim, interleaved, section, layout = family.expected
    assert (ours.head_dim, ours.rotary_dim, ours.interleaved) == (head_dim, rotary_dim, interleaved)
    assert (list(ours.mrope_section), ours.mrope_layout) == (section, layout)
    theirs = reference(family, text_config)
    q, k, positions = _inputs(head_dim, len(section))
    for dtype in (torch.float32, torch.bfloat16):
        q_in, k_in = q.to(dtype), k.to(dtype)
        want_q, want_k = theirs(q_in.float(), k_in.float(), positions)
        for inplace in (False, True):
            q_arg, k_arg = q_in.clone(), k_in.clone()
            got_q, got_k = ours(q_arg, k_arg, positions, inplace=inplace)
            assert (got_q is q_arg and got_k is k_arg) is inplace
            assert got_q.dtype == dtype and got_k.dtype == dtype
            if dtype is torch.float32:
                assert_close(got_q, want_q, atol=ATOL, rtol=RTOL)
                assert_close(got_k, want_k, atol=ATOL, rtol=RTOL)
            else:  # rotated in float32 and cast once: within one bf16 rounding
                exact_q, exact_k = ours(q_in.float(), k_in.float(), positions)
                assert torch.equal(got_q, exact_q.to(dtype))
                assert torch.equal(got_k, exact_k.to(dtype))
                assert_close(got_q.float(), want_q, atol=ATOL, rtol=2**-8)
                assert_close(got_k.float(), want_k, atol=ATOL, rtol=2**-8)


def test_every_multimodal_model_type_has_a_layout_and_is_tested_here() -> None:
    assert set(MROPE_LAYOUTS) == set(MROPE_MODEL_TYPES)
    tested = {family.make()[0].model_type for family in FAMILIES}
    tested |= {family.make()[1].model_type for family in FAMILIES}
    assert tested >= MROPE_MODEL_TYPES


# A wrong layout, channel order or section order is far from the family's code: the
# comparison above tells them apart.
WRONG = [
    ("qwen2-vl", {"mrope_layout": "interleaved", "mrope_section": [6, 5, 5]}),
    ("qwen3-vl", {"mrope_layout": "blocked"}),
    ("glm-4v", {"interleaved": False}),
    ("ernie-4.5-vl", {"mrope_layout": "blocked"}),
    ("ernie-4.5-vl", {"mrope_section": [6, 6, 4], "mrope_layout": "blocked"}),
    ("hunyuan-vl", {"mrope_layout": "blocked"}),
]


@pytest.mark.parametrize(("family_id", "misread"), WRONG, ids=[f"{f}-{m}" for f, m in WRONG])
def test_a_wrong_reading_is_far_from_the_familys_code(
    family_id: str, misread: dict[str, Any]
) -> None:
    family = next(f for f in FAMILIES if f.id == family_id)
    config, text_config = family.make()
    ours = RotaryEmbedding.from_hf_config(config, **misread)
    q, k, positions = _inputs(ours.head_dim, ours.rows)
    want_q, want_k = reference(family, text_config)(q, k, positions)
    got_q, got_k = ours(q, k, positions)
    assert (got_q - want_q).abs().max() > 1.0
    assert (got_k - want_k).abs().max() > 1.0


def test_length_dependent_scaling_follows_the_largest_position_of_any_row() -> None:
    """Dynamic NTK: transformers' ``dynamic_rope_update`` grows the base with the largest
    position of all rows, and resets within the original context; one module on each side,
    kept across the calls as in generation."""
    config = _configuration("qwen2_vl").Qwen2VLTextConfig(
        **TINY,
        max_position_embeddings=64,
        rope_parameters=_rope([4, 6, 6], rope_type="dynamic", factor=2.0),
    )
    ours = RotaryEmbedding.from_hf_config(config)
    theirs = reference(FAMILIES[0], config)
    gen = torch.Generator().manual_seed(1)
    for step, top in enumerate((40, 200, 30, 120)):
        q, k, _ = _inputs(32, 3, seed=step)
        positions = torch.randint(0, 20, (3, 2, 7), generator=gen)
        positions[2, 1, 3] = top  # only the width row reaches it
        want_q, want_k = theirs(q, k, positions)
        got_q, got_k = ours(q, k, positions)
        assert_close(got_q, want_q, atol=ATOL, rtol=RTOL)
        assert_close(got_k, want_k, atol=ATOL, rtol=RTOL)


# --------------------------------------------------------------------------- configs


def test_default_sections_are_the_familys_when_the_config_names_none() -> None:
    config = _configuration("qwen2_vl").Qwen2VLTextConfig(
        hidden_size=256, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1
    )
    ours = RotaryEmbedding.from_hf_config(config)
    assert list(ours.mrope_section) == [16, 24, 24]
    q, k, positions = _inputs(128, 3)
    family = FAMILIES[0]
    want = reference(family, config)(q, k, positions)
    got = ours(q, k, positions)
    assert_close(got, want, atol=ATOL, rtol=RTOL)


def test_a_config_json_reads_like_the_config_object() -> None:
    for family in FAMILIES:
        config, text_config = family.make()
        raw = text_config.to_dict()
        got = RotaryEmbedding.from_hf_config(raw, layer_type=family.layer_type)
        want = RotaryEmbedding.from_hf_config(config, layer_type=family.layer_type)
        assert repr(got) == repr(want), family.id


@pytest.mark.parametrize(
    ("module", "composite", "rotary_class"),
    [
        ("qwen2_vl", "Qwen2VLConfig", "Qwen2VLRotaryEmbedding"),
        ("qwen2_5_vl", "Qwen2_5_VLConfig", "Qwen2_5_VLRotaryEmbedding"),
    ],
)
def test_a_flat_composite_config_json_reads_as_its_text_model(
    module: str, composite: str, rotary_class: str
) -> None:
    """Qwen2-VL's and Qwen2.5-VL's published config.json: model_type qwen2_vl / qwen2_5_vl with
    the text fields at the top level and no text_config; transformers builds the text config
    from them. Read against the rotary module transformers builds from the same dict."""
    raw = {
        "model_type": module,
        **TINY,
        "rope_theta": 1e4,
        "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
    }
    ours = RotaryEmbedding.from_hf_config(raw)
    assert isinstance(ours, MultimodalRotaryEmbedding)
    text_config = getattr(_configuration(module), composite)(**raw).text_config
    family = Family(module, module, "", {}, rotary_class, (32, 32, False, [4, 6, 6], "blocked"))
    theirs = reference(family, text_config)
    q, k, positions = _inputs(32, 3)
    want_q, want_k = theirs(q, k, positions)
    got_q, got_k = ours(q, k, positions)
    assert_close(got_q, want_q, atol=ATOL, rtol=RTOL)
    assert_close(got_k, want_k, atol=ATOL, rtol=RTOL)


def test_legacy_spellings_are_read_as_the_config_classes_read_them() -> None:
    # Qwen2-VL's checkpoints: rope_scaling {"type": "mrope"}, renamed to default on load
    raw = {
        "model_type": "qwen2_vl_text",
        **TINY,
        "rope_theta": 1e4,
        "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
    }
    ours = RotaryEmbedding.from_hf_config(raw)
    assert (ours.rope_type, list(ours.mrope_section)) == ("default", [4, 6, 6])
    # HunYuan's checkpoints: xdrope_section
    raw = {
        "model_type": "hunyuan_vl_text",
        **TINY,
        "head_dim": 32,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "xdrope_section": [4] * 4},
    }
    ours = RotaryEmbedding.from_hf_config(raw)
    assert (list(ours.mrope_section), ours.mrope_layout) == ([4] * 4, "blocked-channels")


def test_keyword_arguments_override_the_config() -> None:
    config, _ = FAMILIES[0].make()
    ours = RotaryEmbedding.from_hf_config(config, mrope_section=[8, 4, 4])
    assert list(ours.mrope_section) == [8, 4, 4]
    llama = transformers.LlamaConfig(**TINY)
    made = RotaryEmbedding.from_hf_config(llama, mrope_section=[4, 6, 6])
    assert isinstance(made, MultimodalRotaryEmbedding)
    assert type(RotaryEmbedding.from_hf_config(llama)) is RotaryEmbedding


def _config(module: str, name: str, **kwargs: Any) -> Callable[[], object]:
    return lambda: getattr(_configuration(module), name)(**kwargs)


def _read(make: Callable[[], object], **kwargs: Any) -> Callable[[], object]:
    return lambda: RotaryEmbedding.from_hf_config(make(), **kwargs)


# fmt: off
CONFIG_MISUSE = [
    # HunYuan-VL's rotary code needs the sections (it has no default)
    Misuse("hunyuan-without-sections", _read(_config("hunyuan_vl", "HunYuanVLConfig")),
           PosencValueError, "mrope_section", "hunyuan_vl_text"),
    Misuse("hunyuan-both-spellings-differ", _read(lambda: {
        "model_type": "hunyuan_vl_text", **TINY, "head_dim": 32, "rope_parameters": {
            "rope_theta": 1e4, "mrope_section": [4] * 4, "xdrope_section": [2, 6, 4, 4]}}),
           PosencValueError, "xdrope_section", [2, 6, 4, 4]),
    Misuse("sections-do-not-sum", _read(_config(
        "qwen2_vl", "Qwen2VLTextConfig", **TINY, rope_parameters=_rope([4, 4, 4]))),
           PosencValueError, "mrope_section", [4, 4, 4]),
    Misuse("four-sections-for-three-rows", _read(_config(
        "qwen2_vl", "Qwen2VLTextConfig", **TINY, rope_parameters=_rope([4, 4, 4, 4]))),
           PosencValueError, "mrope_section", [4, 4, 4, 4]),
    Misuse("ernie-scaled", _read(lambda: {
        "model_type": "ernie4_5_vl_moe_text", **TINY,
        "rope_parameters": _rope([6, 6, 4], rope_type="linear", factor=2.0)}),
           PosencValueError, "rope_type", "linear"),
    Misuse("ernie-unequal-hw", _read(_config(
        "ernie4_5_vl_moe", "Ernie4_5_VLMoeTextConfig", **TINY, rope_parameters=_rope([8, 4, 4]))),
           PosencValueError, "mrope_section", [4, 8, 4]),
    # (NeoMME's config class refuses it too)
    Misuse("neomme-rows-of-unequal-size", _read(lambda: {
        "model_type": "neomme", **TINY, "head_dim": 24, "layer_types": ["full_attention"],
        "rope_parameters": {"full_attention": {
            "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25}}},
        layer_type="full_attention"), PosencValueError, "rotary_dim", 6),
    Misuse("section-not-a-list", _read(lambda: {
        "model_type": "qwen3_vl_text", **TINY, "rope_parameters": _rope(16)}),
           PosencTypeError, "mrope_section", 16),
    Misuse("multimodal-class-for-1d-rope",
           lambda: MultimodalRotaryEmbedding.from_hf_config(transformers.LlamaConfig(**TINY)),
           PosencValueError, "mrope_section", MISSING),
]
# fmt: on


@pytest.mark.parametrize("case", cases(CONFIG_MISUSE))
def test_configs_that_cannot_be_read_exactly_are_refused_naming_the_field(case: Misuse) -> None:
    check(case)


def test_a_layer_types_view_of_a_heterogeneous_config_hides_the_multimodal_fields_too() -> None:
    """NeoMME keeps fields per layer (per_layer_config): the generic reading takes each layer
    type's view of the config, which must be read as the whole config is."""
    family = next(f for f in FAMILIES if f.id == "neomme-full")
    config, _ = family.make()
    assert config.is_heterogeneous
    view, _ = read_multimodal(config, "neomme", "full_attention")
    layer = view.per_layer_config["full_attention"]
    assert (layer.model_type, layer.text_config, layer.rope_interleave) == ("", None, False)
    raw_view, _ = read_multimodal(config.to_dict(), "neomme", "full_attention")
    assert isinstance(raw_view, dict) and raw_view["model_type"] == ""
