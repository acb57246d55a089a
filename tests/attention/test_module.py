"""Attention of ``posenc.attention.module`` against attention written out by hand in float64,
``softmax(q kᵀ / sqrt(d) + bias) v``: every backend for every registered bias scheme, with
and without causal and key-padding masks; the weights it returns; compiled flex attention; the
backend choice; gradients into every learned bias; the encoder end to end against the same
reference; and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

import posenc
import posenc.attention.module as attention_module
from posenc import (
    Encoder,
    MultiHeadAttention,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    scaled_dot_product_attention,
)
from posenc.attention.backends import Backend
from posenc.encodings.base import BiasEncoding
from posenc.encodings.bias.alibi import ALiBi
from posenc.encodings.bias.relative_qk import ShawRelativeBias
from posenc.errors import MemoryBudgetError
from tests.misuse import Misuse, cases, check
from tests.schemes import BIAS, FACTS, NAMES

#: Every bias scheme, no scheme, and Shaw with its value-side term as well.
SCHEMES = ["none", *BIAS, "shaw-values"]
#: The schemes with learned parameters (every bias scheme but ALiBi, today).
LEARNED = [
    name
    for name in [*BIAS, "shaw-values"]
    if any(True for _ in posenc.build_for_model(name.removesuffix("-values"), 16, 4).parameters())
]


def make_pe(name: str, dim: int, heads: int) -> BiasEncoding | None:
    if name == "none":
        return None
    if name == "shaw-values":
        return ShawRelativeBias(heads, dim // heads, max_distance=3, values=True)
    pe = posenc.build_for_model(name, dim, heads)
    assert isinstance(pe, BiasEncoding)
    return pe


def by_hand(
    attn: MultiHeadAttention,
    x: torch.Tensor,
    pe: BiasEncoding | None,
    positions: torch.Tensor,
    *,
    causal: bool,
    padding: torch.Tensor | None,
) -> torch.Tensor:
    """Multi-head attention, every step explicit, in float64."""
    b, n, dim = x.shape
    h = attn.num_heads
    d = dim // h
    qkv = x @ attn.qkv.weight.T + attn.qkv.bias  # (b, n, 3D)
    q, k, v = (t.transpose(1, 2) for t in qkv.view(b, n, 3, h, d).unbind(2))  # (b, h, n, d)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    if pe is not None:
        x_in = {"x": x} if pe.needs_x else {}  # a data-dependent bias reads the layer input
        scores = scores + pe.bias(positions, positions, q=q, k=k, **x_in)
    allowed = torch.ones(b, 1, n, n, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
    if padding is not None:
        allowed = allowed & ~padding.view(b, 1, 1, n)
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    out = weights @ v
    if isinstance(pe, ShawRelativeBias) and pe.value_embeddings is not None:
        K = pe.max_distance
        rel = (positions.view(1, n) - positions.view(n, 1)).clamp(-K, K) + K  # clip(j - i)
        a_v = pe.value_embeddings.weight[rel]  # (n, n, d): a^V_ij
        out = out + torch.einsum("bhij,ijd->bhid", weights, a_v)
    out = out.transpose(1, 2).reshape(b, n, dim)
    return out @ attn.out.weight.T + attn.out.bias


# --------------------------------------------------------------------------- no bias


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
    # the weights are softmax(q kᵀ / sqrt(d)) under the causal mask, per head
    q, k, _ = (t.transpose(1, 2) for t in attn.qkv(x).view(2, 5, 3, 4, 4).unbind(2))
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)
    want = (q @ k.transpose(-2, -1) / 2.0).masked_fill(future, float("-inf")).softmax(-1)
    assert_close(weights, want)


# --------------------------------------------------------------------------- every bias scheme


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("backend", ["math", "sdpa", "flex", "auto"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_backend_matches_attention_by_hand(
    scheme: str, backend: str, causal: bool, padded: bool
) -> None:
    dim, heads, n = 16, 4, 9
    pe = make_pe(scheme, dim, heads)
    attn = MultiHeadAttention(
        dim,
        heads,
        pe=pe,
        causal=causal,
        backend=backend,
        compile_flex=False,  # type: ignore[arg-type]
    ).double()
    x = torch.randn(2, n, dim, dtype=torch.float64)
    positions = torch.arange(n) + 3
    padding = None
    if padded:  # right padding: every query keeps at least one key
        padding = torch.zeros(2, n, dtype=torch.bool)
        padding[0, 6:] = True
        padding[1, 8:] = True
    with torch.no_grad():  # flex has no CPU backward: gradients would send it to SDPA
        got = attn(x, positions=positions, key_padding_mask=padding)
        want = by_hand(attn, x, pe, positions, causal=causal, padding=padding)
    assert_close(got, want, rtol=1e-10, atol=1e-10)
    expected = "math" if backend == "math" or scheme == "shaw-values" else backend
    if expected == "auto":
        expected = "sdpa"  # small: not worth compiling
    assert attn.last_backend == expected


def test_batched_positions_every_backend() -> None:
    dim, heads, n = 16, 4, 7
    pos = torch.stack([torch.arange(n), torch.arange(n) * 2 + 1])
    for name in BIAS:
        pe = make_pe(name, dim, heads)
        for backend in ("math", "sdpa", "flex"):
            attn = MultiHeadAttention(dim, heads, pe=pe, backend=backend, compile_flex=False)  # type: ignore[arg-type]
            attn = attn.double()
            x = torch.randn(2, n, dim, dtype=torch.float64)
            with torch.no_grad():
                got = attn(x, positions=pos)
                want = torch.cat(
                    [
                        by_hand(attn, x[i : i + 1], pe, pos[i], causal=False, padding=None)
                        for i in (0, 1)
                    ]
                )
            assert_close(got, want, rtol=1e-10, atol=1e-10, msg=f"{name} {backend}")


def test_need_weights_returns_the_biased_weights() -> None:
    pe = ALiBi(2)
    attn = MultiHeadAttention(8, 2, pe=pe, backend="sdpa").double()
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    _, weights = attn(x, need_weights=True)
    assert attn.last_backend == "math"
    q, k, _ = attn.qkv(x).view(1, 5, 3, 2, 4).unbind(2)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    scores = q @ k.transpose(-2, -1) / 2.0 + pe.bias(torch.arange(5), torch.arange(5)).double()
    assert_close(weights, scores.softmax(-1))


# --------------------------------------------------------------------------- compiled flex


@pytest.mark.slow
def test_compiled_flex_matches_math_with_masks() -> None:
    """One compilation (tens of seconds on a CPU): ALiBi, causal and padding, a length that
    is not a multiple of the 128 block, so full, partial and skipped blocks all occur."""
    dim, heads, n = 32, 4, 200
    pe = ALiBi(heads)
    flex = MultiHeadAttention(dim, heads, pe=pe, causal=True, backend="flex")
    math_ = MultiHeadAttention(dim, heads, pe=pe, causal=True, backend="math")
    math_.load_state_dict(flex.state_dict())
    x = torch.randn(2, n, dim)
    padding = torch.zeros(2, n, dtype=torch.bool)
    padding[1, 150:] = True
    with torch.no_grad():
        got = flex(x, key_padding_mask=padding)
        want = math_(x, key_padding_mask=padding)
    assert flex.last_backend == "flex"
    assert_close(got, want, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- backend choice


def test_explicit_flex_falls_back_while_training() -> None:
    attn = MultiHeadAttention(8, 2, pe=ALiBi(2), backend="flex", compile_flex=False)
    x = torch.randn(1, 5, 8)
    attn(x).sum().backward()
    assert attn.last_backend == "sdpa"
    assert attn.qkv.weight.grad is not None


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("name", LEARNED)
@pytest.mark.parametrize("backend", ["auto", "math"])
def test_gradients_reach_every_learned_parameter(name: str, backend: str) -> None:
    pe = make_pe(name, 16, 4)
    assert pe is not None
    enc = Encoder(16, 2, 4, pe=pe, causal=name == "cope", backend=backend)  # type: ignore[arg-type]
    x = torch.randn(2, 10, 16)
    enc(x).pow(2).sum().backward()
    params = dict(pe.named_parameters())
    assert params
    for pname, p in params.items():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname


# --------------------------------------------------------------------------- model


def encoder_by_hand(
    enc: Encoder, x: torch.Tensor, *, causal: bool, padding: torch.Tensor | None
) -> torch.Tensor:
    """A pre-norm encoder stack written out from its weights, in float64:
    ``x += attention(norm1(x))``, ``x += W2 relu(W1 norm2(x))`` per layer, a final norm."""

    def norm(module: torch.nn.LayerNorm, t: torch.Tensor) -> torch.Tensor:
        mean, var = t.mean(-1, keepdim=True), t.var(-1, unbiased=False, keepdim=True)
        return (t - mean) / torch.sqrt(var + module.eps) * module.weight + module.bias

    pe = enc.pe if isinstance(enc.pe, BiasEncoding) else None
    positions = torch.arange(x.shape[1])
    for layer in enc.layers:
        x = x + by_hand(layer.attn, norm(layer.norm1, x), pe, positions, causal=causal,
                        padding=padding)  # fmt: skip
        up, down = layer.ffn.up, layer.ffn.down
        x = x + torch.relu(norm(layer.norm2, x) @ up.weight.T + up.bias) @ down.weight.T + down.bias
    return norm(enc.norm, x)


@pytest.mark.parametrize("name", BIAS)
@pytest.mark.parametrize("causal", [False, True])
def test_encoder_end_to_end(name: str, causal: bool) -> None:
    """Two layers sharing one bias module, with padding: the encoder written out by hand."""
    enc = Encoder(16, 2, 4, pe=name, causal=causal).double().eval()
    padding = torch.zeros(2, 8, dtype=torch.bool)
    padding[0, 5:] = True
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    with torch.no_grad():
        got = enc(x, key_padding_mask=padding)
        want = encoder_by_hand(enc, x, causal=causal, padding=padding)
    assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", [name for name in BIAS if FACTS[name].relative])
def test_relative_schemes_ignore_a_shift_of_every_position(name: str) -> None:
    """Schemes of ``i - j`` alone (and CoPE, which reads no positions) give the same output
    for positions shifted by a constant; explicit ``arange`` equals the default."""
    enc = Encoder(16, 1, 4, pe=name).double()
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    default = enc(x)
    assert_close(enc(x, positions=torch.arange(7)), default, rtol=0, atol=0)
    assert_close(enc(x, positions=torch.arange(7) + 11), default, rtol=1e-12, atol=1e-12)


def test_fire_depends_on_the_query_position() -> None:
    enc = Encoder(16, 1, 4, pe=posenc.FIRE(4, threshold=1.0)).double()
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    assert not torch.allclose(enc(x), enc(x, positions=torch.arange(7) + 11))


# --------------------------------------------------------------------------- bad input

NAN = float("nan")
X = torch.randn(2, 5, 8)
Q = torch.randn(2, 2, 5, 4)

MISUSE = [
    Misuse("heads-indivisible", lambda: MultiHeadAttention(10, 3), ValueError, "num_heads", 3),
    Misuse("dim-zero", lambda: MultiHeadAttention(0, 1), ValueError, "dim", 0),
    Misuse("backend", lambda: MultiHeadAttention(8, 2, backend="cuda"), ValueError, "backend",
           "cuda"),
    Misuse("dropout-nan", lambda: MultiHeadAttention(8, 2, dropout=NAN), ValueError, "dropout",
           NAN),
    Misuse("pe-additive", lambda: MultiHeadAttention(8, 2, pe=SinusoidalPositionalEncoding(8)),
           TypeError, "pe", "SinusoidalPositionalEncoding"),
    Misuse("pe-heads", lambda: MultiHeadAttention(16, 4, pe=ALiBi(2)), ValueError, "num_heads",
           2),
    Misuse("pe-heads-in-forward",
           lambda: MultiHeadAttention(16, 4)(torch.randn(1, 3, 16),
                                             pe=posenc.build("t5", num_heads=8)),
           ValueError, "num_heads", 8),
    Misuse("pe-head-dim", lambda: MultiHeadAttention(8, 2, pe=RotaryEmbedding(8)), ValueError,
           "head_dim", 8),
    Misuse("pe-unknown-name", lambda: MultiHeadAttention(8, 2, pe="ropee"), ValueError,
           "positional encoding", "ropee"),
    Misuse("pe-additive-name", lambda: MultiHeadAttention(8, 2, pe="sinusoidal"), TypeError,
           "pe", "additive"),
    Misuse("pe-int", lambda: MultiHeadAttention(8, 2, pe=3), TypeError, "pe", "int"),
    Misuse("causal-str", lambda: MultiHeadAttention(8, 2, causal="yes"), TypeError, "causal",
           "yes"),
    Misuse("mask-shape",
           lambda: MultiHeadAttention(8, 2)(X,
                                            key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)),
           ValueError, "key_padding_mask", (2, 4)),
    Misuse("mask-float", lambda: MultiHeadAttention(8, 2)(X, key_padding_mask=torch.zeros(2, 5)),
           TypeError, "key_padding_mask", torch.float32),
    Misuse("mask-a-row-all-padding",  # transformers' attention_mask.bool(): True = keep
           lambda: MultiHeadAttention(8, 2)(X, key_padding_mask=torch.ones(2, 5, dtype=torch.bool)),
           ValueError, "key_padding_mask", "attention_mask == 0"),
    Misuse("mask-long-names-the-conversion",
           lambda: MultiHeadAttention(8, 2)(X, key_padding_mask=torch.ones(2, 5, dtype=torch.long)),
           TypeError, "key_padding_mask", "attention_mask == 0"),
    Misuse("positions-length",
           lambda: MultiHeadAttention(8, 2, pe=ALiBi(2))(torch.randn(1, 4, 8),
                                                         positions=torch.arange(5)),
           ValueError, "positions", (5,)),
    Misuse("positions-nan",
           lambda: MultiHeadAttention(8, 2, pe=RotaryEmbedding(4))(
               X, positions=torch.tensor([0.0, 1.0, NAN, 3.0, 4.0])),
           ValueError, "positions", NAN),
    Misuse("sdpa-q-list", lambda: posenc.scaled_dot_product_attention([1.0], Q, Q), TypeError,
           "q", [1.0]),
    Misuse("sdpa-shapes", lambda: posenc.scaled_dot_product_attention(Q, Q[..., :3], Q),
           ValueError, "k", (2, 2, 5, 3)),
    Misuse("sdpa-dropout", lambda: posenc.scaled_dot_product_attention(Q, Q, Q, dropout_p=2.0),
           ValueError, "dropout_p", 2.0),
    Misuse("sdpa-size",
           lambda: posenc.scaled_dot_product_attention(*(torch.zeros(1, 10**5, 1),) * 3),
           MemoryBudgetError, "q x k", "100000 x 100000"),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse_names_the_argument_and_the_value(case: Misuse) -> None:
    check(case)


def test_a_row_of_all_padding_is_refused_by_every_entry_point() -> None:
    """The silent case of the opposite convention: a bool mask made from transformers'
    ``attention_mask.bool()`` marks every real token of a row as padding. The Encoder and
    MultiHeadAttention refuse it, naming the row and the conversion; a mask with padding
    somewhere in each row is read as posenc's (True = padding)."""
    attention_mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])  # transformers: 1 = keep
    encoder = Encoder(8, 1, 2, pe="rope", causal=True)
    for module in (encoder, MultiHeadAttention(8, 2)):
        with pytest.raises(ValueError, match=r"row\(s\) \[0\].*attention_mask == 0"):
            module(X, key_padding_mask=attention_mask.bool())
        out = module(X, key_padding_mask=attention_mask == 0)
        assert torch.isfinite(out).all()


