"""Attention, feed-forward, encoder layer and stack against independent references:
attention written out by hand in float64, and torch.nn.TransformerEncoderLayer with the same
weights."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import posenc
from posenc import (
    Encoder,
    EncoderLayer,
    FeedForward,
    MultiHeadAttention,
    TransformerModel,
    fused,
    scaled_dot_product_attention,
)


def reference_mha(
    attn: MultiHeadAttention, x: torch.Tensor, allowed: torch.Tensor | None
) -> torch.Tensor:
    """softmax(q kᵀ/√d + mask) v per head, written out, float64."""
    b, n, dim = x.shape
    h, d = attn.num_heads, attn.head_dim
    w, bias = attn.qkv.weight.double(), attn.qkv.bias.double()
    qkv = x.double() @ w.T + bias
    q, k, v = qkv[..., :dim], qkv[..., dim : 2 * dim], qkv[..., 2 * dim :]
    out = torch.zeros(b, n, dim, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            cols = slice(hi * d, (hi + 1) * d)
            scores = q[bi, :, cols] @ k[bi, :, cols].T / math.sqrt(d)
            if allowed is not None:
                scores = scores.masked_fill(~allowed[bi], float("-inf"))
            out[bi, :, cols] = scores.softmax(-1) @ v[bi, :, cols]
    return out @ attn.out.weight.double().T + attn.out.bias.double()


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_attention_matches_reference(backend: str, causal: bool, padded: bool) -> None:
    attn = MultiHeadAttention(24, 3, causal=causal, backend=backend).double()
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    if padded:
        padding[1, 5:] = True
    allowed = torch.ones(2, 7, 7, dtype=torch.bool)
    if causal:
        allowed &= torch.ones(7, 7, dtype=torch.bool).tril()
    allowed &= ~padding[:, None, :]
    out = attn(x, key_padding_mask=padding if padded else None)
    assert_close(out, reference_mha(attn, x, allowed), rtol=0, atol=1e-12)


def test_weights_returned_and_fp16_safe() -> None:
    q = torch.randn(1, 2, 4, 8)
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    out, w = scaled_dot_product_attention(q, q, q, mask)
    assert_close(w.sum(-1), torch.ones(1, 2, 4))
    assert (w[..., ~mask] == 0).all()
    half = q.half()
    out_h, _ = scaled_dot_product_attention(half, half, half, mask)
    assert out_h.dtype == torch.float16 and torch.isfinite(out_h).all()
    assert_close(out_h.float(), out, rtol=0, atol=2e-3)
    # a fully masked row gives uniform weights, never NaN
    _, w0 = scaled_dot_product_attention(q, q, q, torch.zeros(4, 4, dtype=torch.bool))
    assert_close(w0, torch.full_like(w0, 0.25))


def test_need_weights_equals_fused_path() -> None:
    attn = MultiHeadAttention(16, 4, causal=True)
    x = torch.randn(2, 5, 16)
    fused = attn(x)
    out, weights = attn(x, need_weights=True)
    assert_close(out, fused, rtol=1e-5, atol=1e-6)
    assert weights.shape == (2, 4, 5, 5)


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_layer_matches_torch_transformer_encoder_layer(norm_first: bool, grad: bool) -> None:
    """With autograd on (out-of-place residuals) and off (residuals accumulated by the output
    projections' GEMMs, ReLU fused into the up-projection), and torch's side on its fused
    fast path when autograd is off."""
    dim, heads, ffn = 32, 4, 64
    ours = EncoderLayer(dim, heads, ffn_dim=ffn, norm_first=norm_first).double().eval()
    theirs = (
        nn.TransformerEncoderLayer(
            dim, heads, ffn, dropout=0.0, batch_first=True, norm_first=norm_first
        )
        .double()
        .eval()
    )
    with torch.no_grad():
        theirs.self_attn.in_proj_weight.copy_(ours.attn.qkv.weight)
        theirs.self_attn.in_proj_bias.copy_(ours.attn.qkv.bias)
        theirs.self_attn.out_proj.weight.copy_(ours.attn.out.weight)
        theirs.self_attn.out_proj.bias.copy_(ours.attn.out.bias)
        theirs.linear1.load_state_dict(ours.ffn.up.state_dict())
        theirs.linear2.load_state_dict(ours.ffn.down.state_dict())
        theirs.norm1.load_state_dict(ours.norm1.state_dict())
        theirs.norm2.load_state_dict(ours.norm2.state_dict())
    x = torch.randn(3, 9, dim, dtype=torch.float64)
    padding = torch.zeros(3, 9, dtype=torch.bool)
    padding[0, 6:] = True
    with torch.set_grad_enabled(grad):
        got = ours(x, key_padding_mask=padding)
        want = theirs(x, src_key_padding_mask=padding)
    assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward_equals_its_equation(activation: str) -> None:
    """``ffn(x) = act(x W1ᵀ + b1) W2ᵀ + b2``; the deprecated ``residual=`` adds ``r`` once and
    warns."""
    ffn = FeedForward(6, 10, activation=activation).double()  # type: ignore[arg-type]
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    r = torch.randn(2, 3, 6, dtype=torch.float64)
    act = torch.relu if activation == "relu" else torch.nn.functional.gelu
    expected = act(x @ ffn.up.weight.T + ffn.up.bias) @ ffn.down.weight.T + ffn.down.bias
    assert_close(ffn(x), expected, rtol=0, atol=1e-14)
    with pytest.warns(DeprecationWarning, match="residual"):
        assert_close(ffn(x, residual=r), r + expected, rtol=0, atol=1e-14)


def test_fused_residual_linear_equals_linear_plus_residual() -> None:
    """The inference fast path's GEMM-accumulate: ``residual + linear(h)``."""
    linear = torch.nn.Linear(6, 4).double()
    h = torch.randn(2, 3, 6, dtype=torch.float64)
    r = torch.randn(2, 3, 4, dtype=torch.float64)
    with torch.no_grad():
        got = fused.residual_linear(linear, h, r).view(2, 3, 4)
    assert_close(got, r + h @ linear.weight.T + linear.bias, rtol=0, atol=1e-14)


def test_attention_residual_is_deprecated_and_added_once() -> None:
    attn = MultiHeadAttention(16, 4).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    r = torch.randn(2, 5, 16, dtype=torch.float64)
    plain = attn(x)
    for grad in (True, False):
        with torch.set_grad_enabled(grad), pytest.warns(DeprecationWarning, match="residual"):
            assert_close(attn(x, residual=r), r + plain, rtol=0, atol=1e-14)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_encoder_inference_equals_autograd_path(dropout: float) -> None:
    """Eval mode: the fused inference path equals the autograd path; train mode with dropout
    keeps the plain one (dropout before the residual add) and is seeded-reproducible."""
    torch.manual_seed(0)
    enc = Encoder(32, 2, 4, pe="rope", dropout=dropout).double().eval()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    with torch.no_grad():
        fused = enc(x)
    assert_close(fused, enc(x), rtol=0, atol=1e-12)
    enc.train()
    torch.manual_seed(1)
    first = enc(x)
    torch.manual_seed(1)
    assert torch.equal(first, enc(x))
    if dropout:
        assert not torch.allclose(first, fused)


def test_feed_forward_formula() -> None:
    ffn = FeedForward(6, 10).double()
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    expected = torch.relu(x @ ffn.up.weight.T + ffn.up.bias) @ ffn.down.weight.T + ffn.down.bias
    assert_close(ffn(x), expected, rtol=0, atol=1e-14)


def test_encoder_adds_additive_encoding_once() -> None:
    enc = Encoder(16, 2, 4, pe="sinusoidal").double().eval()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    manual = enc.pe(x)
    for layer in enc.layers:
        manual = layer(manual)
    assert_close(enc(x), enc.norm(manual), rtol=0, atol=0)


@pytest.mark.parametrize("pe", ["none", "sinusoidal", "learned", "scaled-sinusoidal"])
def test_encoder_positions_paths_agree(pe: str) -> None:
    enc = Encoder(16, 2, 2, pe=pe).eval()
    x = torch.randn(2, 6, 16)
    assert torch.equal(enc(x, positions=torch.arange(6)), enc(x))


def test_padding_does_not_leak() -> None:
    enc = Encoder(16, 2, 4, pe="sinusoidal").eval()
    x = torch.randn(1, 8, 16)
    pad = torch.zeros(1, 8, dtype=torch.bool)
    pad[0, 5:] = True
    y = enc(x, key_padding_mask=pad)
    x2 = x.clone()
    x2[0, 5:] = 100.0  # change only padded tokens
    assert_close(enc(x2, key_padding_mask=pad)[:, :5], y[:, :5])


def test_causal_does_not_see_future() -> None:
    enc = Encoder(16, 2, 4, pe="sinusoidal", causal=True).eval()
    x = torch.randn(1, 8, 16)
    x2 = x.clone()
    x2[0, 6:] = -3.0
    assert_close(enc(x2)[:, :6], enc(x)[:, :6])


def test_nope_encoder_is_permutation_equivariant() -> None:
    enc = Encoder(16, 2, 4, pe="none").double().eval()
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    perm = torch.randperm(7)
    assert_close(enc(x[:, perm]), enc(x)[:, perm], rtol=0, atol=1e-12)
    enc_pe = Encoder(16, 2, 4, pe="sinusoidal").double().eval()
    assert (enc_pe(x[:, perm]) - enc_pe(x)[:, perm]).abs().max() > 1e-3


def test_model_embeds_scaled_and_predicts() -> None:
    model = TransformerModel(50, 16, 1, 2, pe="none", num_outputs=7).eval()
    tokens = torch.randint(0, 50, (3, 5))
    logits = model(tokens)
    assert logits.shape == (3, 5, 7)
    x = model.embed(tokens) * 4.0  # sqrt(16)
    assert_close(logits, model.head(model.encoder(x)))


@pytest.mark.slow
def test_training_step_learns() -> None:
    torch.manual_seed(0)
    model = TransformerModel(10, 32, 2, 4, pe="sinusoidal")
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 10, (16, 8))
    losses = []
    for _ in range(30):  # learn to copy the input
        loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


