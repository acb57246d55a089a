"""Tests of ``src/posenc/encodings/rope_types/builtin.py``: the built-in rope types' functions
against their closed forms in float64 (the comparisons with transformers' ``modeling_rope_utils``
for every type are in test_registry.py beside this file, through the registry)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from posenc import PosencTypeError, PosencValueError
from posenc.encodings.rope_types import builtin as rope_types
from posenc.encodings.rope_types.registry import ROPE_TYPES


def _plain(dim: int, base: float) -> torch.Tensor:
    return torch.tensor([base ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)


def test_default_inv_freq_is_roformer_eq_15() -> None:
    assert_close(rope_types.default_inv_freq(8, 10000.0), _plain(8, 10000.0), rtol=0, atol=0)


def test_linear_ntk_and_dynamic_against_their_closed_forms() -> None:
    dim, base, factor = 16, 10000.0, 4.0
    inv_freq, scale = rope_types.init_linear(dim, base, {"factor": factor})
    assert_close(inv_freq, _plain(dim, base) / factor) and scale == 1.0
    inv_freq, _ = rope_types.init_ntk(dim, base, {"factor": factor})
    assert_close(inv_freq, _plain(dim, base * factor ** (dim / (dim - 2))))
    params = {"factor": factor, "original_max_position_embeddings": 32}
    inv_freq, _ = rope_types.init_dynamic(dim, base, params, seq_len=64.0)
    stretch = factor * 64 / 32 - (factor - 1)
    assert_close(inv_freq, _plain(dim, base * stretch ** (dim / (dim - 2))))
    within, _ = rope_types.init_dynamic(dim, base, params, seq_len=16.0)
    assert_close(within, _plain(dim, base))  # inside the original context: plain RoPE


def test_ntk_alpha_is_a_fixed_base_stretch() -> None:
    """HunYuan's NTK-alpha: ``base * alpha^(d/(d-2))`` whatever the length (unlike dynamic)."""
    dim, base, alpha = 16, 10000.0, 1000.0
    for seq_len in (None, 16.0, 1e6):
        inv_freq, scale = rope_types.init_ntk_alpha(dim, base, {"alpha": alpha}, seq_len=seq_len)
        assert_close(inv_freq, _plain(dim, base * alpha ** (dim / (dim - 2))))
        assert scale == 1.0


def test_yarn_attention_factor_is_peng_et_al_eq_22() -> None:
    params = {"factor": 4.0, "original_max_position_embeddings": 64}
    _, scale = rope_types.init_yarn(16, 10000.0, params)
    assert scale == pytest.approx(0.1 * math.log(4.0) + 1.0)


def test_the_registry_holds_these_functions() -> None:
    for name in ("default", "linear", "ntk", "dynamic", "yarn", "longrope", "llama3", "ntk_alpha"):
        assert ROPE_TYPES[name].init is getattr(rope_types, f"init_{name}")


def test_check_number_names_the_key_and_value() -> None:
    with pytest.raises(PosencTypeError, match="'factor' must be a number, got 'x'"):
        rope_types.check_number("factor", "x")
    with pytest.raises(PosencValueError, match="'factor' must be a finite number > 0, got 0"):
        rope_types.check_number("factor", 0)
    rope_types.check_number("factor", None, allow_none=True)
