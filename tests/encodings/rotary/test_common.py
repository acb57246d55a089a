"""Tests of ``src/posenc/encodings/rotary/common.py``: what RoPE, xPos and axial RoPE share,
the checks of their arguments and the rotation of q and k by a scheme's tables."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from posenc import PosencTypeError, PosencValueError, apply_rotary
from posenc.encodings.rotary.common import apply_tables_qk, check_qk, check_rotary_dim
from posenc.encodings.rotary.kernels import native
from posenc.encodings.rotary.kernels.select import KERNELS, Mode, Plan

#: Every plan the caller may hand in: each kernel eagerly (native where it is built), under
#: autograd, and the formula.
PLANS = [
    Plan(mode, KERNELS[name] if name else None, mode.eager)
    for mode, name in (
        (Mode.EAGER, "native"),
        (Mode.EAGER, "torch"),
        (Mode.FUNCTION, "torch"),
        (Mode.TRACED, None),
    )
    if name != "native" or native._native is not None
]


def _tables(n: int = 5, half: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.rand(n, half, dtype=torch.float64) * 6
    return angles.cos().float(), angles.sin().float()


def test_check_qk_names_the_tensor_and_the_shape() -> None:
    q = torch.randn(2, 3, 5, 8)
    assert check_qk(q, torch.randn(2, 1, 5, 8), 8)[0] is q  # grouped-query heads
    with pytest.raises(PosencTypeError, match="k must be a floating-point tensor"):
        check_qk(q, torch.ones(2, 3, 5, 8, dtype=torch.long), 8)
    with pytest.raises(PosencValueError, match="q has head_dim 8, expected 6"):
        check_qk(q, q, 6)
    with pytest.raises(PosencValueError, match="share batch and seq"):
        check_qk(q, torch.randn(2, 3, 4, 8), 8)


def test_check_rotary_dim_names_the_argument() -> None:
    assert check_rotary_dim(8, None) == 8 and check_rotary_dim(8, 4) == 4
    with pytest.raises(PosencValueError, match=r"rotary_dim \(10\) must be <= head_dim \(8\)"):
        check_rotary_dim(8, 10)
    with pytest.raises(PosencValueError, match=r"head_dim \(9\) must be divisible by 2"):
        check_rotary_dim(9, None)


@pytest.mark.parametrize("plan", [None, *PLANS], ids=repr)
@pytest.mark.parametrize("inplace", [False, True])
def test_rotate_qk_gives_the_formula_on_every_plan(plan: Plan | None, inplace: bool) -> None:
    """Whichever plan the caller selected (or none), q and k get apply_rotary's values."""
    q, k, tables = torch.randn(2, 3, 5, 8), torch.randn(2, 1, 5, 8), _tables()
    want = apply_rotary(q, *tables), apply_rotary(k, *tables)
    got = apply_tables_qk(q.clone(), k.clone(), tables, tables, False, inplace, plan)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, rtol=1e-6, atol=1e-6)


def test_rotate_qk_refuses_one_memory_in_place() -> None:
    q, tables = torch.randn(1, 2, 5, 8), _tables()
    with pytest.raises(PosencValueError, match="q and k share memory"):
        apply_tables_qk(q, q[:, :1], tables, tables, False, True)
    with pytest.raises(PosencValueError, match="q and k share memory"):  # not at q's start
        apply_tables_qk(q, q[:, 1:], tables, tables, False, True)
    with pytest.raises(PosencTypeError, match="inplace"):
        apply_tables_qk(q, q.clone(), tables, tables, False, "yes")
