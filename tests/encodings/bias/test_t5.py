"""The T5 bucketed relative bias (Raffel et al. 2020) against Hugging Face T5's buckets and
bias."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close
from transformers import T5Config
from transformers.models.t5.modeling_t5 import T5Attention

from posenc.encodings.bias.t5 import T5RelativeBias, t5_relative_position_bucket
from tests.misuse import Misuse, cases, check

SETTINGS = [
    (True, 32, 128),
    (True, 16, 64),
    (True, 4, 8),
    (True, 64, 1000),
    (True, 10, 37),
    (False, 32, 128),
    (False, 33, 100),
    (False, 2, 2),
    (False, 8, 8),
    (False, 3, 50),
]


@pytest.mark.parametrize(("bidirectional", "num_buckets", "max_distance"), SETTINGS)
def test_t5_buckets_match_transformers(
    bidirectional: bool, num_buckets: int, max_distance: int
) -> None:
    rel = torch.arange(-3000, 3001)
    ours = t5_relative_position_bucket(
        rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    theirs = T5Attention._relative_position_bucket(
        rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    torch.testing.assert_close(ours, theirs.long(), rtol=0, atol=0)
    assert int(ours.min()) >= 0 and int(ours.max()) < num_buckets


def test_t5_two_buckets_bidirectional_split_by_direction() -> None:
    # one bucket per side (Hugging Face divides by zero here): before/at vs after the query
    rel = torch.arange(-5, 6)
    got = t5_relative_position_bucket(rel, bidirectional=True, num_buckets=2, max_distance=2)
    assert_close(got, (rel > 0).long())


@pytest.mark.parametrize(("bidirectional", "past"), [(True, 0), (False, 0), (False, 7), (True, 3)])
def test_t5_bias_matches_transformers(bidirectional: bool, past: int) -> None:
    config = T5Config(
        d_model=32,
        d_kv=8,
        num_heads=4,
        relative_attention_num_buckets=16,
        relative_attention_max_distance=40,
        is_decoder=not bidirectional,
    )
    hf = T5Attention(config, has_relative_attention_bias=True)
    pe = T5RelativeBias(4, num_buckets=16, max_distance=40, bidirectional=bidirectional)
    with torch.no_grad():
        hf.relative_attention_bias.weight.copy_(pe.relative_attention_bias.weight)
        want = hf.compute_bias(9, 9 + past, past_seen_tokens=past)[0]  # (h, q, k)
    got = pe.bias(torch.arange(9) + past, torch.arange(9 + past))
    assert_close(got, want, rtol=0, atol=0)


# --------------------------------------------------------------------------- bad input

MISUSE = [
    Misuse("heads-zero", lambda: T5RelativeBias(0), ValueError, "num_heads", 0),
    Misuse("buckets-one", lambda: T5RelativeBias(2, num_buckets=1), ValueError, "num_buckets", 1),
    Misuse("buckets-odd", lambda: T5RelativeBias(2, num_buckets=7), ValueError, "num_buckets", 7),
    Misuse("max-distance", lambda: T5RelativeBias(2, num_buckets=32, max_distance=16),
           ValueError, "max_distance", 16),
    Misuse("bidirectional-str", lambda: T5RelativeBias(2, bidirectional="yes"), TypeError,
           "bidirectional", "str"),
    Misuse("bucket-float",
           lambda: T5RelativeBias(2).relative_position_bucket(torch.tensor([0.5])), TypeError,
           "relative_position", torch.float32),
    Misuse("bucket-list", lambda: T5RelativeBias(2).relative_position_bucket([1, 2]),
           TypeError, "relative_position", "list"),
    Misuse("fractional-positions",
           lambda: T5RelativeBias(2).bias(torch.tensor([0.0, 0.5]), torch.arange(2)),
           ValueError, "q_positions", 0.5),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse_names_the_argument_and_the_value(case: Misuse) -> None:
    check(case)
