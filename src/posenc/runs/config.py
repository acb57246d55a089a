"""The checks every training config of posenc shares, and the model a config describes.

A run's settings are a dataclass whose every field has a default (lengthgen's
``TrainConfig``, extrapolate's ``ExtrapolateConfig``). :func:`config_from_dict` builds one
from plain data, :func:`check_fields` checks the fields both kinds share, and
:func:`check_encoding` builds the encoding alone, so that a sweep never fails half-way on a
typo; :func:`transformer_for` is the ``posenc.TransformerModel`` the config describes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, TypeVar

from ..errors import PosencError, PosencTypeError, PosencValueError
from .device import PRECISIONS
from .schedules import TEMPERATURE, entry_options, is_schedule, model_kwargs
from .trainer import DECAYS

C = TypeVar("C")


def check_encoding(
    pe: str, dim: int, heads: int, options: dict[str, Any], harness: str = "training"
) -> int | None:
    """Build the encoding alone (cheap: no model) so that an unknown name, an encoding of
    N-D coordinates, bad ``pe_options`` or a size it cannot take fail before any run starts,
    naming the encoding and its options (``harness`` names the command in the message).
    Returns the number of rows of a learned table (positions past it have no embedding),
    else ``None``."""
    from ..encodings.absolute.learned import LearnedPositionalEncoding
    from ..encodings.registry import build_for_model, entry

    if is_schedule(pe):  # every distinct entry alone, with its name's options
        for name, kwargs in entry_options(pe, options).items():
            check_encoding(name, dim, heads, kwargs, harness)
        return None  # a schedule holds no additive (tabled) entry
    if pe == "none" and TEMPERATURE in options:
        raise PosencValueError(
            f"pe option none.{TEMPERATURE}={options[TEMPERATURE]!r}: Llama 4's query temperature "
            f"is no option, it is written in the schedule: 'none:{TEMPERATURE}' (e.g. "
            f"rope/rope/rope/none:{TEMPERATURE})"
        )
    axes = getattr(entry(pe).cls, "axes", 1)  # unknown names list the known ones
    if axes != 1:
        raise PosencValueError(
            f"pe {pe!r} encodes {axes}-D coordinates; {harness} needs an encoding of "
            "sequence positions"
        )

    try:
        module = build_for_model(pe, dim, heads, **options)
    except (TypeError, ValueError) as exc:
        if not isinstance(exc, PosencError) and not options:
            raise  # not the settings' fault: a bug, keep its traceback
        detail = f" with options {options}" if options else f" at dim={dim}, heads={heads}"
        kind = PosencTypeError if isinstance(exc, TypeError) else PosencValueError
        raise kind(f"pe {pe!r}{detail}: {exc}") from None
    return module.max_len if isinstance(module, LearnedPositionalEncoding) else None


def check_type(name: str, value: object, expected: type) -> None:
    """Refuse ``value`` unless it is an ``expected`` (an int where a float is expected is
    fine; a bool is no int; a dict must have string keys), naming ``name``."""
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return  # ints are fine where floats are expected
    if expected is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise PosencTypeError(f"{name} must be a table of options, got {value!r}")
        return
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise PosencTypeError(
            f"{name} must be {expected.__name__}, got {type(value).__name__} {value!r}"
        )


def config_from_dict(cls: type[C], values: dict[str, Any]) -> C:
    """Build the dataclass ``cls`` from a mapping, rejecting unknown keys and values of the
    wrong type (each compared with the type of the field's default)."""
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise PosencValueError(
            f"unknown training option(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
    defaults = cls()
    for name, value in values.items():
        check_type(name, value, type(getattr(defaults, name)))
    return cls(**values)


def check_fields(config: Any, positive: tuple[str, ...], non_negative: tuple[str, ...]) -> None:
    """The checks every training config shares, in order: each field's type against its
    default's, the ``positive`` fields >= 1, the ``non_negative`` ones >= 0, then the seed,
    ``dim % heads``, ``dropout``, ``lr``, ``weight_decay``, ``grad_clip``, ``warmup``,
    ``decay`` and ``precision``."""
    defaults = type(config)()
    for f in dataclasses.fields(config):
        check_type(f.name, getattr(config, f.name), type(getattr(defaults, f.name)))
    for name in positive:
        if getattr(config, name) < 1:
            raise PosencValueError(f"{name} must be >= 1, got {getattr(config, name)}")
    for name in non_negative:
        if getattr(config, name) < 0:
            raise PosencValueError(f"{name} must be >= 0, got {getattr(config, name)}")
    if config.seed >= 2**32:  # numpy's legacy seeding takes 32 bits
        raise PosencValueError(f"seed must be < 2**32, got {config.seed}")
    if config.dim % config.heads:
        raise PosencValueError(f"heads ({config.heads}) must divide dim ({config.dim})")
    if not 0.0 <= config.dropout < 1.0:
        raise PosencValueError(f"dropout must be in [0, 1), got {config.dropout}")
    if not (config.lr > 0 and math.isfinite(config.lr)):
        raise PosencValueError(f"lr must be a finite number > 0, got {config.lr}")
    for name in ("weight_decay", "grad_clip"):
        value = getattr(config, name)
        if not (value >= 0 and math.isfinite(value)):  # NaN fails both comparisons
            raise PosencValueError(f"{name} must be a finite number >= 0, got {value}")
    if not 0.0 <= config.warmup < 1.0:
        raise PosencValueError(f"warmup is a fraction of the steps in [0, 1), got {config.warmup}")
    if config.decay not in DECAYS:
        raise PosencValueError(f"decay must be one of {', '.join(DECAYS)}, got {config.decay!r}")
    if config.precision not in PRECISIONS:
        raise PosencValueError(
            f"precision must be one of {', '.join(PRECISIONS)}, got {config.precision!r}"
        )


def transformer_for(
    config: Any, vocab_size: int, *, causal: bool, trained_length: int | None = None
) -> Any:
    """``posenc.TransformerModel`` of a run's width, depth, heads, encoding (a name or a
    per-layer schedule, :mod:`posenc.runs.schedules`) and its options (``config`` a
    lengthgen or extrapolate config), on the CPU; options the encoding refuses name it.
    ``trained_length`` is the floor of a tempered NoPE entry's query temperature."""
    from ..model.transformer import TransformerModel

    try:
        return TransformerModel(
            vocab_size,
            config.dim,
            config.depth,
            config.heads,
            causal=causal,
            ffn_dim=config.ffn_dim or None,
            dropout=config.dropout,
            **model_kwargs(
                config.pe,
                config.pe_options,
                dim=config.dim,
                heads=config.heads,
                depth=config.depth,
                causal=causal,
                trained_length=trained_length,
            ),
        )
    except TypeError as exc:
        if config.pe_options:
            raise PosencTypeError(
                f"pe {config.pe!r} with options {config.pe_options}: {exc}"
            ) from exc
        raise
