"""Every learned bias trains through flex attention: each scheme's ``score_mod`` gives the
materialised bias's values *and gradients* (of the scheme's parameters, and of ``q`` for
Shaw), and reads each captured tensor that requires a gradient exactly once per score.

The second property is what compiled flex_attention's backward needs on CUDA (its joint graph
turns each read of such a tensor into a scatter of gradients and refuses two reads of one
tensor: "Using multiple indexing operations on the same tensor that requires gradients ...").
Flex's eager reference and its CPU kernel (which has no backward) never run that check, so the
structural test below makes it on the CPU: it traces each ``score_mod`` with a
``TorchFunctionMode`` and counts what happens to every tensor the closure captured.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.testing import assert_close

import posenc
from posenc.encodings.bias.common import DistanceBias
from posenc.encodings.bias.relative import FIRE
from tests.encodings.bias.scores import on_grid
from tests.schemes import BIAS, FACTS, qk, reads

FUSED = [name for name in BIAS if FACTS[name].score_mod]
#: Positions: plain, batched rows, and fractional (for the schemes that take them).
POSITIONS = {
    "arange": torch.arange(9),
    "batched": torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [3, 4, 5, 6, 7, 8, 9, 10, 11]]),
    "fractional": torch.arange(9) * 0.75 + 0.5,
    # rows far apart (streams at different offsets): a table by distance spans the distances
    # within a row, never the gap between rows (10^11 entries)
    "far_rows": torch.stack([torch.arange(9), torch.arange(9) + 10**11]),
}


def _cases() -> list[tuple[str, str]]:
    """Every fused scheme at every kind of positions it takes."""
    return [
        (name, where)
        for name in FUSED
        for where in POSITIONS
        if where != "fractional" or not FACTS[name].integer_positions
    ]


def _scheme(name: str) -> tuple[Any, dict[str, Any]]:
    """The scheme, and what its bias reads: ``q`` (which carries a gradient), ``k`` and,
    for a data-dependent scheme, ``x`` (which carries one too)."""
    torch.manual_seed(0)
    pe = posenc.build_for_model(name, 16, 4).double()
    q, k = qk(2, 4, 9, 4)
    kwargs = reads(pe, q.requires_grad_(), k)
    if "x" in kwargs:
        kwargs["x"].requires_grad_()
    return pe, kwargs


@pytest.mark.parametrize(("name", "where"), _cases())
def test_score_mod_values_and_gradients_equal_the_bias(name: str, where: str) -> None:
    pe, kwargs = _scheme(name)
    positions = POSITIONS[where]
    mod = pe.score_mod(positions, positions, **kwargs)
    if mod is None:  # only a table by distance, which fractional positions cannot index
        assert where == "fractional" and not FACTS[name].integer_positions
        assert isinstance(pe, DistanceBias) and pe.table_score_mod
        assert not pe.fused_at(positions, positions)  # declared: attention materialises it
        return
    got = on_grid(mod, 2, 4, 9)
    want = pe.bias(positions, positions, **kwargs).expand(2, 4, 9, 9)
    assert_close(got, want, rtol=1e-12, atol=1e-12)

    inputs = [p for p in pe.parameters() if p.requires_grad]
    inputs += [kwargs["q"]] if pe.needs_qk else []
    inputs += [kwargs["x"]] if pe.needs_x else []
    if not inputs:  # a fixed bias (ALiBi, Sandwich): nothing to train
        return
    weight = torch.randn(2, 4, 9, 9, dtype=torch.float64)  # a loss that weighs every score
    grads = torch.autograd.grad((got * weight).sum(), inputs, allow_unused=True)
    wants = torch.autograd.grad((want * weight).sum(), inputs, allow_unused=True)
    for param, grad, grad_want in zip(inputs, grads, wants, strict=True):
        assert grad_want is not None
        assert grad is not None, f"{name}: no gradient reaches a {tuple(param.shape)} input"
        assert_close(grad, grad_want, rtol=1e-10, atol=1e-12)


def _captured(fn: Any, seen: set[int] | None = None) -> list[torch.Tensor]:
    """Every tensor a function's closure holds, through the functions it captures."""
    seen = set() if seen is None else seen
    found: list[torch.Tensor] = []
    if id(fn) in seen:
        return found
    seen.add(id(fn))
    for cell in getattr(fn, "__closure__", None) or ():
        value = cell.cell_contents
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif callable(item):
                found.extend(_captured(item, seen))
    return found


