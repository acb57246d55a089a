"""posenc.model.fused, the encoder layer's inference fast path: each residual block equals
``residual + sublayer(h)`` written out in float64 (the ReLU fused into the up-projection's GEMM
and the GELU that is not), and a whole layer through it equals the autograd path."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch.testing import assert_close

from posenc import EncoderLayer, RotaryEmbedding
from posenc.model import fused


def test_fused_residual_linear_equals_linear_plus_residual() -> None:
    """The inference fast path's GEMM-accumulate: ``residual + linear(h)``."""
    linear = torch.nn.Linear(6, 4).double()
    h = torch.randn(2, 3, 6, dtype=torch.float64)
    r = torch.randn(2, 3, 4, dtype=torch.float64)
    with torch.no_grad():
        got = fused.residual_linear(linear, h, r).view(2, 3, 4)
    assert_close(got, r + h @ linear.weight.T + linear.bias, rtol=0, atol=1e-14)


def test_residual_linear_without_bias_leaves_the_residual_alone() -> None:
    linear = torch.nn.Linear(5, 3, bias=False).double()
    h = torch.randn(4, 5, dtype=torch.float64)
    r = torch.randn(4, 3, dtype=torch.float64)
    before = r.clone()
    with torch.no_grad():
        got = fused.residual_linear(linear, h, r)
    assert got.shape == (4, 3) and got.is_contiguous() and got.data_ptr() != r.data_ptr()
    assert torch.equal(r, before)  # a fresh buffer: the residual is not written to
    assert_close(got, before + h @ linear.weight.T, rtol=0, atol=1e-14)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_residual_blocks_equal_residual_plus_sublayer(activation: str) -> None:
    torch.manual_seed(0)
    layer = EncoderLayer(16, 2, ffn_dim=24, activation=activation, pe=RotaryEmbedding(8))  # type: ignore[arg-type]
    layer = layer.double().eval()
    h = torch.randn(2, 5, 16, dtype=torch.float64)
    r = torch.randn(2, 5, 16, dtype=torch.float64)
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[1, 3:] = True
    act = torch.relu if activation == "relu" else torch.nn.functional.gelu
    ffn = layer.ffn
    want_ffn = r + act(h @ ffn.up.weight.T + ffn.up.bias) @ ffn.down.weight.T + ffn.down.bias
    with torch.no_grad():
        want_attn = r + layer.attn(h, key_padding_mask=padding)
        state = layer.attn.state_for(h)
        attention, feed_forward = fused.residual_steps(layer, state, padding)
        assert_close(attention(h, r), want_attn, rtol=0, atol=1e-12)
        assert_close(feed_forward(h, r), want_ffn, rtol=0, atol=1e-12)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_equals_the_autograd_path(norm_first: bool) -> None:
    torch.manual_seed(0)
    layer = EncoderLayer(16, 4, norm_first=norm_first, pe=RotaryEmbedding(4)).double().eval()
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    positions = torch.tensor([0, 2, 3, 7, 8, 11])
    want = layer(x, positions=positions)  # autograd on: the plain residual blocks
    assert want.requires_grad
    spy = mock.patch.object(fused, "residual_steps", wraps=fused.residual_steps)
    with torch.no_grad(), spy as spied:
        got = layer(x, positions=positions)  # eval, no autograd: the fused residual steps
    assert spied.call_count == 1
    assert_close(got, want.detach(), rtol=0, atol=1e-12)
