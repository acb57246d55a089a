"""The multimodal-RoPE families ``test_multimodal.py`` checks posenc against: per family a
tiny config built in code, the family's own transformers rotary module and
``apply_rotary_pos_emb`` (:func:`reference`), and how posenc reads the config.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

transformers = pytest.importorskip("transformers")

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
