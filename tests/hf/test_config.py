"""RotaryEmbedding.from_hf_config against transformers' own rotary code, one model family at a time.

For each family a tiny config is built in code, transformers' rotary computation for that family
is run on random q, k at explicit positions (one row at an offset of 100, one from 0), and the
whole rotated tensors are compared with posenc's. The reference is the family's own code: its
``*RotaryEmbedding`` module and ``apply_rotary_pos_emb`` (partial families rotate the first
``cos.shape[-1]`` channels, as their attention does), GPT-J/CodeGen's sinusoidal table and
``rotate_every_two``, DeepSeek-V2/Llama 4's complex multiply, DeepSeek-V3's de-interleaving one,
OpenAI's privacy filter's per-pair table, Gemma 4's one-tensor apply, DeepSeek-V4's apply on the
trailing slice of whole heads. The list of model types read without a warning
(``KNOWN_MODEL_TYPES``) is checked against the installed transformers' source.
"""

from __future__ import annotations

import importlib
import json
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

transformers = pytest.importorskip("transformers")
# The first modeling imports load transformers' model machinery (seconds): pay at collection.
importlib.import_module("transformers.models.llama.modeling_llama")
importlib.import_module("transformers.models.gptj.modeling_gptj")

from posenc import RotaryEmbedding  # noqa: E402
from posenc.errors import PosencTypeError, PosencValueError  # noqa: E402
from posenc.hf import config as hf_config  # noqa: E402
from posenc.hf import model_types  # noqa: E402
from posenc.hf.config import query_scale_from_hf_config, rotary_arguments_from_hf_config  # noqa: E402
from posenc.hf.model_types import (  # noqa: E402
    CHECKED_TRANSFORMERS_VERSION,
    KNOWN_MODEL_TYPES,
    MROPE_MODEL_TYPES,
)
from tests.hf.test_rope_census import NOT_SEQUENCE  # noqa: E402
from tests.misuse import MISSING, Misuse, cases, check  # noqa: E402
from tests.peers import parameters, require_internals  # noqa: E402

transformers.logging.set_verbosity_error()

# Transformers forms angles in float32 (inv_freq and position * inv_freq), posenc in float64:
# at positions ~116 the angles differ by ~116 * 2**-24 ~ 7e-6 rad, times |q| of a few units.
ATOL = RTOL = 2e-5

POSITIONS = torch.stack((torch.arange(100, 116), torch.arange(16)))  # (b=2, n=16)


def _modeling(name: str) -> Any:
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


def _qk(head_dim: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """q with 4 heads, k with 2 (grouped-query): (2, h, 16, head_dim), seeded."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 16, head_dim, generator=gen)
    k = torch.randn(2, 2, 16, head_dim, generator=gen)
    return q, k


def _tiny(**kwargs: Any) -> dict[str, Any]:
    return {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "vocab_size": 64,
        "intermediate_size": 128,
        **kwargs,
    }


# --------------------------------------------------------------------------- references
# A reference is built once from a config (as a model builds its rotary module once) and then
# rotates (q, k, positions) with q, k as (b, h, n, d), returning the rotated pair.

Rotator = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
Reference = Callable[[Any], Rotator]


def cos_sin_reference(
    module: str, rotary_class: str, *, layer_type: str | None = None
) -> Reference:
    """The Llama pattern: ``cos, sin = XRotaryEmbedding(config)(x, position_ids)``, then
    ``apply_rotary_pos_emb`` on the first ``cos.shape[-1]`` channels (the attention of the
    partial families slices those off itself)."""

    def build(config: Any) -> Rotator:
        modeling = _modeling(module)
        rotary = getattr(modeling, rotary_class)(config)
        extra = {} if layer_type is None else {"layer_type": layer_type}

        def rotate(q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
            cos, sin = rotary(q, positions, **extra)  # (b, n, r) each
            r = cos.shape[-1]
            q_rot, k_rot = modeling.apply_rotary_pos_emb(q[..., :r], k[..., :r], cos, sin)
            return torch.cat((q_rot, q[..., r:]), dim=-1), torch.cat((k_rot, k[..., r:]), dim=-1)

        return rotate

    return build


def gptj_reference(module: str) -> Reference:
    """GPT-J / CodeGen: a ``[sin | cos]`` table of ``rotary_dim`` columns gathered by position,
    ``apply_rotary_pos_emb(tensor, sin, cos)`` on ``(b, n, h, rotary_dim)`` slices."""

    def build(config: Any) -> Rotator:
        modeling = _modeling(module)
        r = config.rotary_dim
        table = modeling.create_sinusoidal_positions(config.max_position_embeddings, r)

        def rotate(q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
            sin, cos = table[positions].split(r // 2, dim=-1)  # (b, n, r/2) each

            def one(x: Tensor) -> Tensor:
                x = x.transpose(1, 2)  # (b, n, h, d), GPT-J's layout
                rot = modeling.apply_rotary_pos_emb(x[..., :r], sin, cos)
                return torch.cat((rot, x[..., r:]), dim=-1).transpose(1, 2)

            return one(q), one(k)

        return rotate

    return build


def complex_reference(module: str, rotary_class: str, *, heads_second: bool) -> Reference:
    """DeepSeek-V2 (q, k as (b, h, n, d)) and Llama 4 (as (b, n, h, d)): ``freqs_cis`` from the
    rotary module, ``apply_rotary_emb`` multiplies the pairs as complex numbers."""

    def build(config: Any) -> Rotator:
        modeling = _modeling(module)
        rotary = getattr(modeling, rotary_class)(config)

        def rotate(q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
            freqs_cis = rotary(q, positions)  # (b, n, r/2) complex
            if heads_second:
                return modeling.apply_rotary_emb(q, k, freqs_cis)
            q_out, k_out = modeling.apply_rotary_emb(
                q.transpose(1, 2), k.transpose(1, 2), freqs_cis
            )
            return q_out.transpose(1, 2), k_out.transpose(1, 2)

        return rotate

    return build


def deinterleaving_reference(
    module: str, rotary_class: str, *, layer_type: str | None = None
) -> Reference:
    """DeepSeek-V3 with ``rope_interleave``: interleaved pairs rotated, written de-interleaved."""

    def build(config: Any) -> Rotator:
        modeling = _modeling(module)
        rotary = getattr(modeling, rotary_class)(config)
        extra = {} if layer_type is None else {"layer_type": layer_type}

        def rotate(q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
            cos, sin = rotary(q, positions, **extra)
            return modeling.apply_rotary_pos_emb_interleave(q, k, cos, sin)

        return rotate

    return build


def one_tensor_reference(module: str, rotary_class: str, *, layer_type: str) -> Reference:
    """The Gemma 4 family: per-layer-type tables, ``apply_rotary_pos_emb(x, cos, sin)`` on q
    and k one at a time (its attention passes ``(b, n, h, d)`` with ``unsqueeze_dim=2``; the
    same rotation on ``(b, h, n, d)`` with the default 1)."""

    def build(config: Any) -> Rotator:
        modeling = _modeling(module)
        rotary = getattr(modeling, rotary_class)(config)

        def rotate(q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
            cos, sin = rotary(q, positions, layer_type)  # (b, n, d) each
            return modeling.apply_rotary_pos_emb(q, cos, sin), modeling.apply_rotary_pos_emb(
                k, cos, sin
            )

        return rotate

    return build


def trailing_slice_reference(module: str, rotary_class: str, *, layer_type: str) -> Reference:
    """DeepSeek-V4: one cos/sin column per pair, and ``apply_rotary_pos_emb(x, cos, sin)`` on
    whole heads, turning interleaved pairs of their trailing ``2 * cos.shape[-1]`` channels.
    The reference hands it heads of 8 random channels in front of q (or k) and checks that
    those pass through; it returns the trailing slice, what posenc rotates."""

    def build(config: Any) -> Rotator:
        modeling = _modeling(module)
        rotary = getattr(modeling, rotary_class)(config)

        def rotate(q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
            cos, sin = rotary(q, positions, layer_type=layer_type)  # (b, n, r/2) each

            def one(x: Tensor) -> Tensor:
                nope = torch.randn(*x.shape[:-1], 8, generator=torch.Generator().manual_seed(5))
                out = modeling.apply_rotary_pos_emb(torch.cat((nope, x), dim=-1), cos, sin)
                assert torch.equal(out[..., :8], nope)
                return out[..., 8:]

            return one(q), one(k)

        return rotate

    return build


def per_pair_reference(module: str, rotary_class: str) -> Reference:
    """OpenAI's privacy filter: the rotary module gives one cos/sin column per pair,
    ``(b, n, r/2)``, and ``apply_rotary_pos_emb`` turns the pairs of the whole head."""

    def build(config: Any) -> Rotator:
        modeling = _modeling(module)
        rotary = getattr(modeling, rotary_class)(config)

        def rotate(q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
            cos, sin = rotary(q, positions)  # (b, n, r/2) each
            return modeling.apply_rotary_pos_emb(q, k, cos, sin)

        return rotate

    return build


def deinterleave(x: Tensor) -> Tensor:
    """posenc's interleaved output in DeepSeek-V3's channel order: ``cat(x[0::2], x[1::2])``."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


# --------------------------------------------------------------------------- the families


def _longrope(pairs: int, original: int, **extra: Any) -> dict[str, Any]:
    return {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.05 * i for i in range(pairs)],
        "long_factor": [1.5 + 0.4 * i for i in range(pairs)],
        "original_max_position_embeddings": original,
        **extra,
    }


