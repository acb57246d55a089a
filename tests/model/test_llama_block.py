"""Today's block, ``Encoder(..., norm="rms", ffn="swiglu", bias=False)`` with RoPE, against
transformers' Llama stack (``LlamaModel`` over ``inputs_embeds``: its rotary embedding, two
``LlamaDecoderLayer``s and the final ``LlamaRMSNorm``), weights copied: outputs and gradients,
with and without autograd (the fused inference path); and the parts' formulas."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import posenc
from posenc.model.layers import RMSNorm, SwiGLU, make_norm


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    ours, theirs = ours.detach().double(), theirs.detach().double()
    return float((ours - theirs).abs().max() / theirs.abs().max())


def llama_pair() -> tuple[nn.Module, posenc.Encoder]:
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        vocab_size=8,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = LlamaModel(config)
    with torch.no_grad():  # norms start at ones: make them say something
        for name, p in theirs.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    ours = posenc.Encoder(
        32,
        2,
        4,
        num_kv_heads=2,
        pe="rope",
        causal=True,
        norm="rms",
        ffn="swiglu",
        bias=False,
        ffn_dim=48,
        norm_eps=1e-6,
    )
    with torch.no_grad():
        for mine, layer in zip(ours.layers, theirs.layers, strict=True):
            a = layer.self_attn
            mine.attn.qkv.weight.copy_(
                torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
            )
            mine.attn.out.weight.copy_(a.o_proj.weight)
            for part in ("gate", "up", "down"):
                getattr(mine.ffn, part).weight.copy_(getattr(layer.mlp, f"{part}_proj").weight)
            mine.norm1.weight.copy_(layer.input_layernorm.weight)
            mine.norm2.weight.copy_(layer.post_attention_layernorm.weight)
        ours.norm.weight.copy_(theirs.norm.weight)
    return theirs, ours


def test_the_block_has_no_biases_and_keeps_the_defaults() -> None:
    _, ours = llama_pair()
    assert not [name for name, _ in ours.named_parameters() if name.endswith("bias")]
    assert isinstance(ours.norm, RMSNorm) and isinstance(ours.layers[0].ffn, SwiGLU)
    default = posenc.Encoder(32, 1, 4)
    assert isinstance(default.norm, nn.LayerNorm) and default.norm.bias is not None
    assert default.config.norm == "layer" and default.config.ffn == "mlp" and default.config.bias
    assert posenc.Encoder(24, 1, 4, ffn="swiglu").layers[0].ffn.up.out_features == 64


@pytest.mark.parametrize("offset", [0, 5])
def test_the_stack_equals_transformers_llama(offset: int) -> None:
    theirs, ours = llama_pair()
    x = torch.randn(2, 13, 32, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(offset, offset + 13)
    x_theirs = x.clone().requires_grad_()
    x_ours = x.clone().requires_grad_()
    expected = theirs(inputs_embeds=x_theirs, position_ids=positions[None]).last_hidden_state
    got = ours(x_ours, positions=positions)
    assert relative_error(got, expected) <= 1e-6
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(2))
    expected.backward(grad)
    got.backward(grad)
    assert x_ours.grad is not None and x_theirs.grad is not None
    assert relative_error(x_ours.grad, x_theirs.grad) <= 1e-6
    pairs = {"norm.weight": theirs.norm.weight}
    for i, layer in enumerate(theirs.layers):
        pairs[f"layers.{i}.attn.out.weight"] = layer.self_attn.o_proj.weight
        pairs[f"layers.{i}.norm1.weight"] = layer.input_layernorm.weight
        pairs[f"layers.{i}.norm2.weight"] = layer.post_attention_layernorm.weight
        for part in ("gate", "up", "down"):
            pairs[f"layers.{i}.ffn.{part}.weight"] = getattr(layer.mlp, f"{part}_proj").weight
    mine = dict(ours.named_parameters())
    for name, p in pairs.items():
        assert relative_error(mine[name].grad, p.grad) <= 1e-6, name
    for i, layer in enumerate(theirs.layers):
        a = layer.self_attn
        qkv = torch.cat([a.q_proj.weight.grad, a.k_proj.weight.grad, a.v_proj.weight.grad])
        assert relative_error(mine[f"layers.{i}.attn.qkv.weight"].grad, qkv) <= 1e-6
    with torch.no_grad():  # the fused inference path: the same sums
        assert relative_error(ours(x, positions=positions), expected) <= 1e-6


def test_rmsnorm_and_swiglu_are_their_formulas_in_float64() -> None:
    torch.manual_seed(3)
    x = torch.randn(3, 5, 8)
    norm = RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x64, w64 = x.double(), norm.weight.double()
    expected = w64 * x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert relative_error(norm(x), expected) <= 1e-6
    assert norm(x.bfloat16()).dtype == torch.bfloat16
    ffn = SwiGLU(8, 12, bias=True)
    g, u, d = ffn.gate, ffn.up, ffn.down
    h = torch.nn.functional.silu(x64 @ g.weight.double().T + g.bias.double())
    h = h * (x64 @ u.weight.double().T + u.bias.double())
    expected = h @ d.weight.double().T + d.bias.double()
    assert relative_error(ffn(x), expected) <= 1e-6


def test_bad_block_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="norm must be 'layer' or 'rms', got 'batch'"):
        posenc.Encoder(16, 1, 2, norm="batch")
    with pytest.raises(ValueError, match="ffn must be 'mlp' or 'swiglu', got 'geglu'"):
        posenc.Encoder(16, 1, 2, ffn="geglu")
    with pytest.raises(TypeError, match="bias"):
        posenc.Encoder(16, 1, 2, bias="no")
    with pytest.raises(ValueError, match="norm_eps"):
        posenc.Encoder(16, 1, 2, norm_eps=0.0)
    layer = posenc.EncoderLayer(16, 2, norm="rms", ffn="swiglu", bias=False)
    assert layer.attn.qkv.bias is None and isinstance(layer.norm1, RMSNorm)
    assert make_norm("layer", 4, bias=False).bias is None


def test_the_record_builds_the_same_block() -> None:
    config = posenc.EncoderConfig(
        posenc.AttentionConfig(32, 4, causal=True, bias=False),
        depth=2,
        pe="rope",
        norm="rms",
        ffn="swiglu",
    )
    assert config.bias is False  # None: the attention record's
    torch.manual_seed(4)
    built = posenc.Encoder.from_config(config)
    torch.manual_seed(4)
    keywords = posenc.Encoder(
        32, 2, 4, pe="rope", causal=True, norm="rms", ffn="swiglu", bias=False
    )
    assert built.config == keywords.config
    theirs = keywords.state_dict()
    assert all(torch.equal(p, theirs[name]) for name, p in built.state_dict().items())