def test_t5_refuses_fractional_positions_inside_attention() -> None:
    t5 = MultiHeadAttention(8, 2, pe=posenc.build("t5", num_heads=2))
    with pytest.raises(ValueError, match="positions"):
        t5(torch.randn(1, 3, 8), positions=torch.tensor([0.0, 0.5, 1.0]))


# --------------------------------------------------------------------------- the API


def test_backend_is_a_str_enum_and_strings_still_work() -> None:
    for name in ("auto", "flex", "sdpa", "math"):
        by_string = MultiHeadAttention(8, 2, backend=name)
        assert by_string.backend is Backend(name) and by_string.backend == name
        assert MultiHeadAttention(8, 2, backend=Backend(name)).backend is Backend(name)
        assert f"{Backend(name)}" == str(Backend(name)) == name
    assert "backend='sdpa'" in repr(MultiHeadAttention(8, 2, backend="sdpa"))


def test_attention_validates_its_input_once_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = attention_module.check_input

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention_module, "check_input", counting)
    MultiHeadAttention(8, 2, pe=ALiBi(2))(torch.randn(1, 5, 8))
    assert len(calls) == 1


@pytest.mark.parametrize(("causal", "head_dim"), [(False, None), (True, None), (True, 24)])
@pytest.mark.parametrize("name", NAMES)
def test_a_registry_name_builds_what_the_encoder_builds(
    name: str, causal: bool, head_dim: int | None
) -> None:
    """``MultiHeadAttention(pe=name)`` sizes the scheme for its own heads and head size and
    starts from its ``causal_defaults`` when causal, as ``Encoder(pe=name)`` does; additive
    schemes are refused (they act on the input), as are conditional ones (they act on the
    hidden states between blocks)."""
    family = posenc.entry(name).family
    if family in ("additive", "conditional"):
        with pytest.raises(TypeError, match=family):
            MultiHeadAttention(24, 2, pe=name)
        return
    attn = MultiHeadAttention(24, 2, pe=name, causal=causal, head_dim=head_dim)
    want = posenc.Encoder(24, 1, 2, pe=name, causal=causal, head_dim=head_dim).pe
    assert repr(attn.pe) == repr(want)
    same = MultiHeadAttention(24, 2, pe=want, causal=causal, head_dim=head_dim)
    same.load_state_dict(attn.state_dict())
    x = torch.randn(2, 5, 24)
    axes = posenc.entry(name).cls.axes
    positions = torch.stack([torch.arange(5) + a for a in range(axes)], -1) if axes > 1 else None
    assert_close(attn(x, positions=positions), same(x, positions=positions), rtol=0, atol=0)
