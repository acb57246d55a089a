"""Tests of ``src/posenc/encodings/rotary/spec.py``: the one place a RoPE module's settings
and a Hugging Face scaling dictionary are normalised."""

from __future__ import annotations

import copy
import pickle

import pytest

from posenc import PosencValueError, RotaryEmbedding
from posenc.encodings.rotary.spec import ReadOnlyMapping, RotarySpec


def test_build_folds_theta_and_partial_factor_into_base_and_rotary_dim() -> None:
    spec = RotarySpec.build(
        64,
        scaling={
            "type": "linear",
            "factor": 2.0,
            "rope_theta": 500.0,
            "partial_rotary_factor": 0.5,
        },
    )
    assert (spec.head_dim, spec.rotary_dim, spec.base) == (64, 32, 500.0)
    assert spec.scaling == {"rope_type": "linear", "factor": 2.0}  # ("type": the legacy key)
    assert spec.rope_type == "linear" and spec.record.name == "linear"
    with pytest.raises(TypeError):
        spec.scaling["factor"] = 3.0  # type: ignore[index]
    with pytest.raises(AttributeError):
        spec.base = 1.5  # type: ignore[misc]


def test_the_module_keeps_the_spec_it_was_built_from() -> None:
    scaling = {"rope_type": "yarn", "factor": 4.0}
    rope = RotaryEmbedding(16, scaling=scaling, max_position_embeddings=64, clockwise=True)
    assert rope.spec == RotarySpec.build(
        16, scaling=scaling, max_position_embeddings=64, clockwise=True
    )
    assert rope.scaling is rope.spec.scaling
    assert rope.scaling["original_max_position_embeddings"] == 64  # filled from the context
    assert RotaryEmbedding(**rope.spec.arguments()).spec == rope.spec


def test_with_scaling_fills_the_original_context_only_where_the_type_needs_it() -> None:
    spec = RotarySpec.build(16, interleaved=True)
    yarn = spec.with_scaling({"rope_type": "yarn", "factor": 4.0}, original=32)
    assert yarn.scaling["original_max_position_embeddings"] == 32 and yarn.interleaved
    linear = spec.with_scaling({"type": "linear", "factor": 4.0}, original=32)
    assert dict(linear.scaling) == {"rope_type": "linear", "factor": 4.0}
    assert spec.with_scaling(None).rope_type == "default"
    with pytest.raises(PosencValueError, match="unknown rope_type"):
        spec.with_scaling({"rope_type": "nope"}, original=32)


@pytest.mark.parametrize(
    ("record", "steps"),
    [
        # dynamic NTK: grows past the original context, holds, resets once a call fits again
        ("dynamic", [(10, None), (20, 20.0), (18, 20.0), (30, 30.0), (17, 30.0), (15, None)]),
        # LongRoPE: only which side of the original context the call lies on
        ("longrope", [(10, None), (20, 17.0), (40, 17.0), (16, None)]),
    ],
)
def test_next_length_follows_hugging_faces_dynamic_update(record: str, steps: list) -> None:
    scaling = {"rope_type": "dynamic", "factor": 2.0}
    if record == "longrope":
        scaling = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}
    spec = RotarySpec.build(8, scaling=scaling, max_position_embeddings=16)
    current = None
    for seq_len, want in steps:
        current = spec.next_length(current, float(seq_len))
        assert current == want, (seq_len, current)


def test_read_only_scaling_pickles_and_copies() -> None:
    params = ReadOnlyMapping({"rope_type": "linear", "factor": 2.0})
    assert pickle.loads(pickle.dumps(params)) == params == {"rope_type": "linear", "factor": 2.0}
    assert copy.deepcopy(params) == params and repr(params) == repr(dict(params))
