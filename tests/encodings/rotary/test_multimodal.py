"""MultimodalRotaryEmbedding (M-RoPE) against transformers' own code, one family at a time.

For every ``model_type`` of ``MROPE_MODEL_TYPES`` a tiny config is built in code, read by
``RotaryEmbedding.from_hf_config``, and the family's own rotary module and
``apply_rotary_pos_emb`` are run on random q (4 heads) and k (2 heads) at random positions
whose rows (temporal, height, width, ...) all differ; the whole rotated tensors must agree to
float32 rounding, out of place and in place, for float32 and bfloat16 inputs. Then: text
positions give plain RoPE exactly, a float64 transcription of each layout, the other entry
points (``rotate``, ``cos_sin``, ``position_state``), the config fields each family reads
or refuses, and the errors.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

transformers = pytest.importorskip("transformers")
importlib.import_module("transformers.models.qwen2_vl.modeling_qwen2_vl")  # pay at collection

from posenc import MultimodalRotaryEmbedding, RotaryEmbedding, apply_rotary  # noqa: E402
from posenc.encodings.rotary.mrope_layouts import pair_rows  # noqa: E402
from posenc.errors import PosencTypeError, PosencValueError  # noqa: E402
from posenc.hf.model_types import MROPE_MODEL_TYPES  # noqa: E402
from posenc.hf.mrope_layouts import MROPE_LAYOUTS, read_multimodal  # noqa: E402
from tests.misuse import MISSING, Misuse, cases, check  # noqa: E402

transformers.logging.set_verbosity_error()

# transformers forms the angles in float32, posenc in float64: at positions < 128 they differ
# by ~128 * 2**-24 rad, times |q| of a few units
ATOL = RTOL = 2e-5

TINY = {
    "hidden_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_hidden_layers": 1,
    "vocab_size": 64,
    "intermediate_size": 64,
}


def _rope(section: list[int], **extra: Any) -> dict[str, Any]:
    return {"rope_type": "default", "rope_theta": 1e4, "mrope_section": section, **extra}


def _modeling(name: str) -> Any:
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


def _configuration(name: str) -> Any:
    return importlib.import_module(f"transformers.models.{name}.configuration_{name}")


@dataclass(frozen=True)
class Family:
    id: str
    #: the transformers folder (modeling_<module>.py, configuration_<module>.py)
    module: str
    config_class: str
    config: dict[str, Any]
    rotary_class: str
    #: what from_hf_config must read: (head_dim, rotary_dim, interleaved, section, layout)
    expected: tuple[int, int, bool, list[int], str]
    layer_type: str | None = None
    #: a composite config class whose text_config this is (read through it)
    composite: str | None = None

    def make(self) -> Any:
        """The config posenc reads, and the one transformers' rotary module is built from."""
        configuration = _configuration(self.module)
        if self.composite is None:
            config = getattr(configuration, self.config_class)(**self.config)
            return config, config
        outer = getattr(configuration, self.composite)(text_config=dict(self.config))
        return outer, outer.text_config


