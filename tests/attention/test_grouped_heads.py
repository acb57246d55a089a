"""Grouped-query attention (``num_kv_heads``) and a free head size (``head_dim``): equal to
full multi-head attention with each key/value head repeated for its group (weights copied),
for every scheme that acts inside attention and every backend; cached decoding through grouped
layers equals one full forward; the defaults keep today's parameters."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from tests.schemes import FACTS, NAMES, SEQUENCE

BACKENDS = ["auto", "sdpa", "math", "flex"]
DIM, HEADS, KV_HEADS, HEAD_DIM = 24, 4, 2, 12  # 12: rope2d and rope3d need 4 | d, 6 | d
INSIDE = [
    n for n in NAMES if posenc.entry(n).family in ("rotary", "bias") and not FACTS[n].per_head
]
ATOL, RTOL = 2e-5, 1e-4


def _coordinates(name: str, n: int) -> torch.Tensor | None:
    axes = posenc.entry(name).cls.axes
    if axes == 1:
        return None
    return torch.stack([torch.arange(n) % 3 + a for a in range(axes)], dim=-1)


def _repeated(grouped: posenc.MultiHeadAttention, pe) -> posenc.MultiHeadAttention:
    """Full attention whose key/value head i is the grouped head i // (h / g)."""
    h, g, d = grouped.num_heads, grouped.num_kv_heads, grouped.head_dim
    full = posenc.MultiHeadAttention(
        grouped.dim, h, pe=pe, causal=grouped.causal, head_dim=d, backend=grouped.backend
    )
    full.compile_flex = False
    heads = torch.arange(h) // (h // g)  # the grouped head serving each query head
    with torch.no_grad():
        for part in ("weight", "bias"):
            w = getattr(grouped.qkv, part)
            q, k, v = w.split([h * d, g * d, g * d])
            k, v = (t.unflatten(0, (g, d))[heads].flatten(0, 1) for t in (k, v))
            getattr(full.qkv, part).copy_(torch.cat([q, k, v]))
        full.out.load_state_dict(grouped.out.state_dict())
    return full


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", INSIDE)
def test_grouped_heads_equal_full_attention_with_repeated_heads(name, backend, causal):
    torch.manual_seed(0)
    # a data-dependent bias reads the layer's input: it is as wide as the model
    width = DIM if getattr(posenc.entry(name).cls, "needs_x", False) else HEADS * HEAD_DIM
    pe = posenc.build_for_model(name, width, HEADS)
    grouped = posenc.MultiHeadAttention(
        DIM,
        HEADS,
        pe=pe,
        causal=causal,
        backend=backend,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
    )
    grouped.compile_flex = False
    full = _repeated(grouped, pe)
    x = torch.randn(2, 7, DIM, generator=torch.Generator().manual_seed(1))
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, 5:] = True
    positions = _coordinates(name, 7)
    with torch.no_grad():
        out = grouped(x, key_padding_mask=padding, positions=positions)
        assert_close(
            out, full(x, key_padding_mask=padding, positions=positions), atol=ATOL, rtol=RTOL
        )
    # and under autograd
    out = grouped(x, key_padding_mask=padding, positions=positions)
    assert_close(out, full(x, key_padding_mask=padding, positions=positions), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", SEQUENCE)
def test_cached_decoding_through_grouped_layers_equals_one_forward(name: str) -> None:
    torch.manual_seed(0)
    model = posenc.TransformerModel(
        30, DIM, 2, HEADS, pe=name, causal=True, num_kv_heads=KV_HEADS, head_dim=10
    ).eval()
    tokens = torch.randint(0, 30, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(tokens)
        cache = posenc.KVCache()
        parts = [model(tokens[:, :4], cache=cache)]
        parts += [model(tokens[:, t : t + 1], cache=cache) for t in range(4, 9)]
    assert_close(torch.cat(parts, dim=1), full, atol=ATOL, rtol=RTOL)
    keys, values = cache.keys_values(model.encoder.layers[0].attn)
    assert values.shape == (2, KV_HEADS, 9, 10)  # the grouped heads are cached
    width = 20 if name == "pope" else 10  # PoPE's keys are complex: twice the head dim
    assert keys.shape == (2, KV_HEADS, 9, width)


def test_defaults_keep_the_parameters_of_a_plain_model() -> None:
    """Checkpoints saved before grouped heads existed still load."""
    model = posenc.TransformerModel(30, DIM, 2, HEADS, pe="rope")
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items() if ".attn." in k}
    assert shapes["encoder.layers.0.attn.qkv.weight"] == (3 * DIM, DIM)
    assert shapes["encoder.layers.0.attn.out.weight"] == (DIM, DIM)
    assert set(shapes) == {
        f"encoder.layers.{i}.attn.{p}.{w}"
        for i in range(2)
        for p in ("qkv", "out")
        for w in ("weight", "bias")
    }
    grouped = posenc.MultiHeadAttention(DIM, HEADS, num_kv_heads=1, head_dim=8)
    assert tuple(grouped.qkv.weight.shape) == ((HEADS + 2) * 8, DIM)
    assert tuple(grouped.out.weight.shape) == (DIM, HEADS * 8)
    assert "num_kv_heads=1, head_dim=8" in repr(grouped)


def test_head_dim_sizes_the_encoding() -> None:
    encoder = posenc.Encoder(DIM, 1, 3, pe="rope", head_dim=16)  # 3 heads of 16 in a 24 model
    assert encoder.pe.head_dim == 16 and encoder.layers[0].attn.head_dim == 16
    assert encoder(torch.randn(1, 5, DIM)).shape == (1, 5, DIM)
    additive = posenc.Encoder(DIM, 1, 3, pe="sinusoidal", head_dim=16)
    assert additive.pe.dim == DIM  # an additive scheme stays as wide as the model


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_kv_heads": 3}, ValueError, r"num_kv_heads \(3\) must divide num_heads \(4\)"),
        ({"num_kv_heads": 0}, ValueError, "num_kv_heads"),
        ({"head_dim": 0}, ValueError, "head_dim"),
        ({"head_dim": 2.5}, TypeError, "head_dim"),
    ],
)
def test_bad_head_counts_are_clear_errors(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        posenc.MultiHeadAttention(DIM, HEADS, **kwargs)
    with pytest.raises(error, match=match):
        posenc.Encoder(DIM, 1, HEADS, **kwargs)


def test_a_width_the_heads_do_not_divide_needs_head_dim() -> None:
    with pytest.raises(ValueError, match=r"must divide dim \(24\), or give head_dim"):
        posenc.MultiHeadAttention(DIM, 5)
    assert posenc.MultiHeadAttention(DIM, 5, head_dim=4)(torch.zeros(1, 2, DIM)).shape == (
        1,
        2,
        DIM,
    )
    with pytest.raises(ValueError, match="head_dim=6 but attention has head_dim=4"):
        posenc.MultiHeadAttention(DIM, 5, head_dim=4, pe=posenc.RotaryEmbedding(6))
