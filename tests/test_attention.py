"""Every attention backend against attention written out by hand in float64,
``softmax(q kᵀ / sqrt(d) + bias) v``, for every bias scheme, with and without causal and
key-padding masks; the backend choice; gradients into every learned bias; the encoder end to
end."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.testing import assert_close

import posenc
import posenc.attention as attention_module
from posenc import Encoder, MultiHeadAttention, TransformerModel
from posenc.encodings import ALiBi, BiasEncoding, ShawRelativeBias
from posenc.encodings.state import BiasState

BIAS_NAMES = ["alibi", "t5", "kerple", "fire", "shaw", "xl", "dpb", "cope"]
SCHEMES = ["none", *BIAS_NAMES, "shaw-values"]
LEARNED = ["t5", "kerple", "fire", "shaw", "shaw-values", "xl", "dpb", "cope"]


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
        scores = scores + pe.bias(positions, positions, q=q, k=k)
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
    for name in BIAS_NAMES:
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


def test_flex_compile_failure_falls_back_to_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(key: object):
        def run(*args: object) -> torch.Tensor:
            raise RuntimeError("no C++ compiler")

        return run

    monkeypatch.setattr(attention_module, "_compiled_flex", broken)
    attention_module.flex_cache_clear()
    pe = ALiBi(2)
    attn = MultiHeadAttention(8, 2, pe=pe, backend="flex")
    ref = MultiHeadAttention(8, 2, pe=pe, backend="math")
    ref.load_state_dict(attn.state_dict())
    x = torch.randn(1, 6, 8)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="compiling flex_attention failed"):
        got = attn(x)
    assert attn.last_backend == "sdpa"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # remembered: no second warning, no second attempt
        again = attn(x)
        want = ref(x)
    assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert_close(again, want, rtol=1e-5, atol=1e-6)
    attention_module.flex_cache_clear()


def test_block_mask_structure() -> None:
    padding = torch.zeros(2, 300, dtype=torch.bool)
    padding[1, 130:] = True
    mask = attention_module.flex_block_mask(
        2, 300, 300, causal=True, key_padding_mask=padding, device=torch.device("cpu")
    )
    dense = mask.to_dense()  # (b, 1, 3, 3) blocks that are visited at all
    expected = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=dense.dtype)
    assert_close(dense[0, 0], expected)
    assert_close(dense[1, 0], torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 0]], dtype=dense.dtype))
    unmasked = attention_module.flex_block_mask(
        1, 300, 300, causal=False, key_padding_mask=None, device=torch.device("cpu")
    )
    assert bool(unmasked.to_dense().all())  # every block visited, all of them full
    assert int(unmasked.kv_num_blocks.sum()) == 0 and int(unmasked.full_kv_num_blocks.sum()) == 9


# --------------------------------------------------------------------------- backend choice


def test_auto_picks_flex_only_when_large_and_inference(monkeypatch: pytest.MonkeyPatch) -> None:
    attn = MultiHeadAttention(16, 4, pe=ALiBi(4))
    q = torch.randn(1, 4, 64, 4, requires_grad=True)
    assert isinstance(attn.pe, BiasEncoding)
    pe = attn.pe.position_state(None, seq_len=64, batch=1, device=q.device, dtype=q.dtype)
    assert isinstance(pe, BiasState)
    assert attn._choose_backend(q.detach(), pe, False, 0.0) == "sdpa"  # 4 * 64² < 2**24
    monkeypatch.setattr(attention_module, "FLEX_AUTO_MIN_ELEMENTS", 1000)
    assert attn._choose_backend(q.detach(), pe, False, 0.0) == "auto-flex"
    assert attn._choose_backend(q, pe, False, 0.0) == "sdpa"  # gradients on a CPU
    assert attn._choose_backend(q.detach(), pe, False, 0.1) == "sdpa"  # dropout
    assert attn._choose_backend(q.detach(), pe, True, 0.0) == "math"  # weights wanted
    assert attn._choose_backend(q.detach(), None, False, 0.0) == "sdpa"  # no bias to fuse


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


@pytest.mark.parametrize("name", BIAS_NAMES)
@pytest.mark.parametrize("causal", [False, True])
def test_encoder_end_to_end(name: str, causal: bool) -> None:
    enc = Encoder(16, 2, 4, pe=name, causal=causal)
    padding = torch.zeros(2, 8, dtype=torch.bool)
    padding[0, 5:] = True
    out = enc(torch.randn(2, 8, 16), key_padding_mask=padding)
    assert out.shape == (2, 8, 16) and torch.isfinite(out).all()
    model = TransformerModel(20, 16, 1, 4, pe=name)
    assert model(torch.randint(0, 20, (2, 6))).shape == (2, 6, 20)


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "shaw", "xl", "dpb", "cope"])
def test_relative_schemes_ignore_a_shift_of_every_position(name: str) -> None:
    """Schemes of ``i - j`` alone (and CoPE, which reads no positions) give the same output
    for positions shifted by a constant; explicit ``arange`` equals the default."""
    enc = Encoder(16, 1, 4, pe=name).double()
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    default = enc(x)
    assert_close(enc(x, positions=torch.arange(7)), default, rtol=0, atol=0)
    assert_close(enc(x, positions=torch.arange(7) + 11), default, rtol=1e-12, atol=1e-12)


def test_fire_depends_on_the_query_position() -> None:
    enc = Encoder(16, 1, 4, pe=posenc.encodings.FIRE(4, threshold=1.0)).double()
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    assert not torch.allclose(enc(x), enc(x, positions=torch.arange(7) + 11))


# --------------------------------------------------------------------------- bad input


def test_head_count_mismatch_is_rejected() -> None:
    with pytest.raises(ValueError, match="pe=ALiBi has num_heads=2 but attention has num_heads=4"):
        MultiHeadAttention(16, 4, pe=ALiBi(2))
    attn = MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match="has num_heads=8 but attention has num_heads=4"):
        attn(torch.randn(1, 3, 16), pe=posenc.build("t5", num_heads=8))
    with pytest.raises(ValueError, match="has num_heads=3 but attention has num_heads=4"):
        Encoder(16, 1, 4, pe=posenc.build("alibi", num_heads=3))


def test_bad_backend_and_positions() -> None:
    with pytest.raises(
        ValueError, match="backend must be one of auto, flex, sdpa, math; got 'fast'"
    ):
        MultiHeadAttention(8, 2, backend="fast")  # type: ignore[arg-type]
    attn = MultiHeadAttention(8, 2, pe=ALiBi(2))
    with pytest.raises(ValueError, match=r"positions must have shape \(seq,\) or \(batch, seq\)"):
        attn(torch.randn(1, 4, 8), positions=torch.arange(5))
    t5 = MultiHeadAttention(8, 2, pe=posenc.build("t5", num_heads=2))
    with pytest.raises(ValueError, match="whole numbers"):
        t5(torch.randn(1, 3, 8), positions=torch.tensor([0.0, 0.5, 1.0]))