FAMILIES = [
    Family(
        "qwen2-vl",
        "qwen2_vl",
        "Qwen2VLTextConfig",
        dict(TINY, rope_parameters=_rope([4, 6, 6])),
        "Qwen2VLRotaryEmbedding",
        (32, 32, False, [4, 6, 6], "blocked"),
        composite="Qwen2VLConfig",
    ),
    Family(
        "qwen2.5-vl",
        "qwen2_5_vl",
        "Qwen2_5_VLTextConfig",
        dict(TINY, rope_parameters=_rope([4, 6, 6])),
        "Qwen2_5_VLRotaryEmbedding",
        (32, 32, False, [4, 6, 6], "blocked"),
        composite="Qwen2_5_VLConfig",
    ),
    Family(
        "qwen2.5-omni-text",
        "qwen2_5_omni",
        "Qwen2_5OmniTextConfig",
        dict(TINY, rope_parameters=_rope([6, 4, 6])),
        "Qwen2_5OmniRotaryEmbedding",
        (32, 32, False, [6, 4, 6], "blocked"),
    ),
    Family(
        "qwen2.5-omni-thinker",
        "qwen2_5_omni",
        "Qwen2_5OmniTextConfig",
        dict(TINY, rope_parameters=_rope([4, 6, 6])),
        "Qwen2_5OmniRotaryEmbedding",
        (32, 32, False, [4, 6, 6], "blocked"),
        composite="Qwen2_5OmniThinkerConfig",
    ),
    Family(
        "qwen2.5-omni-talker",
        "qwen2_5_omni",
        "Qwen2_5OmniTalkerConfig",
        dict(TINY, head_dim=32, rope_parameters=_rope([4, 6, 6])),
        "Qwen2_5OmniRotaryEmbedding",
        (32, 32, False, [4, 6, 6], "blocked"),
    ),
    Family(
        "paddleocr-vl",
        "paddleocr_vl",
        "PaddleOCRTextConfig",
        dict(TINY, head_dim=32, rope_parameters=_rope([4, 6, 6])),
        "PaddleOCRRotaryEmbedding",
        (32, 32, False, [4, 6, 6], "blocked"),
    ),
    # GLM: partial rotary, interleaved pairs (GLM-4V, GLM-OCR) or half (GLM-4V-MoE, GLM-Image)
    Family(
        "glm-4v",
        "glm4v",
        "Glm4vTextConfig",
        dict(TINY, rope_parameters=_rope([2, 3, 3], partial_rotary_factor=0.5)),
        "Glm4vTextRotaryEmbedding",
        (32, 16, True, [2, 3, 3], "blocked"),
        composite="Glm4vConfig",
    ),
    Family(
        "glm-4v-moe",
        "glm4v_moe",
        "Glm4vMoeTextConfig",
        dict(TINY, rope_parameters=_rope([2, 3, 3], partial_rotary_factor=0.5)),
        "Glm4vMoeTextRotaryEmbedding",
        (32, 16, False, [2, 3, 3], "blocked"),
    ),
    Family(
        "glm-image",
        "glm_image",
        "GlmImageTextConfig",
        dict(TINY, rope_parameters=_rope([3, 2, 3], partial_rotary_factor=0.5)),
        "GlmImageTextRotaryEmbedding",
        (32, 16, False, [3, 2, 3], "blocked"),
    ),
    Family(
        "glm-ocr",
        "glm_ocr",
        "GlmOcrTextConfig",
        dict(TINY, rope_parameters=_rope([2, 3, 3], partial_rotary_factor=0.5)),
        "GlmOcrTextRotaryEmbedding",
        (32, 16, True, [2, 3, 3], "blocked"),
    ),
    # MRoPE-I (interleaved sections)
    Family(
        "qwen3-vl",
        "qwen3_vl",
        "Qwen3VLTextConfig",
        dict(TINY, head_dim=32, rope_parameters=_rope([6, 5, 5], mrope_interleaved=True)),
        "Qwen3VLTextRotaryEmbedding",
        (32, 32, False, [6, 5, 5], "interleaved"),
        composite="Qwen3VLConfig",
    ),
    Family(
        "qwen3-vl-moe",
        "qwen3_vl_moe",
        "Qwen3VLMoeTextConfig",
        dict(TINY, head_dim=32, rope_parameters=_rope([6, 5, 5])),
        "Qwen3VLMoeTextRotaryEmbedding",
        (32, 32, False, [6, 5, 5], "interleaved"),
    ),
    Family(
        "qwen3-omni-text",
        "qwen3_omni_moe",
        "Qwen3OmniMoeTextConfig",
        dict(TINY, rope_parameters=_rope([6, 5, 5], interleaved=True)),
        "Qwen3OmniMoeThinkerTextRotaryEmbedding",
        (32, 32, False, [6, 5, 5], "interleaved"),
    ),
    Family(
        "qwen3-omni-thinker",
        "qwen3_omni_moe",
        "Qwen3OmniMoeTextConfig",
        dict(TINY, rope_parameters=_rope([6, 5, 5])),
        "Qwen3OmniMoeThinkerTextRotaryEmbedding",
        (32, 32, False, [6, 5, 5], "interleaved"),
        composite="Qwen3OmniMoeThinkerConfig",
    ),
    Family(
        "qwen3-omni-talker",
        "qwen3_omni_moe",
        "Qwen3OmniMoeTalkerTextConfig",
        dict(TINY, rope_parameters=_rope([6, 5, 5])),
        "Qwen3OmniMoeTalkerRotaryEmbedding",
        (32, 32, False, [6, 5, 5], "interleaved"),
    ),
    Family(
        "qwen3.5",
        "qwen3_5",
        "Qwen3_5TextConfig",
        dict(TINY, head_dim=64, rope_parameters=_rope([3, 3, 2], partial_rotary_factor=0.25)),
        "Qwen3_5TextRotaryEmbedding",
        (64, 16, False, [3, 3, 2], "interleaved"),
    ),
    Family(
        "qwen3.5-moe",
        "qwen3_5_moe",
        "Qwen3_5MoeTextConfig",
        dict(TINY, head_dim=64, rope_parameters=_rope([3, 3, 2], partial_rotary_factor=0.25)),
        "Qwen3_5MoeTextRotaryEmbedding",
        (64, 16, False, [3, 3, 2], "interleaved"),
    ),
    # Qwen4-Exp's default sections name fewer pairs than it rotates: row 0 takes the rest
    Family(
        "qwen4-exp",
        "qwen4_exp",
        "Qwen4ExpTextConfig",
        dict(TINY, head_dim=32, rope_parameters=_rope([2, 3, 2])),
        "Qwen4ExpTextRotaryEmbedding",
        (32, 32, False, [2, 3, 2], "interleaved"),
    ),
    Family(
        "cosmos3-edge",
        "cosmos3_edge",
        "Cosmos3EdgeTextConfig",
        dict(TINY, head_dim=32, rope_parameters=_rope([6, 5, 5])),
        "Cosmos3EdgeTextRotaryEmbedding",
        (32, 32, False, [6, 5, 5], "interleaved"),
    ),
    Family(
        "cohere-compass",
        "cohere_compass",
        "CohereCompassTextConfig",
        dict(TINY, rope_parameters={"full_attention": _rope([6, 5, 5])}),
        "CohereCompassRotaryEmbedding",
        (32, 32, False, [6, 5, 5], "interleaved"),
        layer_type="full_attention",
    ),
    # latent attention: the rotated slice is qk_rope_head_dim, interleaved pairs
    Family(
        "hy-v4-vl",
        "hy_v4_vl",
        "HYV4VLTextConfig",
        dict(
            TINY,
            qk_rope_head_dim=32,
            qk_nope_head_dim=16,
            v_head_dim=16,
            q_lora_rank=16,
            kv_lora_rank=16,
            rope_parameters=_rope([6, 5, 5]),
        ),
        "HYV4VLRotaryEmbedding",
        (32, 32, True, [6, 5, 5], "interleaved"),
    ),
    # NeoMME: two rows alternating over the pairs, per layer type, no mrope_section
    Family(
        "neomme-full",
        "neomme",
        "NeoMMEConfig",
        dict(
            TINY,
            head_dim=32,
            num_hidden_layers=2,
            layer_types=["sliding_attention", "full_attention"],
        ),
        "NeoMMERotaryEmbedding",
        (32, 8, False, [2, 2], "interleaved"),
        layer_type="full_attention",
    ),
    Family(
        "neomme-sliding",
        "neomme",
        "NeoMMEConfig",
        dict(
            TINY,
            head_dim=32,
            num_hidden_layers=2,
            layer_types=["sliding_attention", "full_attention"],
        ),
        "NeoMMERotaryEmbedding",
        (32, 32, False, [8, 8], "interleaved"),
        layer_type="sliding_attention",
    ),
    # ERNIE-4.5-VL: config sections are (h, w, t); posenc's are in row order (t, h, w)
    Family(
        "ernie-4.5-vl",
        "ernie4_5_vl_moe",
        "Ernie4_5_VLMoeTextConfig",
        dict(TINY, rope_parameters=_rope([6, 6, 4])),
        "Ernie4_5_VLMoeTextRotaryEmbedding",
        (32, 32, True, [4, 6, 6], "alternating"),
        composite="Ernie4_5_VLMoeConfig",
    ),
    # HunYuan-VL: four rows, sections over the channels
    Family(
        "hunyuan-vl",
        "hunyuan_vl",
        "HunYuanVLTextConfig",
        dict(TINY, head_dim=32, rope_parameters=_rope([4, 4, 4, 4])),
        "HunYuanVLRotaryEmbedding",
        (32, 32, False, [4, 4, 4, 4], "blocked-channels"),
        composite="HunYuanVLConfig",
    ),
    Family(
        "hunyuan-vl-uneven",
        "hunyuan_vl",
        "HunYuanVLTextConfig",
        dict(TINY, head_dim=32, rope_parameters=_rope([3, 5, 2, 6])),
        "HunYuanVLRotaryEmbedding",
        (32, 32, False, [3, 5, 2, 6], "blocked-channels"),
    ),
    # HunYuan's checkpoints say dynamic with an alpha: its rotary module reads NTK-alpha
    Family(
        "hunyuan-vl-ntk-alpha",
        "hunyuan_vl",
        "HunYuanVLTextConfig",
        dict(
            TINY,
            head_dim=32,
            rope_parameters=_rope([4, 4, 4, 4], rope_type="dynamic", alpha=1000.0, factor=1.0),
        ),
        "HunYuanVLRotaryEmbedding",
        (32, 32, False, [4, 4, 4, 4], "blocked-channels"),
    ),
    # a scaled one: YaRN's frequencies and attention factor, with M-RoPE
    Family(
        "qwen2-vl-yarn",
        "qwen2_vl",
        "Qwen2VLTextConfig",
        dict(
            TINY,
            max_position_embeddings=256,
            rope_parameters=_rope(
                [4, 6, 6],
                rope_type="yarn",
                factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
        "Qwen2VLRotaryEmbedding",
        (32, 32, False, [4, 6, 6], "blocked"),
    ),
]
Rotator = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def reference(family: Family, config: Any) -> Rotator:
    """The family's rotary module and ``apply_rotary_pos_emb`` on the first ``cos.shape[-1]``
    channels (the partial families' attention slices those off itself, or its apply does)."""
    modeling = _modeling(family.module)
    rotary = getattr(modeling, family.rotary_class)(config)
    extra = {} if family.layer_type is None else {"layer_type": family.layer_type}

    def rotate(q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = rotary(q, positions, **extra)  # (b, n, r) each
        r = cos.shape[-1]
        q_rot, k_rot = modeling.apply_rotary_pos_emb(q[..., :r], k[..., :r], cos, sin)
        return torch.cat((q_rot, q[..., r:]), -1), torch.cat((k_rot, k[..., r:]), -1)

    return rotate


def _inputs(head_dim: int, rows: int, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """q (2, 4, 7, d), k (2, 2, 7, d) and positions (rows, 2, 7) below 128, rows distinct."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 7, head_dim, generator=gen)
    k = torch.randn(2, 2, 7, head_dim, generator=gen)
    positions = torch.randint(0, 128, (rows, 2, 7), generator=gen)
    for a in range(rows):
        for b in range(a):
            assert not torch.equal(positions[a], positions[b])
    return q, k, positions


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


# --------------------------------------------------------------------------- text and float64

LAYOUT_CASES = [
    ("blocked", [2, 3, 3], False, None),
    ("blocked", [4, 0, 2, 2], True, None),
    ("interleaved", [4, 2, 2], False, None),
    ("interleaved", [1, 2, 1], True, 12),  # partial rotary; row 0 takes what is left
    ("alternating", [2, 3, 3], True, None),
    ("alternating", [1, 1, 1, 1, 1, 1, 1, 1], False, None),
    ("blocked-channels", [1, 3, 2, 2], False, None),
    ("blocked-channels", [3, 1, 2], True, 12),
]
LAYOUT_IDS = [
    f"{layout}-{section}-{'il' if il else 'half'}" for layout, section, il, _ in LAYOUT_CASES
]


def _module(layout: str, section: list[int], interleaved: bool, rotary_dim: int | None):
    return MultimodalRotaryEmbedding(
        16,
        mrope_section=section,
        mrope_layout=layout,
        interleaved=interleaved,
        rotary_dim=rotary_dim,
    )


@pytest.mark.parametrize(
    ("layout", "section", "interleaved", "rotary_dim"), LAYOUT_CASES, ids=LAYOUT_IDS
)
def test_text_positions_rotate_exactly_as_plain_rope(
    layout: str, section: list[int], interleaved: bool, rotary_dim: int | None
) -> None:
    ours = _module(layout, section, interleaved, rotary_dim)
    plain = RotaryEmbedding(16, interleaved=interleaved, rotary_dim=rotary_dim)
    q, k, positions = _inputs(16, len(section))
    text = positions[0]  # (b, n)
    every_row = text.expand(len(section), -1, -1)  # (rows, b, n), equal rows
    for ours_positions, plain_positions in (
        (None, None),
        (text[0], text[0]),
        (text, text),
        (every_row, text),
        (every_row[:, :1], text[:1]),
        (every_row.double() + 0.5, text.double() + 0.5),
    ):
        want = plain(q, k, plain_positions)
        got = ours(q, k, ours_positions)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # a longer sequence (beyond a decode step's few positions) is gathered row by row
    q, k = q.repeat(1, 1, 6, 1), k.repeat(1, 1, 6, 1)  # n = 42
    text = torch.randint(0, 5000, (2, 42))
    want = plain(q, k, text)
    got = ours(q, k, text.expand(len(section), -1, -1))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def _rotate_every_two(x: Tensor) -> Tensor:
    return torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)


def channel_angles(layout: str, section: list[int], positions: Tensor, r: int, interleaved: bool):
    """float64 angles per rotated channel, ``(b, n, r)``, transcribed from the layouts'
    definitions (``hf/mrope_layouts.py``), slicing the per-row angles as transformers does."""
    half, rows = r // 2, len(section)
    theta = 1e4 ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)  # (r/2,)
    per_row = positions.double()[..., None] * theta  # (rows, b, n, r/2)
    if layout == "blocked-channels":  # blocks of 2 s_k over the duplicated channels
        doubled = torch.cat((per_row, per_row), -1)
        blocks = doubled.split([2 * s for s in section], -1)
        angles = torch.cat([block[k] for k, block in enumerate(blocks)], -1)  # (b, n, r)
        if interleaved:  # pair i's two channels are 2i and 2i+1
            angles = torch.stack((angles[..., :half], angles[..., half:]), -1).flatten(-2)
        return angles
    if layout == "blocked":
        pairs = torch.cat([block[k] for k, block in enumerate(per_row.split(section, -1))], -1)
    elif layout == "interleaved":
        pairs = per_row[0].clone()
        for k in range(1, rows):
            pairs[..., k : rows * section[k] : rows] = per_row[k][..., k : rows * section[k] : rows]
    else:  # alternating
        pairs = per_row[0].clone()
        cycled = (rows - 1) * section[1]
        for k in range(1, rows):
            pairs[..., k - 1 : cycled : rows - 1] = per_row[k][..., k - 1 : cycled : rows - 1]
    if interleaved:
        return pairs.repeat_interleave(2, -1)
    return torch.cat((pairs, pairs), -1)


@pytest.mark.parametrize(
    ("layout", "section", "interleaved", "rotary_dim"), LAYOUT_CASES, ids=LAYOUT_IDS
)
def test_rotation_equals_the_float64_formula(
    layout: str, section: list[int], interleaved: bool, rotary_dim: int | None
) -> None:
    ours = _module(layout, section, interleaved, rotary_dim)
    r = ours.rotary_dim
    q, k, positions = _inputs(16, len(section), seed=3)
    positions = positions * 37  # up to ~4700
    angles = channel_angles(layout, section, positions, r, interleaved)[:, None]  # (b, 1, n, r)
    turn = _rotate_every_two if interleaved else _rotate_half
    for x, got in zip((q, k), ours(q.double(), k.double(), positions), strict=True):
        x = x.double()
        rot = x[..., :r] * angles.cos() + turn(x[..., :r]) * angles.sin()
        want = torch.cat((rot, x[..., r:]), -1)
        assert_close(got, want, atol=1e-12, rtol=0)
    for x, got in zip((q, k), ours(q, k, positions), strict=True):  # float32 tables
        x = x.double()
        rot = x[..., :r] * angles.cos() + turn(x[..., :r]) * angles.sin()
        assert_close(got.double(), torch.cat((rot, x[..., r:]), -1), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("layout", "section", "interleaved", "rotary_dim"), LAYOUT_CASES, ids=LAYOUT_IDS
)
def test_rotate_position_state_and_cos_sin_agree_with_forward(
    layout: str, section: list[int], interleaved: bool, rotary_dim: int | None
) -> None:
    ours = _module(layout, section, interleaved, rotary_dim)
    q, k, positions = _inputs(16, len(section), seed=4)
    want_q, want_k = ours(q, k, positions)
    assert torch.equal(ours.rotate(q, positions), want_q)
    assert torch.equal(ours.rotate(k.clone(), positions, inplace=True), want_k)
    state = ours.position_state(positions, torch.zeros(2, 7, 8))
    got_q, got_k = state(q, k)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    q_copy, k_copy = q.clone(), k.clone()
    got_q, got_k = state(q_copy, k_copy, inplace=True)
    assert got_q is q_copy and torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    if layout == "blocked-channels":
        with pytest.raises(PosencValueError, match="blocked-channels"):
            ours.cos_sin(positions, 7, dtype=torch.float32)
        return
    cos, sin = ours.cos_sin(positions, 7, dtype=torch.float32)
    assert cos.shape == (2, 1, 7, ours.rotary_dim // 2)
    assert torch.equal(apply_rotary(q, cos, sin, interleaved=interleaved), want_q)


def test_pair_rows_of_each_layout() -> None:
    assert pair_rows("blocked", (2, 1, 3), 6) == ([0, 0, 1, 2, 2, 2],) * 2
    assert pair_rows("interleaved", (4, 2, 2), 8) == ([0, 1, 2, 0, 1, 2, 0, 0],) * 2
    assert pair_rows("alternating", (2, 3, 3), 8) == ([1, 2, 1, 2, 1, 2, 0, 0],) * 2
    assert pair_rows("blocked-channels", (1, 2, 1), 4) == ([0, 0, 1, 1], [1, 1, 2, 2])


def test_autograd_flows_through_the_rotation() -> None:
    ours = MultimodalRotaryEmbedding(16, mrope_section=[3, 3, 2], mrope_layout="interleaved")
    q, k, positions = _inputs(16, 3)
    q.requires_grad_(True)
    got_q, _ = ours(q, k, positions)
    got_q.square().sum().backward()
    assert_close(q.grad, 2 * q.detach(), atol=1e-5, rtol=1e-5)  # a rotation keeps the norm
    # blocked-channels turns q twice and keeps half of each: gradients of both turns
    split = MultimodalRotaryEmbedding(
        16, mrope_section=[2, 2, 2, 2], mrope_layout="blocked-channels"
    )
    x = torch.randn(1, 2, 3, 16, dtype=torch.float64, requires_grad=True)
    rows = torch.tensor([[0, 5, 9], [1, 7, 2], [3, 3, 8], [6, 0, 4]])[:, None]
    assert torch.autograd.gradcheck(lambda x: split(x, x.detach(), rows)[0], (x,))


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


# --------------------------------------------------------------------------- errors


def _m(**kwargs: Any) -> MultimodalRotaryEmbedding:
    return MultimodalRotaryEmbedding(16, **{"mrope_section": [2, 3, 3], **kwargs})


def _call(positions: Tensor, **kwargs: Any) -> Callable[[], object]:
    q, k, _ = _inputs(16, 3)
    return lambda: _m(**kwargs)(q, k, positions)


# fmt: off
MISUSE = [
    Misuse("no-section", lambda: MultimodalRotaryEmbedding(16), PosencValueError,
           "mrope_section", MISSING),
    Misuse("section-sum", lambda: _m(mrope_section=[2, 2, 2]), PosencValueError,
           "mrope_section", [2, 2, 2]),
    Misuse("section-negative", lambda: _m(mrope_section=[10, -1, -1]), PosencValueError,
           "mrope_section", [10, -1, -1]),
    Misuse("section-float", lambda: _m(mrope_section=[2.0, 3, 3]), PosencTypeError,
           "mrope_section", [2.0, 3, 3]),
    Misuse("section-str", lambda: _m(mrope_section="233"), PosencTypeError, "mrope_section",
           "str"),
    Misuse("section-empty", lambda: _m(mrope_section=[]), PosencValueError, "mrope_section", []),
    Misuse("layout-name", lambda: _m(mrope_layout="mrope-i"), PosencValueError, "mrope_layout",
           "mrope-i"),
    Misuse("layout-type", lambda: _m(mrope_layout=3), PosencTypeError, "mrope_layout", "int"),
    Misuse("interleaved-past-the-pairs", lambda: _m(mrope_section=[0, 4, 4],
                                                    mrope_layout="interleaved"),
           PosencValueError, "mrope_section", [0, 4, 4]),
    Misuse("alternating-unequal", lambda: _m(mrope_section=[2, 4, 2], mrope_layout="alternating"),
           PosencValueError, "mrope_section", [2, 4, 2]),
    Misuse("rows", _call(torch.zeros(2, 2, 7, dtype=torch.long)), PosencValueError, "positions",
           (2, 2, 7)),
    Misuse("rows-batch", _call(torch.zeros(3, 3, 7, dtype=torch.long)), PosencValueError,
           "positions", (3, 3, 7)),
    Misuse("rows-seq", _call(torch.zeros(3, 2, 6, dtype=torch.long)), PosencValueError,
           "positions", (3, 2, 6)),
    Misuse("rows-negative", _call(torch.full((3, 2, 7), -1)), PosencValueError, "positions", -1),
    Misuse("rows-bool", _call(torch.zeros(3, 2, 7, dtype=torch.bool)), PosencTypeError,
           "positions", "torch.bool"),
    Misuse("rows-nan", _call(torch.full((3, 2, 7), float("nan"))), PosencValueError, "positions",
           "nan"),
    # M-RoPE positions without their batch axis (3, n), for a batch of 2: named as such
    Misuse("rows-without-batch", _call(torch.zeros(3, 7, dtype=torch.long)), PosencValueError,
           "(rows, batch, seq)", (3, 7)),
]
# fmt: on


@pytest.mark.parametrize("case", cases(MISUSE))
def test_bad_arguments_are_refused_naming_them(case: Misuse) -> None:
    check(case)


def test_with_scaling_refuses_the_multimodal_module() -> None:
    with pytest.raises(PosencTypeError, match="MultimodalRotaryEmbedding"):
        _m().with_scaling({"rope_type": "linear", "factor": 2.0})


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
