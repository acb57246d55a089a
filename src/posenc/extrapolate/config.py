"""What a ``posenc extrapolate`` sweep is: one :class:`ExtrapolateConfig` per trained model,
one :class:`EvalSettings` for every evaluation, and the named presets.

Every field is checked before any work (:meth:`ExtrapolateConfig.validate`,
:meth:`EvalSettings.validate`), so a sweep never fails half-way on a typo.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import PosencTypeError, PosencValueError, check_bytes
from ..runs.config import check_encoding, check_fields, check_type, config_from_dict

#: The encodings of the preset and of a bare ``posenc extrapolate``, where registered.
DEFAULT_PES = ("sinusoidal", "learned", "rope", "alibi", "t5", "none")
#: The per-layer schedules of the ``scale`` preset: Llama 4's 3:1 interleave of RoPE and NoPE
#: layers, plain and with its NoPE layers' query temperature (floor at L; posenc.runs.schedules).
SCHEDULES = ("rope/rope/rope/none", "rope/rope/rope/none:temp")
#: RoPE context extensions applied at evaluation time, and the ones fine-tuning may use.
SCALINGS = ("linear", "dynamic", "yarn")
FINETUNE_SCALINGS = ("linear", "yarn")
#: The longest window a sweep may train or evaluate (attention is quadratic in it).
MAX_LENGTH = 16384

#: Named settings. ``press``: the shape of Press et al. 2022, Fig. 1 (sinusoidal, rotary,
#: T5 bias and ALiBi trained at L and scored at L..16L; here also learned and NoPE) at 0.7M
#: parameters, one seed, with the zero-shot RoPE scalings of Chen et al. 2023 (linear PI)
#: and Peng et al. 2023 (dynamic NTK, YaRN). T5's bias is the decoder's one-directional one
#: with ``max_distance = L``, so that every bucket is trained (see ``T5RelativeBias``).
PRESETS: dict[str, dict[str, Any]] = {
    "press": {
        "pe": list(DEFAULT_PES),
        "seeds": [0],
        "jobs": "auto",
        "steps": 1200,
        "batch_size": 32,
        "train_len": 64,
        "eval_lens": [64, 128, 256, 512, 1024],
        "scalings": list(SCALINGS),
        "eval_tokens": 32768,
        "finetune_steps": 0,
        "pe_options": {"t5": {"bidirectional": False, "max_distance": 64}},
    },
    # ``scale``: for a GPU. Wide and deep enough, and trained long enough on windows of which
    # half carry a needle and its repeat, that copying within L is learned; then retrieval at
    # L..16L asks whether each encoding still finds the needle far past L (see
    # benchmarks/extrapolate.md for the FLOP estimate of its time). The learned table covers
    # every evaluation window (its rows past L are never trained).
    "scale": {
        "pe": [*DEFAULT_PES, *SCHEDULES],
        "seeds": [0],
        "jobs": 1,
        "dim": 512,
        "depth": 8,
        "heads": 8,
        "steps": 3000,  # RoPE's curves settle by then (benchmarks/extrapolate-scale.md)
        "batch_size": 32,
        "lr": 1e-3,
        "weight_decay": 0.1,
        "precision": "bf16",
        "train_len": 256,
        "needle_share": 0.5,
        "eval_lens": [256, 512, 1024, 2048, 4096],
        "scalings": list(SCALINGS),
        "eval_tokens": 65536,
        "batch_tokens": 32768,  # evaluation in large batches: 8 windows of 16L per forward
        "finetune_steps": 0,
        "retrieval": True,
        "pe_options": {
            "t5": {"bidirectional": False, "max_distance": 256},
            "learned": {"max_len": 8192},
        },
    },
}


@dataclass
class ExtrapolateConfig:
    """Everything that determines one trained model (and its fine-tunes)."""

    pe: str = "rope"  # registry name (posenc.available()) or schedule (posenc.runs.schedules)
    pe_options: dict[str, Any] = field(default_factory=dict)  # kwargs (a schedule's: by name)
    seed: int = 0  # model init and the order of the training windows
    dim: int = 128  # model width
    depth: int = 3  # layers
    heads: int = 4  # attention heads
    ffn_dim: int = 0  # feed-forward width; 0 means 4 * dim
    dropout: float = 0.0
    steps: int = 1500  # optimiser steps
    batch_size: int = 32  # windows per step (split across torchrun processes)
    train_len: int = 64  # L: tokens per training window
    lr: float = 2e-3  # peak learning rate
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    warmup: float = 0.05  # fraction of steps with linear warm-up from 0
    decay: str = "cosine"  # after warm-up: "cosine" or "linear" to 0, or "constant"
    grad_clip: float = 1.0  # clip the global gradient norm to this; 0 disables
    checkpoint_every: int = 0  # checkpoint every N steps (0: by wall time only), and at the end
    checkpoint_minutes: float = 5.0  # and every this many minutes of training (0: never)
    compile: bool = False  # train through torch.compile (paid once per model; see README)
    precision: str = "fp32"  # "fp32", or "bf16": forward and loss under bfloat16 autocast
    needle_share: float = 0.0  # share of training windows with a needle and its repeat
    needle_len: int = 16  # tokens per needle (training needles and --retrieval)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ExtrapolateConfig:
        """Build from a mapping, rejecting unknown keys and values of the wrong type."""
        return config_from_dict(cls, values)

    def validate(self) -> int | None:
        """Check every field and build the encoding alone (bad ``pe_options`` fail now);
        return the rows of a learned table (``None`` for other encodings)."""
        positive = ("dim", "depth", "heads", "steps", "batch_size", "train_len")
        check_fields(self, positive, ("ffn_dim", "checkpoint_every", "seed"))
        if not (self.checkpoint_minutes >= 0 and math.isfinite(self.checkpoint_minutes)):
            raise PosencValueError(
                f"checkpoint_minutes must be a finite number >= 0, got {self.checkpoint_minutes}"
            )
        if self.train_len > MAX_LENGTH:
            raise PosencValueError(f"train_len must be <= {MAX_LENGTH}, got {self.train_len}")
        if not 0.0 <= self.needle_share <= 1.0:  # NaN fails too
            raise PosencValueError(f"needle_share must be in [0, 1], got {self.needle_share}")
        if self.needle_len < 4 or (self.needle_share and 2 * self.needle_len > self.train_len):
            raise PosencValueError(
                f"needle_len must be >= 4 and, with needles in training, at most half of "
                f"train_len ({self.train_len}); got {self.needle_len}"
            )
        table = check_encoding(self.pe, self.dim, self.heads, self.pe_options, "extrapolate")
        if table is not None and table < self.train_len:
            raise PosencValueError(
                f"pe {self.pe!r} has a table of max_len={table} positions, shorter than "
                f"train_len={self.train_len}; raise pe_options.{self.pe}.max_len"
            )
        check_bytes(
            "batch_size x train_len x dim x depth",
            f"{self.batch_size} x {self.train_len} x {self.dim} x {self.depth}",
            step_bytes(self, self.batch_size, self.train_len),
        )
        return table


def step_bytes(config: ExtrapolateConfig, rows: int, length: int, vocab: int = 256) -> int:
    """A generous estimate of the memory of one training step (or evaluation batch) of
    ``rows`` windows of ``length`` tokens: weights, gradients and two AdamW moments, and the
    activations autograd keeps per token and layer (projections, feed-forward, attention
    scores and weights), plus the logits."""
    ffn = config.ffn_dim or 4 * config.dim
    params = config.depth * (4 * config.dim * config.dim + 2 * config.dim * ffn)
    per_token = config.depth * (12 * config.dim + 3 * ffn + 4 * config.heads * length)
    return 4 * (4 * params + rows * length * (per_token + 2 * vocab))


@dataclass
class EvalSettings:
    """How every model of a sweep is evaluated and fine-tuned."""

    eval_lens: list[int] = field(default_factory=list)  # empty: L, 2L, 4L, 8L, 16L
    scalings: list[str] = field(default_factory=lambda: list(SCALINGS))  # zero-shot, RoPE only
    eval_tokens: int = 65536  # most validation tokens scored at every length
    batch_tokens: int = 4096  # tokens per evaluation forward
    sliding: int = 0  # stride of the sliding-window evaluation (Press et al. 2022); 0: off
    finetune_steps: int = 0  # fine-tune RoPE models with each FINETUNE_SCALINGS type
    finetune_len: int = 0  # window length of fine-tuning; 0: the longest eval length
    finetune_lr: float = 2e-4  # peak learning rate of fine-tuning (warm-up 10%, cosine)
    finetune_scalings: list[str] = field(default_factory=lambda: list(FINETUNE_SCALINGS))
    context_blocks: int = 128  # target blocks of the context-gain measure; 0: off
    retrieval: bool = False  # score copying a needle back at every length
    retrieval_trials: int = 16  # windows per (length, depth) of the retrieval measure

    def lengths(self, train_len: int) -> list[int]:
        """The evaluation lengths, sorted (default ``L, 2L, 4L, 8L, 16L``)."""
        return sorted(self.eval_lens) if self.eval_lens else [train_len * 2**k for k in range(5)]

    def finetune_length(self, train_len: int) -> int:
        return self.finetune_len or max(self.lengths(train_len))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self, train_len: int) -> None:
        """Check every field against the training length ``train_len``."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("eval_lens", "scalings", "finetune_scalings"):
                if not isinstance(value, list):
                    raise PosencTypeError(f"{f.name} must be a list, got {value!r}")
            else:
                check_type(f.name, value, type(getattr(EvalSettings(), f.name)))
        for length in self.eval_lens:
            if isinstance(length, bool) or not isinstance(length, int) or length < 1:
                raise PosencValueError(f"eval_lens must be ints >= 1, got {self.eval_lens!r}")
        if len(set(self.eval_lens)) != len(self.eval_lens):
            raise PosencValueError(f"eval_lens {self.eval_lens!r} repeat a length")
        lengths = self.lengths(train_len)
        for name, value in (("eval_lens", max(lengths)), ("finetune_len", self.finetune_len)):
            if value > MAX_LENGTH:
                raise PosencValueError(f"{name} must be <= {MAX_LENGTH}, got {value}")
        for name, allowed in (("scalings", SCALINGS), ("finetune_scalings", FINETUNE_SCALINGS)):
            chosen = getattr(self, name)
            unknown = [s for s in chosen if s not in allowed]
            if unknown or len(set(chosen)) != len(chosen):
                raise PosencValueError(
                    f"{name} must be distinct names among {', '.join(allowed)}, got {chosen!r}"
                )
        for name in ("eval_tokens", "batch_tokens"):
            if getattr(self, name) < 1:
                raise PosencValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.retrieval_trials < 1:
            raise PosencValueError(f"retrieval_trials must be >= 1, got {self.retrieval_trials}")
        for name in ("sliding", "finetune_steps", "finetune_len", "context_blocks"):
            if getattr(self, name) < 0:
                raise PosencValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.sliding and any(length % self.sliding for length in lengths):
            raise PosencValueError(
                f"sliding (the stride, {self.sliding}) must divide every eval length {lengths}"
            )
        if self.finetune_len and self.finetune_len <= train_len:
            raise PosencValueError(
                f"finetune_len ({self.finetune_len}) must be longer than train_len ({train_len})"
            )
        if not self.finetune_lr > 0:
            raise PosencValueError(f"finetune_lr must be > 0, got {self.finetune_lr}")
