"""Tests of ``src/posenc/encodings/kernels/select.py``: the one function that decides where a
rotation runs, asked in every situation that decides it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from torch import Tensor

from posenc.encodings.kernels import native
from posenc.encodings.kernels.select import Route, select

NATIVE = Route.NATIVE if native._native is not None else Route.TORCH


class Sub(Tensor):
    """A tensor subclass: sees only the operations it intercepts."""


def _tables(requires_grad: bool = False) -> tuple[Tensor, Tensor]:
    cos, sin = torch.rand(5, 4), torch.rand(5, 4)
    return cos.requires_grad_(requires_grad), sin.requires_grad_(requires_grad)


@dataclass
class Situation:
    name: str
    want: Route
    x: Callable[[], Tensor] = lambda: torch.randn(2, 3, 5, 8)
    tables: Callable[[], tuple[Tensor, Tensor] | None] = lambda: None
    inplace: bool = False
    learned: bool = False
    pair: Callable[[], Tensor | None] = lambda: None
    #: torch functions replaced by constants: the modes of torch.compile, torch.export, ONNX
    modes: dict[str, bool] = field(default_factory=dict)
    grad: bool = True


COMPILING = {"is_compiling": True}
EXPORTING_ONNX = {"is_compiling": True, "is_exporting": True, "is_in_onnx_export": True}
SITUATIONS = [
    # eager, nothing for autograd to record: the kernel where it takes the tensors
    Situation("float32", NATIVE),
    Situation("bfloat16", NATIVE, x=lambda: torch.randn(2, 3, 5, 8, dtype=torch.bfloat16)),
    Situation("in-place", NATIVE, inplace=True),
    Situation("no-grad-mode", NATIVE, x=lambda: torch.randn(5, 8, requires_grad=True), grad=False),
    Situation("learned-no-grad", NATIVE, learned=True, grad=False),
    Situation("given-tables", NATIVE, tables=_tables),
    Situation("float64", Route.TORCH, x=lambda: torch.randn(5, 8, dtype=torch.float64)),
    Situation("float16", Route.TORCH, x=lambda: torch.randn(5, 8, dtype=torch.float16)),
    Situation("strided-channels", Route.TORCH, x=lambda: torch.randn(8, 5).t()),
    Situation("meta", Route.TORCH, x=lambda: torch.randn(5, 8, device="meta")),
    Situation("float64-tables", Route.TORCH, tables=lambda: (torch.rand(5, 4).double(),) * 2),
    Situation("pair-float16", Route.TORCH, pair=lambda: torch.randn(5, 8, dtype=torch.float16)),
    # eager under autograd
    Situation("x-grad", Route.FUNCTION, x=lambda: torch.randn(5, 8, requires_grad=True)),
    Situation("pair-grad", Route.FUNCTION, pair=lambda: torch.randn(5, 8, requires_grad=True)),
    Situation("tables-grad", Route.FORMULA, tables=lambda: _tables(requires_grad=True)),
    Situation("learned", Route.FORMULA, learned=True),
    # graphs: torch.compile and torch.export
    Situation("compiled", Route.OPERATOR, modes=COMPILING),
    Situation("compiled-in-place", Route.OPERATOR_INPLACE, inplace=True, modes=COMPILING),
    Situation(
        "compiled-in-place-grad",
        Route.TRACED,
        x=lambda: torch.randn(5, 8, requires_grad=True),
        inplace=True,
        modes=COMPILING,
    ),
    Situation("compiled-learned", Route.TRACED, learned=True, modes=COMPILING),
    Situation(
        "compiled-float64", Route.TRACED, x=lambda: torch.randn(5, 8).double(), modes=COMPILING
    ),
    Situation("onnx-export", Route.TRACED, modes=EXPORTING_ONNX),
    Situation("onnx-export-in-place", Route.TRACED, inplace=True, modes=EXPORTING_ONNX),
    # tensors that are not plain
    Situation("subclass", Route.TRACED, x=lambda: torch.randn(5, 8).as_subclass(Sub)),
    Situation("subclass-pair", Route.TRACED, pair=lambda: torch.randn(5, 8).as_subclass(Sub)),
]
if native._native is None:  # the operator needs the kernel; else the formula
    for situation in SITUATIONS:
        if situation.want is Route.OPERATOR:
            situation.want = Route.TRACED


@pytest.mark.parametrize("situation", SITUATIONS, ids=lambda s: s.name)
def test_the_path_of_each_situation(situation: Situation, monkeypatch: pytest.MonkeyPatch) -> None:
    x, pair, tables = situation.x(), situation.pair(), situation.tables()
    for name, value in situation.modes.items():
        owner = torch.onnx if name == "is_in_onnx_export" else torch.compiler
        monkeypatch.setattr(owner, name, lambda value=value: value)
    with torch.set_grad_enabled(situation.grad):
        got = select(x, tables, inplace=situation.inplace, learned=situation.learned, pair=pair)
    assert got is situation.want
    assert got.eager == (not situation.modes and situation.want is not Route.TRACED)


def test_autocast_changes_nothing() -> None:
    """Every path computes in the tables' dtype and returns x's: autocast picks the same."""
    x = torch.randn(5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert select(x, inplace=False) is NATIVE


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated")
def test_traces_and_transforms_take_the_formula() -> None:
    """``torch.jit.trace`` and ``torch.func`` transforms (on x, or only on the positions)
    capture the formula; the paths found inside them are recorded as they are chosen."""
    seen: list[Route] = []

    def record(x: Tensor, positions: Tensor | None = None) -> Tensor:
        seen.append(select(x, inplace=False, positions=positions))
        return x * 1

    x = torch.randn(5, 8)
    torch.jit.trace(record, (x,), check_trace=False)
    torch.func.vmap(record)(torch.randn(3, 5, 8))
    torch.func.vmap(lambda p: record(x, p))(torch.arange(6).view(2, 3))
    torch.func.grad(lambda t: record(t).sum())(x)
    assert seen == [Route.TRACED] * 4


def test_a_real_compile_agrees_with_the_table() -> None:
    """Inside torch.compile the selector gives the operators (the table above replaces
    ``is_compiling``; here dynamo runs it)."""
    seen: list[Route] = []

    def record(x: Tensor) -> Tensor:
        seen.append(select(x, inplace=False))
        seen.append(select(x, inplace=True))
        return x * 1

    torch._dynamo.reset()
    torch.compile(record, backend="eager", fullgraph=True)(torch.randn(5, 8))
    out_of_place = Route.OPERATOR if native._native is not None else Route.TRACED
    assert seen == [out_of_place, Route.OPERATOR_INPLACE]
