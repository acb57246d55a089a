"""What one lengthgen run is: :class:`TrainConfig`.

Every field is checked (type, range, the task, the encoding and its options, the memory a
step needs) before any work, so a sweep never fails half-way on a typo; the checks every
training config of posenc shares live in :mod:`posenc.runs.config` (``check_fields``,
``config_from_dict``, ``check_encoding``, ``transformer_for``).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import PosencValueError, check_bytes
from ..runs import config as shared
from .abacus import check_digit_tokens
from .data import check_coupling, longest_model_length
from .evaluate import VALID_THRESHOLD
from .tasks import Task, get_task

#: Longest input length a sweep may train or test on.
MAX_INPUT_LENGTH = 4096


class InDistributionWarning(UserWarning):
    """Some test lengths lie inside the trained range: their accuracy measures fitting, not
    generalization to unseen lengths."""


def in_distribution_message(train: tuple[int, int], test: tuple[int, int]) -> str | None:
    """The warning for test lengths ``test = (min, max)`` that overlap the trained range
    ``train``, or ``None`` when every test length lies outside it."""
    low, high = max(train[0], test[0]), min(train[1], test[1])
    if low > high:
        return None
    which = f"length {low} is" if low == high else f"lengths {low}-{high} are"
    return (
        f"test lengths {test[0]}-{test[1]} overlap the trained range {train[0]}-{train[1]}: "
        f"{which} in distribution, so their accuracy does not measure length generalization"
    )


@dataclass
class TrainConfig:
    """Everything that determines one run. The CLI and TOML files fill it field by field."""

    task: str = "copy-v1"  # registry name, or path/to/file.py:ClassName
    pe: str = "none"  # registry name (posenc.available()) or schedule (posenc.runs.schedules)
    random_positions: bool = False  # randomized positions (Ruoss et al. 2023)
    random_max: int = 256  # L: randomized positions are drawn from [0, L)
    coupled_positions: bool = False  # position coupling (Cho et al. 2024; task-aware)
    abacus: bool = False  # Abacus digit positions added to the embeddings (McLeish 2024)
    abacus_offset: int = 100  # the largest training offset of the Abacus indices
    pe_options: dict[str, Any] = field(default_factory=dict)  # kwargs (a schedule's: by name)
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
    precision: str = "fp32"  # "fp32", or "bf16": forward and loss under bfloat16 autocast

    @property
    def label(self) -> str:
        """How the encoding is named in tables: ``rope``, ``rope+random``, ``rope+coupled``
        or ``rope+random+coupled``; with Abacus positions ``rope+abacus`` (``abacus`` alone
        for NoPE)."""
        name = self.pe
        if self.abacus:
            name = "abacus" if self.pe == "none" else f"{self.pe}+abacus"
        return (
            name
            + ("+random" if self.random_positions else "")
            + ("+coupled" if self.coupled_positions else "")
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Build from a mapping, rejecting unknown keys and values of the wrong type."""
        return shared.config_from_dict(cls, values)

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
        range) before any work; return the task. Test lengths inside the trained range are
        allowed, with an :class:`InDistributionWarning`."""
        positive = ("random_max", "dim", "depth", "heads", "steps", "batch_size")
        positive += ("train_min_length", "test_min_length", "eval_samples", "test_samples")
        nonnegative = ("ffn_dim", "eval_every", "checkpoint_every", "seed", "abacus_offset")
        shared.check_fields(self, positive, nonnegative)
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
        overlap = in_distribution_message(
            (self.train_min_length, self.train_max_length),
            (self.test_min_length, self.test_max_length),
        )
        if overlap is not None:
            warnings.warn(overlap, InDistributionWarning, stacklevel=2)
        for name in ("train_max_length", "test_max_length"):
            if getattr(self, name) > MAX_INPUT_LENGTH:
                raise PosencValueError(
                    f"{name} must be <= {MAX_INPUT_LENGTH} (attention over a longer sequence "
                    f"would not fit a tiny-model sweep), got {getattr(self, name)}"
                )
        table = shared.check_encoding(self.pe, self.dim, self.heads, self.pe_options, "lengthgen")
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
        if self.abacus:
            check_digit_tokens(task)
        return task

    def abacus_rows(self, task: Task) -> int:
        """Rows of the Abacus table a run needs: a digit index for the longest sequence it
        sees (no run of digits is longer), plus the largest training offset, plus row 0."""
        probe = np.random.default_rng([self.seed, 99])
        longest = longest_model_length(task, [self.train_max_length, self.test_max_length], probe)
        return longest + self.abacus_offset + 1
