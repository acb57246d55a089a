"""MultimodalRotaryEmbedding (M-RoPE) against formulas of its own: text positions give plain
RoPE exactly, a float64 transcription of each layout, the other entry points (``rotate``,
``cos_sin``, ``position_state``) against ``forward``, and the errors. The comparison with each
family's transformers code is ``test_multimodal.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from posenc import MultimodalRotaryEmbedding, RotaryEmbedding, apply_rotary
from posenc.encodings.rotary.mrope_layouts import pair_rows
from posenc.errors import PosencTypeError, PosencValueError
from tests.misuse import MISSING, Misuse, cases, check

ATOL = RTOL = 2e-5


def _inputs(head_dim: int, rows: int, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """q (2, 4, 7, d), k (2, 2, 7, d) and positions (rows, 2, 7) below 128, rows distinct."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 7, head_dim, generator=gen)
    k = torch.randn(2, 2, 7, head_dim, generator=gen)
    positions = torch.randint(0, 128, (rows, 2, 7), generator=gen)
    for a in range(rows):
        for b in range(a):
            assert not torch.equal(positions[a], positions[b])
    return q, k, positions


# --------------------------------------------------------------------------- text and float64

LAYOUT_CASES = [
    ("blocked", [2, 3, 3], False, None),
    ("blocked", [4, 0, 2, 2], True, None),
    ("interleaved", [4, 2, 2], False, None),
    ("interleaved", [1, 2, 1], True, 12),  # partial rotary; row 0 takes what is left
    ("alternating", [2, 3, 3], True, None),
    ("alternating", [1, 1, 1, 1, 1, 1, 1, 1], False, None),
    ("blocked-channels", [1, 3, 2, 2], False, None),
    ("blocked-channels", [3, 1, 2], True, 12),
]
LAYOUT_IDS = [
    f"{layout}-{section}-{'il' if il else 'half'}" for layout, section, il, _ in LAYOUT_CASES
]


def _module(layout: str, section: list[int], interleaved: bool, rotary_dim: int | None):
    return MultimodalRotaryEmbedding(
        16,
        mrope_section=section,
        mrope_layout=layout,
        interleaved=interleaved,
        rotary_dim=rotary_dim,
    )


@pytest.mark.parametrize(
    ("layout", "section", "interleaved", "rotary_dim"), LAYOUT_CASES, ids=LAYOUT_IDS
)
def test_text_positions_rotate_exactly_as_plain_rope(
    layout: str, section: list[int], interleaved: bool, rotary_dim: int | None
) -> None:
    ours = _module(layout, section, interleaved, rotary_dim)
    plain = RotaryEmbedding(16, interleaved=interleaved, rotary_dim=rotary_dim)
    q, k, positions = _inputs(16, len(section))
    text = positions[0]  # (b, n)
    every_row = text.expand(len(section), -1, -1)  # (rows, b, n), equal rows
    for ours_positions, plain_positions in (
        (None, None),
        (text[0], text[0]),
        (text, text),
        (every_row, text),
        (every_row[:, :1], text[:1]),
        (every_row.double() + 0.5, text.double() + 0.5),
    ):
        want = plain(q, k, plain_positions)
        got = ours(q, k, ours_positions)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # a longer sequence (beyond a decode step's few positions) is gathered row by row
    q, k = q.repeat(1, 1, 6, 1), k.repeat(1, 1, 6, 1)  # n = 42
    text = torch.randint(0, 5000, (2, 42))
    want = plain(q, k, text)
    got = ours(q, k, text.expand(len(section), -1, -1))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def _rotate_every_two(x: Tensor) -> Tensor:
    return torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)