# multi-head latent attention: the rotary part of each head is its own qk_rope_head_dim slice
MLA = _tiny(
    qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16, q_lora_rank=16
)
# the Perception Encoder's audio and video towers (which take no vocab_size)
PE_ENCODER = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "head_dim": 16,
    "num_hidden_layers": 1,
    "intermediate_size": 128,
}
GEMMA3 = _tiny(
    num_hidden_layers=2,
    layer_types=["sliding_attention", "full_attention"],
    num_key_value_heads=2,
    head_dim=32,
)
# Gemma 4: 16 channels per head on the 5 sliding layers, 32 on the full-attention one
GEMMA4 = _tiny(num_hidden_layers=6, num_key_value_heads=2, head_dim=16, global_head_dim=32)
# HunYuan's checkpoints (Hunyuan-7B, -A13B): "dynamic" with an alpha, and keys it never reads
HUNYUAN_ALPHA = {
    "alpha": 1000.0,
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "type": "dynamic",
}
# Ministral 3's RoPE dictionary: YaRN plus a query scale and a length no rotary code reads
MINISTRAL3_YARN = {
    "type": "yarn",
    "rope_theta": 1e6,
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "max_position_embeddings": 256,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale_all_dim": 1.0,
    "mscale": 1.0,
    "llama_4_scaling_beta": 0.1,
}
# Mistral 4: latent attention, heads of 16 + 16 channels, the trailing 16 rotated
MISTRAL4 = _tiny(
    qk_rope_head_dim=16,
    qk_nope_head_dim=16,
    v_head_dim=16,
    kv_lora_rank=16,
    q_lora_rank=16,
    n_routed_experts=4,
    moe_intermediate_size=32,
)
# DeepSeek-V4: heads of 32, the trailing 16 rotated; YaRN on the compressed layers
DEEPSEEK_V4 = _tiny(
    head_dim=32,
    qk_rope_head_dim=16,
    num_hidden_layers=2,
    q_lora_rank=16,
    moe_intermediate_size=32,
    n_routed_experts=4,
    rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
)
# dots3: latent attention of 16 + 16 on indexed layers, 32 + 16 on sliding ones (per layer)
DOTS3 = _tiny(
    num_key_value_heads=4,
    head_dim=32,
    qk_rope_head_dim=16,
    qk_nope_head_dim=16,
    v_head_dim=16,
    kv_lora_rank=16,
    q_lora_rank=16,
    num_hidden_layers=4,
    moe_intermediate_size=32,
    n_routed_experts=4,
    num_experts_per_tok=2,
    shared_experts_intermediate_size=32,
    index_head_dim=16,
    index_n_heads=2,
    swa_num_attention_heads=2,
    swa_num_key_value_heads=2,
    swa_head_dim=48,
    swa_qk_nope_head_dim=32,
    swa_kv_lora_rank=16,
    swa_q_lora_rank=16,
)


@dataclass
class Family:
    id: str
    make_config: Callable[[], Any]
    reference: Reference
    #: what from_hf_config must read: (head_dim, rotary_dim, base, interleaved)
    expected: tuple[int, int, float, bool]
    layer_type: str | None = None
    #: maps posenc's output into the reference's channel order
    reorder: Callable[[Tensor], Tensor] = field(default=lambda x: x)
    #: each pair turns by -angle (NanoChat)
    clockwise: bool = False
    #: for the families read wrong before transformers 5.24's census: the arguments posenc
    #: used to read (the rest as now), which must differ from the family's code
    misread_as: dict[str, Any] = field(default_factory=dict)


def _config(name: str, **kwargs: Any) -> Callable[[], Any]:
    return lambda: getattr(transformers, name)(**kwargs)


