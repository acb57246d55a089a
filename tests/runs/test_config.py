"""``posenc.runs.config``: the checks every training config shares. A mapping with an
unknown key or a value of the wrong type is refused naming it; each range check (the
precision among them) names the field and the value; the encoding is built alone so that
bad options fail before any run; the model built for a config has its width, depth, heads
and encoding."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest

import posenc
from posenc.errors import PosencTypeError, PosencValueError
from posenc.runs.config import (
    check_encoding,
    check_fields,
    check_type,
    config_from_dict,
    transformer_for,
)


@dataclass
class Run:
    """The fields :func:`check_fields` reads, as an experiment's config has them."""

    pe: str = "alibi"
    pe_options: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    dim: int = 16
    depth: int = 3
    heads: int = 2
    ffn_dim: int = 24
    dropout: float = 0.0
    steps: int = 10
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup: float = 0.1
    decay: str = "cosine"
    grad_clip: float = 1.0
    precision: str = "fp32"


def test_from_dict_refuses_unknown_keys_and_wrong_types() -> None:
    assert config_from_dict(Run, {"lr": 1}).lr == 1  # an int where a float is expected
    assert config_from_dict(Run, {"precision": "bf16"}) == Run(precision="bf16")
    with pytest.raises(PosencValueError, match=r"unknown training option\(s\) bogus, zeta; known"):
        config_from_dict(Run, {"zeta": 1, "bogus": 2, "lr": 1e-3})
    with pytest.raises(PosencTypeError, match="dim must be int, got bool True"):
        config_from_dict(Run, {"dim": True})
    with pytest.raises(PosencTypeError, match=r"lr must be float, got str '0\.1'"):
        config_from_dict(Run, {"lr": "0.1"})
    with pytest.raises(PosencTypeError, match="precision must be str, got int 16"):
        config_from_dict(Run, {"precision": 16})
    with pytest.raises(PosencTypeError, match="pe_options must be a table of options"):
        check_type("pe_options", {1: 2}, dict)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dim": 0}, "dim must be >= 1, got 0"),
        ({"seed": -1}, "seed must be >= 0, got -1"),
        ({"seed": 2**32}, "seed must be < 2\\*\\*32"),
        ({"dim": 30, "heads": 4}, "heads \\(4\\) must divide dim \\(30\\)"),
        ({"dropout": 1.0}, "dropout must be in \\[0, 1\\), got 1.0"),
        ({"lr": float("inf")}, "lr must be a finite number > 0, got inf"),
        ({"grad_clip": float("nan")}, "grad_clip must be a finite number >= 0, got nan"),
        ({"warmup": 1.0}, "warmup is a fraction"),
        ({"decay": "step"}, "decay must be one of .*got 'step'"),
        ({"precision": "fp16"}, "precision must be one of fp32, bf16, got 'fp16'"),
    ],
)
def test_check_fields_names_the_field_and_the_value(change: dict, message: str) -> None:
    check_fields(Run(), ("dim", "depth", "heads", "steps"), ("seed",))
    with pytest.raises(PosencValueError, match=message):
        check_fields(dataclasses.replace(Run(), **change), ("dim",), ("seed",))


def test_check_encoding_builds_the_encoding_alone() -> None:
    assert check_encoding("learned", 16, 2, {"max_len": 50}) == 50
    assert check_encoding("rope", 16, 2, {}) is None
    with pytest.raises(PosencValueError, match="'rope2d' encodes 2-D coordinates; lengthgen"):
        check_encoding("rope2d", 16, 2, {}, "lengthgen")
    with pytest.raises(PosencTypeError, match="pe 'alibi' with options \\{'bogus': 1\\}"):
        check_encoding("alibi", 16, 2, {"bogus": 1})
    with pytest.raises(ValueError, match="nope"):
        check_encoding("nope", 16, 2, {})


def test_the_model_follows_the_config() -> None:
    model = transformer_for(Run(), 11, causal=True)
    assert isinstance(model, posenc.TransformerModel)
    assert len(model.encoder.layers) == 3 and model.encoder.layers[0].attn.num_heads == 2
    assert isinstance(model.encoder.pe, posenc.ALiBi) and model.encoder.causal
    assert model.head.out_features == 11
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    with pytest.raises(PosencTypeError, match="pe 'alibi' with options"):
        transformer_for(Run(pe_options={"bogus": 1}), 11, causal=True)
