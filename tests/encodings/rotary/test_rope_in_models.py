"""RoPE wired into the models (``src/posenc/encodings/rotary/rope.py``): the registry, the
Encoder end to end, and transformers' Llama with posenc's rotation giving the same logits.
The formula, peers and positions are ``test_rope.py``'s."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc import (
    AxialRotaryEmbedding,
    Encoder,
    RotaryEmbedding,
    XPos,
    build_for_model,
)
from tests.peers import parameters, require_internals
from tests.schemes import SEQUENCE, of_family

# --------------------------------------------------------------------------- wired in


def test_registry_names_and_for_model() -> None:
    assert {"rope", "rope-interleaved", "xpos", "rope2d", "rope3d"} <= set(posenc.available())
    rope = build_for_model("rope", 64, 4)
    assert isinstance(rope, RotaryEmbedding) and rope.head_dim == 16 and not rope.interleaved
    assert build_for_model("rope-interleaved", 64, 4).interleaved
    assert isinstance(build_for_model("xpos", 64, 8), XPos)
    assert build_for_model("rope2d", 64, 4).ndim == 2
    assert build_for_model("rope3d", 96, 4).ndim == 3
    assert all(posenc.entry(n).family == "rotary" for n in ("rope", "xpos", "rope2d"))


def _encoder(pe: str, **kwargs: object) -> Encoder:
    torch.manual_seed(1)
    return Encoder(32, 2, 4, pe=pe, **kwargs).eval()  # type: ignore[arg-type]


@pytest.mark.parametrize("pe", [name for name in of_family("rotary") if name in SEQUENCE])
def test_encoder_with_rotary_is_shift_invariant_and_order_aware(pe: str) -> None:
    enc = _encoder(pe)
    if pe == "xpos":
        enc.pe.center = 0.0  # a fixed centre: shifts then cancel exactly
    if pe == "pope":  # at phase 0 its scores are even in i - j: a phase makes order count
        with torch.no_grad():
            enc.pe.phase.uniform_(-2 * math.pi, 0.0)
    if pe == "fope":  # mixed tables are no rotation; with identity mixing it is RoPE
        with torch.no_grad():
            for coef in (enc.pe.cos_coef, enc.pe.sin_coef):
                coef.copy_(torch.eye(coef.shape[-1]).expand_as(coef))
    x = torch.randn(2, 9, 32)
    positions = torch.arange(9)
    out = enc(x, positions=positions)
    assert_close(enc(x, positions=positions + 25), out, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(enc(x, positions=positions.flip(0)), out, atol=1e-3)
    assert_close(enc(x), out)


def test_encoder_with_rope_causal_and_key_padding() -> None:
    enc = _encoder("rope", causal=True)
    x = torch.randn(2, 8, 32)
    out = enc(x)
    changed = x.clone()
    changed[:, 5:] = torch.randn(2, 3, 32)
    assert_close(enc(changed)[:, :5], out[:, :5])  # causal: the future does not leak

    enc = _encoder("rope")
    padding = torch.zeros(2, 8, dtype=torch.bool)
    padding[1, 6:] = True
    out = enc(x, key_padding_mask=padding)
    changed = x.clone()
    changed[1, 6:] = 100.0
    assert_close(enc(changed, key_padding_mask=padding)[1, :6], out[1, :6])


def test_encoder_with_rope2d_takes_coordinates() -> None:
    enc = _encoder("rope2d")
    x = torch.randn(2, 12, 32)
    coords = AxialRotaryEmbedding.grid(3, 4)
    out = enc(x, positions=coords)
    assert out.shape == (2, 12, 32)
    batched = torch.stack((coords, coords + torch.tensor([2, 5])))  # (b, n, 2)
    shifted = enc(x, positions=batched)
    assert_close(shifted, out, rtol=1e-4, atol=1e-4)  # a 2-D shift changes nothing
    assert not torch.allclose(enc(x, positions=coords.flip(-1)), out, atol=1e-3)
    # no coordinates: refused (it rotated every token as if on one row), as sinusoidal-2d is
    with pytest.raises(ValueError, match=r"Rotary2DEmbedding needs positions.*\(seq, 2\)"):
        enc(x)


# --------------------------------------------------------------------------- drop-in proof


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "rope_theta": 50000.0,
        },
    ],
    ids=["default", "yarn"],
)
def test_llama_with_posenc_rotary_gives_the_same_logits(
    rope_parameters: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny random LlamaForCausalLM; its rotary step is replaced by posenc's: the model's
    rotary module hands the position ids through instead of cos/sin, and every attention layer
    rotates q, k with posenc.RotaryEmbedding (from the same config). Same logits."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_parameters=rope_parameters,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    tokens = torch.randint(0, 100, (2, 40))
    position_ids = torch.stack((torch.arange(40), torch.arange(7, 47)))  # one row at an offset
    with torch.no_grad():
        want = model(tokens, position_ids=position_ids).logits

    rope = RotaryEmbedding.from_hf_config(config)
    calls = []

    class PositionsThrough(torch.nn.Module):
        def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple:
            return position_ids, position_ids  # arrives in attention as (cos, sin)

    def posenc_rotary(q, k, positions, _unused, unsqueeze_dim=1):  # type: ignore[no-untyped-def]
        calls.append(positions.shape)
        return rope(q, k, positions)

    require_internals(
        transformers,
        {
            "LlamaModel.rotary_emb": hasattr(model.model, "rotary_emb"),
            "apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)": parameters(
                modeling_llama.apply_rotary_pos_emb
            )
            == ["q", "k", "cos", "sin", "unsqueeze_dim"],
        },
    )
    monkeypatch.setattr(model.model, "rotary_emb", PositionsThrough())
    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", posenc_rotary)
    with torch.no_grad():
        got = model(tokens, position_ids=position_ids).logits
    assert len(calls) == 2  # both layers went through posenc
    assert_close(got, want, rtol=1e-5, atol=1e-5)
