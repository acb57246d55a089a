"""Tests of ``src/posenc/encodings/rotary/kernels/select.py``: the one function that decides where a
rotation runs (the mode, and the kernel), asked in every situation that decides it, and
``POSENC_ROTARY_KERNEL``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from torch import Tensor

from posenc import PosencValueError
from posenc.encodings.rotary.kernels import native, pytorch, rotate
from posenc.encodings.rotary.kernels.select import (
    KERNELS,
    Mode,
    Plan,
    native_eager,
    native_eager_pair,
    select,
    turn_prepared_pair,
)

#: The kernel a float32/bfloat16 CPU tensor gets: the C kernel where it was built.
NATIVE = "native" if native._native is not None else "torch"


class Sub(Tensor):
    """A tensor subclass: sees only the operations it intercepts."""


def _tables(requires_grad: bool = False) -> tuple[Tensor, Tensor]:
    cos, sin = torch.rand(5, 4), torch.rand(5, 4)
    return cos.requires_grad_(requires_grad), sin.requires_grad_(requires_grad)


@dataclass
class Situation:
    name: str
    want: Mode
    #: The kernel's name, ``None`` for the formula (the decision table's kernel column).
    kernel: str | None
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
EAGER, FUNCTION, FORMULA = Mode.EAGER, Mode.FUNCTION, Mode.FORMULA
OPERATOR, OPERATOR_INPLACE, TRACED = Mode.OPERATOR, Mode.OPERATOR_INPLACE, Mode.TRACED
SITUATIONS = [
    # eager, nothing for autograd to record: the C kernel where it takes the tensors
    Situation("float32", EAGER, NATIVE),
    Situation("bfloat16", EAGER, NATIVE, x=lambda: torch.randn(2, 3, 5, 8, dtype=torch.bfloat16)),
    Situation("in-place", EAGER, NATIVE, inplace=True),
    Situation(
        "no-grad-mode", EAGER, NATIVE, x=lambda: torch.randn(5, 8, requires_grad=True), grad=False
    ),
    Situation("learned-no-grad", EAGER, NATIVE, learned=True, grad=False),
    Situation("given-tables", EAGER, NATIVE, tables=_tables),
    Situation("float64", EAGER, "torch", x=lambda: torch.randn(5, 8, dtype=torch.float64)),
    Situation("float16", EAGER, "torch", x=lambda: torch.randn(5, 8, dtype=torch.float16)),
    Situation("strided-channels", EAGER, "torch", x=lambda: torch.randn(8, 5).t()),
    Situation("meta", EAGER, "torch", x=lambda: torch.randn(5, 8, device="meta")),
    Situation("float64-tables", EAGER, "torch", tables=lambda: (torch.rand(5, 4).double(),) * 2),
    Situation("pair-float16", EAGER, "torch", pair=lambda: torch.randn(5, 8, dtype=torch.float16)),
    # eager under autograd: the same kernel as one autograd node, or the formula
    Situation("x-grad", FUNCTION, NATIVE, x=lambda: torch.randn(5, 8, requires_grad=True)),
    Situation("pair-grad", FUNCTION, NATIVE, pair=lambda: torch.randn(5, 8, requires_grad=True)),
    Situation(
        "x-grad-float64",
        FUNCTION,
        "torch",
        x=lambda: torch.randn(5, 8, dtype=torch.float64, requires_grad=True),
    ),
    Situation("tables-grad", FORMULA, None, tables=lambda: _tables(requires_grad=True)),
    Situation("learned", FORMULA, None, learned=True),
    # graphs: torch.compile and torch.export
    Situation("compiled", OPERATOR, NATIVE, modes=COMPILING),
    Situation("compiled-in-place", OPERATOR_INPLACE, NATIVE, inplace=True, modes=COMPILING),
    Situation(
        "compiled-in-place-float64",
        OPERATOR_INPLACE,
        "torch",
        x=lambda: torch.randn(5, 8).double(),
        inplace=True,
        modes=COMPILING,
    ),
    Situation(
        "compiled-in-place-grad",
        TRACED,
        None,
        x=lambda: torch.randn(5, 8, requires_grad=True),
        inplace=True,
        modes=COMPILING,
    ),
    Situation("compiled-learned", TRACED, None, learned=True, modes=COMPILING),
    Situation(
        "compiled-float64", TRACED, None, x=lambda: torch.randn(5, 8).double(), modes=COMPILING
    ),
    Situation("onnx-export", TRACED, None, modes=EXPORTING_ONNX),
    Situation("onnx-export-in-place", TRACED, None, inplace=True, modes=EXPORTING_ONNX),
    # tensors that are not plain
    Situation("subclass", TRACED, None, x=lambda: torch.randn(5, 8).as_subclass(Sub)),
    Situation("subclass-pair", TRACED, None, pair=lambda: torch.randn(5, 8).as_subclass(Sub)),
]
if native._native is None:  # the operator needs a kernel faster than torch's path
    for situation in SITUATIONS:
        if situation.want is OPERATOR:
            situation.want, situation.kernel = TRACED, None


@pytest.mark.parametrize("situation", SITUATIONS, ids=lambda s: s.name)
def test_the_path_of_each_situation(situation: Situation, monkeypatch: pytest.MonkeyPatch) -> None:
    x, pair, tables = situation.x(), situation.pair(), situation.tables()
    for name, value in situation.modes.items():
        owner = torch.onnx if name == "is_in_onnx_export" else torch.compiler
        monkeypatch.setattr(owner, name, lambda value=value: value)
    with torch.set_grad_enabled(situation.grad):
        got = select(x, tables, inplace=situation.inplace, learned=situation.learned, pair=pair)
        mode_only = select(
            x, tables, inplace=situation.inplace, learned=situation.learned, pair=pair, kernel=False
        )
    assert got.mode is situation.want
    assert (got.kernel and got.kernel.name) == situation.kernel
    assert got.eager == (not situation.modes and situation.want is not TRACED)
    assert mode_only.mode is got.mode and mode_only.kernel is None


@pytest.mark.parametrize("forced", [None, "native", "torch"])
@pytest.mark.parametrize("situation", SITUATIONS, ids=lambda s: s.name)
def test_native_eager_pair_is_the_selectors_answer(
    situation: Situation, forced: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``native_eager_pair`` is True exactly where ``select`` answers the C kernel eagerly for
    the pair turned in place by float32 tables with contiguous channels, autograd off (with
    it on, never: in place, autograd would not see the change)."""
    x, pair = situation.x(), situation.pair()
    pair = x.clone() if pair is None else pair
    for name, value in situation.modes.items():
        owner = torch.onnx if name == "is_in_onnx_export" else torch.compiler
        monkeypatch.setattr(owner, name, lambda value=value: value)
    if forced is not None:
        monkeypatch.setenv("POSENC_ROTARY_KERNEL", forced)
    for grad in {situation.grad, False}:
        with torch.set_grad_enabled(grad):
            try:
                plan = select(x, _tables(), inplace=True, pair=pair)
            except PosencValueError:  # a forced kernel that cannot take the tensors
                plan = None
            got = native_eager_pair(x, pair)
        native_plan = plan is not None and plan.mode is EAGER and plan.kernel is KERNELS["native"]
        assert got is (native_plan and not grad)
        if situation.name == "float32" and forced != "torch" and native._native is not None:
            assert got is not grad  # (the answer is not always False)


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated")
def test_native_eager_pair_is_false_in_traces_and_transforms() -> None:
    seen: list[bool] = []

    def record(x: Tensor) -> Tensor:
        seen.append(native_eager_pair(x, x.clone()))
        return x * 1

    with torch.no_grad():
        torch.jit.trace(record, (torch.randn(5, 8),), check_trace=False)
        torch.func.vmap(record)(torch.randn(3, 5, 8))
    assert seen == [False, False]