FAMILIES = [
    Family(
        "llama",
        _config("LlamaConfig", **_tiny(num_key_value_heads=2)),
        cos_sin_reference("llama", "LlamaRotaryEmbedding"),
        (16, 16, 10000.0, False),
    ),
    Family(
        "mistral-explicit-head-dim",  # Mistral-Nemo: head_dim != hidden_size / heads
        _config("MistralConfig", **_tiny(num_key_value_heads=2, head_dim=32)),
        cos_sin_reference("mistral", "MistralRotaryEmbedding"),
        (32, 32, 10000.0, False),
    ),
    Family(
        "qwen2",
        _config(
            "Qwen2Config",
            **_tiny(num_key_value_heads=2, rope_parameters={"rope_theta": 1e6}),
        ),
        cos_sin_reference("qwen2", "Qwen2RotaryEmbedding"),
        (16, 16, 1e6, False),
    ),
    Family(
        "gemma-explicit-head-dim",
        _config("GemmaConfig", **_tiny(num_key_value_heads=1, head_dim=32)),
        cos_sin_reference("gemma", "GemmaRotaryEmbedding"),
        (32, 32, 10000.0, False),
    ),
    Family(
        "qwen3-explicit-head-dim",
        _config("Qwen3Config", **_tiny(num_key_value_heads=2, head_dim=32)),
        cos_sin_reference("qwen3", "Qwen3RotaryEmbedding"),
        (32, 32, 10000.0, False),
    ),
    Family(
        "falcon-rope",
        _config("FalconConfig", **_tiny()),
        cos_sin_reference("falcon", "FalconRotaryEmbedding"),
        (16, 16, 10000.0, False),
    ),
    Family(
        "phi-partial",
        _config("PhiConfig", **_tiny(partial_rotary_factor=0.5)),
        cos_sin_reference("phi", "PhiRotaryEmbedding"),
        (16, 8, 10000.0, False),
    ),
    Family(
        "stablelm-partial",
        _config("StableLmConfig", **_tiny(num_attention_heads=2, partial_rotary_factor=0.25)),
        cos_sin_reference("stablelm", "StableLmRotaryEmbedding"),
        (32, 8, 10000.0, False),
    ),
    Family(
        "persimmon-partial",
        _config("PersimmonConfig", **_tiny(rope_theta=25000.0)),
        cos_sin_reference("persimmon", "PersimmonRotaryEmbedding"),
        (16, 8, 25000.0, False),
    ),
    Family(
        "gpt-neox-rotary-pct",
        _config("GPTNeoXConfig", **_tiny(rotary_pct=0.25, rotary_emb_base=500)),
        cos_sin_reference("gpt_neox", "GPTNeoXRotaryEmbedding"),
        (16, 4, 500.0, False),
    ),
    Family(
        "gpt-neox-japanese",
        _config("GPTNeoXJapaneseConfig", **_tiny()),
        cos_sin_reference("gpt_neox_japanese", "GPTNeoXJapaneseRotaryEmbedding"),
        (16, 16, 10000.0, False),
    ),
    Family(
        "glm-interleaved-partial",
        _config("GlmConfig", **_tiny(num_key_value_heads=2, head_dim=16)),
        cos_sin_reference("glm", "GlmRotaryEmbedding"),
        (16, 8, 10000.0, True),
    ),
    Family(
        "glm4-interleaved-partial",
        _config("Glm4Config", **_tiny(num_key_value_heads=2, head_dim=16)),
        cos_sin_reference("glm4", "Glm4RotaryEmbedding"),
        (16, 8, 10000.0, True),
    ),
    Family(
        "ernie4_5-interleaved",
        _config("Ernie4_5Config", **_tiny(num_key_value_heads=2, head_dim=16)),
        cos_sin_reference("ernie4_5", "Ernie4_5RotaryEmbedding"),
        (16, 16, 500000.0, True),
    ),
    Family(
        "ernie4_5-moe-interleaved",
        _config("Ernie4_5_MoeConfig", **_tiny(num_key_value_heads=2, head_dim=16)),
        cos_sin_reference("ernie4_5_moe", "Ernie4_5_MoeRotaryEmbedding"),
        (16, 16, 500000.0, True),
    ),
    Family(
        "helium-interleaved",
        _config("HeliumConfig", **_tiny(num_key_value_heads=2, head_dim=16)),
        cos_sin_reference("helium", "HeliumRotaryEmbedding"),
        (16, 16, 100000.0, True),
    ),
    Family(
        "gptj-rotary-dim",  # the bug report's shape: head_dim 64, 16 dims rotated
        _config("GPTJConfig", n_embd=256, n_head=4, n_layer=1, rotary_dim=16, vocab_size=64),
        gptj_reference("gptj"),
        (64, 16, 10000.0, True),
    ),
    Family(
        "codegen-rotary-dim",
        _config("CodeGenConfig", n_embd=64, n_head=4, n_layer=1, rotary_dim=8, vocab_size=64),
        gptj_reference("codegen"),
        (16, 8, 10000.0, True),
    ),
    Family(
        "minimax-m2-rotary-dim-half",  # rotary_dim without the interleaved layout
        _config(
            "MiniMaxM2Config",
            **_tiny(num_key_value_heads=2, head_dim=32, rotary_dim=16, num_local_experts=2),
        ),
        cos_sin_reference("minimax_m2", "MiniMaxM2RotaryEmbedding"),
        (32, 16, 5e6, False),
    ),
    Family(
        "deepseek-v2-complex",
        _config(
            "DeepseekV2Config",
            **_tiny(
                qk_rope_head_dim=16,
                qk_nope_head_dim=16,
                v_head_dim=16,
                kv_lora_rank=16,
                q_lora_rank=None,
            ),
        ),
        complex_reference("deepseek_v2", "DeepseekV2RotaryEmbedding", heads_second=True),
        (16, 16, 10000.0, True),
    ),
    Family(
        "deepseek-v3-rope-interleave",
        _config(
            "DeepseekV3Config",
            **_tiny(
                qk_rope_head_dim=16,
                qk_nope_head_dim=16,
                v_head_dim=16,
                kv_lora_rank=16,
                q_lora_rank=None,
                n_routed_experts=4,
            ),
        ),
        deinterleaving_reference("deepseek_v3", "DeepseekV3RotaryEmbedding"),
        (16, 16, 10000.0, True),
        reorder=deinterleave,
    ),
    Family(
        "deepseek-v3.2-deinterleaved",  # MLA models that always de-interleave, no flag
        _config("DeepseekV32Config", **MLA),
        deinterleaving_reference("deepseek_v32", "DeepseekV32RotaryEmbedding"),
        (16, 16, 10000.0, True),
        reorder=deinterleave,
    ),
    Family(
        "glm-moe-dsa-deinterleaved",
        _config("GlmMoeDsaConfig", **MLA),
        deinterleaving_reference("glm_moe_dsa", "GlmMoeDsaRotaryEmbedding"),
        (16, 16, 10000.0, True),
        reorder=deinterleave,
    ),
    Family(
        "longcat-flash-deinterleaved",
        _config("LongcatFlashConfig", **{**MLA, "head_dim": 16}),  # its own field, = 64 = rope
        deinterleaving_reference("longcat_flash", "LongcatFlashRotaryEmbedding"),
        (16, 16, 10000000.0, True),
        reorder=deinterleave,
    ),
    Family(
        "bailing-hybrid-deinterleaved",
        _config("BailingHybridConfig", **MLA),
        deinterleaving_reference("bailing_hybrid", "BailingHybridRotaryEmbedding"),
        (16, 16, 6e6, True),
        reorder=deinterleave,
    ),
    Family(
        "mistral-large-3-yarn-deinterleaved",  # its default rope_parameters: YaRN, factor 2048
        _config("MistralLarge4TextConfig", **MLA),
        deinterleaving_reference("mistral_large4", "MistralLarge4TextRotaryEmbedding"),
        (16, 16, 10000.0, True),
        reorder=deinterleave,
    ),
    Family(
        "moonshine-interleaved-partial",  # 0.9 of a 16-dim head: 14 channels rotate
        _config(
            "MoonshineConfig",
            hidden_size=64,
            encoder_num_attention_heads=4,
            decoder_num_attention_heads=4,
            encoder_num_hidden_layers=1,
            decoder_num_hidden_layers=1,
            vocab_size=64,
        ),
        cos_sin_reference("moonshine", "MoonshineRotaryEmbedding"),
        (16, 14, 10000.0, True),
    ),
    Family(
        "llama4-complex",
        _config("Llama4TextConfig", **_tiny(num_key_value_heads=2, head_dim=16)),
        complex_reference("llama4", "Llama4TextRotaryEmbedding", heads_second=False),
        (16, 16, 500000.0, True),
    ),
    Family(
        "gemma3-sliding-layer",
        _config("Gemma3TextConfig", **GEMMA3),
        cos_sin_reference("gemma3", "Gemma3RotaryEmbedding", layer_type="sliding_attention"),
        (32, 32, 10000.0, False),
        layer_type="sliding_attention",
    ),
    Family(
        "gemma3-full-layer-linear",
        _config(
            "Gemma3TextConfig",
            **GEMMA3,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            },
        ),
        cos_sin_reference("gemma3", "Gemma3RotaryEmbedding", layer_type="full_attention"),
        (32, 32, 1e6, False),
        layer_type="full_attention",
    ),
    Family(
        "modernbert-global-layer",  # an encoder with per-layer-type RoPE
        _config(
            "ModernBertConfig",
            hidden_size=64,
            num_attention_heads=4,
            num_hidden_layers=3,
            intermediate_size=128,
            vocab_size=64,
        ),
        cos_sin_reference("modernbert", "ModernBertRotaryEmbedding", layer_type="full_attention"),
        (16, 16, 160000.0, False),
        layer_type="full_attention",
    ),
    Family(
        "llama-linear",
        _config(
            "LlamaConfig",
            **_tiny(rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}),
        ),
        cos_sin_reference("llama", "LlamaRotaryEmbedding"),
        (16, 16, 10000.0, False),
    ),
    Family(
        "llama-dynamic",
        _config(
            "LlamaConfig",
            **_tiny(
                max_position_embeddings=64,
                rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
            ),
        ),
        cos_sin_reference("llama", "LlamaRotaryEmbedding"),
        (16, 16, 10000.0, False),
    ),
    Family(
        "llama3-scaling",
        _config(
            "LlamaConfig",
            **_tiny(
                max_position_embeddings=512,
                rope_parameters={
                    "rope_type": "llama3",
                    "rope_theta": 500000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
            ),
        ),
        cos_sin_reference("llama", "LlamaRotaryEmbedding"),
        (16, 16, 500000.0, False),
    ),
    Family(
        "qwen2-yarn",
        _config(
            "Qwen2Config",
            **_tiny(
                num_key_value_heads=2,
                max_position_embeddings=256,
                rope_parameters={
                    "rope_type": "yarn",
                    "rope_theta": 1e6,
                    "factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
            ),
        ),
        cos_sin_reference("qwen2", "Qwen2RotaryEmbedding"),
        (16, 16, 1e6, False),
    ),
    Family(
        "phi3-longrope",  # Phi-3: original length at the top level, factor implied
        _config(
            "Phi3Config",
            **_tiny(
                num_key_value_heads=2,
                max_position_embeddings=256,
                original_max_position_embeddings=64,
                rope_parameters=_longrope(8, 64, rope_theta=10000.0),
            ),
        ),
        cos_sin_reference("phi3", "Phi3RotaryEmbedding"),
        (16, 16, 10000.0, False),
    ),
    Family(
        "phi4-mini-longrope-partial",  # Phi-4-mini: longrope on 3/4 of each head
        _config(
            "Phi3Config",
            **_tiny(
                num_attention_heads=2,
                num_key_value_heads=1,
                max_position_embeddings=256,
                partial_rotary_factor=0.75,
                original_max_position_embeddings=64,  # else Phi3Config's 4096 wins
                rope_parameters=_longrope(12, 64, rope_theta=10000.0, factor=4.0),
            ),
        ),
        cos_sin_reference("phi3", "Phi3RotaryEmbedding"),
        (32, 24, 10000.0, False),
    ),
    # Families read their own way (hf/families.py, hf/fields.py), each against its own code.
    Family(
        "hunyuan-dense-ntk-alpha",  # "dynamic" + alpha in the checkpoint: a fixed base
        _config(
            "HunYuanDenseV1Config",
            **_tiny(num_key_value_heads=2, head_dim=16, rope_theta=1e4, rope_scaling=HUNYUAN_ALPHA),
        ),
        cos_sin_reference("hunyuan_v1_dense", "HunYuanDenseV1RotaryEmbedding"),
        (16, 16, 10000.0, False),
    ),
    Family(
        "hunyuan-moe-ntk-alpha",
        _config(
            "HunYuanMoEV1Config",
            **_tiny(
                num_key_value_heads=2,
                head_dim=16,
                num_experts=2,
                rope_theta=1e4,
                rope_scaling=HUNYUAN_ALPHA,
            ),
        ),
        cos_sin_reference("hunyuan_v1_moe", "HunYuanMoEV1RotaryEmbedding"),
        (16, 16, 10000.0, False),
    ),
    Family(
        "phimoe-longrope-mscales",  # short_mscale up to 64 positions, long_mscale past them
        _config(
            "PhimoeConfig",
            **_tiny(
                num_key_value_heads=2,
                num_local_experts=2,
                max_position_embeddings=256,
                rope_parameters=_longrope(8, 64, rope_theta=1e4, short_mscale=1.1, long_mscale=1.3),
            ),
        ),
        cos_sin_reference("phimoe", "PhimoeRotaryEmbedding"),
        (16, 16, 10000.0, False),
    ),
    Family(
        "ministral3-yarn-with-query-scale-keys",
        _config(
            "Ministral3Config",
            **_tiny(
                num_key_value_heads=2,
                head_dim=16,
                max_position_embeddings=256,
                rope_parameters=MINISTRAL3_YARN,
            ),
        ),
        cos_sin_reference("ministral3", "Ministral3RotaryEmbedding"),
        (16, 16, 1e6, False),
    ),
    Family(
        "mistral4-rope-slice-deinterleaved",  # its default: YaRN, factor 128
        _config("Mistral4Config", **MISTRAL4),
        deinterleaving_reference("mistral4", "Mistral4RotaryEmbedding"),
        (16, 16, 10000.0, True),
        reorder=deinterleave,
    ),
    Family(
        "mistral4-rope-slice-half",
        _config("Mistral4Config", **MISTRAL4, rope_interleave=False),
        cos_sin_reference("mistral4", "Mistral4RotaryEmbedding"),
        (16, 16, 10000.0, False),
    ),
    Family(
        "deepseek-v4-main-trailing-slice",  # nested by rope label: main (sliding layers)
        _config("DeepseekV4Config", **DEEPSEEK_V4),
        trailing_slice_reference("deepseek_v4", "DeepseekV4RotaryEmbedding", layer_type="main"),
        (16, 16, 10000.0, True),
        layer_type="main",
    ),
    Family(
        "deepseek-v4-compress-yarn-trailing-slice",  # and compress (its attention factor 1)
        _config("DeepseekV4Config", **DEEPSEEK_V4),
        trailing_slice_reference("deepseek_v4", "DeepseekV4RotaryEmbedding", layer_type="compress"),
        (16, 16, 160000.0, True),
        layer_type="compress",
    ),
    Family(
        "dots3-indexed-deinterleaved",
        _config("Dots3NoteTextConfig", **DOTS3),
        deinterleaving_reference(
            "dots3_note", "Dots3NoteTextRotaryEmbedding", layer_type="indexed_attention"
        ),
        (16, 16, 8e7, True),
        layer_type="indexed_attention",
        reorder=deinterleave,
    ),
    Family(
        "dots3-sliding-per-layer-head-dim",  # 16 of its per-layer 48 channels
        _config("Dots3NoteTextConfig", **DOTS3),
        deinterleaving_reference(
            "dots3_note", "Dots3NoteTextRotaryEmbedding", layer_type="sliding_attention"
        ),
        (16, 16, 50000.0, True),
        layer_type="sliding_attention",
        reorder=deinterleave,
    ),
    Family(
        "gemma4-sliding-layer",
        _config("Gemma4TextConfig", **GEMMA4),
        one_tensor_reference("gemma4", "Gemma4TextRotaryEmbedding", layer_type="sliding_attention"),
        (16, 16, 10000.0, False),
        layer_type="sliding_attention",
    ),
    Family(
        "gemma4-full-layer-global-head-dim-proportional",
        _config("Gemma4TextConfig", **GEMMA4),
        one_tensor_reference("gemma4", "Gemma4TextRotaryEmbedding", layer_type="full_attention"),
        (32, 32, 1e6, False),
        layer_type="full_attention",
    ),
    Family(
        "gemma4-unified-full-layer",
        _config("Gemma4UnifiedTextConfig", **GEMMA4),
        one_tensor_reference(
            "gemma4_unified", "Gemma4UnifiedTextRotaryEmbedding", layer_type="full_attention"
        ),
        (32, 32, 1e6, False),
        layer_type="full_attention",
    ),
    Family(
        "diffusion-gemma-full-layer",
        _config("DiffusionGemmaTextConfig", **GEMMA4),
        one_tensor_reference(
            "diffusion_gemma", "DiffusionGemmaTextRotaryEmbedding", layer_type="full_attention"
        ),
        (32, 32, 1e6, False),
        layer_type="full_attention",
    ),
    Family(
        "embedding-gemma2-sliding-layer",
        _config("EmbeddingGemma2TextConfig", **GEMMA4),
        cos_sin_reference(
            "embedding_gemma2", "EmbeddingGemma2RotaryEmbedding", layer_type="sliding_attention"
        ),
        (16, 16, 10000.0, False),
        layer_type="sliding_attention",
    ),
    Family(
        "embedding-gemma2-full-layer-global-head-dim",
        _config("EmbeddingGemma2TextConfig", **GEMMA4),
        cos_sin_reference(
            "embedding_gemma2", "EmbeddingGemma2RotaryEmbedding", layer_type="full_attention"
        ),
        (32, 32, 1e6, False),
        layer_type="full_attention",
    ),
    # The families transformers 5.24's census found read wrong: seven rotate interleaved pairs,
    # MiniMax-M3-VL ignores its rotary_dim, NanoChat turns by -angle.
    Family(
        "cohere-interleaved",
        _config("CohereConfig", **_tiny(num_key_value_heads=2)),
        cos_sin_reference("cohere", "CohereRotaryEmbedding"),
        (16, 16, 500000.0, True),
        misread_as={"interleaved": False},
    ),
    Family(
        "cohere2-interleaved",
        _config("Cohere2Config", **_tiny(num_key_value_heads=2)),
        cos_sin_reference("cohere2", "Cohere2RotaryEmbedding"),
        (16, 16, 10000.0, True),
        misread_as={"interleaved": False},
    ),
    Family(
        "cohere2-moe-interleaved",
        _config("Cohere2MoeConfig", **_tiny(num_key_value_heads=2, head_dim=16, num_experts=2)),
        cos_sin_reference("cohere2_moe", "Cohere2MoeRotaryEmbedding"),
        (16, 16, 10000.0, True),
        misread_as={"interleaved": False},
    ),
    Family(
        "blt-local-encoder-interleaved",  # BLT builds one rotary module per sub-config
        _config("BltLocalEncoderConfig", **_tiny()),
        cos_sin_reference("blt", "BltRotaryEmbedding"),
        (16, 16, 500000.0, True),
        misread_as={"interleaved": False},
    ),
    Family(
        "blt-patcher-interleaved",  # the patcher's config has no default_theta of its own
        _config("BltPatcherConfig", **_tiny()),
        cos_sin_reference("blt", "BltRotaryEmbedding"),
        (16, 16, 10000.0, True),
        misread_as={"interleaved": False},
    ),
    Family(
        "openai-privacy-filter-interleaved-yarn",  # its default: YaRN, factor 32
        _config(
            "OpenAIPrivacyFilterConfig",
            **_tiny(num_key_value_heads=2, head_dim=16, num_local_experts=2),
        ),
        per_pair_reference("openai_privacy_filter", "OpenAIPrivacyFilterRotaryEmbedding"),
        (16, 16, 150000.0, True),
        misread_as={"interleaved": False},
    ),
    Family(
        "pe-audio-encoder-interleaved",
        _config("PeAudioEncoderConfig", **PE_ENCODER),
        cos_sin_reference("pe_audio", "PeAudioEncoderRotaryEmbedding"),
        (16, 16, 20000.0, True),
        misread_as={"interleaved": False},
    ),
    Family(
        "pe-video-encoder-interleaved",
        _config("PeVideoEncoderConfig", **PE_ENCODER),
        cos_sin_reference("pe_video", "PeVideoEncoderRotaryEmbedding"),
        (16, 16, 20000.0, True),
        misread_as={"interleaved": False},
    ),
    Family(
        "pe-audio-video-encoder-interleaved",
        _config("PeAudioVideoEncoderConfig", **PE_ENCODER),
        cos_sin_reference("pe_audio_video", "PeAudioVideoEncoderRotaryEmbedding"),
        (16, 16, 20000.0, True),
        misread_as={"interleaved": False},
    ),
    Family(
        "minimax-m3-vl-ignores-rotary-dim",  # rotary_dim=16 of 32 in the config, 32 rotate
        _config(
            "MiniMaxM3VLTextConfig",
            **_tiny(num_key_value_heads=2, head_dim=32, rotary_dim=16, num_local_experts=2),
        ),
        cos_sin_reference("minimax_m3_vl", "MiniMaxM3VLRotaryEmbedding"),
        (32, 32, 5e6, False),
        misread_as={"rotary_dim": 16},
    ),
    Family(
        "nanochat-clockwise",  # rotate_half returns cat(x2, -x1): each pair turns by -angle
        _config("NanoChatConfig", **_tiny(num_key_value_heads=2)),
        cos_sin_reference("nanochat", "NanoChatRotaryEmbedding"),
        (16, 16, 10000.0, False),
        clockwise=True,
        misread_as={"clockwise": False},
    ),
]


@pytest.mark.parametrize("family", FAMILIES, ids=[f.id for f in FAMILIES])
def test_rotated_qk_match_the_familys_own_code(family: Family) -> None:
    config = family.make_config()
    ours = RotaryEmbedding.from_hf_config(config, layer_type=family.layer_type)
    assert (ours.head_dim, ours.rotary_dim, ours.base, ours.interleaved) == family.expected
    assert ours.clockwise is family.clockwise
    q, k = _qk(ours.head_dim)
    want_q, want_k = family.reference(config)(q, k, POSITIONS)
    got_q, got_k = ours(q, k, POSITIONS)
    assert_close(family.reorder(got_q), want_q, atol=ATOL, rtol=RTOL)
    assert_close(family.reorder(got_k), want_k, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize(
    "family_id",
    [
        "phi3-longrope",
        "phi4-mini-longrope-partial",
        "llama-dynamic",
        "qwen2-yarn",
        "phimoe-longrope-mscales",
        "hunyuan-dense-ntk-alpha",
    ],
)
def test_length_dependent_scaling_follows_transformers_over_a_generation(family_id: str) -> None:
    """LongRoPE switches to the long factors past the original context and back; dynamic NTK
    grows its base and resets: every step's rotated q, k equal transformers' (one module on
    each side, kept across the steps, as in generation)."""
    family = next(f for f in FAMILIES if f.id == family_id)
    config = family.make_config()
    ours = RotaryEmbedding.from_hf_config(config)
    theirs = family.reference(config)
    steps = (torch.arange(16), torch.arange(100, 116), torch.arange(8), torch.arange(120, 122))
    for step, positions in enumerate(steps):
        q, k = _qk(ours.head_dim, seed=step)
        q, k = q[:1, :, : len(positions)], k[:1, :, : len(positions)]
        want_q, want_k = theirs(q, k, positions[None])
        got_q, got_k = ours(q, k, positions)
        assert_close(got_q, want_q, atol=ATOL, rtol=RTOL)
        assert_close(got_k, want_k, atol=ATOL, rtol=RTOL)


def test_deepseek_v3_scores_equal_without_reordering() -> None:
    """The de-interleaved order of DeepSeek-V3 is a permutation applied to q and k alike: the
    attention scores of posenc's in-place rotation already equal transformers'."""
    family = next(f for f in FAMILIES if f.id == "deepseek-v3-rope-interleave")
    config = family.make_config()
    ours = RotaryEmbedding.from_hf_config(config)
    q, k = _qk(16)
    k = k.repeat_interleave(2, dim=1)  # same head count for a plain q @ k^T
    want_q, want_k = family.reference(config)(q, k, POSITIONS)
    got_q, got_k = ours(q, k, POSITIONS)
    assert_close(
        got_q @ got_k.transpose(-1, -2), want_q @ want_k.transpose(-1, -2), atol=1e-4, rtol=1e-5
    )


# The checkpoints' own labels, read as transformers' types of those names would read them:
# HunYuan's "dynamic" (factor 1: plain RoPE at every length) and PhiMoE's "longrope" (long
# factors and sqrt(1 + ln f / ln L0) past the original context). Both were refused before.
AS_LABELLED = {
    "hunyuan-dense-ntk-alpha": {"rope_type": "dynamic", "factor": 1.0},
    "phimoe-longrope-mscales": _longrope(8, 64),
}


@pytest.mark.parametrize("family_id", sorted(AS_LABELLED))
def test_reading_these_checkpoints_as_labelled_is_far_from_their_code(family_id: str) -> None:
    family = next(f for f in FAMILIES if f.id == family_id)
    config = family.make_config()
    ours = RotaryEmbedding.from_hf_config(config)
    labelled = RotaryEmbedding(
        ours.head_dim, base=ours.base, scaling=AS_LABELLED[family_id], max_position_embeddings=256
    )
    q, k = _qk(ours.head_dim)
    want_q, _ = family.reference(config)(q, k, POSITIONS)
    assert (labelled(q, k, POSITIONS)[0] - want_q).abs().max() > 1.0
    assert_close(ours(q, k, POSITIONS)[0], want_q, atol=ATOL, rtol=RTOL)


def test_hunyuan_reads_alpha_alone_and_a_zero_alpha_as_dynamic_ntk() -> None:
    """HunYuan's NTK-alpha reads alpha and rope_theta only (the checkpoint's factor, beta_*
    and mscale* go unread); with a zero alpha its code keeps dynamic NTK, and so does posenc."""
    config = next(f for f in FAMILIES if f.id == "hunyuan-dense-ntk-alpha").make_config()
    assert RotaryEmbedding.from_hf_config(config).scaling == {
        "rope_type": "ntk_alpha",
        "alpha": 1e3,
    }
    plain = {
        **_tiny(head_dim=16, max_position_embeddings=64),
        "model_type": "hunyuan_v1_dense",
        "rope_theta": 1e4,
    }
    zero = {**plain, "rope_scaling": {"type": "dynamic", "factor": 2.0, "alpha": 0.0}}
    reference = cos_sin_reference("hunyuan_v1_dense", "HunYuanDenseV1RotaryEmbedding")
    hf = transformers.HunYuanDenseV1Config(**{k: v for k, v in zero.items() if k != "model_type"})
    ours = RotaryEmbedding.from_hf_config(zero)
    assert ours.rope_type == "dynamic"
    theirs = reference(hf)
    for positions in (torch.arange(16), torch.arange(100, 116)):  # past 64: the base grows
        q, k = _qk(16)
        want_q, want_k = theirs(q[:1], k[:1], positions[None])
        got_q, got_k = ours(q[:1], k[:1], positions)
        assert_close(got_q, want_q, atol=ATOL, rtol=RTOL)
        assert_close(got_k, want_k, atol=ATOL, rtol=RTOL)


def test_a_deepseek_v3_config_json_as_on_the_hub_reads_like_its_config_class() -> None:
    """DeepSeek-V3's config.json names neither head_dim nor rope_interleave: its config class
    sets head_dim to qk_rope_head_dim and defaults rope_interleave to true. posenc used to read
    hidden_size // heads (here 32) in the half layout."""
    config = transformers.DeepseekV3Config(
        **{**MLA, "hidden_size": 128, "q_lora_rank": None}, n_routed_experts=4
    )
    hub = {k: v for k, v in config.to_dict().items() if k not in ("head_dim", "rope_interleave")}
    from_hub = RotaryEmbedding.from_hf_config(hub)
    assert repr(from_hub) == repr(RotaryEmbedding.from_hf_config(config))
    assert (from_hub.head_dim, from_hub.interleaved) == (16, True)
    q, k = _qk(16)
    reference = deinterleaving_reference("deepseek_v3", "DeepseekV3RotaryEmbedding")
    want_q, want_k = reference(config)(q, k, POSITIONS)
    got_q, got_k = from_hub(q, k, POSITIONS)
    assert_close(deinterleave(got_q), want_q, atol=ATOL, rtol=RTOL)
    assert_close(deinterleave(got_k), want_k, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("as_json", [False, True], ids=["config", "config-json"])
def test_the_query_scale_beside_the_rotation(as_json: bool) -> None:
    """Ministral 3 and Mistral 4: (llama_4_scaling_beta, original context) as their attention
    reads them from the standardised RoPE dictionary; other families have none."""
    configs = {
        "ministral3": transformers.Ministral3Config(
            **_tiny(head_dim=16), rope_parameters=dict(MINISTRAL3_YARN)
        ),
        "mistral4": transformers.Mistral4Config(**MISTRAL4),
        "llama": transformers.LlamaConfig(**_tiny()),
    }
    for name, config in configs.items():
        read = config.to_dict() if as_json else config
        if name == "llama":
            assert query_scale_from_hf_config(read) is None
            continue
        params = config.rope_parameters
        want = (params["llama_4_scaling_beta"], params["original_max_position_embeddings"])
        assert query_scale_from_hf_config(read) == want


def test_a_query_scale_its_attention_cannot_compute_is_refused() -> None:
    no_beta = {**MINISTRAL3_YARN}
    del no_beta["llama_4_scaling_beta"]
    config = {**_tiny(head_dim=16), "model_type": "ministral3", "rope_parameters": no_beta}
    check(
        Misuse(
            "no-beta",
            lambda: query_scale_from_hf_config(config),
            PosencValueError,
            "llama_4_scaling_beta",
            "ministral3",
        )
    )
    plain = {"rope_type": "default", "rope_theta": 1e4, "llama_4_scaling_beta": 0.1}
    config = {**_tiny(head_dim=16), "model_type": "ministral3", "rope_parameters": plain}
    check(
        Misuse(
            "no-original",
            lambda: query_scale_from_hf_config(config),
            PosencValueError,
            "original_max_position_embeddings",
            "ministral3",
        )
    )


# --------------------------------------------------------------------------- GPT-J end to end


def _require_gptj_internals(model: Any, modeling_gptj: Any) -> None:
    """What the end-to-end test patches: a model-level ``rotary_emb(x, position_ids) ->
    (sin, cos)`` handed to every layer as ``position_embeddings``, each layer's
    ``rotary_dim``, and ``apply_rotary_pos_emb(tensor, sin, cos)``."""
    attention = modeling_gptj.GPTJAttention.forward
    require_internals(
        transformers,
        {
            "GPTJModel.rotary_emb": hasattr(model.transformer, "rotary_emb"),
            "GPTJAttention.rotary_dim": all(
                hasattr(b.attn, "rotary_dim") for b in model.transformer.h
            ),
            "GPTJAttention.forward(position_embeddings=)": "position_embeddings"
            in parameters(attention),
            "apply_rotary_pos_emb(tensor, sin, cos)": parameters(modeling_gptj.apply_rotary_pos_emb)
            == ["tensor", "sin", "cos"],
        },
    )


def test_gptj_logits_match_when_posenc_rotates_and_the_old_reading_did_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bug report: on a GPT-J config (rotary_dim=16, head_dim=64) posenc used to build a
    64-dim half-layout rotation, and logits of a model it drove differed from transformers' by
    ~8. Driving GPT-J's attention with posenc's rotation now gives transformers' logits; the
    old reading is still ~4 off on this tiny random model (2 heads of 64, 16 dims rotated)."""
    from transformers.models.gptj import modeling_gptj

    config = transformers.GPTJConfig(
        n_embd=128,
        n_head=2,
        n_layer=1,
        rotary_dim=16,
        vocab_size=64,
        n_positions=128,
        initializer_range=0.2,  # logits of ~10, like a trained model's, not ~1
    )
    torch.manual_seed(0)
    model = transformers.GPTJForCausalLM(config).eval()
    tokens = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        want = model(tokens, position_ids=POSITIONS).logits

    # Route every attention layer through a posenc module on the whole head: the model's
    # rotary module is replaced by one whose (sin, cos) carry the positions themselves, and
    # the patched apply function reads them back. This reaches into GPT-J's internals, so the
    # names and signatures it relies on are checked first.
    _require_gptj_internals(model, modeling_gptj)
    rotary: list[RotaryEmbedding] = []

    def posenc_apply(x: Tensor, sin: Tensor, cos: Tensor) -> Tensor:  # x: (b, n, h, d)
        positions = sin[..., 0].round().long()  # (b, n)
        return rotary[0].rotate(x.transpose(1, 2), positions).transpose(1, 2)

    class PositionsAsTables(torch.nn.Module):
        def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
            carried = position_ids[..., None].to(x.dtype)  # (b, n, 1)
            return carried, carried

    for block in model.transformer.h:
        block.attn.rotary_dim = None  # hand the whole head to apply_rotary_pos_emb
    monkeypatch.setattr(model.transformer, "rotary_emb", PositionsAsTables())
    monkeypatch.setattr(modeling_gptj, "apply_rotary_pos_emb", posenc_apply)

    def logits_with(rope: RotaryEmbedding) -> Tensor:
        rotary[:] = [rope]
        with torch.no_grad():
            return model(tokens, position_ids=POSITIONS).logits

    # float32 angles in GPT-J vs float64 in posenc: a few 1e-6 on logits of ~10
    assert_close(logits_with(RotaryEmbedding.from_hf_config(config)), want, atol=1e-5, rtol=1e-5)
    old_reading = RotaryEmbedding(64)  # what from_hf_config built before: 64 dims, half layout
    assert (logits_with(old_reading) - want).abs().max() > 2.0


# --------------------------------------------------------------------------- other spellings


@pytest.mark.parametrize("family", FAMILIES, ids=[f.id for f in FAMILIES])
def test_config_json_dict_reads_like_the_config_object(family: Family) -> None:
    """``config.to_dict()`` (a config.json as loaded: GPT-J's n_embd names, no class defaults)
    gives the same module as the config object."""
    config = family.make_config()
    as_dict = json.loads(json.dumps(config.to_dict()))
    a = RotaryEmbedding.from_hf_config(config, layer_type=family.layer_type)
    b = RotaryEmbedding.from_hf_config(as_dict, layer_type=family.layer_type)
    assert repr(a) == repr(b)
    assert torch.equal(a.inv_freq, b.inv_freq) and a.attention_factor == b.attention_factor


# transformers 4.x config.json files (as on the Hub), read directly and through transformers 5,
# which converts their legacy fields into rope_parameters.
LEGACY_JSON = {
    "pythia": {  # GPT-NeoX: rotary_pct, rotary_emb_base, no rope_scaling
        "model_type": "gpt_neox",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rotary_pct": 0.25,
        "rotary_emb_base": 10000,
        "max_position_embeddings": 2048,
    },
    "phi-2": {  # top-level partial_rotary_factor and rope_theta
        "model_type": "phi",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "partial_rotary_factor": 0.4,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "max_position_embeddings": 2048,
    },
    "llama-4.x-linear": {  # rope_theta at the top, rope_scaling with the legacy "type" key
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_theta": 500000.0,
        "rope_scaling": {"type": "linear", "factor": 2.0},
        "max_position_embeddings": 2048,
    },
    "phi-3-su": {  # Phi-3's first configs named LongRoPE "su"
        "model_type": "phi3",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "original_max_position_embeddings": 64,
        "rope_scaling": {
            "type": "su",
            "short_factor": [1.0 + 0.05 * i for i in range(8)],
            "long_factor": [1.5 + 0.4 * i for i in range(8)],
        },
    },
}
CONFIG_CLASSES = {
    "gpt_neox": "GPTNeoXConfig",
    "phi": "PhiConfig",
    "llama": "LlamaConfig",
    "phi3": "Phi3Config",
}


@pytest.mark.parametrize("name", sorted(LEGACY_JSON))
def test_transformers_4_config_json_reads_like_transformers_5_does(name: str) -> None:
    raw = LEGACY_JSON[name]
    fields = {k: v for k, v in raw.items() if k != "model_type"}
    if name == "phi-3-su":  # transformers 5 renames "su" only after it looked for "longrope"
        fields["rope_scaling"] = {**fields["rope_scaling"], "type": "longrope"}
    config = getattr(transformers, CONFIG_CLASSES[raw["model_type"]])(**fields)
    from_raw = RotaryEmbedding.from_hf_config(raw)
    from_json = RotaryEmbedding.from_hf_config(SimpleNamespace(**raw))  # a 4.x config object
    from_config = RotaryEmbedding.from_hf_config(config)
    assert repr(from_raw) == repr(from_config) == repr(from_json)
    for positions in (torch.arange(16), torch.arange(100, 116)):
        for module in (from_raw, from_config):
            module(
                torch.zeros(1, 1, 16, module.head_dim),
                torch.zeros(1, 1, 16, module.head_dim),
                positions,
            )
        assert torch.equal(from_raw.inv_freq, from_config.inv_freq)
        assert from_raw.attention_factor == from_config.attention_factor


# --------------------------------------------------------------------------- refused configs


def _namespace(**fields: Any) -> SimpleNamespace:
    return SimpleNamespace(hidden_size=64, num_attention_heads=4, **fields)


def _from(make: Callable[[], Any], **kwargs: Any) -> Callable[[], object]:
    return lambda: RotaryEmbedding.from_hf_config(make(), **kwargs)


#: Configs that cannot be mapped: each is refused naming the config field and its value.
MISUSE = [
    Misuse("gpt2", _from(lambda: transformers.GPT2Config(n_embd=64, n_head=4)), PosencValueError,
           "model_type", "gpt2"),
    Misuse("bloom", _from(lambda: transformers.BloomConfig(hidden_size=64, n_head=4)),
           PosencValueError, "model_type", "bloom"),
    Misuse("mpt", _from(lambda: transformers.MptConfig(d_model=64, n_heads=4)), PosencValueError,
           "model_type", "mpt"),
    Misuse("falcon-alibi", _from(lambda: transformers.FalconConfig(**_tiny(alibi=True))),
           PosencValueError, "alibi", True),
    Misuse("gptj-rotary-dim-wide",
           _from(lambda: transformers.GPTJConfig(n_embd=256, n_head=4, rotary_dim=80)),
           PosencValueError, "rotary_dim", 80),
    Misuse("gptj-rotary-dim-odd",
           _from(lambda: transformers.GPTJConfig(n_embd=256, n_head=4, rotary_dim=15)),
           PosencValueError, "rotary_dim", 15),
    # head_dim 50, half of it rotated: transformers would round 25 up to 26
    Misuse("phi-odd-rotary-dimension",
           _from(lambda: transformers.PhiConfig(hidden_size=100, num_attention_heads=2,
                                                partial_rotary_factor=0.5)),
           PosencValueError, "partial_rotary_factor", 0.5),
    Misuse("rotary-dim-contradicts-partial",
           _from(lambda: _namespace(model_type="mystery", rotary_dim=8,
                                    partial_rotary_factor=0.25)),
           PosencValueError, "rotary_dim", 8),
    Misuse("rotary-pct-contradicts-partial",
           _from(lambda: _namespace(model_type="mystery", rotary_pct=0.5,
                                    partial_rotary_factor=0.25)),
           PosencValueError, "rotary_pct", 0.5),
    Misuse("base-contradicts",
           _from(lambda: _namespace(model_type="mystery", rope_theta=1e4, rotary_emb_base=500)),
           PosencValueError, "rotary_emb_base", 500.0),
    Misuse("parameters-and-scaling-differ",
           _from(lambda: _namespace(rope_parameters={"rope_type": "linear", "factor": 2.0},
                                    rope_scaling={"rope_type": "linear", "factor": 4.0})),
           PosencValueError, "rope_scaling", MISSING),
    Misuse("partial-above-one",
           _from(lambda: _namespace(model_type="mystery", partial_rotary_factor=1.5)),
           PosencValueError, "partial_rotary_factor", 1.5),
    Misuse("unknown-rope-type",
           _from(lambda: _namespace(model_type="llama", rope_parameters={
               "rope_type": "made_up", "rope_theta": 1e4, "partial_rotary_factor": 0.5})),
           PosencValueError, "rope_type", "made_up"),
    Misuse("unknown-key",
           _from(lambda: _namespace(model_type="llama", rope_parameters={
               "rope_type": "default", "mrope_section": [2, 3, 3]})),
           PosencValueError, "rope_parameters", "mrope_section"),
    Misuse("nested-by-layer-type",
           _from(lambda: transformers.Gemma3TextConfig(**_tiny(head_dim=32))), PosencValueError,
           "layer_type", MISSING),
    Misuse("phi-without-fraction", _from(lambda: _namespace(model_type="phi", rope_theta=1e4)),
           PosencValueError, "partial_rotary_factor", MISSING),
    Misuse("gptj-ignores-rope-theta",
           _from(lambda: _namespace(model_type="gptj", rotary_dim=8, rope_theta=5e5)),
           PosencValueError, "rope_theta", 500000.0),
    # M-RoPE (read by mrope_layouts.py, tests/encodings/rotary/test_multimodal.py): HunYuan-VL's
    # code has no default sections
    Misuse("multimodal-rope-without-sections", _from(lambda: transformers.HunYuanVLConfig()),
           PosencValueError, "mrope_section", "hunyuan_vl_text"),
    # latent attention whose rotary tables (32 channels: no fraction) miss its 16-channel slice
    Misuse("rope-slice-wider-tables",
           _from(lambda: _namespace(model_type="mistral4", head_dim=32, qk_rope_head_dim=16,
                                    rope_theta=1e4)),
           PosencValueError, "qk_rope_head_dim", 16),
    # DeepSeek-V4: RoPE parameters nested by rope label (main, compress)
    Misuse("rope-label-needed", _from(lambda: transformers.DeepseekV4Config(**DEEPSEEK_V4)),
           PosencValueError, "layer_type", MISSING),
    # Gemma 4: head_dim differs per layer type, a config object and its config.json alike
    Misuse("head-dim-per-layer", _from(lambda: transformers.Gemma4TextConfig(**GEMMA4)),
           PosencValueError, "layer_type", "head_dim"),
    Misuse("head-dim-per-layer-json",
           _from(lambda: transformers.Gemma4TextConfig(**GEMMA4).to_dict()), PosencValueError,
           "layer_type", "head_dim"),
    Misuse("per-layer-config-unknown-layer-type",
           _from(lambda: transformers.Gemma4TextConfig(**GEMMA4), layer_type="chunked_attention"),
           PosencValueError, "layer_type", "chunked_attention"),
    # two full-attention layers, one of them without the override: no one view of that type
    Misuse("per-layer-config-uneven",
           _from(lambda: {**transformers.Gemma4TextConfig(**GEMMA4).to_dict(),
                          "layer_types": ["sliding_attention"] * 4 + ["full_attention"] * 2},
                 layer_type="full_attention"),
           PosencValueError, "per_layer_config", "full_attention"),
    # a NoPE layer type: BEAM's full-attention layers have no RoPE parameters
    Misuse("nope-layer-type",
           _from(lambda: transformers.BeamConfig(**_tiny(num_key_value_heads=2)),
                 layer_type="full_attention"),
           PosencValueError, "layer_type", "full_attention"),
    # HunYuan rotates whole heads whatever partial_rotary_factor says
    Misuse("hunyuan-partial",
           _from(lambda: _namespace(model_type="hunyuan_v1_dense", head_dim=16, rope_parameters={
               "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5})),
           PosencValueError, "partial_rotary_factor", 0.5),
    # PhiMoE's rotary code reads short_mscale and long_mscale for any rope_type but default
    Misuse("phimoe-without-mscales",
           _from(lambda: _namespace(model_type="phimoe", max_position_embeddings=256,
                                    rope_parameters=_longrope(8, 64, rope_theta=1e4))),
           PosencValueError, "short_mscale", "longrope"),
    Misuse("absolute-esm",
           _from(lambda: _namespace(model_type="esm", rope_theta=1e4,
                                    position_embedding_type="absolute")),
           PosencValueError, "position_embedding_type", "absolute"),
    Misuse("layer-type-unknown",
           _from(lambda: transformers.Gemma3TextConfig(**_tiny(head_dim=32)), layer_type="chunked"),
           PosencValueError, "layer_type", "chunked"),
    Misuse("layer-type-not-nested",
           _from(lambda: transformers.LlamaConfig(**_tiny()), layer_type="full_attention"),
           PosencValueError, "layer_type", "full_attention"),
    Misuse("rotary-dim-str", _from(lambda: _namespace(model_type="gptj", rotary_dim="16")),
           PosencTypeError, "rotary_dim", "16"),
    Misuse("rope-interleave-str",
           _from(lambda: _namespace(rope_theta=1e4, rope_interleave="yes")), PosencTypeError,
           "rope_interleave", "yes"),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_configs_that_cannot_be_mapped_are_refused_naming_the_field(case: Misuse) -> None:
    check(case)


def test_explicit_keyword_arguments_override_the_config() -> None:
    config = transformers.GPTJConfig(n_embd=256, n_head=4, rotary_dim=16)
    rope = RotaryEmbedding.from_hf_config(config, rotary_dim=32, base=500.0)
    assert (rope.rotary_dim, rope.base, rope.interleaved) == (32, 500.0, True)
    assert math.isclose(rope.inv_freq[1].item(), 500.0 ** (-2 / 32))


# --------------------------------------------------------------------------- the census fixes

CENSUS_FAMILIES = [family for family in FAMILIES if family.misread_as]


@pytest.mark.parametrize("family", CENSUS_FAMILIES, ids=[f.id for f in CENSUS_FAMILIES])
def test_what_posenc_read_before_the_census_is_far_from_the_familys_code(family: Family) -> None:
    """The families the census found read wrong, read the old way (the half layout, MiniMax-M3-VL's
    unused rotary_dim, NanoChat turned by +angle): q and k differ from the family's own code by
    more than 1 (unit-variance entries), so the comparison above tells the two readings apart."""
    config = family.make_config()
    arguments = rotary_arguments_from_hf_config(config, layer_type=family.layer_type)
    arguments.update(family.misread_as)
    old = RotaryEmbedding(arguments.pop("head_dim"), **arguments)
    q, k = _qk(old.head_dim)
    want_q, want_k = family.reference(config)(q, k, POSITIONS)
    got_q, got_k = old(q, k, POSITIONS)
    assert (got_q - want_q).abs().max() > 1.0
    assert (got_k - want_k).abs().max() > 1.0


def test_the_arguments_name_the_sense_of_rotation_for_every_config() -> None:
    nanochat = transformers.NanoChatConfig(**_tiny())
    llama = transformers.LlamaConfig(**_tiny())
    plain = {"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 1e4}  # no model_type
    assert rotary_arguments_from_hf_config(nanochat)["clockwise"] is True
    assert rotary_arguments_from_hf_config(llama)["clockwise"] is False
    assert rotary_arguments_from_hf_config(plain)["clockwise"] is False


# --------------------------------------------------------------------------- unchecked types


def _unchecked(model_type: str = "mystery_lm") -> SimpleNamespace:
    return _namespace(model_type=model_type, rope_theta=1e4)


@pytest.fixture
def no_model_type_warned_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh per-process record of the model types warned about."""
    monkeypatch.setattr(hf_config, "_WARNED_MODEL_TYPES", set())


@pytest.mark.usefixtures("no_model_type_warned_yet")
def test_an_unchecked_model_type_is_read_with_one_warning_naming_it_and_the_version() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # count the warnings this module gives, not the filter's
        first = RotaryEmbedding.from_hf_config(_unchecked())
        again = RotaryEmbedding.from_hf_config(_unchecked())
        rotary_arguments_from_hf_config(_unchecked("another_lm"))
    messages = [str(w.message) for w in caught if w.category is UserWarning]
    assert len(messages) == 2, messages
    assert "'mystery_lm'" in messages[0] and "'another_lm'" in messages[1]
    for message in messages:
        assert f"transformers {CHECKED_TRANSFORMERS_VERSION}" in message
        assert "half or interleaved" in message and "half layout" in message
    # read from the generic fields, as before the list existed
    assert repr(first) == repr(again) == "RotaryEmbedding(head_dim=16, rotary_dim=16, base=10000)"


@pytest.mark.usefixtures("no_model_type_warned_yet")
@pytest.mark.parametrize(
    "read",
    [RotaryEmbedding.from_hf_config, rotary_arguments_from_hf_config],
    ids=["module", "dict"],
)
def test_strict_refuses_an_unchecked_model_type_naming_it_and_the_version(
    read: Callable[..., object],
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused, not warned about
        with pytest.raises(PosencValueError, match="'mystery_lm'") as info:
            read(_unchecked(), strict=True)
    assert f"transformers {CHECKED_TRANSFORMERS_VERSION}" in str(info.value)
    assert not hf_config._WARNED_MODEL_TYPES


#: (config, layer_type) read without a warning, even with strict=True
CHECKED_OR_UNNAMED: dict[str, Callable[[], tuple[Any, str | None]]] = {
    "checked-config": lambda: (transformers.LlamaConfig(**_tiny()), None),
    "checked-config-json": lambda: ({**_tiny(), "model_type": "cohere", "rope_theta": 1e4}, None),
    # read through its text_config, whose model_type (gemma3_text) is the one checked
    "composite": lambda: (transformers.Gemma3Config(text_config=GEMMA3), "full_attention"),
    "dict-without-model-type": lambda: ({**_tiny(), "rope_theta": 1e4}, None),
    "empty-model-type": lambda: (_namespace(model_type="", rope_theta=1e4), None),
}


@pytest.mark.usefixtures("no_model_type_warned_yet")
@pytest.mark.parametrize("name", sorted(CHECKED_OR_UNNAMED))
def test_no_warning_for_a_checked_model_type_or_a_config_without_one(name: str) -> None:
    config, layer_type = CHECKED_OR_UNNAMED[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rotary_arguments_from_hf_config(config, layer_type=layer_type, strict=True)


def test_strict_must_be_a_bool() -> None:
    check(
        Misuse(
            "strict-str",
            _from(lambda: transformers.LlamaConfig(**_tiny()), strict="yes"),
            PosencTypeError,
            "strict",
            "yes",
        )
    )


def test_every_model_type_tested_here_or_named_in_hf_config_is_a_checked_one() -> None:
    tested = {family.make_config().model_type for family in FAMILIES}
    tested |= {raw["model_type"] for raw in LEGACY_JSON.values()}
    assert tested - KNOWN_MODEL_TYPES == set()
    named = set().union(
        model_types.INTERLEAVED_MODEL_TYPES,
        model_types.DEINTERLEAVED_MODEL_TYPES,
        model_types.CLOCKWISE_MODEL_TYPES,
        model_types.ROTARY_DIM_IGNORED_MODEL_TYPES,
        model_types.FIXED_BASE_MODEL_TYPES,
        model_types.PARTIAL_MODEL_TYPES,
        model_types.ROPE_TYPE_ALIASES,
        model_types.ROPE_INTERLEAVE_DEFAULT_MODEL_TYPES,
        model_types.NTK_ALPHA_MODEL_TYPES,
        model_types.QUERY_SCALE_MODEL_TYPES,
        model_types.LONGROPE_MSCALE_MODEL_TYPES,
    )
    assert named - KNOWN_MODEL_TYPES == set()
    assert not KNOWN_MODEL_TYPES & MROPE_MODEL_TYPES


# --------------------------------------------------------------------------- the census
# The model types of transformers' configs that carry RoPE fields, in the folders whose modeling
# code defines a *RotaryEmbedding, are each checked (KNOWN_MODEL_TYPES), read as multimodal
# RoPE (MROPE_MODEL_TYPES), or left out on purpose for one of the reasons below.

#: Vision, video and audio towers and the like: RoPE over patch or frame coordinates, not over
#: one sequence position (the census's list, ``test_rope_census.NOT_SEQUENCE``, with a reason
#: each; its model types, not the config classes it names by class).
NOT_SEQUENCE_POSITIONS = frozenset(name for name in NOT_SEQUENCE if name.islower())

#: Read from the generic fields (with a warning), but a field hf_config does not read changes
#: the rotation; hf/model_types.py names each.
FIELD_NOT_READ_MODEL_TYPES = frozenset(
    {
        "granite_swa",  # layer_rope_theta
        "granitemoe_swa",  # layer_rope_theta
        "granitemoehybrid",  # position_embedding_type (None: no RoPE)
        "molmo2_text",  # rope_scaling_layers
        "muse_glimmer_text",  # layer_rope_theta
        "muse_spark_text",  # layer_rope_theta
        "zamba2",  # use_mem_rope
    }
)

#: Composite configs with RoPE fields of their own, whose rotary modules are built from their
#: sub-configs (BLT: one per transformer).
WRAPPER_MODEL_TYPES = frozenset({"blt"})

LEFT_OUT = {
    "NOT_SEQUENCE_POSITIONS": NOT_SEQUENCE_POSITIONS,
    "FIELD_NOT_READ_MODEL_TYPES": FIELD_NOT_READ_MODEL_TYPES,
    "WRAPPER_MODEL_TYPES": WRAPPER_MODEL_TYPES,
    # refused by name: they rotate something other than every head of a token sequence
    "NOT_TOKEN_ROTATION_MODEL_TYPES": frozenset(model_types.NOT_TOKEN_ROTATION_MODEL_TYPES),
}


def _census() -> tuple[set[str], set[str]]:
    """From transformers' source, read as text (importing every model would take minutes): the
    model types of config classes declaring a field hf_config reads RoPE from, in the folders
    whose modeling code defines a ``*RotaryEmbedding`` class; and every model type of those
    folders."""
    models = Path(transformers.__file__).parent / "models"
    rotary = re.compile(r"^class \w+RotaryEmbedding\(", re.M)
    config_class = re.compile(r"^class \w+\(.*?(?=^class |^@|\Z)", re.M | re.S)
    model_type = re.compile(r'^    model_type = "([^"]+)"', re.M)
    rope_field = re.compile(rf"^    ({'|'.join(hf_config._ROPE_FIELDS)})\b", re.M)
    with_rope, every = set(), set()
    for folder in sorted(path for path in models.iterdir() if path.is_dir()):
        if not any(rotary.search(p.read_text()) for p in folder.glob("modeling_*.py")):
            continue
        for path in folder.glob("configuration_*.py"):
            for body in config_class.findall(path.read_text()):
                if found := model_type.search(body):
                    every.add(found.group(1))
                    if rope_field.search(body):
                        with_rope.add(found.group(1))
    return with_rope, every


def test_known_model_types_cover_the_installed_transformers() -> None:
    if transformers.__version__ != CHECKED_TRANSFORMERS_VERSION:
        pytest.skip(
            f"KNOWN_MODEL_TYPES was checked against transformers {CHECKED_TRANSFORMERS_VERSION}; "
            f"transformers {transformers.__version__} is installed"
        )
    with_rope, every = _census()
    left_out = set().union(*LEFT_OUT.values())
    unaccounted = with_rope - KNOWN_MODEL_TYPES - MROPE_MODEL_TYPES - left_out
    assert not unaccounted, (
        f"model types with a rotary embedding in transformers {transformers.__version__} that "
        f"no list names: {sorted(unaccounted)}; check each against its modeling code and add it "
        "to KNOWN_MODEL_TYPES (hf/model_types.py) or to one of this test's sets"
    )
    assert KNOWN_MODEL_TYPES - every == set()  # no name transformers does not have
    for name, types in LEFT_OUT.items():
        assert types - with_rope == set(), f"{name} names types the census does not find"
        assert types & KNOWN_MODEL_TYPES == set(), f"{name} names checked types"


def test_dynamic_with_alpha_of_a_family_whose_code_ignores_alpha_is_refused() -> None:
    """posenc reads a given ``dynamic`` + ``alpha`` as NTK-alpha (vLLM's spelling); a family
    whose transformers code runs dynamic NTK without reading ``alpha`` (Llama) is refused by
    name rather than read two ways. HunYuan's families read it as NTK-alpha (above)."""
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "rope_scaling": {"rope_type": "dynamic", "factor": 2.0, "alpha": 1000.0},
    }
    with pytest.raises(
        PosencValueError, match=r"model_type 'llama' has rope_type 'dynamic' with alpha"
    ):
        RotaryEmbedding.from_hf_config(config)
