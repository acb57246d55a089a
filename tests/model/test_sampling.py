"""``posenc.SamplingConfig``: the record of ``generate``'s sampling options gives the tokens
the keyword form gives under one seed, refuses bad values by name when made, and cannot be
given together with the keywords it replaces."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import posenc
from posenc.errors import PosencTypeError, PosencValueError

VOCAB, DIM, HEADS = 24, 16, 2


def _model() -> posenc.TransformerModel:
    torch.manual_seed(0)
    return posenc.TransformerModel(VOCAB, DIM, 2, HEADS, pe="rope", causal=True).eval()


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"temperature": 1.3},
        {"temperature": 0.9, "top_k": 5},
        {"temperature": 1.1, "top_p": 0.8, "eos_token_id": 3},
    ],
)
def test_the_record_generates_what_the_keywords_generate(options: dict) -> None:
    model = _model()
    prompt = torch.randint(0, VOCAB, (3, 4), generator=torch.Generator().manual_seed(5))
    by_keywords = model.generate(prompt, 9, generator=torch.Generator().manual_seed(7), **options)
    by_record = model.generate(
        prompt,
        9,
        generator=torch.Generator().manual_seed(7),
        sampling=posenc.SamplingConfig(**options),
    )
    assert torch.equal(by_record, by_keywords)
    if options.get("temperature"):  # sampled: another seed draws other tokens
        other = model.generate(
            prompt,
            9,
            generator=torch.Generator().manual_seed(8),
            sampling=posenc.SamplingConfig(**options),
        )
        assert not torch.equal(other, by_record)


def test_the_record_is_frozen_with_generates_defaults() -> None:
    config = posenc.SamplingConfig()
    assert (config.temperature, config.top_k, config.top_p, config.eos_token_id) == (
        0.0,
        None,
        None,
        None,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.temperature = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"temperature": -0.5}, PosencValueError, r"temperature must be .* got -0.5"),
        ({"temperature": float("nan")}, PosencValueError, r"temperature must be .* got nan"),
        ({"temperature": "hot"}, PosencTypeError, r"temperature must be a number, got 'hot'"),
        ({"temperature": True}, PosencTypeError, r"temperature must be a number, got True"),
        ({"top_k": 0}, PosencValueError, r"top_k must be >= 1, got 0"),
        ({"top_k": 2.0}, PosencTypeError, r"top_k must be an int or None, got 2.0"),
        ({"top_p": 0.0}, PosencValueError, r"top_p must be in \(0, 1\], got 0.0"),
        ({"top_p": 1.5}, PosencValueError, r"top_p must be in \(0, 1\], got 1.5"),
        ({"top_p": "x"}, PosencTypeError, r"top_p must be a number or None, got 'x'"),
        ({"eos_token_id": -1}, PosencValueError, r"eos_token_id must be >= 0, got -1"),
        ({"eos_token_id": 1.0}, PosencTypeError, r"eos_token_id must be an int or None"),
    ],
)
def test_bad_values_are_refused_by_name_when_made(fields: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        posenc.SamplingConfig(**fields)


def test_a_record_and_its_keywords_together_are_refused() -> None:
    model = _model()
    prompt = torch.ones(1, 3, dtype=torch.long)
    config = posenc.SamplingConfig(temperature=1.0)
    with pytest.raises(PosencValueError, match=r"not both: .*top_k=4"):
        model.generate(prompt, 2, sampling=config, top_k=4)
    # a keyword at its default value counts as given, too
    with pytest.raises(PosencValueError, match=r"not both: .*temperature=0.0"):
        model.generate(prompt, 2, sampling=config, temperature=0.0)
    with pytest.raises(PosencTypeError, match=r"sampling must be a posenc.SamplingConfig"):
        model.generate(prompt, 2, sampling={"temperature": 1.0})  # type: ignore[arg-type]
    # the model's own range is checked by generate: eos past the vocabulary
    with pytest.raises(PosencValueError, match=r"eos_token_id must be in \[0, 24\), got 30"):
        model.generate(prompt, 2, sampling=posenc.SamplingConfig(eos_token_id=30))