class _Reads(TorchFunctionMode):
    """Records, for each watched tensor, every operation that takes it: ``True`` for an
    indexing (``t[...]``), ``False`` for any other use."""

    def __init__(self, watched: list[torch.Tensor]) -> None:
        super().__init__()
        self.watched = {id(t): t for t in watched}
        self.reads: dict[int, list[bool]] = {key: [] for key in self.watched}

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        for position, arg in enumerate([*args, *kwargs.values()]):
            if id(arg) in self.watched and arg is self.watched[id(arg)]:
                self.reads[id(arg)].append(func is torch.Tensor.__getitem__ and position == 0)
        return func(*args, **kwargs)


@pytest.mark.parametrize(("name", "where"), _cases())
def test_each_captured_tensor_that_requires_grad_is_indexed_once(name: str, where: str) -> None:
    pe, kwargs = _scheme(name)
    positions = POSITIONS[where]
    mod = pe.score_mod(positions, positions, **kwargs)
    if mod is None:
        return  # covered by the test above
    captured = _captured(mod)
    learned = [t for t in captured if t.requires_grad]
    if any(p.requires_grad for p in pe.parameters()):  # a learned bias: its table is captured
        assert learned, f"{name}'s score_mod captures nothing that carries a gradient"
    index = torch.tensor(1), torch.tensor(3), torch.tensor(5), torch.tensor(2)  # b, h, q, kv
    with _Reads(learned) as reads:
        mod(torch.zeros((), dtype=torch.float64), *index)
    for tensor in learned:
        used = reads.reads[id(tensor)]
        assert used == [True], (
            f"{name}: a captured {tuple(tensor.shape)} tensor that requires grad is used "
            f"{len(used)} times ({sum(used)} indexings): compiled flex's backward takes one"
        )


def test_the_structural_check_catches_a_second_read() -> None:
    """The check above fails on the form compiled flex refuses: one table read twice."""
    table = torch.randn(4, 9, requires_grad=True)

    def twice(score, b, h, q_idx, kv_idx):  # type: ignore[no-untyped-def]
        return score + table[h, q_idx] + table[h, kv_idx]

    with _Reads([table]) as reads:
        twice(torch.zeros(()), *(torch.tensor(1),) * 4)
    assert reads.reads[id(table)] == [True, True]
    assert _captured(twice) == [table]


def test_fire_segments_are_its_mlp() -> None:
    """FIRE's kernel form, ``A[s] + B[s] · x`` with ``s`` the number of kinks at or below
    ``x``, equals the MLP at every point, kinks included, with flat hidden units (``w1 = 0``)
    both active and inactive: the same function, not an approximation."""
    torch.manual_seed(1)
    pe = FIRE(3, mlp_dim=7).double()
    with torch.no_grad():
        pe.mlp[0].weight[2, 0] = 0.0
        pe.mlp[0].bias[2] = 0.5  # always on
        pe.mlp[0].weight[5, 0] = 0.0
        pe.mlp[0].bias[5] = -0.5  # always off
    intercept, gradient, kinks = pe.mlp_segments(torch.float64)
    assert kinks.shape == (7,) and torch.isinf(kinks[5:]).all()  # 5 real kinks, P = 8
    finite = kinks[torch.isfinite(kinks)]
    x = torch.cat([torch.linspace(-4, 4, 801, dtype=torch.float64), finite])
    s = (kinks.unsqueeze(0) <= x.unsqueeze(-1)).sum(-1)  # (points,)
    got = intercept[:, s] + gradient[:, s] * x  # (h, points)
    want = pe.mlp(x.unsqueeze(-1)).T
    assert_close(got, want, rtol=0, atol=1e-13)