def channel_angles(layout: str, section: list[int], positions: Tensor, r: int, interleaved: bool):
    """float64 angles per rotated channel, ``(b, n, r)``, transcribed from the layouts'
    definitions (``hf/mrope_layouts.py``), slicing the per-row angles as transformers does."""
    half, rows = r // 2, len(section)
    theta = 1e4 ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)  # (r/2,)
    per_row = positions.double()[..., None] * theta  # (rows, b, n, r/2)
    if layout == "blocked-channels":  # blocks of 2 s_k over the duplicated channels
        doubled = torch.cat((per_row, per_row), -1)
        blocks = doubled.split([2 * s for s in section], -1)
        angles = torch.cat([block[k] for k, block in enumerate(blocks)], -1)  # (b, n, r)
        if interleaved:  # pair i's two channels are 2i and 2i+1
            angles = torch.stack((angles[..., :half], angles[..., half:]), -1).flatten(-2)
        return angles
    if layout == "blocked":
        pairs = torch.cat([block[k] for k, block in enumerate(per_row.split(section, -1))], -1)
    elif layout == "interleaved":
        pairs = per_row[0].clone()
        for k in range(1, rows):
            pairs[..., k : rows * section[k] : rows] = per_row[k][..., k : rows * section[k] : rows]
    else:  # alternating
        pairs = per_row[0].clone()
        cycled = (rows - 1) * section[1]
        for k in range(1, rows):
            pairs[..., k - 1 : cycled : rows - 1] = per_row[k][..., k - 1 : cycled : rows - 1]
    if interleaved:
        return pairs.repeat_interleave(2, -1)
    return torch.cat((pairs, pairs), -1)


