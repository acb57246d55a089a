"""``RotaryEmbedding(clockwise=True)``: each pair turned by ``-angle``, as NanoChat does, on
every path that forms cos and sin (the decode lane's table rows, gathered rows, float
positions, float64 work, far positions, learned frequencies, dynamic NTK), checked against a
float64 transcription of the formula with the angle negated (the transformers comparison is
``tests/hf/test_config.py``'s NanoChat family)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from posenc import RotaryEmbedding, XPos
from posenc.encodings.rotary.rope import InterleavedRotaryEmbedding
from posenc.errors import PosencTypeError

# --------------------------------------------------------------------------- reference


def turned(x: Tensor, angles: Tensor, *, interleaved: bool, factor: float = 1.0) -> Tensor:
    """Each rotated pair ``(a, b)`` of ``x`` ``(b, h, n, d)`` becomes
    ``factor * (a cos t - b sin t, a sin t + b cos t)`` with ``t`` from ``angles``
    ``(n, r/2)`` or ``(b, n, r/2)``; the channels past ``r`` pass through. Float64."""
    x = x.double()
    if angles.dim() == 3:
        angles = angles[:, None]  # (b, 1, n, r/2): the same angle for every head
    half = angles.shape[-1]
    cos, sin = angles.cos() * factor, angles.sin() * factor
    first = slice(0, 2 * half, 2) if interleaved else slice(0, half)
    second = slice(1, 2 * half, 2) if interleaved else slice(half, 2 * half)
    a, b = x[..., first], x[..., second]
    out = x.clone()
    out[..., first], out[..., second] = a * cos - b * sin, a * sin + b * cos
    return out


def clockwise_reference(rope: RotaryEmbedding, x: Tensor, positions: Tensor) -> Tensor:
    """``x`` turned by ``-positions * θ_i`` with the module's own frequencies and attention
    factor (read after the call, for dynamic NTK)."""
    freq = rope.freq if rope.learned_freq else rope.inv_freq
    angles = -(positions.double()[..., None] * freq.detach().double())
    return turned(x, angles, interleaved=rope.interleaved, factor=rope.attention_factor)


def _qk(n: int, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(n)
    q = torch.randn(2, 3, n, 12, generator=gen).to(dtype)
    k = torch.randn(2, 1, n, 12, generator=gen).to(dtype)
    return q, k


# --------------------------------------------------------------------------- the formula

POSITIONS = {
    "decode-lane-one-position": torch.tensor([37]),  # one row of the cached table, as a view
    "run-at-an-offset": torch.arange(100, 108),
    "per-batch-rows": torch.tensor([[3, 0, 41, 7, 7], [9, 200, 1, 5, 2]]),  # gathered rows
    "float": torch.tensor([0.5, 3.25, 100.75]),  # angles formed in float64, no table
    "far": torch.tensor([10**9]),  # past any table: angles of that position only
}


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("name", sorted(POSITIONS))
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_clockwise_turns_each_pair_by_minus_the_angle(
    interleaved: bool, name: str, inplace: bool
) -> None:
    positions = POSITIONS[name]
    rope = RotaryEmbedding(12, rotary_dim=8, base=500.0, interleaved=interleaved, clockwise=True)
    q, k = _qk(positions.shape[-1])
    want_q, want_k = (clockwise_reference(rope, x, positions) for x in (q, k))
    got_q, got_k = rope(q.clone(), k.clone(), positions, inplace=inplace)
    # float32 cos/sin of float64 angles, float32 arithmetic: a few ulp of |x| ~ 3
    assert_close(got_q.double(), want_q, rtol=0, atol=2e-6)
    assert_close(got_k.double(), want_k, rtol=0, atol=2e-6)
    assert_close(rope.rotate(k, positions).double(), want_k, rtol=0, atol=2e-6)


MODULES: dict[str, dict[str, Any]] = {
    "float64-work": {},  # float64 q, k: the angles are computed, never read from a table
    "learned-frequencies": {"learned_freq": True},
    "yarn-attention-factor": {
        "scaling": {"rope_type": "yarn", "factor": 4.0},
        "max_position_embeddings": 32,
    },
    "dynamic-ntk-grown": {
        "scaling": {"rope_type": "dynamic", "factor": 2.0},
        "max_position_embeddings": 16,
    },
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_clockwise_reaches_every_way_of_forming_the_angles(name: str) -> None:
    rope = RotaryEmbedding(12, interleaved=True, clockwise=True, **MODULES[name])
    dtype = torch.float64 if name == "float64-work" else torch.float32
    q, k = _qk(40, dtype)  # 40 positions: past dynamic NTK's original 16, so its base grows
    positions = torch.arange(40)
    got_q, got_k = rope(q, k, positions)
    assert_close(got_q.double(), clockwise_reference(rope, q, positions), rtol=0, atol=5e-6)
    assert_close(got_k.double(), clockwise_reference(rope, k, positions), rtol=0, atol=5e-6)


# --------------------------------------------------------------------------- the two senses


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_clockwise_at_p_is_counter_clockwise_at_minus_p(interleaved: bool) -> None:
    """Positions are non-negative, so ``-p`` is shown two ways: turning clockwise and then
    counter-clockwise by the same position gives the input back; and the scores of q at ``m``
    and k at ``n`` equal the counter-clockwise ones at ``c - m`` and ``c - n`` (scores depend
    on the difference only, so ``c`` cancels)."""
    cw = RotaryEmbedding(12, interleaved=interleaved, clockwise=True)
    ccw = RotaryEmbedding(12, interleaved=interleaved)
    q, k = _qk(8, torch.float64)
    m, n, c = torch.arange(8) * 5, torch.arange(8) + 70, 200
    assert_close(ccw.rotate(cw.rotate(q, m), m), q, rtol=0, atol=1e-12)
    scores = cw.rotate(q, m) @ cw.rotate(k, n).transpose(-1, -2)
    negated = ccw.rotate(q, c - m) @ ccw.rotate(k, c - n).transpose(-1, -2)
    assert_close(scores, negated, rtol=0, atol=1e-11)


def test_clockwise_is_shown_kept_checked_and_passed_through() -> None:
    rope = RotaryEmbedding(8, clockwise=True)
    assert repr(rope) == "RotaryEmbedding(head_dim=8, rotary_dim=8, base=10000, clockwise=True)"
    assert rope.with_scaling({"rope_type": "linear", "factor": 2.0}).clockwise is True
    assert RotaryEmbedding(8).clockwise is False and "clockwise" not in repr(RotaryEmbedding(8))
    assert InterleavedRotaryEmbedding(8, clockwise=True).clockwise is True
    with pytest.raises(PosencTypeError, match="clockwise"):
        RotaryEmbedding(8, clockwise="yes")  # type: ignore[arg-type]
    xpos = XPos(8)  # passes its own arguments to RotaryEmbedding: counter-clockwise
    assert xpos.clockwise is False
    q, k = _qk(5)
    assert xpos(q[..., :8], k[..., :8])[0].shape == (2, 3, 5, 8)
