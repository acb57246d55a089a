"""Every bias scheme declares whether it has a fused form (``has_score_mod``, and
``fused_at`` for given positions), and the declaration is what ``score_mod`` does: a
``score_mod`` exactly where declared, giving the materialised bias's values. Attention chooses
its backend from the declaration alone (``posenc.attention.backends.Request.kind_of``).

The expected answers come from :data:`tests.schemes.FACTS` (written per scheme, apart from the
classes), and the values from each scheme's own ``bias``, itself checked against float64
transcriptions of the papers in the scheme's test file.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.attention.backends import Request
from tests.encodings.bias.scores import on_grid
from tests.schemes import FACTS, of_family, qk, reads

ALL_BIAS = of_family("bias")
B, H, N, D = 2, 4, 6, 4


def _positions(name: str, fractional: bool = False) -> torch.Tensor:
    if posenc.entry(name).cls.axes == 2:  # (n, 2) grid coordinates
        return torch.stack([torch.arange(N) // 3, torch.arange(N) % 3], dim=-1)
    return torch.arange(N) * 0.75 + 0.5 if fractional else torch.arange(N)


def _scheme(name: str) -> Any:
    torch.manual_seed(0)
    return posenc.build_for_model(name, H * D, H).double()


@pytest.mark.parametrize("name", ALL_BIAS)
def test_the_declaration_is_the_scheme_s_fact(name: str) -> None:
    cls = posenc.entry(name).cls
    assert cls.has_score_mod is FACTS[name].score_mod, name
    # declared by the scheme (or a family class of posenc's), not inherited from the protocol
    below = cls.__mro__[: cls.__mro__.index(posenc.BiasEncoding)]
    assert any("has_score_mod" in vars(c) for c in below), name


@pytest.mark.parametrize("name", ALL_BIAS)
def test_score_mod_exists_exactly_where_declared_and_equals_the_bias(name: str) -> None:
    pe = _scheme(name)
    q, k = qk(B, H, N, D)
    positions = _positions(name)
    kwargs = reads(pe, q, k)  # one x for both, where the scheme reads the layer's input
    mod = pe.score_mod(positions, positions, **kwargs)
    assert pe.fused_at(positions, positions) is pe.has_score_mod
    assert (mod is not None) is pe.has_score_mod, name
    if mod is not None:
        want = pe.bias(positions, positions, **kwargs).expand(B, H, N, N)
        assert_close(on_grid(mod, B, H, N), want, rtol=1e-12, atol=1e-12)
    empty = positions[:0]
    assert not pe.fused_at(empty, positions) and not pe.fused_at(positions, empty)


@pytest.mark.parametrize(
    "name", [n for n in ALL_BIAS if posenc.entry(n).cls.axes == 1 and FACTS[n].score_mod]
)
def test_at_fractional_positions_only_a_table_by_distance_has_none(name: str) -> None:
    pe = _scheme(name)
    positions = _positions(name, fractional=True)
    q, k = qk(B, H, N, D)
    if FACTS[name].integer_positions:  # refused by bias and score_mod alike
        assert pe.fused_at(positions, positions)
        with pytest.raises(posenc.PosencValueError, match="whole numbers"):
            pe.score_mod(positions, positions, **reads(pe, q, k))
        return
    fused = pe.fused_at(positions, positions)
    assert fused is (name not in ("kerple", "dpb", "sandwich"))  # a table by distance
    assert (pe.score_mod(positions, positions, **reads(pe, q, k)) is not None) is fused
    # whole numbers in a float tensor index the table
    assert pe.fused_at(positions.floor(), positions.floor())


@pytest.mark.parametrize("name", ALL_BIAS)
def test_attention_reads_the_declaration_not_the_method(name: str) -> None:
    """The kind of bias attention's backend choice reads, for every scheme, follows
    ``has_score_mod``; a scheme that declared none would be materialised even with a
    ``score_mod`` (the declaration, not the method, decides)."""
    pe = _scheme(name).float()
    x = torch.zeros(1, N, H * D)
    state = pe.position_state(_positions(name) if pe.axes == 2 else None, x)
    fused = "score_mod" if FACTS[name].score_mod else "materialised"
    want = "value" if pe.has_value_term else fused
    assert Request.kind_of(state) == want
    if pe.has_score_mod:
        undeclared = type("Undeclared", (type(pe),), {"has_score_mod": False})
        pe.__class__ = undeclared
        state = pe.position_state(_positions(name) if pe.axes == 2 else None, x)
        assert Request.kind_of(state) == ("value" if pe.has_value_term else "materialised")


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5s_fixed_table_covers_distances_past_max_distance(bidirectional: bool) -> None:
    """T5's fused form holds ``2 max_distance + 1`` distances, clamped, and reads no position:
    at distances up to twice ``max_distance`` (and batched, shifted rows) it equals the bias."""
    torch.manual_seed(0)
    pe = posenc.T5RelativeBias(H, num_buckets=8, max_distance=8, bidirectional=bidirectional)
    pe = pe.double()
    n = 20
    positions = torch.stack([torch.arange(n), torch.arange(n) + 37])  # (2, n)
    mod = pe.score_mod(positions, positions)
    got = on_grid(mod, 2, H, n)
    assert_close(got, pe.bias(positions, positions), rtol=0, atol=0)
