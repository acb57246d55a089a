"""Learned attention sinks, logit soft-capping and the softmax scale (``sinks=``,
``softcap=``, ``softmax_scale=`` on :class:`~posenc.MultiHeadAttention`).

Every number is checked against :func:`reference`, the formula written out here in float64
(``scores · scale + bias``, the cap, the mask, the softmax over ``[scores, sink]``, the sink
dropped, ``@ v``), on the three backends, and against transformers' own
``eager_attention_forward`` of gpt-oss (sinks) and Gemma 2 (soft-capping, scaling).

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

import posenc
from posenc.attention import backends, flex
from posenc.attention.backends import AttentionCall
from posenc.errors import PosencTypeError, PosencValueError

BACKENDS = ("math", "sdpa", "flex")


def reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float | None = None,
    bias: Tensor | None = None,
    softcap: float | None = None,
    mask: Tensor | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """Attention in float64, written out: q ``(b, h, nq, d)``, k and v ``(b, h, nk, d)``,
    mask broadcastable to ``(b, h, nq, nk)`` (True = attend), sinks ``(h,)``."""
    q, k, v = q.double(), k.double(), v.double()
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale  # (b, h, nq, nk)
    if bias is not None:
        scores = scores + bias.double()
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    if sinks is not None:
        sink = sinks.double().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]
    else:
        weights = scores.softmax(dim=-1)
    return weights @ v


def close(actual: Tensor, expected: Tensor, rel: float) -> None:
    """Whole tensors: ``max|a - b| <= rel · max|b|`` (and no NaN anywhere)."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.isfinite(actual).all()
    error = (actual.double() - expected.double()).abs().max().item()
    assert error <= rel * expected.abs().max().item(), f"max error {error}"


