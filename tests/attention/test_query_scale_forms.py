"""QueryScale's ``ssmax`` (Nakanishi 2025) and ``logn`` (Qwen) forms: the attention written
out in float64 in this file (mask, key counts, scale, softmax), forward and gradients, and
the paths (batch of one = batch, packing = each document alone, cache = full forward)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc import QueryScale
from posenc.attention.query_scale import visible_keys


def reference(
    mha: posenc.MultiHeadAttention,
    x: torch.Tensor,
    form: str,
    *,
    s: torch.Tensor | None = None,
    length: int = 0,
    documents: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """The layer in float64: causal, inside each document (positions restart at 0 in each),
    within ``window`` positions; the queries scaled by ``s_h log n_i`` (n_i the keys query i
    may attend to) or by ``max(1, log_L(p_i + 1))``."""
    b, n, _ = x.shape
    h, d = mha.num_heads, mha.head_dim
    w, bias = mha.qkv.weight.double(), mha.qkv.bias.double()
    q, k, v = (x.double() @ w.T + bias).view(b, n, 3, h, d).unbind(2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (b, h, n, d)
    docs = torch.zeros(b, n, dtype=torch.long) if documents is None else documents
    mask = torch.zeros(b, n, n, dtype=torch.bool)
    positions = torch.zeros(b, n, dtype=torch.float64)
    for r in range(b):
        for i in range(n):
            start = i
            while start > 0 and docs[r, start - 1] == docs[r, i]:
                start -= 1
            positions[r, i] = i - start
            for j in range(start, i + 1):
                mask[r, i, j] = window is None or i - j < window
    if form == "ssmax":
        assert s is not None
        counts = mask.sum(-1).double()  # (b, n)
        factor = s.view(1, h, 1, 1) * torch.log(counts)[:, None, :, None]
    else:
        factor = torch.log(positions + 1) / math.log(length)
        factor = torch.where(factor > 1, factor, torch.ones_like(factor))[:, None, :, None]
    scores = (q * factor) @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    heads = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, h * d)
    return heads @ mha.out.weight.double().T + mha.out.bias.double()


def layer(scale: QueryScale, **kw: object) -> posenc.MultiHeadAttention:
    torch.manual_seed(0)
    mha = posenc.MultiHeadAttention(24, 3, causal=True, query_scale=scale, **kw)
    if mha.ssmax_scale is not None:
        with torch.no_grad():
            mha.ssmax_scale.copy_(torch.tensor([0.3, 0.7, 1.2]))
    return mha


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    ours, theirs = ours.detach().double(), theirs.detach()
    return float((ours - theirs).abs().max() / theirs.abs().max())


def test_logn_factor_is_qwens_list() -> None:
    # modeling_qwen.py: logn_list = [math.log(i, seq_length) if i > seq_length else 1 ...]
    trained = 16
    qwen = [math.log(i, trained) if i > trained else 1 for i in range(1, 2001)]
    ours = QueryScale.logn(trained).factor(torch.arange(2000))
    assert_close(ours.double(), torch.tensor(qwen, dtype=torch.float64), atol=0, rtol=3e-7)


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("form", ["ssmax", "logn"])
def test_forward_and_gradients_equal_the_float64_formula(form: str, window: int | None) -> None:
    scale = QueryScale.ssmax(1.0) if form == "ssmax" else QueryScale.logn(3)
    mha = layer(scale, window=window)
    x = torch.randn(2, 11, 24, generator=torch.Generator().manual_seed(1), requires_grad=True)
    documents = torch.tensor([[0] * 5 + [1] * 6, [0] * 11])
    ours = mha(x, document_ids=documents)
    s = None if mha.ssmax_scale is None else mha.ssmax_scale.detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    theirs = reference(mha, x64, form, s=s, length=3, documents=documents, window=window)
    assert relative_error(ours, theirs) <= 2e-6
    grad = torch.randn(ours.shape, generator=torch.Generator().manual_seed(2))
    ours.backward(grad)
    theirs.backward(grad.double())
    assert x.grad is not None and x64.grad is not None
    assert relative_error(x.grad, x64.grad) <= 2e-5
    if form == "ssmax":
        assert mha.ssmax_scale is not None and mha.ssmax_scale.grad is not None
        assert s is not None and s.grad is not None
        assert relative_error(mha.ssmax_scale.grad, s.grad) <= 2e-5


@pytest.mark.parametrize("form", ["ssmax", "logn"])
def test_batch_of_one_packing_and_cache_equal_the_full_forward(form: str) -> None:
    scale = QueryScale.ssmax(1.0) if form == "ssmax" else QueryScale.logn(3)
    mha = layer(scale).eval()
    x = torch.randn(2, 10, 24, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = mha(x)
        for r in range(2):  # batch of one = batch
            assert_close(mha(x[r : r + 1]), full[r : r + 1], atol=1e-6, rtol=1e-5)
        # packing: two documents in one row = each document alone
        packed = mha(x[:1], document_ids=torch.tensor([[0] * 4 + [1] * 6]))
        assert_close(packed[:, :4], mha(x[:1, :4]), atol=1e-6, rtol=1e-5)
        assert_close(packed[:, 4:], mha(x[:1, 4:]), atol=1e-6, rtol=1e-5)
        # a cache: a prompt of 4 tokens, then one at a time
        cache = posenc.KVCache()
        steps = [mha(x[:, :4], cache=cache)] + [
            mha(x[:, t : t + 1], cache=cache) for t in range(4, 10)
        ]
    assert_close(torch.cat(steps, dim=1), full, atol=1e-6, rtol=1e-5)


def test_ssmax_counts_the_keys_left_after_padding() -> None:
    mha = layer(QueryScale.ssmax(1.0)).eval()
    x = torch.randn(1, 6, 24, generator=torch.Generator().manual_seed(4))
    padded = torch.cat([x, torch.zeros(1, 2, 24)], dim=1)
    mask = torch.tensor([[False] * 6 + [True] * 2])
    with torch.no_grad():
        assert_close(mha(padded, key_padding_mask=mask)[:, :6], mha(x), atol=1e-6, rtol=1e-5)
        left = torch.tensor([[True] * 2 + [False] * 6])  # left padding: counts skip the pads
        assert_close(
            mha(torch.cat([torch.zeros(1, 2, 24), x], 1), key_padding_mask=left)[:, 2:],
            mha(x),
            atol=1e-6,
            rtol=1e-5,
        )


def test_visible_keys_counts_mask_rows() -> None:
    mask = torch.ones(3, 3, dtype=torch.bool).tril().view(1, 1, 3, 3)
    assert visible_keys(mask, 2, 3, 3, torch.device("cpu")).tolist() == [[1, 2, 3]] * 2
    assert visible_keys(None, 1, 2, 5, torch.device("cpu")).tolist() == [[5, 5]]


def test_ssmax_scale_is_a_parameter_per_layer_and_forms_are_checked() -> None:
    encoder = posenc.Encoder(16, 2, 2, pe="rope", causal=True, query_scale=QueryScale.ssmax(0.4))
    names = [name for name, _ in encoder.named_parameters() if "ssmax" in name]
    assert names == ["layers.0.attn.ssmax_scale", "layers.1.attn.ssmax_scale"]
    assert encoder.layers[0].attn.ssmax_scale.tolist() == pytest.approx([0.4, 0.4])
    assert posenc.MultiHeadAttention(16, 2).ssmax_scale is None
    with pytest.raises(ValueError, match="form must be one of floor, ssmax, logn; got 'log'"):
        QueryScale(scale=1.0, floor=1.0, form="log")
    with pytest.raises(ValueError, match="must be an int >= 2, got 1"):
        QueryScale.logn(1)
    with pytest.raises(ValueError, match="form 'floor' takes none"):
        QueryScale(scale=1.0, floor=1.0, length=8)
    with pytest.raises(ValueError, match="use ssmax_factor"):
        QueryScale.ssmax(1.0).factor(torch.arange(3))
