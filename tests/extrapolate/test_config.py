"""posenc.extrapolate.config: ``ExtrapolateConfig`` and ``EvalSettings``. Every check names the
field and the value; the default evaluation lengths are L, 2L, 4L, 8L and 16L; the shipped
preset is valid; the memory estimate counts the model's weight matrices and grows with the
logits as the vocabulary does."""

from __future__ import annotations

import dataclasses

import pytest

from posenc.errors import PosencTypeError, PosencValueError
from posenc.extrapolate.config import (
    MAX_LENGTH,
    PRESETS,
    EvalSettings,
    ExtrapolateConfig,
    step_bytes,
)
from posenc.extrapolate.train import build_model


def test_round_trip_and_the_preset_are_valid() -> None:
    config = ExtrapolateConfig(pe="t5", pe_options={"max_distance": 64}, steps=10)
    assert ExtrapolateConfig.from_dict(config.to_dict()) == config
    assert config.validate() is None
    assert ExtrapolateConfig(pe="learned", pe_options={"max_len": 128}).validate() == 128
    for preset in PRESETS.values():
        for pe in preset["pe"]:
            options = preset["pe_options"].get(pe, {})
            ExtrapolateConfig(pe=pe, pe_options=options, train_len=preset["train_len"]).validate()
        settings = EvalSettings(eval_lens=preset["eval_lens"], scalings=preset["scalings"])
        settings.validate(preset["train_len"])
    with pytest.raises(PosencValueError, match="unknown training option"):
        ExtrapolateConfig.from_dict({"task": "copy-v1"})  # a lengthgen field


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"train_len": 0}, "train_len must be >= 1, got 0"),
        ({"train_len": MAX_LENGTH + 1}, f"train_len must be <= {MAX_LENGTH}"),
        ({"pe": "learned", "pe_options": {"max_len": 32}}, "max_len=32 positions, shorter than"),
        ({"checkpoint_every": -1}, "checkpoint_every must be >= 0"),
        ({"batch_size": 4096, "dim": 4096, "train_len": 4096}, "batch_size x train_len"),
    ],
)
def test_config_validate_names_the_field(change: dict, message: str) -> None:
    with pytest.raises(PosencValueError, match=message):
        dataclasses.replace(ExtrapolateConfig(), **change).validate()


def test_eval_lengths_default_to_l_times_powers_of_two() -> None:
    assert EvalSettings().lengths(64) == [64, 128, 256, 512, 1024]
    assert EvalSettings(eval_lens=[256, 64]).lengths(64) == [64, 256]
    assert EvalSettings().finetune_length(64) == 1024
    assert EvalSettings(finetune_len=300).finetune_length(64) == 300


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"eval_lens": [64, 64]}, "repeat a length"),
        ({"eval_lens": [64, 0]}, "eval_lens must be ints >= 1"),
        ({"eval_lens": [MAX_LENGTH * 2]}, f"eval_lens must be <= {MAX_LENGTH}"),
        ({"scalings": ["yarn", "ntk"]}, "scalings must be distinct names among"),
        ({"scalings": ["yarn", "yarn"]}, "scalings must be distinct names among"),
        ({"finetune_scalings": ["dynamic"]}, "finetune_scalings must be distinct names among"),
        ({"eval_tokens": 0}, "eval_tokens must be >= 1"),
        ({"sliding": 48}, "sliding .the stride, 48. must divide every eval length"),
        ({"finetune_len": 64}, "finetune_len .64. must be longer than train_len .64."),
        ({"finetune_lr": 0.0}, "finetune_lr must be > 0"),
    ],
)
def test_eval_settings_validate_names_the_field(change: dict, message: str) -> None:
    with pytest.raises(PosencValueError, match=message):
        EvalSettings(**change).validate(64)


def test_eval_settings_types_are_checked() -> None:
    with pytest.raises(PosencTypeError, match="eval_lens must be a list"):
        EvalSettings(eval_lens=(64,)).validate(64)  # type: ignore[arg-type]
    with pytest.raises(PosencTypeError, match="sliding must be int"):
        EvalSettings(sliding=1.5).validate(64)  # type: ignore[arg-type]


def test_step_bytes_counts_the_weight_matrices_and_the_logits() -> None:
    config = ExtrapolateConfig(pe="rope", dim=16, depth=2, heads=2, ffn_dim=40)
    model = build_model(config, 256)
    matrices = sum(
        p.numel() for name, p in model.named_parameters() if ".layers." in name and p.dim() == 2
    )
    assert step_bytes(config, 0, 64) == 4 * 4 * matrices  # weights, grads, two AdamW moments
    # Each token of each row keeps its logits twice (values and gradients), 4 bytes each.
    more_vocab = step_bytes(config, 3, 10, vocab=1000) - step_bytes(config, 3, 10, vocab=256)
    assert more_vocab == 4 * 3 * 10 * 2 * (1000 - 256)
    rows = [step_bytes(config, r, 32) for r in range(4)]
    assert rows[1] - rows[0] == rows[2] - rows[1] == rows[3] - rows[2] > 0  # linear in rows
