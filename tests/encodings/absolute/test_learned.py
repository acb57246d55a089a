"""The learned absolute table (BERT, GPT-2): rows added by position, initialisations,
gradients, precision, and bad input."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from posenc import LearnedPositionalEncoding
from posenc.errors import MemoryBudgetError
from tests.misuse import Misuse, cases, check


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


NAN = float("nan")


def _learned(positions: torch.Tensor) -> object:
    return LearnedPositionalEncoding(8, max_len=20)(torch.zeros(1, 3, 8), positions)


MISUSE = [
    Misuse("too-long", lambda: LearnedPositionalEncoding(8, max_len=20)(torch.zeros(1, 25, 8)),
           ValueError, "input has", 25),
    Misuse("position-past-the-table", lambda: _learned(torch.tensor([0, 1, 20])), ValueError,
           "position", 20),
    Misuse("fractional", lambda: _learned(torch.tensor([0.0, 1.5, 2.0])), ValueError,
           "positions", 1.5),
    Misuse("negative", lambda: _learned(torch.tensor([0, -2, 1])), ValueError, "positions", -2),
    Misuse("nan", lambda: _learned(torch.tensor([0.0, NAN, 1.0])), ValueError, "positions", NAN),
    Misuse("max-len-zero", lambda: LearnedPositionalEncoding(8, max_len=0), ValueError,
           "max_len", 0),
    Misuse("max-len-none", lambda: LearnedPositionalEncoding(8, max_len=None), TypeError,
           "max_len", None),
    Misuse("init", lambda: LearnedPositionalEncoding(8, init="zeros"), ValueError, "init",
           "zeros"),
    Misuse("size", lambda: LearnedPositionalEncoding(64, max_len=10**10), MemoryBudgetError,
           "max_len x dim", "10000000000 x 64"),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse_names_the_argument_and_the_value(case: Misuse) -> None:
    check(case)
