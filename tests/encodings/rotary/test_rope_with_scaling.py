"""Changing a trained RoPE model's scaling for evaluation (RotaryEmbedding.with_scaling,
Encoder/TransformerModel.with_rope_scaling, trained_length), and dynamic NTK's original
context in its scaling dictionary, checked against transformers' dynamic NTK."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc import Encoder, RotaryEmbedding, TransformerModel
from posenc.encodings.rope_types.registry import rope_parameters, validate_rope_scaling
from posenc.errors import PosencTypeError, PosencValueError

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"base": 500.0, "rotary_dim": 8},
        {"interleaved": True, "max_position_embeddings": 64},
        {"scaling": {"rope_type": "linear", "factor": 2.0}},
    ],
)
@pytest.mark.parametrize(
    "scaling",
    [None, {"rope_type": "linear", "factor": 4.0}, YARN, {"rope_type": "dynamic", "factor": 2.0,
     "original_max_position_embeddings": 16}],
)  # fmt: skip
def test_with_scaling_equals_a_module_built_with_that_scaling(
    kwargs: dict[str, Any], scaling: dict[str, Any] | None
) -> None:
    rope = RotaryEmbedding(16, **kwargs)
    new = rope.with_scaling(scaling)
    settings = {k: v for k, v in kwargs.items() if k != "scaling"}
    want = RotaryEmbedding(16, **settings, scaling=scaling)
    assert type(new) is RotaryEmbedding and new is not rope
    assert (new.head_dim, new.rotary_dim, new.base, new.interleaved) == (
        want.head_dim,
        want.rotary_dim,
        want.base,
        want.interleaved,
    )
    assert new.scaling == want.scaling
    q, k = torch.randn(2, 3, 40, 16), torch.randn(2, 3, 40, 16)
    for got, expected in zip(new(q, k), want(q, k), strict=True):
        assert_close(got, expected, rtol=0, atol=0)
    assert rope.scaling == RotaryEmbedding(16, **kwargs).scaling  # left as it was


def test_with_scaling_refuses_what_it_cannot_rebuild() -> None:
    assert not hasattr(posenc.build("xpos", head_dim=8), "with_scaling")  # (no HF scaling)
    assert not hasattr(posenc.XPos(8), "cos_cached")  # (no tables it would never read)
    with pytest.raises(PosencValueError, match="learned_freq"):
        RotaryEmbedding(8, learned_freq=True).with_scaling(None)
    with pytest.raises(PosencValueError, match="rope_theta"):
        RotaryEmbedding(8, base=500.0).with_scaling({"rope_type": "default", "rope_theta": 7.0})


def test_model_with_rope_scaling_shares_weights_and_equals_a_scaled_model() -> None:
    torch.manual_seed(0)
    model = TransformerModel(50, 16, 2, 2, pe="rope", causal=True)
    model.trained_length = 16
    assert "trained_length=16" in repr(model.encoder)
    stretched = model.with_rope_scaling({"rope_type": "yarn", "factor": 4.0})
    # The dictionary got the trained length as its original context.
    assert stretched.encoder.pe.scaling["original_max_position_embeddings"] == 16
    assert stretched.trained_length == 16
    assert stretched.embed is model.embed and stretched.head is model.head
    assert all(a is b for a, b in zip(stretched.encoder.layers, model.encoder.layers, strict=True))
    assert model.encoder.pe.rope_type == "default"  # the original is untouched

    # The same weights in a model built with that scaling compute the same logits.
    reference = TransformerModel(50, 16, 2, 2, pe="rope", causal=True, pe_kwargs={"scaling": YARN})
    reference.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 50, (2, 64))
    with torch.no_grad():
        assert_close(stretched(tokens), reference(tokens), rtol=0, atol=0)
        plain = model(tokens)
    assert not torch.equal(plain, reference(tokens).detach())

    # Shared: a change to the original's weights shows in the stretched view.
    with torch.no_grad():
        model.head.bias.add_(1.0)
        assert_close(stretched(tokens), reference(tokens) + 1.0, rtol=1e-6, atol=1e-5)
    # deepcopy gives an independent model (what fine-tuning uses).
    apart = copy.deepcopy(stretched)
    with torch.no_grad():
        model.head.bias.sub_(1.0)
    assert not torch.equal(apart.head.bias, model.head.bias)


def test_with_rope_scaling_keeps_an_explicit_original_length_and_refuses_other_schemes() -> None:
    encoder = Encoder(16, 1, 2, pe="rope")
    encoder.trained_length = 32
    scaled = encoder.with_rope_scaling({**YARN, "original_max_position_embeddings": 8})
    assert scaled.pe.scaling["original_max_position_embeddings"] == 8
    assert encoder.with_rope_scaling(None).pe.rope_type == "default"
    with pytest.raises(PosencValueError, match=r"needs a rotary encoding.*ALiBi"):
        Encoder(16, 1, 2, pe="alibi").with_rope_scaling(YARN)
    with pytest.raises(PosencTypeError, match="scaling must be a dict"):
        encoder.with_rope_scaling("yarn")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- dynamic NTK


def test_dynamic_takes_the_original_context_from_its_dictionary() -> None:
    by_dict = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 32}
    by_argument = {"rope_type": "dynamic", "factor": 2.0}
    for seq_len in (None, 20.0, 100.0):
        got, _ = rope_parameters(by_dict, 16, 10000.0, seq_len=seq_len)
        want, _ = rope_parameters(
            by_argument, 16, 10000.0, max_position_embeddings=32, seq_len=seq_len
        )
        assert_close(got, want, rtol=0, atol=0)
    # The argument fills the dictionary, as for yarn; the dictionary wins when both are given.
    assert validate_rope_scaling(by_argument, rotary_dim=16, max_position_embeddings=32) == by_dict
    mixed = validate_rope_scaling(by_dict, rotary_dim=16, max_position_embeddings=64)
    assert mixed["original_max_position_embeddings"] == 32
    with pytest.raises(PosencValueError, match="needs max_position_embeddings or"):
        RotaryEmbedding(16, scaling=by_argument)


def test_dynamic_with_the_dictionary_rotates_as_transformers_over_a_generation() -> None:
    """One dictionary shape for dynamic and yarn: dynamic NTK given its original context in
    the dictionary (no max_position_embeddings) equals transformers' dynamic NTK whose
    config has max_position_embeddings = that context, while it grows and resets."""
    transformers = pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    transformers.logging.set_verbosity_error()
    config = LlamaConfig(
        hidden_size=32,
        num_attention_heads=2,
        head_dim=16,
        max_position_embeddings=24,
        rope_parameters={"rope_type": "dynamic", "factor": 3.0, "rope_theta": 10000.0},
    )
    hf = LlamaRotaryEmbedding(config)
    ours = RotaryEmbedding(
        16, scaling={"rope_type": "dynamic", "factor": 3.0, "original_max_position_embeddings": 24}
    )
    for positions in (
        torch.arange(10),
        torch.arange(70, 90),
        torch.arange(90, 92),
        torch.arange(5),
    ):
        positions = positions[None]
        q, k = torch.randn(1, 2, positions.shape[1], 16), torch.randn(1, 2, positions.shape[1], 16)
        cos, sin = hf(q, positions)
        want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
        got_q, got_k = ours(q, k, positions)
        assert_close(got_q, want_q, rtol=1e-4, atol=1e-4)
        assert_close(got_k, want_k, rtol=1e-4, atol=1e-4)


def test_from_hf_config_reads_dynamic_as_transformers_does() -> None:
    """transformers takes dynamic NTK's original context from max_position_embeddings even
    when rope_parameters carries original_max_position_embeddings: so does from_hf_config."""
    config = {
        "model_type": "llama",
        "hidden_size": 32,
        "num_attention_heads": 2,
        "max_position_embeddings": 48,
        "rope_parameters": {
            "rope_type": "dynamic",
            "factor": 2.0,
            "rope_theta": 10000.0,
            "original_max_position_embeddings": 12,
        },
    }
    rope = RotaryEmbedding.from_hf_config(config)
    assert rope.scaling["original_max_position_embeddings"] == 48