@pytest.mark.parametrize(
    ("layout", "section", "interleaved", "rotary_dim"), LAYOUT_CASES, ids=LAYOUT_IDS
)
def test_rotation_equals_the_float64_formula(
    layout: str, section: list[int], interleaved: bool, rotary_dim: int | None
) -> None:
    ours = _module(layout, section, interleaved, rotary_dim)
    r = ours.rotary_dim
    q, k, positions = _inputs(16, len(section), seed=3)
    positions = positions * 37  # up to ~4700
    angles = channel_angles(layout, section, positions, r, interleaved)[:, None]  # (b, 1, n, r)
    turn = _rotate_every_two if interleaved else _rotate_half
    for x, got in zip((q, k), ours(q.double(), k.double(), positions), strict=True):
        x = x.double()
        rot = x[..., :r] * angles.cos() + turn(x[..., :r]) * angles.sin()
        want = torch.cat((rot, x[..., r:]), -1)
        assert_close(got, want, atol=1e-12, rtol=0)
    for x, got in zip((q, k), ours(q, k, positions), strict=True):  # float32 tables
        x = x.double()
        rot = x[..., :r] * angles.cos() + turn(x[..., :r]) * angles.sin()
        assert_close(got.double(), torch.cat((rot, x[..., r:]), -1), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("layout", "section", "interleaved", "rotary_dim"), LAYOUT_CASES, ids=LAYOUT_IDS
)
def test_rotate_position_state_and_cos_sin_agree_with_forward(
    layout: str, section: list[int], interleaved: bool, rotary_dim: int | None
) -> None:
    ours = _module(layout, section, interleaved, rotary_dim)
    q, k, positions = _inputs(16, len(section), seed=4)
    want_q, want_k = ours(q, k, positions)
    assert torch.equal(ours.rotate(q, positions), want_q)
    assert torch.equal(ours.rotate(k.clone(), positions, inplace=True), want_k)
    state = ours.position_state(positions, torch.zeros(2, 7, 8))
    got_q, got_k = state(q, k)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    q_copy, k_copy = q.clone(), k.clone()
    got_q, got_k = state(q_copy, k_copy, inplace=True)
    assert got_q is q_copy and torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    if layout == "blocked-channels":
        with pytest.raises(PosencValueError, match="blocked-channels"):
            ours.cos_sin(positions, 7, dtype=torch.float32)
        return
    cos, sin = ours.cos_sin(positions, 7, dtype=torch.float32)
    assert cos.shape == (2, 1, 7, ours.rotary_dim // 2)
    assert torch.equal(apply_rotary(q, cos, sin, interleaved=interleaved), want_q)


def test_pair_rows_of_each_layout() -> None:
    assert pair_rows("blocked", (2, 1, 3), 6) == ([0, 0, 1, 2, 2, 2],) * 2
    assert pair_rows("interleaved", (4, 2, 2), 8) == ([0, 1, 2, 0, 1, 2, 0, 0],) * 2
    assert pair_rows("alternating", (2, 3, 3), 8) == ([1, 2, 1, 2, 1, 2, 0, 0],) * 2
    assert pair_rows("blocked-channels", (1, 2, 1), 4) == ([0, 0, 1, 1], [1, 1, 2, 2])


def test_autograd_flows_through_the_rotation() -> None:
    ours = MultimodalRotaryEmbedding(16, mrope_section=[3, 3, 2], mrope_layout="interleaved")
    q, k, positions = _inputs(16, 3)
    q.requires_grad_(True)
    got_q, _ = ours(q, k, positions)
    got_q.square().sum().backward()
    assert_close(q.grad, 2 * q.detach(), atol=1e-5, rtol=1e-5)  # a rotation keeps the norm
    # blocked-channels turns q twice and keeps half of each: gradients of both turns
    split = MultimodalRotaryEmbedding(
        16, mrope_section=[2, 2, 2, 2], mrope_layout="blocked-channels"
    )
    x = torch.randn(1, 2, 3, 16, dtype=torch.float64, requires_grad=True)
    rows = torch.tensor([[0, 5, 9], [1, 7, 2], [3, 3, 8], [6, 0, 4]])[:, None]
    assert torch.autograd.gradcheck(lambda x: split(x, x.detach(), rows)[0], (x,))


# --------------------------------------------------------------------------- errors


def _m(**kwargs: Any) -> MultimodalRotaryEmbedding:
    return MultimodalRotaryEmbedding(16, **{"mrope_section": [2, 3, 3], **kwargs})


def _call(positions: Tensor, **kwargs: Any) -> Callable[[], object]:
    q, k, _ = _inputs(16, 3)
    return lambda: _m(**kwargs)(q, k, positions)


# fmt: off
MISUSE = [
    Misuse("no-section", lambda: MultimodalRotaryEmbedding(16), PosencValueError,
           "mrope_section", MISSING),
    Misuse("section-sum", lambda: _m(mrope_section=[2, 2, 2]), PosencValueError,
           "mrope_section", [2, 2, 2]),
    Misuse("section-negative", lambda: _m(mrope_section=[10, -1, -1]), PosencValueError,
           "mrope_section", [10, -1, -1]),
    Misuse("section-float", lambda: _m(mrope_section=[2.0, 3, 3]), PosencTypeError,
           "mrope_section", [2.0, 3, 3]),
    Misuse("section-str", lambda: _m(mrope_section="233"), PosencTypeError, "mrope_section",
           "str"),
    Misuse("section-empty", lambda: _m(mrope_section=[]), PosencValueError, "mrope_section", []),
    Misuse("layout-name", lambda: _m(mrope_layout="mrope-i"), PosencValueError, "mrope_layout",
           "mrope-i"),
    Misuse("layout-type", lambda: _m(mrope_layout=3), PosencTypeError, "mrope_layout", "int"),
    Misuse("interleaved-past-the-pairs", lambda: _m(mrope_section=[0, 4, 4],
                                                    mrope_layout="interleaved"),
           PosencValueError, "mrope_section", [0, 4, 4]),
    Misuse("alternating-unequal", lambda: _m(mrope_section=[2, 4, 2], mrope_layout="alternating"),
           PosencValueError, "mrope_section", [2, 4, 2]),
    Misuse("rows", _call(torch.zeros(2, 2, 7, dtype=torch.long)), PosencValueError, "positions",
           (2, 2, 7)),
    Misuse("rows-batch", _call(torch.zeros(3, 3, 7, dtype=torch.long)), PosencValueError,
           "positions", (3, 3, 7)),
    Misuse("rows-seq", _call(torch.zeros(3, 2, 6, dtype=torch.long)), PosencValueError,
           "positions", (3, 2, 6)),
    Misuse("rows-negative", _call(torch.full((3, 2, 7), -1)), PosencValueError, "positions", -1),
    Misuse("rows-bool", _call(torch.zeros(3, 2, 7, dtype=torch.bool)), PosencTypeError,
           "positions", "torch.bool"),
    Misuse("rows-nan", _call(torch.full((3, 2, 7), float("nan"))), PosencValueError, "positions",
           "nan"),
    # M-RoPE positions without their batch axis (3, n), for a batch of 2: named as such
    Misuse("rows-without-batch", _call(torch.zeros(3, 7, dtype=torch.long)), PosencValueError,
           "(rows, batch, seq)", (3, 7)),
]
# fmt: on


@pytest.mark.parametrize("case", cases(MISUSE))
def test_bad_arguments_are_refused_naming_them(case: Misuse) -> None:
    check(case)


def test_with_scaling_refuses_the_multimodal_module() -> None:
    with pytest.raises(PosencTypeError, match="MultimodalRotaryEmbedding"):
        _m().with_scaling({"rope_type": "linear", "factor": 2.0})
