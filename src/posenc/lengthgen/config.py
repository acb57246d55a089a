"""What one lengthgen run is: :class:`TrainConfig`, and the checks every training config of
posenc shares (:func:`check_fields`, :func:`config_from_dict`, :func:`check_encoding`).

Every field is checked (type, range, the task, the encoding and its options, the memory a
step needs) before any work, so a sweep never fails half-way on a typo.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from ..errors import PosencError, PosencTypeError, PosencValueError, check_bytes
from .data import check_coupling, longest_model_length
from .evaluate import VALID_THRESHOLD
from .loop import DECAYS
from .tasks import Task, get_task

#: Longest input length a sweep may train or test on.
MAX_INPUT_LENGTH = 4096

C = TypeVar("C")


@dataclass
class TrainConfig:
    """Everything that determines one run. The CLI and TOML files fill it field by field."""

    task: str = "copy-v1"  # registry name, or path/to/file.py:ClassName
    pe: str = "none"  # registry name of the positional encoding (posenc.available())
    random_positions: bool = False  # randomized positions (Ruoss et al. 2023)
    random_max: int = 256  # L: randomized positions are drawn from [0, L)
    coupled_positions: bool = False  # position coupling (Cho et al. 2024; task-aware)
    pe_options: dict[str, Any] = field(default_factory=dict)  # extra kwargs for the encoding
    seed: int = 0  # model init, data and evaluation all derive from it
    dim: int = 64  # model width
    depth: int = 2  # layers
    heads: int = 4  # attention heads
    ffn_dim: int = 0  # feed-forward width; 0 means 4 * dim
    dropout: float = 0.0
    steps: int = 1000  # optimiser steps
    batch_size: int = 64  # global batch (split across torchrun processes)
    lr: float = 1e-3  # peak learning rate
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    warmup: float = 0.1  # fraction of steps with linear warm-up from 0
    decay: str = "cosine"  # after warm-up: "cosine" or "linear" to 0, or "constant"
    grad_clip: float = 1.0  # clip the global gradient norm to this; 0 disables
    train_min_length: int = 1  # training input lengths are uniform in [min, max]
    train_max_length: int = 20
    test_min_length: int = 21  # every length in [min, max] is tested
    test_max_length: int = 40
    eval_every: int = 250  # periodic evaluation every N steps; 0 disables
    eval_samples: int = 16  # examples per length in periodic evaluation
    test_samples: int = 100  # examples per length in the final evaluation
    checkpoint_every: int = 100  # checkpoint every N steps (and at the end); 0 = only at the end
    valid_threshold: float = VALID_THRESHOLD  # in-distribution exact match needed to be valid
    greedy_eval: bool = False  # score decoder tasks by greedy decoding (slow; same exact match)

    @property
    def label(self) -> str:
        """How the encoding is named in tables: ``rope``, ``rope+random``, ``rope+coupled``
        or ``rope+random+coupled``."""
        return (
            self.pe
            + ("+random" if self.random_positions else "")
            + ("+coupled" if self.coupled_positions else "")
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Build from a mapping, rejecting unknown keys and values of the wrong type."""
        return config_from_dict(cls, values)

    def step_bytes(self, length: int) -> int:
        """A generous estimate of one training step's or evaluation batch's memory at model
        sequence length ``length``: weights, gradients and two AdamW moments, plus the
        activations autograd keeps per token and layer (projections, feed-forward, and the
        ``heads x length`` attention scores, weights and their dropout)."""
        ffn = self.ffn_dim or 4 * self.dim
        params = self.depth * (4 * self.dim * self.dim + 2 * self.dim * ffn)
        batch = max(self.batch_size, self.eval_samples, self.test_samples)
        per_token = self.depth * (12 * self.dim + 3 * ffn + 4 * self.heads * length)
        return 4 * (4 * params + batch * length * per_token)

    def validate(self) -> Task:
        """Check every field (types, ranges, the task, the encoding, the randomized-position
        range) before any work; return the task."""
        positive = ("random_max", "dim", "depth", "heads", "steps", "batch_size")
        positive += ("train_min_length", "test_min_length", "eval_samples", "test_samples")
        check_fields(self, positive, ("ffn_dim", "eval_every", "checkpoint_every", "seed"))
        if not 0.0 < self.valid_threshold <= 1.0:
            raise PosencValueError(f"valid_threshold must be in (0, 1], got {self.valid_threshold}")
        for low, high in (("train_min_length", "train_max_length"),):
            if getattr(self, high) < getattr(self, low):
                raise PosencValueError(
                    f"{high} ({getattr(self, high)}) < {low} ({getattr(self, low)})"
                )
        if self.test_max_length < self.test_min_length:
            raise PosencValueError(
                f"test_max_length ({self.test_max_length}) < test_min_length "
                f"({self.test_min_length})"
            )
        for name in ("train_max_length", "test_max_length"):
            if getattr(self, name) > MAX_INPUT_LENGTH:
                raise PosencValueError(
                    f"{name} must be <= {MAX_INPUT_LENGTH} (attention over a longer sequence "
                    f"would not fit a tiny-model sweep), got {getattr(self, name)}"
                )
        table = check_encoding(self.pe, self.dim, self.heads, self.pe_options, "lengthgen")
        task = get_task(self.task)
        probe = np.random.default_rng([self.seed, 99])
        longest = longest_model_length(task, [self.train_max_length, self.test_max_length], probe)
        check_bytes(
            "batch_size x length x dim x depth",
            f"{self.batch_size} x {longest} x {self.dim} x {self.depth}",
            self.step_bytes(longest),
        )
        if table is not None:  # a learned table knows nothing past its rows
            needed, why = (
                (self.random_max, "random_max")
                if self.random_positions
                else (longest, "the longest sequence")
            )
            if needed > table:
                raise PosencValueError(
                    f"encoding {self.label!r} cannot handle the test sequences: its table holds "
                    f"max_len={table} positions, the runs need {needed} ({why}); raise "
                    f"pe_options.{self.pe}.max_len"
                )
        if self.random_positions and self.random_max < longest:
            raise PosencValueError(
                f"randomized positions need L (random_max={self.random_max}) at least as "
                f"large as the longest sequence the model sees: {longest} tokens for "
                f"{task.name} at input length {self.test_max_length}; "
                f"use random_max >= {longest}"
            )
        if self.coupled_positions:
            check_coupling(task)
        return task


