"""posenc.lengthgen.config: ``TrainConfig``. A mapping with an unknown key or a value of the
wrong type is refused naming it; every range check names the field and the value; the
memory estimate counts the model's weight matrices; test lengths inside the trained range
warn. (The checks every training config
shares are tested in ``tests/runs/test_config.py``.)"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

import posenc
from posenc.errors import PosencTypeError, PosencValueError
from posenc.lengthgen.config import InDistributionWarning, TrainConfig
from posenc.runs.config import transformer_for


def test_from_dict_round_trips_and_refuses_unknown_keys_and_wrong_types() -> None:
    config = TrainConfig(task="reverse-string", pe="alibi", lr=3e-4, pe_options={"max_bias": 4})
    assert TrainConfig.from_dict(config.to_dict()) == config
    assert TrainConfig.from_dict({"lr": 1}).lr == 1  # an int where a float is expected
    assert TrainConfig.from_dict({"precision": "bf16"}).precision == "bf16"
    with pytest.raises(PosencValueError, match=r"unknown training option\(s\) bogus, zeta; known"):
        TrainConfig.from_dict({"zeta": 1, "bogus": 2, "lr": 1e-3})
    with pytest.raises(PosencTypeError, match="dim must be int, got bool True"):
        TrainConfig.from_dict({"dim": True})
    with pytest.raises(PosencTypeError, match=r"lr must be float, got str '0\.1'"):
        TrainConfig.from_dict({"lr": "0.1"})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dim": 0}, "dim must be >= 1, got 0"),
        ({"eval_every": -1}, "eval_every must be >= 0, got -1"),
        ({"seed": 2**32}, "seed must be < 2\\*\\*32"),
        ({"dim": 30, "heads": 4}, "heads \\(4\\) must divide dim \\(30\\)"),
        ({"dropout": 1.0}, "dropout must be in \\[0, 1\\), got 1.0"),
        ({"lr": float("inf")}, "lr must be a finite number > 0, got inf"),
        ({"grad_clip": float("nan")}, "grad_clip must be a finite number >= 0, got nan"),
        ({"warmup": 1.0}, "warmup is a fraction"),
        ({"decay": "step"}, "decay must be one of .*got 'step'"),
        ({"precision": "fp16"}, "precision must be one of fp32, bf16, got 'fp16'"),
        ({"valid_threshold": 0.0}, "valid_threshold must be in \\(0, 1\\]"),
        ({"train_min_length": 30}, "train_max_length \\(20\\) < train_min_length \\(30\\)"),
        ({"test_max_length": 5000}, "test_max_length must be <= 4096"),
        ({"pe": "learned", "pe_options": {"max_len": 16}}, "max_len=16 positions, the runs need"),
        ({"random_positions": True, "random_max": 40}, "random_max=40.*use random_max >= "),
    ],
)
def test_validate_names_the_field_and_the_value(change: dict, message: str) -> None:
    with pytest.raises(PosencValueError, match=message):
        dataclasses.replace(TrainConfig(), **change).validate()


def test_validate_returns_the_task_and_labels_name_the_additions() -> None:
    assert TrainConfig(task="copy-v1").validate().name == "copy-v1"
    labels = [
        TrainConfig(pe="rope", random_positions=r, coupled_positions=c).label
        for r in (False, True)
        for c in (False, True)
    ]
    assert labels == ["rope", "rope+coupled", "rope+random", "rope+random+coupled"]


def test_the_model_and_the_memory_estimate_follow_the_config() -> None:
    config = TrainConfig(pe="alibi", dim=16, depth=3, heads=2, ffn_dim=24)
    model = transformer_for(config, 11, causal=True)
    assert isinstance(model, posenc.TransformerModel)
    assert len(model.encoder.layers) == 3 and model.encoder.layers[0].attn.num_heads == 2
    assert isinstance(model.encoder.pe, posenc.ALiBi) and model.encoder.causal
    matrices = sum(
        p.numel() for name, p in model.named_parameters() if ".layers." in name and p.dim() == 2
    )
    # At length 0 only the weights, their gradients and AdamW's two moments are left.
    assert config.step_bytes(0) == 4 * 4 * matrices
    batch = max(config.batch_size, config.eval_samples, config.test_samples)
    grown = config.step_bytes(64) - config.step_bytes(32)
    assert grown > 4 * batch * 32 * 3 * (12 * 16 + 3 * 24)  # activations grow with length
    with pytest.raises(PosencTypeError, match="pe 'alibi' with options"):
        transformer_for(dataclasses.replace(config, pe_options={"bogus": 1}), 11, causal=True)


def test_test_lengths_inside_the_trained_range_warn() -> None:
    """Test lengths overlapping the trained range are allowed, with an InDistributionWarning
    naming the in-distribution lengths; disjoint ranges (the default) validate silently."""
    with pytest.warns(InDistributionWarning, match=r"test lengths 5-10 overlap .* 1-20: lengths"):
        TrainConfig(test_min_length=5, test_max_length=10).validate()
    with pytest.warns(InDistributionWarning, match=r"length 20 is in distribution"):
        TrainConfig(test_min_length=20, test_max_length=30).validate()
    with pytest.warns(InDistributionWarning, match=r"lengths 3-4 are in distribution"):
        TrainConfig(train_min_length=3, test_min_length=1, test_max_length=4).validate()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TrainConfig().validate()  # 1-20, tested on 21-40
        TrainConfig(train_min_length=5, test_min_length=1, test_max_length=4).validate()
