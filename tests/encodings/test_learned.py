from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from posenc import LearnedPositionalEncoding


def test_adds_rows_of_the_table() -> None:
    pe = LearnedPositionalEncoding(8, max_len=20)
    x = torch.randn(2, 12, 8)
    assert_close(pe(x), x + pe.weight[:12], rtol=0, atol=0)
    assert torch.equal(pe(x, torch.arange(12)), pe(x))
    pos = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]] * 2)
    assert torch.equal(pe(x, pos), x + pe.weight[3:15])


def test_inits() -> None:
    torch.manual_seed(0)
    normal = LearnedPositionalEncoding(256, max_len=512, init="normal")
    assert abs(normal.weight.std().item() - 0.02) < 1e-3
    assert abs(normal.weight.mean().item()) < 1e-3
    xavier = LearnedPositionalEncoding(256, max_len=512, init="xavier")
    bound = (6 / (512 + 256)) ** 0.5  # Glorot & Bengio 2010, eq. 16
    assert xavier.weight.abs().max() <= bound
    assert xavier.weight.abs().max() > 0.95 * bound
    assert abs(xavier.weight.std().item() - bound / 3**0.5) < 2e-3


def test_gradients_reach_table_rows_used() -> None:
    pe = LearnedPositionalEncoding(4, max_len=10)
    pe(torch.zeros(1, 3, 4)).sum().backward()
    assert pe.weight.grad is not None
    assert (pe.weight.grad[:3] == 1).all() and (pe.weight.grad[3:] == 0).all()


def test_state_dict_holds_table() -> None:
    a = LearnedPositionalEncoding(4, max_len=6)
    b = LearnedPositionalEncoding(4, max_len=6)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.weight, b.weight)


def test_half_input_computed_in_fp32() -> None:
    pe = LearnedPositionalEncoding(8, max_len=16)
    x = torch.randn(1, 5, 8).to(torch.bfloat16)
    out = pe(x)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, (x.float() + pe.weight[:5]).to(torch.bfloat16))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda pe: pe(torch.zeros(1, 25, 8)),
            ValueError,
            "input has 25 positions but the learned table has max_len=20",
        ),
        (
            lambda pe: pe(torch.zeros(1, 3, 8), torch.tensor([0, 1, 20])),
            ValueError,
            "position 20 is past the learned table \\(max_len=20\\)",
        ),
        (
            lambda pe: pe(torch.zeros(1, 3, 8), torch.tensor([0.0, 1.5, 2.0])),
            ValueError,
            "whole numbers",
        ),
        (
            lambda pe: pe(torch.zeros(1, 3, 8), torch.tensor([0, -2, 1])),
            ValueError,
            "minimum of -2",
        ),
        (
            lambda pe: LearnedPositionalEncoding(8, max_len=0),
            ValueError,
            "max_len must be >= 1, got 0",
        ),
        (lambda pe: LearnedPositionalEncoding(8, init="zeros"), ValueError, "init must be"),
    ],
)
def test_bad_input(call, error, match) -> None:  # type: ignore[no-untyped-def]
    pe = LearnedPositionalEncoding(8, max_len=20)
    with pytest.raises(error, match=match):
        call(pe)
