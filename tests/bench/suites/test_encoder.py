"""The ``encoder`` suite of ``posenc bench`` (``posenc.bench.suites.encoder``): the torch
encoder it times against computes what ``posenc.Encoder`` computes (given the same weights,
the outputs agree), the timed steps do what their names say, and the profile breakdown lists
posenc's largest excess first and torch's last."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.bench.suites import encoder as suite


def test_the_torch_peer_is_the_same_encoder() -> None:
    dim, depth, heads, ffn = 16, 2, 4, 32
    torch.manual_seed(0)
    ours = posenc.Encoder(dim, depth, heads, pe="sinusoidal", ffn_dim=ffn).double().eval()
    theirs = suite._torch_encoder(dim, depth, heads, ffn, 0.0).double().eval()
    stack = theirs[1]
    with torch.no_grad():
        for mine, peer in zip(ours.layers, stack.layers, strict=True):
            peer.self_attn.in_proj_weight.copy_(mine.attn.qkv.weight)
            peer.self_attn.in_proj_bias.copy_(mine.attn.qkv.bias)
            peer.self_attn.out_proj.load_state_dict(mine.attn.out.state_dict())
            peer.linear1.load_state_dict(mine.ffn.up.state_dict())
            peer.linear2.load_state_dict(mine.ffn.down.state_dict())
            peer.norm1.load_state_dict(mine.norm1.state_dict())
            peer.norm2.load_state_dict(mine.norm2.state_dict())
        stack.norm.load_state_dict(ours.norm.state_dict())
    x = torch.randn(2, 7, dim, dtype=torch.float64)
    assert_close(theirs(x), ours(x), rtol=0, atol=1e-10)


def test_steps_run_forward_or_forward_and_backward() -> None:
    model = torch.nn.Linear(3, 1)
    x = torch.ones(2, 3)
    out = suite._step(model, x, backward=False)()
    assert isinstance(out, torch.Tensor) and model.weight.grad is None
    assert suite._step(model, x, backward=True)() is None
    assert torch.equal(model.weight.grad, torch.full((1, 3), 2.0))  # d(sum)/dW: 2 rows of 1


def test_breakdown_orders_operators_by_posenc_excess(monkeypatch: pytest.MonkeyPatch) -> None:
    ours = {"a": (5.0, 1), "b": (1.0, 2), "c": (0.5, 1), "shared": (2.0, 4)}
    theirs = {"b": (3.0, 1), "c": (0.5, 1), "shared": (1.0, 4), "fused": (4.0, 1)}
    profiles = iter([ours, theirs])
    monkeypatch.setattr(suite, "_profile", lambda fn, grad: next(profiles))
    table = suite._breakdown("eval forward", lambda: None, lambda: None, grad=False, k=2)
    # differences: a +5, shared +1, c 0, b -2, fused -4; the 2 largest, then torch's 1
    assert [row[0] for row in table.rows] == ["`a`", "`shared`", "`fused`"]
    assert table.rows[0] == ["`a`", "5.00", "1", "0.00", "0", "+5.00"]
    assert table.rows[2][-1] == "-4.00"
    assert "Totals: posenc 8.5 ms, torch 8.5 ms." in table.caption