def test_registry() -> None:
    names = posenc.available()
    for name in ("none", "sinusoidal", "learned"):
        assert name in names
    assert isinstance(posenc.build("none"), posenc.NoPE)
    with pytest.raises(
        ValueError, match=r"unknown positional encoding 'nope'; known: .*sinusoidal"
    ):
        posenc.build("nope")
    for name in names:
        assert posenc.entry(name).family in posenc.FAMILIES


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: MultiHeadAttention(10, 3), ValueError, r"num_heads \(3\) must divide dim \(10\)"),
        (lambda: MultiHeadAttention(0, 1), ValueError, "dim must be >= 1, got 0"),
        (lambda: MultiHeadAttention(8, 2, backend="fast"), ValueError, "backend must be one of"),
        (
            lambda: MultiHeadAttention(8, 2, pe=posenc.build("sinusoidal", dim=8)),
            TypeError,
            "additive",
        ),
        (lambda: Encoder(12, 2, 5), ValueError, r"num_heads \(5\) must divide dim \(12\)"),
        (lambda: Encoder(12, 0, 3), ValueError, "depth must be >= 1, got 0"),
        (lambda: Encoder(12, 1, 3, pe="bogus"), ValueError, "unknown positional encoding 'bogus'"),
        (lambda: Encoder(12, 1, 3, pe=3), TypeError, "pe must be"),
        (
            lambda: Encoder(8, 1, 2)(torch.zeros(1, 3, 9)),
            ValueError,
            "last dimension 9, expected dim=8",
        ),
        (lambda: Encoder(8, 1, 2)(torch.zeros(3, 8)), ValueError, "must have 3 dimensions"),
        (
            lambda: Encoder(8, 1, 2)(
                torch.zeros(1, 3, 8), key_padding_mask=torch.zeros(1, 4, dtype=torch.bool)
            ),
            ValueError,
            "key_padding_mask must have shape",
        ),
        (
            lambda: Encoder(8, 1, 2)(torch.zeros(1, 3, 8), key_padding_mask=torch.zeros(1, 3)),
            TypeError,
            "bool",
        ),
        (
            lambda: Encoder(8, 1, 2)(torch.zeros(1, 3, 8), positions=torch.arange(4)),
            ValueError,
            "positions must have shape",
        ),
        (
            lambda: TransformerModel(5, 8, 1, 2)(torch.tensor([[0, 5]])),
            ValueError,
            r"token ids must be in \[0, 5\)",
        ),
        (lambda: TransformerModel(5, 8, 1, 2)(torch.zeros(1, 2)), TypeError, "tokens must be"),
    ],
)
def test_bad_input(call, error, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        call()


# --------------------------------------------------------------------------- positions once


def _host_syncs(enc: Encoder, x: torch.Tensor, positions: torch.Tensor | None) -> int:
    """``aten::_local_scalar_dense`` calls (``.item()``, ``int(t)``, a tensor in an ``if``)
    in one forward after warm-up."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        enc(x, positions=positions)  # warm-up: tables grow here
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            enc(x, positions=positions)
    return sum(e.count for e in prof.key_averages() if e.key == "aten::_local_scalar_dense")


@pytest.mark.parametrize("pe", ["sinusoidal", "learned", "rope", "alibi", "t5"])
def test_host_syncs_do_not_grow_with_depth(pe: str) -> None:
    """Positions are resolved, and the encoding asked, once per forward: the host syncs of
    depth 4 and depth 8 are the same small constant with explicit positions, and zero with
    the default ones."""
    torch.manual_seed(0)
    x = torch.randn(2, 16, 32)
    explicit = torch.arange(16) + 3
    counts = {}
    for depth in (4, 8):
        enc = Encoder(32, depth, 4, pe=pe).eval()
        counts[depth] = (_host_syncs(enc, x, None), _host_syncs(enc, x, explicit))
    assert counts[4] == counts[8], counts
    default, given = counts[4]
    assert default == 0
    assert 1 <= given <= 2  # validating the positions (and, for a table, their largest one)


@pytest.mark.parametrize("pe", ["alibi", "t5", "kerple", "fire", "dpb"])
def test_bias_is_computed_once_per_forward(pe: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bias that reads neither q nor k is made at the first layer and reused by the rest;
    the result equals each layer asking for it (the MultiHeadAttention path)."""
    torch.manual_seed(0)
    enc = Encoder(16, 3, 2, pe=pe, backend="sdpa").double().eval()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    calls = []
    original = type(enc.pe).bias

    def counting(self: object, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(type(enc.pe), "bias", counting)
    with torch.no_grad():
        got = enc(x)
    assert len(calls) == 1
    h = x
    for layer in enc.layers:  # each layer asks the encoding itself, with autograd on
        h = layer(h, pe=enc.pe)
    assert_close(got, enc.norm(h), rtol=0, atol=1e-12)


@pytest.mark.parametrize("pe", ["rope", "xpos", "rope-interleaved", "alibi", "t5", "shaw"])
def test_position_state_equals_asking_each_layer(pe: str) -> None:
    """The Encoder's once-per-forward state gives the output of each layer asking the
    encoding with the same explicit positions (float64, autograd path)."""
    torch.manual_seed(0)
    enc = Encoder(16, 2, 2, pe=pe).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    positions = torch.tensor([[0, 2, 3, 5, 8, 9], [1, 2, 3, 4, 5, 6]])
    h = x
    for layer in enc.layers:
        h = layer(h, positions=positions, pe=enc.pe)
    assert_close(enc(x, positions=positions), enc.norm(h), rtol=0, atol=1e-12)


def test_causal_encoder_builds_unidirectional_t5_buckets() -> None:
    """T5's decoder sees one direction: a causal Encoder's T5 bias equals Hugging Face's
    ``T5Attention(is_decoder=True)`` bias; ``bidirectional`` given explicitly still wins."""
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    enc = Encoder(32, 1, 4, pe="t5", causal=True)
    assert enc.pe.bidirectional is False
    assert Encoder(32, 1, 4, pe="t5").pe.bidirectional is True
    kept = Encoder(32, 1, 4, pe="t5", causal=True, pe_kwargs={"bidirectional": True})
    assert kept.pe.bidirectional is True
    config = T5Config(d_model=32, d_kv=8, num_heads=4, is_decoder=True)
    hf = T5Attention(config, has_relative_attention_bias=True)
    with torch.no_grad():
        hf.relative_attention_bias.weight.copy_(enc.pe.relative_attention_bias.weight)
        want = hf.compute_bias(40, 40)[0]  # (h, q, k)
    got = enc.pe.bias(torch.arange(40), torch.arange(40))
    assert_close(got, want, rtol=0, atol=0)


# --------------------------------------------------------------------------- randomized


def test_randomize_positions_keeps_order_and_ties() -> None:
    """Ruoss et al. 2023: sorted distinct draws from [0, L); coupled (tied) positions stay
    tied; one draw per row; reproducible from a generator."""
    g = torch.Generator().manual_seed(0)
    out = posenc.randomize_positions(None, 50, 200, generator=g)
    assert out.shape == (50,)
    assert bool((out[1:] > out[:-1]).all()) and int(out.min()) >= 0 and int(out.max()) < 200
    coupled = torch.tensor([[0, 1, 2, 1, 2, 3], [0, 0, 1, 1, 2, 2]])
    mapped = posenc.randomize_positions(coupled, 6, 30, generator=g)
    for row, src in zip(mapped, coupled, strict=True):
        for i in range(6):
            for j in range(6):  # the order of every pair is kept, ties included
                assert (row[i] < row[j]) == (src[i] < src[j])
                assert (row[i] == row[j]) == (src[i] == src[j])
    again = posenc.randomize_positions(None, 50, 200, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again, out)
    with pytest.raises(ValueError, match="max_positions >= 7"):
        posenc.randomize_positions(None, 7, 6)


def test_randomize_positions_is_uniform_over_subsets() -> None:
    """Every position of [0, L) is drawn equally often (the first of n draws is the minimum of
    a uniform n-subset: P(min = p) = C(L-1-p, n-1) / C(L, n))."""
    g = torch.Generator().manual_seed(1)
    draws = torch.stack([posenc.randomize_positions(None, 3, 8, generator=g) for _ in range(4000)])
    counts = torch.bincount(draws.flatten(), minlength=8).double() / draws.numel()
    assert_close(counts, torch.full((8,), 1 / 8, dtype=torch.float64), rtol=0, atol=0.02)
    first = torch.bincount(draws[:, 0], minlength=8).double() / len(draws)
    want = torch.tensor([math.comb(7 - p, 2) / math.comb(8, 3) for p in range(8)])
    assert_close(first, want.double(), rtol=0, atol=0.03)


@pytest.mark.parametrize("pe", ["sinusoidal", "rope", "alibi", "learned"])
def test_encoder_random_positions_train_only(pe: str) -> None:
    """``Encoder(random_positions=L)`` feeds randomized positions in training (the same as
    passing them explicitly after the same draw) and the plain ones in evaluation."""
    torch.manual_seed(0)
    enc = Encoder(16, 2, 2, pe=pe, random_positions=64).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    torch.manual_seed(5)
    got = enc(x)
    torch.manual_seed(5)
    drawn = posenc.randomize_positions(None, 9, 64)
    enc.random_positions = None
    assert_close(got, enc(x, positions=drawn), rtol=0, atol=1e-12)
    enc.random_positions = 64
    enc.eval()
    assert_close(enc(x), enc(x, positions=torch.arange(9)), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"random_positions.*0"):
        Encoder(16, 1, 2, random_positions=0)
