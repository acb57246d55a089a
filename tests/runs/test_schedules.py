"""Per-layer schedules as the training commands write them (``posenc.runs.schedules``): the
pattern repeated to the depth and cut there, options by entry name, Llama 4's NoPE-layer
temperature against its formula in float64, and every bad spec refused naming its entry."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import NoPE, RotaryEmbedding
from posenc.errors import PosencTypeError, PosencValueError
from posenc.runs.cli import options_for, parse_pe_list, pe_names
from posenc.runs.config import check_encoding
from posenc.runs.schedules import (
    LayerEntry,
    entry_options,
    layer_entries,
    model_kwargs,
    parse_schedule,
    query_temperature,
)

ROPE, NONE, TEMP = LayerEntry("rope"), LayerEntry("none"), LayerEntry("none", tempered=True)


def test_the_pattern_is_repeated_to_the_depth_and_cut_there() -> None:
    assert layer_entries("rope/rope/rope/none", 8) == [ROPE, ROPE, ROPE, NONE] * 2
    assert layer_entries("rope/rope/rope/none", 3) == [ROPE] * 3
    assert layer_entries("rope/rope/rope/none", 6) == [ROPE, ROPE, ROPE, NONE, ROPE, ROPE]
    assert layer_entries("rope/none:temp", 3) == [ROPE, TEMP, ROPE]
    assert layer_entries("rope", 2) == [ROPE, ROPE]


def test_the_model_of_a_schedule() -> None:
    kwargs = model_kwargs("rope/rope/rope/none:temp", {"rope": {"base": 500.0}}, dim=16,
                          heads=2, depth=8, causal=True, trained_length=64)  # fmt: skip
    pes, scales = kwargs["pe"], kwargs["query_scale"]
    assert [type(pe) for pe in pes] == [RotaryEmbedding] * 3 + [NoPE] + [RotaryEmbedding] * 3 + [
        NoPE
    ]
    assert len({id(pe) for pe in pes}) == 2  # equal names share one module
    assert pes[0].base == 500.0
    assert scales == [None] * 3 + [query_temperature(64)] + [None] * 3 + [query_temperature(64)]
    single = model_kwargs("rope", {"base": 5.0}, dim=16, heads=2, depth=2, causal=True,
                          trained_length=None)  # fmt: skip
    assert single == {"pe": "rope", "pe_kwargs": {"base": 5.0}}


def test_the_temperature_is_llama4s_with_its_floor_at_the_training_length() -> None:
    """``1 + 0.1 · log(1 + floor((p + 1) / L))`` in float64: 1 below L - 1, then steps; at
    Llama 4's own floor of 8192 it is exactly 1 at every position the scale preset scores
    (L = 256 to 16L = 4096), which is why the floor is scaled to L."""
    positions = torch.arange(4096)
    want = torch.tensor([1 + 0.1 * math.log1p(math.floor((p + 1) / 256)) for p in range(4096)],
                        dtype=torch.float64)  # fmt: skip
    got = query_temperature(256).factor(positions)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
    assert torch.all(got[:255] == 1) and got[255] > 1
    assert torch.all(query_temperature(8192).factor(positions) == 1)


def test_options_go_to_every_entry_of_their_name() -> None:
    options = {"rope": {"base": 100.0}, "alibi": {"max_bias": 4.0}}
    assert options_for("rope", options) == {"base": 100.0}
    assert options_for("rope/none", options) == {"rope": {"base": 100.0}}
    assert options_for("rope/alibi/none:temp", options) == options
    assert entry_options("rope/none", {}) == {"rope": {}, "none": {}}
    assert pe_names(parse_pe_list("alibi,rope/t5/none:temp+random")) == {"alibi", "rope", "t5",
                                                                         "none"}  # fmt: skip
    with pytest.raises(PosencValueError, match="'t5', which it does not use"):
        entry_options("rope/none", {"t5": {}})
    with pytest.raises(PosencTypeError, match=r"'rope'.*max_bias"):
        check_encoding("rope/none", 16, 2, {"rope": {"max_bias": 1}})


def test_the_pe_list_keeps_schedules_as_written_and_the_modifiers_after() -> None:
    assert parse_pe_list("rope,rope/rope/rope/none,rope/none:temp+random") == [
        ("rope", ""),
        ("rope/rope/rope/none", ""),
        ("rope/none:temp", "random"),
    ]


@pytest.mark.parametrize(
    ("spec", "fragments"),
    [
        ("rope//none", ["entry 2", "empty entry"]),
        ("rope/bogus", ["entry 2 ('bogus')", "unknown positional encoding"]),
        ("rope/none:tmp", ["entry 2 ('none:tmp')", "none:temp"]),
        ("rope:temp", ["'rope:temp'", "only a NoPE entry"]),
        ("rope/sinusoidal", ["entry 2 ('sinusoidal')", "additive"]),
        ("rope/rope2d", ["entry 2 ('rope2d')", "N-D"]),
        ("rope/none+bogus", ["'+bogus'"]),
    ],
)
def test_bad_specs_name_the_entry(spec: str, fragments: list[str]) -> None:
    with pytest.raises(PosencValueError) as info:
        parse_pe_list(spec)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    assert "\n" not in str(info.value)
    assert parse_schedule("rope/none:temp") == [ROPE, TEMP]
