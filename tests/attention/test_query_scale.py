"""Position-dependent query scaling against transformers' code: Llama 4's NoPE-layer
temperature (its attention module, weights copied) and Ministral 3's ``llama_4_scaling_beta``
(its scaling function); the formula in float64; cached decoding with a scaled layer."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc import QueryScale
from tests.peers import require_internals


def test_the_factor_is_the_formula_in_float64() -> None:
    scale = QueryScale(scale=0.3, floor=5.0, offset=1.0)
    positions = torch.arange(0, 200)
    expected = [1 + 0.3 * math.log(1 + math.floor((p + 1) / 5)) for p in range(200)]
    assert_close(scale.factor(positions).double(), torch.tensor(expected, dtype=torch.float64))


def test_ministral3_scaling_equals_transformers() -> None:
    import transformers
    from transformers.models.ministral3 import modeling_ministral3 as ministral3

    require_internals(
        transformers,
        {"ministral3.get_llama_4_attn_scale": hasattr(ministral3, "get_llama_4_attn_scale")},
    )
    positions = torch.arange(0, 5000).view(1, -1)
    theirs = ministral3.get_llama_4_attn_scale(positions, 0.1, 1024)  # (1, 1, n, 1)
    ours = QueryScale.ministral3(beta=0.1, original_max_position_embeddings=1024)
    assert_close(ours.factor(positions).view(1, 1, -1, 1), theirs.float(), atol=0, rtol=0)


def test_llama4_nope_layer_equals_transformers_attention() -> None:
    """A Llama 4 NoPE layer with attn_temperature_tuning: transformers' own attention module
    and posenc's (grouped heads, head_dim, causal, query scale; weights copied)."""
    import transformers
    from transformers import Llama4TextConfig
    from transformers.models.llama4 import modeling_llama4 as llama4

    require_internals(
        transformers, {"llama4.Llama4TextAttention": hasattr(llama4, "Llama4TextAttention")}
    )
    config = Llama4TextConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_hidden_layers=2,
        no_rope_layers=[1, 0],  # layer 1: NoPE
        attn_temperature_tuning=True,
        floor_scale=4,
        attn_scale=0.5,
        intermediate_size=64,
        intermediate_size_mlp=64,
        vocab_size=50,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = llama4.Llama4TextAttention(config, layer_idx=1).eval()
    assert not theirs.use_rope
    ours = posenc.MultiHeadAttention(
        32,
        4,
        num_kv_heads=2,
        head_dim=8,
        causal=True,
        bias=False,
        query_scale=QueryScale.llama4(attn_scale=0.5, floor_scale=4),
    ).eval()
    with torch.no_grad():
        ours.qkv.weight.copy_(
            torch.cat([theirs.q_proj.weight, theirs.k_proj.weight, theirs.v_proj.weight])
        )
        ours.out.weight.copy_(theirs.o_proj.weight)
    n = 23
    x = torch.randn(2, n, 32, generator=torch.Generator().manual_seed(1))
    causal = torch.full((n, n), float("-inf")).triu(1).view(1, 1, n, n)
    with torch.no_grad():
        expected, _ = theirs(x, position_embeddings=None, attention_mask=causal)
        assert_close(ours(x), expected, atol=2e-6, rtol=1e-5)
        cache = posenc.KVCache()  # the scale follows the position through a cache
        steps = [ours(x[:, :7], cache=cache)] + [
            ours(x[:, t : t + 1], cache=cache) for t in range(7, n)
        ]
    assert_close(torch.cat(steps, dim=1), expected, atol=2e-6, rtol=1e-5)


def test_a_per_layer_query_scale_and_its_errors() -> None:
    scale = QueryScale.llama4(attn_scale=0.1, floor_scale=8)
    encoder = posenc.Encoder(16, 2, 2, pe=["rope", "none"], query_scale=[None, scale])
    assert (
        encoder.layers[1].attn.query_scale is scale and encoder.layers[0].attn.query_scale is None
    )
    assert "query_scale=QueryScale(scale=0.1" in repr(encoder.layers[1].attn)
    with pytest.raises(TypeError, match=r"query_scale must be a posenc\.QueryScale"):
        posenc.MultiHeadAttention(16, 2, query_scale=0.1)
    with pytest.raises(ValueError, match="query_scale has 1 entries"):
        posenc.Encoder(16, 2, 2, query_scale=[scale])
    with pytest.raises(ValueError, match="floor must be > 0"):
        QueryScale(scale=0.1, floor=0)
