"""What every bias scheme shares, parametrised from the registry: the flex ``score_mod``
equals the materialised bias (``posenc.encodings.bias.common``), batched positions give each
row's own bias, ``build_for_model`` sizes the scheme, and the checks on positions and on
``q``/``k`` name the argument and the value."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.encodings.bias.alibi import ALiBi
from posenc.encodings.bias.relative import KERPLE, DynamicPositionBias
from posenc.encodings.bias.t5 import T5RelativeBias
from posenc.errors import MemoryBudgetError
from tests.encodings.bias.scores import on_grid
from tests.misuse import MISSING, Misuse, cases, check
from tests.schemes import BIAS, FACTS, qk, reads

NEEDS_QK = [name for name in BIAS if posenc.entry(name).cls.needs_qk]


# --------------------------------------------------------------------------- score_mod


@pytest.mark.parametrize("name", BIAS)
@pytest.mark.parametrize("batched", [False, True])
def test_score_mod_equals_bias(name: str, batched: bool) -> None:
    pe = posenc.build_for_model(name, 16, 4).double()
    q, k = qk(2, 4, 9, 4)
    qp = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [3, 4, 5, 6, 7, 8, 9, 10, 11]])
    qp = qp if batched else qp[0]
    kwargs = reads(pe, q, k)
    with torch.no_grad():
        mod = pe.score_mod(qp, qp, **kwargs)
        want = pe.bias(qp, qp, **kwargs).expand(2, 4, 9, 9)
    if not FACTS[name].score_mod:
        assert mod is None  # these read every pair: attention materialises their bias
        return
    assert mod is not None
    assert_close(on_grid(mod, 2, 4, 9, 9), want, rtol=1e-6, atol=1e-7)


def test_alibi_score_mod_handles_fractional_positions() -> None:
    pe = ALiBi(2)
    pos = torch.tensor([0.0, 0.5, 2.25])
    got = on_grid(pe.score_mod(pos, pos), 1, 2, 3, 3)
    assert_close(got, pe.bias(pos, pos).double().unsqueeze(0), rtol=1e-6, atol=1e-7)


def test_distance_schemes_without_integer_positions_have_no_table() -> None:
    pos = torch.tensor([0.0, 0.5, 2.25])
    assert KERPLE(2).score_mod(pos, pos) is None
    assert DynamicPositionBias(2).score_mod(pos, pos) is None


# --------------------------------------------------------------------------- shared


@pytest.mark.parametrize("name", BIAS)
def test_registry_and_for_model(name: str) -> None:
    pe = posenc.build_for_model(name, 24, 3)
    assert pe.family == "bias" and pe.num_heads == 3
    assert pe.paper
    if "head_dim" in FACTS[name].arguments(24, 3):
        assert pe.head_dim == 8  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", BIAS)
def test_batched_positions_give_each_row_its_own_bias(name: str) -> None:
    """``(b, n)`` positions: row ``b`` of the bias is the bias of row ``b``'s positions (and
    of row ``b``'s q, k) computed alone; 1-D positions give ``(h, n, n)`` unless the scheme
    reads q, k."""
    pe = posenc.build_for_model(name, 16, 4).double()
    q, k = qk(2, 4, 6, 4)
    pos = torch.stack((torch.arange(6), torch.arange(6) * 2 + 3))  # (b, n): two different rows
    kwargs = reads(pe, q, k)
    with torch.no_grad():
        batched = pe.bias(pos, pos, **kwargs)
        rows = [
            pe.bias(pos[b], pos[b], **{n: t[b : b + 1] for n, t in kwargs.items()}) for b in (0, 1)
        ]
    assert batched.shape == (2, 4, 6, 6)
    for b, row in enumerate(rows):
        batch_first = pe.needs_qk or pe.needs_x
        assert row.shape == ((1, 4, 6, 6) if batch_first else (4, 6, 6))
        assert_close(batched[b], row.reshape(4, 6, 6), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- bad input

NAN, INF = float("nan"), float("inf")


def _position_misuse(name: str) -> list[Misuse]:
    """Bad positions for the scheme ``name``: each names the argument and the value."""
    pe = posenc.build_for_model(name, 16, 4)
    q = torch.randn(2, 4, 5, 4)
    extra = reads(pe, q, q)  # (and a data-dependent scheme's input): only positions are bad
    pos = torch.arange(5)
    return [
        Misuse(f"{name}-batch-mismatch",
               lambda: pe.bias(torch.zeros(2, 5, dtype=torch.long),
                               torch.zeros(3, 5, dtype=torch.long), **extra),
               ValueError, "k_positions", (3, 5)),
        Misuse(f"{name}-rank",
               lambda: pe.bias(torch.zeros(1, 2, 5, dtype=torch.long), pos, **extra),
               ValueError, "q_positions", (1, 2, 5)),
        Misuse(f"{name}-list", lambda: pe.bias([0, 1], pos, **extra), TypeError, "q_positions",
               "list"),
        Misuse(f"{name}-bool", lambda: pe.bias(torch.ones(5, dtype=torch.bool), pos, **extra),
               TypeError, "q_positions", torch.bool),
        Misuse(f"{name}-q-nan",
               lambda: pe.bias(torch.tensor([0.0, 1.0, NAN, 3.0, 4.0]), pos, **extra),
               ValueError, "q_positions", NAN),
        Misuse(f"{name}-k-inf",
               lambda: pe.bias(pos, torch.tensor([0.0, 1.0, 2.0, -INF, 4.0]), **extra),
               ValueError, "k_positions", -INF),
    ]  # fmt: skip


def _qk_misuse(name: str) -> list[Misuse]:
    """Schemes that read q, k: without q, or with a q of the wrong shape."""
    pe = posenc.build_for_model(name, 16, 4)
    pos = torch.arange(5)
    wrong = torch.randn(1, 2, 5, 4)
    return [
        Misuse(f"{name}-no-q", lambda: pe.bias(pos, pos), ValueError, "q=", MISSING),
        Misuse(f"{name}-q-shape", lambda: pe.bias(pos, pos, q=wrong, k=wrong), ValueError, "q",
               (1, 2, 5, 4)),
    ]  # fmt: skip


MISUSE = [
    *(case for name in BIAS for case in _position_misuse(name)),
    *(case for name in NEEDS_QK for case in _qk_misuse(name)),
    Misuse("alibi-size", lambda: ALiBi(8).bias(torch.arange(10**6), torch.arange(10**6)),
           MemoryBudgetError, "q_positions x k_positions", "1000000 x 1000000"),
    Misuse("t5-size",
           lambda: T5RelativeBias(8).bias(torch.arange(10**6), torch.arange(10**6)),
           MemoryBudgetError, "q_positions x k_positions", "1000000 x 1000000"),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse_names_the_argument_and_the_value(case: Misuse) -> None:
    check(case)
