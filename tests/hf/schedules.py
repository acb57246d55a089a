"""Reading transformers configs into schedules for the differential tests
(``tests/hf/test_differential.py``, ``tests/hf/test_released_configs.py``): small sizes, the
config classes built quietly, and a schedule as one comparable value."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from posenc.hf.schedule import ModelSchedule, read_schedule

#: Small sizes (a class that refuses them, or whose small config posenc refuses while it reads
#: the defaults, is read with its defaults).
SMALL = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 64,
    "num_hidden_layers": 8,
}


def quiet_config(cls: type, **kwargs: Any) -> Any:
    """``cls(**kwargs)`` without transformers' logging (its classes log about the legacy
    fields they convert)."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls(**kwargs)
    finally:
        logging.set_verbosity(level)


def read(config: Any) -> ModelSchedule:
    """The schedule of ``config``, its rotary modules on the ``meta`` device (no tables)."""
    with torch.device("meta"):
        return read_schedule(config)


def sweep_read(config: Any) -> ModelSchedule:
    """:func:`read` without the warning posenc gives, once per model type, for a rotary
    family it has not checked (``KNOWN_MODEL_TYPES``; the schedule is what is compared here)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "config model_type .* is not one of the model types")
        return read(config)


def signature(schedule: ModelSchedule) -> tuple:
    """Everything a schedule says, comparable with ``==``."""

    def encoding(pe: Any) -> Any:
        if pe is None:
            return None
        return (
            type(pe).__name__,
            pe.head_dim,
            pe.rotary_dim,
            pe.base,
            pe.interleaved,
            getattr(pe, "clockwise", False),
            repr(sorted(dict(pe.scaling or {}).items())),
            tuple(getattr(pe, "mrope_section", None) or ()),
        )

    layers = tuple(
        (
            layer.kind,
            layer.window,
            layer.chunk,
            layer.query_scale,
            encoding(layer.pe),
            layer.sinks,
            layer.softcap,
            layer.softmax_scale,
        )
        for layer in schedule.layers
    )
    sizes = (schedule.hidden_size, schedule.num_heads, schedule.num_kv_heads, schedule.head_dim)
    return (schedule.model_type, schedule.causal, sizes, schedule.intermediate_size, layers)
