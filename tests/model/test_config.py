"""The records layers are built from (``posenc.AttentionConfig``, ``posenc.EncoderConfig``):
``from_config`` builds, under one seed, the same parameters with the same names and the same
outputs as the keyword forms, and every field is checked when the record is made."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import AttentionConfig, Encoder, EncoderConfig, EncoderLayer, MultiHeadAttention
from posenc.errors import PosencTypeError, PosencValueError


def _same_modules(a: torch.nn.Module, b: torch.nn.Module) -> None:
    named_a, named_b = dict(a.named_parameters()), dict(b.named_parameters())
    assert list(named_a) == list(named_b)
    for name, value in named_a.items():
        assert torch.equal(value, named_b[name]), name


def _seeded(make):
    torch.manual_seed(7)
    return make()


def test_attention_from_config_is_the_keyword_form() -> None:
    options = dict(num_kv_heads=2, causal=True, window=4, sinks=True, softcap=30.0,
                   softmax_scale=0.2, dropout=0.0)  # fmt: skip
    keyword = _seeded(lambda: MultiHeadAttention(32, 4, pe="alibi", **options))
    record = _seeded(
        lambda: MultiHeadAttention.from_config(AttentionConfig(32, 4, **options), pe="alibi")
    )
    _same_modules(keyword, record)
    assert keyword.config == record.config
    x = torch.randn(2, 6, 32)
    assert torch.equal(keyword(x), record(x))


@pytest.mark.parametrize("pe", ["rope", ["rope", "none", "alibi"], "sinusoidal"])
def test_encoder_from_config_is_the_keyword_form(pe) -> None:
    per_layer = dict(window=[None, 3, None], sinks=[False, True, True], softcap=[None, 20.0, None])
    options = dict(causal=True, num_kv_heads=2, ffn_dim=48, softmax_scale=0.3, **per_layer)
    keyword = _seeded(lambda: Encoder(32, 3, 4, pe=pe, **options))
    config = EncoderConfig(
        AttentionConfig(32, 4, num_kv_heads=2, causal=True, softmax_scale=0.3),
        depth=3, pe=pe, ffn_dim=48, **per_layer,
    )  # fmt: skip
    record = _seeded(lambda: Encoder.from_config(config))
    _same_modules(keyword, record)
    assert keyword.config == record.config == config
    assert [layer.attn.window for layer in record.layers] == [None, 3, None]
    assert [layer.attn.sinks is not None for layer in record.layers] == [False, True, True]
    x = torch.randn(2, 7, 32)
    assert torch.equal(keyword(x), record(x))
    model = _seeded(lambda: posenc.TransformerModel(50, 32, 3, 4, pe=pe, **options))
    assert model.encoder.config == config


def test_layers_take_a_record_and_at_most_three_more_arguments() -> None:
    config = EncoderConfig(AttentionConfig(16, 2), depth=1, ffn_dim=24, activation="gelu")
    layer = _seeded(lambda: EncoderLayer.from_config(config, pe=posenc.RotaryEmbedding(8)))
    keyword = _seeded(
        lambda: EncoderLayer(16, 2, ffn_dim=24, activation="gelu", pe=posenc.RotaryEmbedding(8))
    )
    _same_modules(layer, keyword)
    import inspect

    assert len(inspect.signature(EncoderLayer.from_config).parameters) <= 4  # cls excluded


def test_records_check_their_fields_when_made() -> None:
    cases = [
        (lambda: AttentionConfig(30, 4), PosencValueError, "num_heads"),
        (lambda: AttentionConfig(32, 4, backend="fast"), PosencValueError, "backend"),
        (lambda: AttentionConfig(32, 4, softcap=0.0), PosencValueError, "softcap"),
        (lambda: AttentionConfig(32, 4, softmax_scale=[0.1, 0.2]), PosencTypeError,
         "softmax_scale is one number"),
        (lambda: AttentionConfig(32, 4).for_layer(heads=2), PosencValueError, "for_layer takes"),
        (lambda: EncoderConfig(AttentionConfig(32, 4), depth=0), PosencValueError, "depth"),
        (lambda: EncoderConfig({"dim": 32}, depth=2), PosencTypeError, "AttentionConfig"),
        (lambda: EncoderConfig(AttentionConfig(32, 4), depth=2, window=[1]), PosencValueError,
         "window has 1 entries but the model has depth=2"),
        (lambda: EncoderConfig(AttentionConfig(32, 4, window=8), depth=2, window=[1, 2]),
         PosencValueError, "window is set both for every layer"),
        (lambda: EncoderConfig(AttentionConfig(32, 4), depth=2, activation="tanh"),
         PosencValueError, "activation"),
        (lambda: Encoder.from_config(AttentionConfig(32, 4)), PosencTypeError, "EncoderConfig"),
        (lambda: MultiHeadAttention.from_config({"dim": 4}), PosencTypeError, "AttentionConfig"),
    ]  # fmt: skip
    for make, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            make()
    # the record fills in what the layer would: equal records build equal layers
    assert AttentionConfig(32, 4) == AttentionConfig(32, 4, num_kv_heads=4, head_dim=8)