def test_autocast_changes_nothing() -> None:
    """Every path computes in the tables' dtype and returns x's: autocast picks the same."""
    x = torch.randn(5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = select(x, inplace=False)
    assert got.mode is EAGER and got.kernel is KERNELS[NATIVE]


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated")
def test_traces_and_transforms_take_the_formula() -> None:
    """``torch.jit.trace`` and ``torch.func`` transforms (on x, or only on the positions)
    capture the formula; the paths found inside them are recorded as they are chosen."""
    seen: list[Mode] = []

    def record(x: Tensor, positions: Tensor | None = None) -> Tensor:
        seen.append(select(x, inplace=False, positions=positions).mode)
        return x * 1

    x = torch.randn(5, 8)
    torch.jit.trace(record, (x,), check_trace=False)
    torch.func.vmap(record)(torch.randn(3, 5, 8))
    torch.func.vmap(lambda p: record(x, p))(torch.arange(6).view(2, 3))
    torch.func.grad(lambda t: record(t).sum())(x)
    assert seen == [TRACED] * 4


def test_a_real_compile_agrees_with_the_table() -> None:
    """Inside torch.compile the selector gives the operators (the table above replaces
    ``is_compiling``; here dynamo runs it)."""
    seen: list[Plan] = []

    def record(x: Tensor) -> Tensor:
        seen.append(select(x, inplace=False))
        seen.append(select(x, inplace=True))
        return x * 1

    torch._dynamo.reset()
    torch.compile(record, backend="eager", fullgraph=True)(torch.randn(5, 8))
    out_of_place = OPERATOR if native._native is not None else TRACED
    assert [plan.mode for plan in seen] == [out_of_place, OPERATOR_INPLACE]
    assert seen[1].kernel is KERNELS[NATIVE]


# --------------------------------------------------------------------------- POSENC_ROTARY_KERNEL


@pytest.mark.parametrize("value", ["auto", ""])
def test_auto_or_empty_is_the_table(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSENC_ROTARY_KERNEL", value)
    assert select(torch.randn(5, 8), inplace=False).kernel is KERNELS[NATIVE]


def test_a_forced_kernel_runs_wherever_one_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read on every call: eager, under autograd, and in the compiled modes."""
    monkeypatch.setenv("POSENC_ROTARY_KERNEL", "torch")
    x = torch.randn(5, 8)
    assert select(x, inplace=False).kernel is KERNELS["torch"]
    assert select(x.requires_grad_(), inplace=True).kernel is KERNELS["torch"]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    plan = select(x.detach(), inplace=False)  # (the operator, even with the torch path)
    assert plan.mode is OPERATOR and plan.kernel is KERNELS["torch"]
    monkeypatch.setenv("POSENC_ROTARY_KERNEL", "auto")
    assert select(x.detach(), inplace=False).mode is (OPERATOR if NATIVE == "native" else TRACED)


@pytest.mark.parametrize(
    ("kernel", "x", "says"),
    [
        ("native", lambda: torch.randn(5, 8, dtype=torch.float64), "torch.float64 on cpu"),
        ("native", lambda: torch.randn(8, 5).t(), "strides (1, 5)"),
        ("triton", lambda: torch.randn(5, 8), "torch.float32 on cpu"),
    ],
)
def test_forcing_a_kernel_that_cannot_take_the_tensors_is_an_error(
    kernel: str, x: Callable[[], Tensor], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POSENC_ROTARY_KERNEL", kernel)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(PosencValueError, match=f"POSENC_ROTARY_KERNEL={kernel}: .*cannot take"):
        select(x(), inplace=False)
    try:
        select(x(), inplace=False)
    except PosencValueError as error:
        assert says in str(error)


@pytest.mark.parametrize(
    ("situation", "why"),
    [
        (Situation("learned", FORMULA, None, learned=True), "learned frequencies"),
        (Situation("onnx", TRACED, None, modes=EXPORTING_ONNX), "ONNX export"),
        (
            Situation("subclass", TRACED, None, x=lambda: torch.randn(5, 8).as_subclass(Sub)),
            "tensor subclass",
        ),
    ],
    ids=lambda s: getattr(s, "name", ""),
)
def test_forcing_a_kernel_where_the_formula_is_needed_is_an_error(
    situation: Situation, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in situation.modes.items():
        owner = torch.onnx if name == "is_in_onnx_export" else torch.compiler
        monkeypatch.setattr(owner, name, lambda value=value: value)
    monkeypatch.setenv("POSENC_ROTARY_KERNEL", "native")
    with pytest.raises(PosencValueError, match=f"POSENC_ROTARY_KERNEL=native: .*{why}"):
        select(situation.x(), inplace=False, learned=situation.learned)
    # the callers that only need the mode (the tables' eagerness) are not refused
    assert select(situation.x(), inplace=False, learned=situation.learned, kernel=False)


def test_torch_func_with_a_forced_kernel_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSENC_ROTARY_KERNEL", "torch")
    with pytest.raises(PosencValueError, match=r"torch\.func"):
        torch.func.vmap(lambda x: select(x, inplace=False) and x)(torch.randn(3, 5, 8))


def test_a_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSENC_ROTARY_KERNEL", "cuda")
    with pytest.raises(
        PosencValueError,
        match=r"POSENC_ROTARY_KERNEL must be one of auto, native, torch, triton, got 'cuda'",
    ):
        select(torch.randn(5, 8), inplace=False)


def test_the_public_modules_obey_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same numbers through every kernel a CPU tensor can take, and the kernel asked for
    is the one that runs (each counted where it starts work)."""
    import posenc

    rope = posenc.RotaryEmbedding(16)
    q, k = torch.randn(2, 4, 6, 16), torch.randn(2, 2, 6, 16)
    want = rope(q, k)
    ran: list[str] = []
    for name, module, entry in (
        ("torch", pytorch, "turn_tiled"),
        ("native", native, "_run_kernel"),
    ):
        original = getattr(module, entry)
        monkeypatch.setattr(
            module, entry, lambda *a, name=name, f=original: ran.append(name) or f(*a)
        )
    names = ["torch"] + (["native"] if native._native is not None else [])
    for name in names:
        monkeypatch.setenv("POSENC_ROTARY_KERNEL", name)
        ran.clear()
        torch.testing.assert_close(rope(q, k), want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(rope.rotate(q), want[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(
            posenc.apply_rotary(q, *rope.cos_sin(None, 6, dtype=torch.float32)), want[0]
        )
        assert set(ran) == {name}


def test_native_eager_is_the_pair_answer_before_the_tensors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``native_eager`` answers for the call's state alone: False under autograd, in a
    trace, with another kernel forced or none built; where it is True, ``native_eager_pair``
    adds only what the tensors must be. ``turn_prepared_pair`` (its checks written out) turns
    q and k exactly where ``native_eager`` holds, and otherwise writes nothing."""
    x = torch.randn(2, 3, 4, 8)
    angles = torch.rand(4, 4, dtype=torch.float64)
    cos, sin = angles.cos().float(), angles.sin().float()
    prepared = native.prepare_tables(cos, sin)

    def turns() -> bool:
        q, k = x.clone(), x[:, :1].clone()
        answer = turn_prepared_pair(q, k, prepared, False) if prepared else False
        want = [rotate.rotate_reference(t, cos, sin) for t in (x, x[:, :1])]
        if answer:
            assert torch.equal(q, want[0]) and torch.equal(k, want[1])
        else:
            assert torch.equal(q, x) and torch.equal(k, x[:, :1])
        return answer

    with torch.no_grad():
        assert native_eager() is (native._native is not None) is turns()
        assert native_eager_pair(x, x.clone()) is native_eager()
        assert native_eager_pair(x.half(), x.half()) is False  # (the tensors' part)
        monkeypatch.setenv("POSENC_ROTARY_KERNEL", "torch")
        assert native_eager() is False is turns()
        monkeypatch.setenv("POSENC_ROTARY_KERNEL", "native")
        assert native_eager() is (native._native is not None) is turns()
        monkeypatch.setattr(native, "_native", None)
        assert native_eager() is False
    assert native_eager() is False is turns()  # autograd on
    seen: list[bool] = []
    with torch.no_grad():
        torch.func.vmap(lambda t: seen.append(native_eager()) or t * 1)(torch.randn(3, 4))
        torch.func.vmap(lambda t: seen.append(turns()) or t * 1)(torch.randn(3, 4))
    assert seen == [False, False]
