"""posenc.encodings.state, what one forward's layers share: a ``RotaryState`` applies the
rotation it was given; a ``BiasState`` asks its encoding once per forward for a scheme that
reads no ``q``/``k`` (and again in every layer for one that does), keeps what is derived from
the bias by the identity of its key, and gives the encoding's bias (ALiBi's, against its
formula)."""

from __future__ import annotations

from typing import Any

import torch

import posenc
from posenc.encodings.state import BiasState, RotaryState


class CountingBias:
    """A bias encoding that counts its calls: the bias is ``k_pos - q_pos`` (plus ``q`` and
    ``k``'s sums when it reads them)."""

    has_value_term = False

    def __init__(self, needs_qk: bool) -> None:
        self.needs_qk = needs_qk
        self.calls: list[str] = []

    def bias(self, qpos: torch.Tensor, kpos: torch.Tensor, **qk: torch.Tensor) -> torch.Tensor:
        self.calls.append("bias")
        out = (kpos[None, :] - qpos[:, None]).float()[None]  # (1, n, n)
        return out + (qk["q"].sum() + qk["k"].sum() if qk else 0.0)

    def score_mod(self, qpos: torch.Tensor, kpos: torch.Tensor, **qk: Any) -> None:
        self.calls.append("score_mod")
        return None


def test_rotary_state_passes_the_inplace_request_on() -> None:
    seen: list[bool] = []

    def rotate(q: torch.Tensor, k: torch.Tensor, inplace: bool) -> tuple[torch.Tensor, ...]:
        seen.append(inplace)
        return 2 * q, -k

    state = RotaryState(rotate)
    q, k = torch.ones(1, 1, 2, 4), torch.ones(1, 1, 2, 4)
    got_q, got_k = state(q, k)
    assert torch.equal(got_q, 2 * q) and torch.equal(got_k, -k)
    state(q, k, inplace=True)
    assert seen == [False, True]


def test_a_qk_free_bias_is_made_once_per_forward() -> None:
    pe = CountingBias(needs_qk=False)
    positions = torch.tensor([0, 1, 3])
    state = BiasState(pe, positions)
    q = k = torch.randn(1, 2, 3, 4)
    layers = [state.bias(q, k) for _ in range(4)]  # four layers of one forward
    assert pe.calls == ["bias"] and all(bias is layers[0] for bias in layers)
    assert torch.equal(layers[0][0], (positions[None, :] - positions[:, None]).float())
    assert state.score_mod(q, k) is None and state.score_mod(q, k) is None
    assert pe.calls == ["bias", "score_mod"]
    assert not state.needs_qk and not state.has_value_term


def test_a_bias_that_reads_q_and_k_is_asked_in_every_layer() -> None:
    pe = CountingBias(needs_qk=True)
    state = BiasState(pe, torch.arange(3))
    q1, k1 = torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2)
    q2, k2 = torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2)
    first, second = state.bias(q1, k1), state.bias(q2, k2)
    assert pe.calls == ["bias", "bias"] and state.needs_qk
    assert torch.equal(second - first, torch.full_like(first, 12.0))  # 6 + 6 from q2, k2
    made = [state.keep(("mask",), lambda: torch.zeros(1)) for _ in range(2)]
    assert made[0] is not made[1]  # derived from a per-layer bias: made anew


def test_keep_matches_keys_by_identity() -> None:
    state = BiasState(CountingBias(needs_qk=False), torch.arange(3))
    mask_a, mask_b = torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool)
    made: list[int] = []

    def make() -> torch.Tensor:
        made.append(1)
        return torch.tensor(float(len(made)))

    one = state.keep((mask_a, True), make)
    assert state.keep((mask_a, True), make) is one
    other = state.keep((mask_b, True), make)  # an equal mask, but another tensor
    assert other is not one and state.keep((mask_a,), make) is not one
    assert len(made) == 3


def test_a_real_encoding_state_gives_its_bias() -> None:
    alibi = posenc.ALiBi(num_heads=4)
    x = torch.randn(2, 6, 16)
    positions = torch.tensor([0, 1, 2, 4, 5, 9])
    state = alibi.position_state(positions, x)
    assert isinstance(state, BiasState)
    q = k = torch.randn(2, 4, 6, 4)
    slopes = torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8])  # 2^(-8h/4), h = 1..4
    distance = (positions[None, :] - positions[:, None]).abs().float()  # (n, n)
    want = -slopes[:, None, None] * distance  # (h, n, n), written out from the paper
    torch.testing.assert_close(state.bias(q, k), want)
    assert state.bias(q, k) is state.bias(q, k)