def check_encoding(
    pe: str, dim: int, heads: int, options: dict[str, Any], harness: str = "training"
) -> int | None:
    """Build the encoding alone (cheap: no model) so that an unknown name, an encoding of
    N-D coordinates, bad ``pe_options`` or a size it cannot take fail before any run starts,
    naming the encoding and its options (``harness`` names the command in the message).
    Returns the number of rows of a learned table (positions past it have no embedding),
    else ``None``."""
    from posenc import LearnedPositionalEncoding, build_for_model, entry

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
    ``dim % heads``, ``dropout``, ``lr``, ``weight_decay``, ``grad_clip``, ``warmup`` and
    ``decay``."""
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


def transformer_for(config: Any, vocab_size: int, *, causal: bool) -> Any:
    """``posenc.TransformerModel`` of a run's width, depth, heads, encoding and its options
    (``config`` a lengthgen or extrapolate config); options the encoding refuses name it."""
    from ..model import TransformerModel

    try:
        return TransformerModel(
            vocab_size,
            config.dim,
            config.depth,
            config.heads,
            pe=config.pe,
            causal=causal,
            ffn_dim=config.ffn_dim or None,
            dropout=config.dropout,
            pe_kwargs=dict(config.pe_options) or None,
        )
    except TypeError as exc:
        if config.pe_options:
            raise PosencTypeError(
                f"pe {config.pe!r} with options {config.pe_options}: {exc}"
            ) from exc
        raise