def heads(attn: posenc.MultiHeadAttention, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The module's q ``(b, h, n, d)`` and k, v (grouped heads repeated), in float64."""
    b, n, _ = x.shape
    h, g, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    qkv = x.double() @ attn.qkv.weight.double().T + attn.qkv.bias.double()
    q, k, v = qkv.view(b, n, h + 2 * g, d).split([h, g, g], dim=2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return q, k.repeat_interleave(h // g, dim=1), v.repeat_interleave(h // g, dim=1)


def module_reference(attn: posenc.MultiHeadAttention, x: Tensor, **kw: Any) -> Tensor:
    """The module's forward in float64 through :func:`reference`."""
    b, n, _ = x.shape
    q, k, v = heads(attn, x)
    out = reference(
        q, k, v, scale=attn.softmax_scale, softcap=attn.softcap, sinks=attn.sinks, **kw
    )  # (b, h, n, d)
    out = out.transpose(1, 2).reshape(b, n, -1)
    return out @ attn.out.weight.double().T + attn.out.bias.double()


def make(backend: str, **kw: Any) -> posenc.MultiHeadAttention:
    """An attention with random (not zero) sinks, eager flex (no compilation here)."""
    attn = posenc.MultiHeadAttention(16, 4, backend=backend, compile_flex=False, **kw).eval()
    if attn.sinks is not None:
        with torch.no_grad():
            attn.sinks.copy_(torch.tensor([-1.0, 0.5, 2.0, 0.0]))
    return attn


def full_setting(backend: str, softcap: float) -> dict[str, Any]:
    """Sinks and a softmax scale, and a cap where the backend runs one (SDPA cannot: a capped
    call leaves it for math, so SDPA's cases go uncapped to test SDPA itself)."""
    setting: dict[str, Any] = {"sinks": True, "softmax_scale": 0.4}
    return setting if backend == "sdpa" else {**setting, "softcap": softcap}


def causal(n: int) -> Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


# --------------------------------------------------------------------------- the formula

SETTINGS = [
    {"sinks": True},
    {"softcap": 0.7},
    {"softmax_scale": 0.9},
    {"sinks": True, "softcap": 0.7, "softmax_scale": 0.9},
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "+".join(s))
def test_each_backend_equals_the_formula(backend: str, setting: dict[str, Any]) -> None:
    """Causal, with ALiBi's bias (scaled scores + bias, then the cap, then the mask)."""
    attn = make(backend, causal=True, pe=posenc.ALiBi(4), **setting)
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        out = attn(x)
    bias = posenc.ALiBi(4).bias(torch.arange(9), torch.arange(9))
    expected = module_reference(attn, x, bias=bias, mask=causal(9))
    close(out, expected, 2e-6)
    # soft-capping never runs on SDPA (it cannot cap): math stands for it
    assert attn.last_backend == ("math" if backend == "sdpa" and "softcap" in setting else backend)


def test_the_settings_change_the_numbers() -> None:
    """Each setting moves the output (the comparisons above would otherwise pass vacuously),
    and a zero sink is not no sink: it takes ``1 / (1 + Z)`` of each row."""
    x = torch.randn(1, 6, 16)
    torch.manual_seed(1)
    plain = make("math")
    with torch.no_grad():
        base = plain(x)
        for setting in SETTINGS:
            attn = make("math", **setting)
            attn.load_state_dict(plain.state_dict(), strict=False)
            assert (attn(x) - base).abs().max() > 1e-3, setting
        zero = make("math", sinks=True)
        zero.load_state_dict(plain.state_dict(), strict=False)
        zero.sinks.zero_()
        assert (zero(x) - base).abs().max() > 1e-3


@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_gqa_and_fully_masked_rows(backend: str) -> None:
    """Grouped heads, a left-padded row (its first queries see no key): with sinks such a
    row's weights are all zero, so its output is the output projection's bias, on every
    backend, never NaN."""
    attn = make(backend, causal=True, num_kv_heads=2, **full_setting(backend, 2.0))
    x = torch.randn(2, 7, 16)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, :3] = True
    with torch.no_grad():
        out = attn(x, key_padding_mask=padding)
    assert attn.last_backend == backend
    mask = causal(7) & ~padding.view(2, 1, 1, 7)
    close(out, module_reference(attn, x, mask=mask), 2e-6)
    torch.testing.assert_close(out[1, :3], attn.out.bias.expand(3, 16), rtol=0, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_and_packed_documents(backend: str) -> None:
    """A sliding window over two packed documents (positions restart in each)."""
    attn = make(backend, causal=True, window=3, **full_setting(backend, 1.5))
    x = torch.randn(1, 10, 16)
    documents = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        out = attn(x, document_ids=documents)
    assert attn.last_backend == backend
    pos = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 4, 5])
    same = documents[0].view(-1, 1) == documents[0].view(1, -1)
    near = (pos.view(-1, 1) - pos.view(1, -1)).abs() < 3
    close(out, module_reference(attn, x, mask=causal(10) & same & near), 2e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cached_decoding_equals_the_full_forward(backend: str) -> None:
    """A prompt, then one token at a time through a KVCache: the full forward's rows."""
    attn = make(backend, causal=True, pe="rope", num_kv_heads=2, **full_setting(backend, 1.0))
    x = torch.randn(2, 8, 16)
    with torch.no_grad():
        full = attn(x)
        cache = posenc.KVCache()
        steps = [attn(x[:, :5], cache=cache)]
        steps += [attn(x[:, i : i + 1], cache=cache) for i in range(5, 8)]
    assert attn.last_backend == backend
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=2e-6)


def test_encoder_with_a_cache_and_per_layer_settings() -> None:
    """An Encoder whose layers differ (sinks in the first, a cap in the second): cached
    decoding equals the full forward, and each layer holds what it was given."""
    enc = posenc.Encoder(
        16, 2, 4, pe="rope", causal=True, sinks=[True, False], softcap=[None, 3.0],
        softmax_scale=0.3,
    ).eval()  # fmt: skip
    first, second = (layer.attn for layer in enc.layers)
    assert first.sinks is not None and second.sinks is None
    assert (first.softcap, second.softcap) == (None, 3.0)
    assert first.softmax_scale == second.softmax_scale == 0.3
    assert (
        "layers.0.attn.sinks" in enc.state_dict() and "layers.1.attn.sinks" not in enc.state_dict()
    )
    with torch.no_grad():
        first.sinks.normal_()
        x = torch.randn(1, 6, 16)
        full = enc(x)
        cache = posenc.KVCache()
        steps = [
            enc(x[:, :4], cache=cache),
            enc(x[:, 4:5], cache=cache),
            enc(x[:, 5:], cache=cache),
        ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=5e-6)


def test_transformer_model_takes_the_settings() -> None:
    model = posenc.TransformerModel(20, 16, 2, 4, pe="rope", causal=True, sinks=True, softcap=5.0)
    assert all(layer.attn.sinks is not None for layer in model.encoder.layers)
    out = model.generate(torch.tensor([[1, 2, 3]]), 3)
    assert out.shape == (1, 6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_bf16(backend: str) -> None:
    """Under CPU autocast the projections run in bf16; the softmax statistics, the sink and
    the cap stay fp32: the output is within bf16's rounding of the float64 formula."""
    attn = make(backend, causal=True, **full_setting(backend, 1.0))
    x = torch.randn(2, 9, 16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = attn(x)
    assert out.dtype == torch.bfloat16 and attn.last_backend == backend
    close(out.float(), module_reference(attn, x, mask=causal(9)), 3e-2)


# --------------------------------------------------------------------------- gradients


def _call(**kw: Any) -> AttentionCall:
    return AttentionCall(batch=2, nq=kw.pop("nq"), causal=True, **kw)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_gradients_equal_the_float64_formula(backend: str) -> None:
    """Gradients of q, k, v and the sinks (SDPA's through its additive mask's sink column)
    against autograd through :func:`reference` in float64."""
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    sinks = torch.tensor([-1.0, 0.5, 2.0, 0.0])
    grad_out = torch.randn(2, 4, 6, 8)
    setting = {"scale": 0.6, "softcap": None if backend == "sdpa" else 1.5}

    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    call = _call(nq=6, sinks=leaves[3], **setting)
    out, _ = backends.BACKEND_FUNCTIONS[backends.Backend(backend)](*leaves[:3], call)
    (out * grad_out).sum().backward()

    exact = [t.double().requires_grad_() for t in (q, k, v, sinks)]
    expected = reference(*exact[:3], sinks=exact[3], mask=causal(6), **setting)
    (expected * grad_out.double()).sum().backward()
    close(out, expected, 2e-6)
    for name, mine, theirs in zip("qkvs", leaves, exact, strict=True):
        assert theirs.grad.abs().max() > 0, name
        close(mine.grad, theirs.grad, 1e-5)


def test_a_module_trains_its_sinks() -> None:
    """Training (dropout off) on the CPU runs SDPA; the sinks' gradient is the formula's."""
    attn = make("auto", causal=True, sinks=True).train()
    x = torch.randn(2, 5, 16)
    attn(x).square().sum().backward()
    assert attn.last_backend == "sdpa"
    sinks = attn.sinks.detach().double().requires_grad_()
    q, k, v = (t.detach() for t in heads(attn, x))
    out = reference(q, k, v, sinks=sinks, mask=causal(5)).transpose(1, 2).reshape(2, 5, 16)
    (out @ attn.out.weight.double().T + attn.out.bias.double()).square().sum().backward()
    close(attn.sinks.grad, sinks.grad, 1e-5)


# --------------------------------------------------------------------------- flex


def test_flex_lse_is_the_natural_log_sum_exp() -> None:
    """torch 2.13 converts its kernels' base-2 statistics: the lse flex hands back is
    ``log Σ exp(scale · q·k)`` in base e, which :func:`posenc.attention.flex.with_sinks` assumes."""
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    block_mask = flex.flex_block_mask(1, 5, 5, causal=True, key_padding_mask=None, device=q.device)
    _, lse = flex._flex(q, k, v, None, block_mask, 0.7, lse=True)
    scores = (q.double() @ k.double().transpose(-2, -1) * 0.7).masked_fill(~causal(5), -math.inf)
    torch.testing.assert_close(lse.double(), scores.logsumexp(-1), rtol=0, atol=1e-6)


def test_flex_never_materialises_a_sink_column(monkeypatch: pytest.MonkeyPatch) -> None:
    """flex_attention is called with the caller's keys (no extra one) and asked for its
    lse, with softcap composed into the score_mod."""
    seen: list[tuple[int, bool]] = []
    real = flex._flex

    def spy(q: Tensor, k: Tensor, *args: Any, lse: bool) -> Any:
        seen.append((k.shape[-2], lse))
        return real(q, k, *args, lse=lse)

    monkeypatch.setattr(flex, "_flex", spy)
    attn = make("flex", causal=True, sinks=True, softcap=1.0)
    with torch.no_grad():
        attn(torch.randn(1, 6, 16))
    assert seen == [(6, True)]


def test_flex_falls_back_to_math_for_softcap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where flex cannot run after all (a failed compilation), a capped call runs on math,
    an uncapped one with sinks on SDPA; both equal the formula."""
    monkeypatch.setattr(flex, "flex_attention_forward", lambda *a, **kw: None)
    x = torch.randn(1, 6, 16)
    for setting, fallback in (({"softcap": 1.0}, "math"), ({"sinks": True}, "sdpa")):
        attn = make("flex", causal=True, **setting)
        with torch.no_grad():
            out = attn(x)
        assert attn.last_backend == fallback
        close(out, module_reference(attn, x, mask=causal(6)), 2e-6)


@pytest.mark.parametrize("n", [200, 128])  # the sink key in the last block / a new one
@pytest.mark.parametrize("mask", ["none", "causal+padding", "window+documents"])
def test_flex_sink_key_equals_the_formula(
    monkeypatch: pytest.MonkeyPatch, n: int, mask: str
) -> None:
    """The CPU's compiled flex kernel returns no lse, so there sinks run as one more key
    (:func:`posenc.attention.flex.sink_score_mod`, its block mask extended). Forced here on the
    eager kernel, with ALiBi's score_mod and a cap composed before it: the formula's numbers."""
    monkeypatch.setattr(flex, "lse_route", lambda device, compile: False)
    seen: list[int] = []
    real = flex._flex

    def spy(q: Tensor, k: Tensor, *args: Any, lse: bool) -> Any:
        seen.append(k.shape[-2])
        return real(q, k, *args, lse=lse)

    monkeypatch.setattr(flex, "_flex", spy)
    kw: dict[str, Any] = {"causal": mask != "none", "window": 5 if "window" in mask else None}
    attn = make("flex", sinks=True, softcap=1.5, pe=posenc.ALiBi(4), **kw)
    x = torch.randn(2, n, 16)
    padding = torch.zeros(2, n, dtype=torch.bool)
    padding[1, :3] = True
    documents = (torch.arange(n) >= n // 2).long().expand(2, n)
    pos = torch.arange(n)
    allowed = torch.ones(2, 1, n, n, dtype=torch.bool)
    given: dict[str, Tensor] = {}
    if mask == "causal+padding":
        given = {"key_padding_mask": padding}
        allowed = causal(n) & ~padding.view(2, 1, 1, n)
    elif mask == "window+documents":
        given = {"document_ids": documents}
        pos = torch.where(documents[0] == 1, pos - n // 2, pos)
        same = documents[0].view(-1, 1) == documents[0].view(1, -1)
        allowed = causal(n) & same & ((pos.view(-1, 1) - pos.view(1, -1)).abs() < 5)
    with torch.no_grad():
        out = attn(x, **given)
    assert seen == [n + 1] and attn.last_backend == "flex"
    bias = posenc.ALiBi(4).bias(pos, pos)
    close(out, module_reference(attn, x, bias=bias, mask=allowed), 2e-6)


@pytest.mark.parametrize("n", [200, 256])
@pytest.mark.parametrize("masked", [False, True])
def test_sink_key_block_mask(n: int, masked: bool) -> None:
    """The block mask with a sink key (the eager kernel above ignores block sparsity, so the
    blocks are checked here): every query block reads the sink's block, every other block
    is as without the sink, and the mask_mod allows the sink key and agrees elsewhere."""
    cpu = torch.device("cpu")
    where: dict[str, Any] = {"causal": False, "key_padding_mask": None, "device": cpu}
    if masked:
        padding = torch.zeros(2, n, dtype=torch.bool)
        padding[1, :130] = True
        runs = (torch.arange(n) >= 150).long().expand(2, n)
        positions = torch.arange(n).expand(2, n)
        where.update(causal=True, key_padding_mask=padding, q_documents=runs, k_documents=runs)
        where.update(q_positions=positions, k_positions=positions, window=60)
    base = flex.flex_block_mask(2 if masked else 1, n, n, **where)
    extended = flex.flex_block_mask(2 if masked else 1, n, n, sink_key=True, **where)
    assert extended.seq_lengths == (n, n + 1)
    blocks, old = extended.to_dense(), base.to_dense()  # (B, 1, mq, mk) visited
    sink_block = n // flex.FLEX_BLOCK_SIZE
    assert blocks[..., sink_block].all()
    others = [c for c in range(blocks.shape[-1]) if c != sink_block]
    assert torch.equal(blocks[..., others], old[..., others])
    if masked:
        assert not old.all()  # some blocks skipped: the comparison above means something
    q_idx, kv_idx = torch.arange(n).view(-1, 1), torch.arange(n + 1).view(1, -1)
    if n % flex.FLEX_BLOCK_SIZE == 0:  # the sink's own block: full for every query block
        counts, indices = extended.full_kv_num_blocks, extended.full_kv_indices
        for b, qb in np.ndindex(counts.shape[0], counts.shape[-1]):
            assert sink_block in indices[b, 0, qb, : counts[b, 0, qb]].tolist()
    if masked:  # the mask_mod: the sink key allowed, the others as without it
        rows = [extended.mask_mod(torch.tensor(b), 0, q_idx, kv_idx) for b in range(2)]
        allowed = torch.stack(rows)  # (2, n, n + 1)
        assert allowed[..., n].all()
        expected = torch.stack(
            [base.mask_mod(torch.tensor(b), 0, q_idx, kv_idx[:, :n]) for b in range(2)]
        )
        assert torch.equal(allowed[..., :n], expected)


@pytest.mark.slow
def test_compiled_flex_with_sinks_and_softcap() -> None:
    """The one compiled case: 128 queries (the compiled CPU kernel runs from one block),
    sinks (one more key: the CPU kernel returns no lse) and a cap, a left-padded row with
    fully masked queries. Compiled afresh: after an earlier test compiled this kernel at
    another shape, torch 2.13's recompile with symbolic lengths fails to lower on the CPU
    (``unbacked_bindings``) and posenc falls back to a materialised backend, warned."""
    from posenc.attention import flex

    flex._FLEX_COMPILED.clear()
    flex._FLEX_FAILED.clear()
    torch._dynamo.reset()
    attn = posenc.MultiHeadAttention(
        16, 2, causal=True, backend="flex", sinks=True, softcap=1.0
    ).eval()
    with torch.no_grad():
        attn.sinks.copy_(torch.tensor([1.0, -0.5]))
    x = torch.randn(2, 128, 16)
    padding = torch.zeros(2, 128, dtype=torch.bool)
    padding[1, :5] = True
    with torch.no_grad():
        out = attn(x, key_padding_mask=padding)
    assert attn.last_backend == "flex", flex._FLEX_FAILED  # why compiling failed, if it did
    mask = causal(128) & ~padding.view(2, 1, 1, 128)
    close(out, module_reference(attn, x, mask=mask), 5e-6)


# --------------------------------------------------------------------------- transformers


def _transformers(name: str) -> Any:
    return pytest.importorskip(f"transformers.models.{name}.modeling_{name}")


def _additive(mask: Tensor) -> Tensor:
    """transformers' 4-D float mask: 0 where attending, the dtype's min elsewhere."""
    return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gpt_oss_eager_attention(backend: str) -> None:
    """gpt-oss's own ``eager_attention_forward`` (sinks, grouped heads) with the same q, k, v
    and sinks, on each backend: ``max|a - b| / max|b| <= 2e-5`` in fp32."""
    gpt_oss = _transformers("gpt_oss")
    q = torch.randn(2, 4, 7, 8)
    k, v = torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    sinks = torch.tensor([-1.0, 0.5, 2.0, 0.0])
    module = SimpleNamespace(num_key_value_groups=2, sinks=sinks, training=False)
    theirs, _ = gpt_oss.eager_attention_forward(
        module, q, k, v, _additive(causal(7)).view(1, 1, 7, 7), scaling=8**-0.5
    )  # (b, n, h, d)
    call = _call(nq=7, sinks=sinks, scale=8**-0.5, compile_flex=False)
    kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    mine, _ = backends.BACKEND_FUNCTIONS[backends.Backend(backend)](q, kk, vv, call)
    close(mine.transpose(1, 2), theirs, 2e-5)


@pytest.mark.parametrize("backend", ["math", "flex"])
def test_gemma2_eager_attention(backend: str) -> None:
    """Gemma 2's own ``eager_attention_forward`` (soft-capping, ``query_pre_attn_scalar``
    scaling) with the same q, k, v: ``max|a - b| / max|b| <= 2e-5`` in fp32."""
    gemma2 = _transformers("gemma2")
    q, k, v = (torch.randn(2, 4, 7, 8) * 3 for _ in range(3))  # large logits: the cap bites
    module = SimpleNamespace(num_key_value_groups=1, head_dim=8, training=False)
    scaling, softcap = 256**-0.5 * 4, 2.0
    theirs, _ = gemma2.eager_attention_forward(
        module, q, k, v, _additive(causal(7)).view(1, 1, 7, 7), scaling=scaling, softcap=softcap
    )
    call = _call(nq=7, scale=scaling, softcap=softcap, compile_flex=False)
    mine, _ = backends.BACKEND_FUNCTIONS[backends.Backend(backend)](q, k, v, call)
    close(mine.transpose(1, 2), theirs, 2e-5)
    uncapped, _ = backends.math_backend(q, k, v, _call(nq=7, scale=scaling))
    assert (uncapped - mine).abs().max() > 1e-2  # the cap was reached


# --------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"sinks": 1}, PosencTypeError, "sinks"),
        ({"sinks": "yes"}, PosencTypeError, "sinks"),
        ({"softcap": 0.0}, PosencValueError, "softcap"),
        ({"softcap": -30.0}, PosencValueError, "-30.0"),
        ({"softcap": float("nan")}, PosencValueError, "softcap"),
        ({"softcap": "50"}, PosencTypeError, "softcap"),
        ({"softmax_scale": 0}, PosencValueError, "softmax_scale"),
        ({"softmax_scale": float("inf")}, PosencValueError, "softmax_scale"),
        ({"softmax_scale": True}, PosencTypeError, "softmax_scale"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, Any], error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        posenc.MultiHeadAttention(16, 4, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"sinks": [True]}, PosencValueError, "sinks has 1 entries"),
        ({"sinks": [True, "no"]}, PosencTypeError, r"sinks\[1\]"),
        ({"softcap": [None, 0.0]}, PosencValueError, r"softcap\[1\]"),
        ({"softcap": [None, None, None]}, PosencValueError, "depth=2"),
        ({"softmax_scale": [0.1, 0.1]}, PosencTypeError, "softmax_scale"),
        ({"softmax_scale": -1.0}, PosencValueError, "softmax_scale"),
    ],
)
def test_bad_per_layer_arguments_are_named(kwargs: dict[str, Any], error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        posenc.Encoder(16, 2, 4, **kwargs)


def test_repr_shows_the_settings() -> None:
    text = repr(posenc.MultiHeadAttention(16, 4, sinks=True, softcap=30.0, softmax_scale=0.25))
    assert "sinks=True" in text and "softcap=30.0" in text and "softmax_scale=0.25" in text
    assert "sinks" not in repr(posenc.MultiHeadAttention(16, 4))


def test_sinks_are_an_fp32_parameter_starting_at_zero() -> None:
    attn = posenc.MultiHeadAttention(16, 4, sinks=True)
    assert isinstance(attn.sinks, torch.nn.Parameter) and attn.sinks.dtype == torch.float32
    assert attn.sinks.shape == (4,) and not attn.sinks.any()
    assert posenc.MultiHeadAttention(16, 4).sinks is None
