"""The sizes of ``posenc bench`` (``posenc.bench.suites.settings``): ``settings_for`` picks
QUICK or DEFAULT and replaces only the fields given, every QUICK size is at most its DEFAULT,
and the shared sentences state the numbers they are given."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest

from posenc.bench.suites.settings import (
    DEFAULT,
    QUICK,
    Settings,
    missing_peer,
    settings_for,
    timing_line,
)


def test_settings_for_replaces_only_the_fields_given() -> None:
    assert settings_for(True) == QUICK and settings_for(False) == DEFAULT
    s = settings_for(True, repeats=7, threads=None, bias_sizes=(8,))
    assert s.repeats == 7 and s.bias_sizes == (8,) and s.threads == QUICK.threads
    changed = {f.name for f in fields(Settings) if getattr(s, f.name) != getattr(QUICK, f.name)}
    assert changed == {"repeats", "bias_sizes"}
    with pytest.raises(TypeError):
        settings_for(False, no_such_field=1)


def test_every_quick_size_is_at_most_the_default() -> None:
    for f in fields(Settings):
        quick, default = getattr(QUICK, f.name), getattr(DEFAULT, f.name)
        if isinstance(default, bool) or f.name == "threads":
            continue
        if f.name in ("rope", "rope_cuda"):  # the shapes of q: compare their element counts
            assert max(math.prod(shape) for shape in quick) <= min(
                math.prod(shape) for shape in default
            )
        elif f.name in ("bias_sizes", "scaling_sizes"):  # sequence lengths
            assert max(quick) <= min(default), f.name
        elif isinstance(default, tuple):
            assert all(q <= d for q, d in zip(quick, default, strict=True)), f.name
        else:
            assert quick <= default, f.name


def test_shared_sentences_state_their_numbers() -> None:
    line = timing_line(settings_for(True, repeats=13, warmup=4))
    assert "Medians over 13 timed calls" in line and "after 4 untimed" in line
    assert missing_peer("x-transformers", "x-transformers RoPE") == (
        "x-transformers RoPE: skipped, `x-transformers` is not installed "
        "(`pip install posenc[bench]`)"
    )
