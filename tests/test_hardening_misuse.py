"""Misuse of the public API and the command line (issue #8, part 5).

Table-driven: every bad input gets a ``ValueError`` or ``TypeError`` whose message names the
argument and the bad value, raised before any work; the command exits 2 with exactly one line
on stderr and no traceback. Then hypothesis fuzzes the command's argument parsing (argv lists
built from the real flags, real and garbage values) and the ``posenc lengthgen`` TOML
configuration, in-process through ``posenc.cli.main`` (heavy work replaced by a stub that
records that validation let the call through), with a subprocess for a handful of cases.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fuzzing import examples
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import posenc
from posenc import (
    FIRE,
    KERPLE,
    ALiBi,
    CoPE,
    DynamicPositionBias,
    Encoder,
    EncoderLayer,
    FeedForward,
    LearnedPositionalEncoding,
    MultiHeadAttention,
    Rotary2DEmbedding,
    RotaryEmbedding,
    ScaledSinusoidalPositionalEncoding,
    ShawRelativeBias,
    Sinusoidal2DPositionalEncoding,
    SinusoidalPositionalEncoding,
    T5RelativeBias,
    TransformerModel,
    TransformerXLRelativeBias,
    XPos,
)
from posenc.cli import main
from posenc.errors import MemoryBudgetError, PosencError

NAN, INF = float("nan"), float("inf")
X = torch.randn(2, 5, 8)
Q = torch.randn(2, 2, 5, 4)
FRAC_NAN = torch.tensor([0.0, 1.0, NAN, 3.0, 4.0])
FRAC_INF = torch.tensor([0.0, 1.0, INF, 3.0, 4.0])


def _yarn(**extra: Any) -> dict[str, Any]:
    return {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16, **extra}


# (id, thunk, exception, regex naming the argument and the value)
API_CASES: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    # tables
    ("table-num-positions-float", lambda: posenc.sinusoidal_table(4.0, 8), TypeError,
     r"num_positions must be an int, got float \(4\.0\)"),
    ("table-num-positions-neg", lambda: posenc.sinusoidal_table(-1, 8), ValueError,
     r"num_positions must be >= 0, got -1"),
    ("table-dim-zero", lambda: posenc.sinusoidal_table(4, 0), ValueError,
     r"dim must be >= 1, got 0"),
    ("table-dim-nan", lambda: posenc.sinusoidal_table(4, NAN), TypeError,
     r"dim must be an int, got float \(nan\)"),
    ("table-base-nan", lambda: posenc.sinusoidal_table(4, 8, base=NAN), ValueError,
     r"base must be a finite number > 0, got nan"),
    ("table-base-inf", lambda: posenc.sinusoidal_table(4, 8, base=INF), ValueError,
     r"base must be a finite number > 0, got inf"),
    ("table-base-one", lambda: posenc.sinusoidal_table(4, 8, base=1.0), ValueError,
     r"base must not be 1\.0"),
    ("table-dtype-str", lambda: posenc.sinusoidal_table(4, 8, dtype="float32"), TypeError,
     r"dtype must be a torch\.dtype, got str \('float32'\)"),
    ("table-dtype-int", lambda: posenc.sinusoidal_table(4, 8, dtype=torch.int64), TypeError,
     r"dtype must be a floating-point dtype, got torch\.int64"),
    ("encode-positions-list", lambda: posenc.sinusoidal_encode([1, 2], 4), TypeError,
     r"positions must be a torch\.Tensor, got list"),
    ("encode-dim-zero", lambda: posenc.sinusoidal_encode(torch.arange(3), 0), ValueError,
     r"dim must be >= 1, got 0"),
    ("encode-base-zero", lambda: posenc.sinusoidal_encode(torch.arange(3), 4, base=0.0),
     ValueError, r"base must be a finite number > 0, got 0\.0"),
    ("table-np-dim-zero", lambda: posenc.sinusoidal_table_np(3, 0), ValueError,
     r"dim must be >= 1, got 0"),
    ("nd-table-empty-shape", lambda: posenc.sinusoidal_nd_table((), 4), ValueError,
     r"shape must be a non-empty tuple of axis sizes, got \(\)"),
    ("nd-table-axis-zero", lambda: posenc.sinusoidal_nd_table((2, 0), 4), ValueError,
     r"shape\[1\] must be >= 1, got 0"),
    ("nd-table-dim-zero", lambda: posenc.sinusoidal_nd_table((2, 2), 0), ValueError,
     r"dim must be >= 1, got 0"),
    ("nd-table-base-nan", lambda: posenc.sinusoidal_nd_table((2, 2), 4, base=NAN), ValueError,
     r"base must be a finite number > 0, got nan"),
    # additive modules
    ("sin-dim-str", lambda: SinusoidalPositionalEncoding("8"), TypeError,
     r"dim must be an int, got str \('8'\)"),
    ("sin-dim-bool", lambda: SinusoidalPositionalEncoding(True), TypeError,
     r"dim must be an int, got bool \(True\)"),
    ("sin-max-len-zero", lambda: SinusoidalPositionalEncoding(8, max_len=0), ValueError,
     r"max_len must be >= 1, got 0"),
    ("sin-dropout-nan", lambda: SinusoidalPositionalEncoding(8, dropout=NAN), ValueError,
     r"dropout must be in \[0, 1\), got nan"),
    ("sin-dropout-one", lambda: SinusoidalPositionalEncoding(8, dropout=1.0), ValueError,
     r"dropout must be in \[0, 1\), got 1\.0"),
    ("sin-x-list", lambda: SinusoidalPositionalEncoding(8)([[1.0]]), TypeError,
     r"x must be a torch\.Tensor, got list"),
    ("sin-x-int", lambda: SinusoidalPositionalEncoding(8)(X.long()), TypeError,
     r"x must be a floating-point tensor, got dtype torch\.int64"),
    ("sin-x-rank", lambda: SinusoidalPositionalEncoding(8)(X[0]), ValueError,
     r"x must have 3 dimensions, got shape \(5, 8\)"),
    ("sin-x-width", lambda: SinusoidalPositionalEncoding(7)(X), ValueError,
     r"x has last dimension 8, expected dim=7"),
    ("sin-positions-length", lambda: SinusoidalPositionalEncoding(8)(X, torch.arange(4)),
     ValueError, r"positions must have shape \(seq,\) or \(batch, seq\) with seq=5, got \(4,\)"),
    ("sin-positions-negative", lambda: SinusoidalPositionalEncoding(8)(X, torch.arange(-1, 4)),
     ValueError, r"positions must be >= 0, got a minimum of -1"),
    ("sin-positions-nan", lambda: SinusoidalPositionalEncoding(8)(X, FRAC_NAN), ValueError,
     r"positions must be finite, got nan"),
    ("sin-positions-inf", lambda: SinusoidalPositionalEncoding(8)(X, FRAC_INF), ValueError,
     r"positions must be finite, got inf"),
    ("sin-positions-bool",
     lambda: SinusoidalPositionalEncoding(8)(X, torch.ones(5, dtype=torch.bool)), TypeError,
     r"positions must be an integer or float tensor, got dtype torch\.bool"),
    ("sin-positions-batch",
     lambda: SinusoidalPositionalEncoding(8)(X, torch.zeros(3, 5, dtype=torch.long)),
     ValueError, r"positions has batch size 3 but the input has batch size 2"),
    ("sin-positions-list", lambda: SinusoidalPositionalEncoding(8)(X, [0, 1, 2, 3, 4]),
     TypeError, r"positions must be a torch\.Tensor, got list"),
    ("scaled-dim-zero", lambda: ScaledSinusoidalPositionalEncoding(0), ValueError,
     r"dim must be >= 1, got 0"),
    ("learned-too-long", lambda: LearnedPositionalEncoding(8, max_len=4)(X), ValueError,
     r"input has 5 positions but the learned table has max_len=4"),
    ("learned-position-past",
     lambda: LearnedPositionalEncoding(8, max_len=4)(X[:, :3], torch.tensor([0, 1, 4])),
     ValueError, r"position 4 is past the learned table \(max_len=4\)"),
    ("learned-fractional",
     lambda: LearnedPositionalEncoding(8, max_len=4)(X[:, :3], torch.tensor([0.0, 0.5, 1.0])),
     ValueError, r"positions must hold whole numbers"),
    ("learned-nan",
     lambda: LearnedPositionalEncoding(8, max_len=4)(X[:, :3], torch.tensor([0.0, NAN, 1.0])),
     ValueError, r"positions must be finite, got nan"),
    ("learned-init", lambda: LearnedPositionalEncoding(8, init="uniform"), ValueError,
     r"init must be 'xavier' or 'normal', got 'uniform'"),
    ("learned-max-len-none", lambda: LearnedPositionalEncoding(8, max_len=None), TypeError,
     r"max_len must be an int, got NoneType \(None\)"),
    ("sin2d-flat-no-positions", lambda: Sinusoidal2DPositionalEncoding(8)(X), ValueError,
     r"a flattened input needs positions of shape \(seq, 2\)"),
    ("sin2d-positions-shape",
     lambda: Sinusoidal2DPositionalEncoding(8)(X, torch.zeros(5, 3)), ValueError,
     r"positions must have shape \(5, 2\) .*got \(5, 3\)"),
    ("sin2d-positions-nan",
     lambda: Sinusoidal2DPositionalEncoding(8)(X, torch.full((5, 2), NAN)), ValueError,
     r"positions must be finite, got nan"),
    # rotary
    ("rope-head-dim-zero", lambda: RotaryEmbedding(0), ValueError, r"head_dim must be >= 1, got 0"),
    ("rope-head-dim-odd", lambda: RotaryEmbedding(7), ValueError,
     r"head_dim \(7\) must be divisible by 2"),
    ("rope-base-nan", lambda: RotaryEmbedding(8, base=NAN), ValueError,
     r"base must be a finite number > 0, got nan"),
    ("rope-rotary-dim-wide", lambda: RotaryEmbedding(8, rotary_dim=10), ValueError,
     r"rotary_dim \(10\) must be <= head_dim \(8\)"),
    ("rope-rotary-dim-odd", lambda: RotaryEmbedding(8, rotary_dim=3), ValueError,
     r"rotary_dim \(3\) must be divisible by 2"),
    ("rope-max-position-zero", lambda: RotaryEmbedding(8, max_position_embeddings=0),
     ValueError, r"max_position_embeddings must be >= 1, got 0"),
    ("rope-scaling-list", lambda: RotaryEmbedding(8, scaling=[1]), TypeError,
     r"scaling must be a dict or None, got list"),
    ("rope-scaling-type", lambda: RotaryEmbedding(8, scaling={"rope_type": "foo"}), ValueError,
     r"unknown rope_type 'foo'"),
    ("rope-factor-nan",
     lambda: RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": NAN}), ValueError,
     r"rope scaling 'factor' must be a finite number > 0, got nan"),
    ("rope-factor-zero",
     lambda: RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": 0}), ValueError,
     r"rope scaling 'factor' must be a finite number > 0, got 0"),
    ("rope-factor-str",
     lambda: RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": "2"}), TypeError,
     r"rope scaling 'factor' must be a number, got '2'"),
    ("rope-factor-missing", lambda: RotaryEmbedding(8, scaling={"rope_type": "linear"}),
     ValueError, r"rope_type 'linear' needs the key\(s\) \['factor'\]"),
    ("rope-unknown-key",
     lambda: RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": 2, "foo": 1}),
     ValueError, r"unknown key\(s\) \['foo'\] for rope_type 'linear'"),
    ("rope-yarn-no-original",
     lambda: RotaryEmbedding(8, scaling={"rope_type": "yarn", "factor": 2}), ValueError,
     r"rope_type 'yarn' needs the key\(s\) \['original_max_position_embeddings'\]"),
    ("rope-yarn-beta-nan", lambda: RotaryEmbedding(8, scaling=_yarn(beta_fast=NAN)),
     ValueError, r"'beta_fast' must be a finite number .*got nan"),
    ("rope-yarn-beta-order", lambda: RotaryEmbedding(8, scaling=_yarn(beta_fast=-1)),
     ValueError, r"beta_fast \(-1\) must be >= beta_slow \(1\)"),
    ("rope-yarn-truncate", lambda: RotaryEmbedding(8, scaling=_yarn(truncate="yes")),
     TypeError, r"rope scaling 'truncate' must be a bool, got 'yes'"),
    ("rope-yarn-attention-nan", lambda: RotaryEmbedding(8, scaling=_yarn(attention_factor=NAN)),
     ValueError, r"'attention_factor' must be a finite number > 0, got nan"),
    ("rope-yarn-original-float",
     lambda: RotaryEmbedding(8, scaling=_yarn(original_max_position_embeddings=16.0)),
     ValueError, r"original_max_position_embeddings must be an int >= 1, got 16\.0"),
    ("rope-dynamic-no-max",
     lambda: RotaryEmbedding(8, scaling={"rope_type": "dynamic", "factor": 2}), ValueError,
     r"rope_type 'dynamic' needs max_position_embeddings"),
    ("rope-llama3-order",
     lambda: RotaryEmbedding(8, scaling={
         "rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1,
         "original_max_position_embeddings": 16}), ValueError,
     r"high_freq_factor \(1\) must be > low_freq_factor \(4\)"),
    ("rope-longrope-length",
     lambda: RotaryEmbedding(8, scaling={
         "rope_type": "longrope", "factor": 2.0, "short_factor": [1.0],
         "long_factor": [1.0] * 4, "original_max_position_embeddings": 16}), ValueError,
     r"'short_factor' must be a list of rotary_dim // 2 = 4 numbers, got \[1\.0\]"),
    ("rope-longrope-nan",
     lambda: RotaryEmbedding(8, scaling={
         "rope_type": "longrope", "factor": 2.0, "short_factor": [1.0, NAN, 1.0, 1.0],
         "long_factor": [1.0] * 4, "original_max_position_embeddings": 16}), ValueError,
     r"'short_factor\[1\]' must be a finite number > 0, got nan"),
    ("rope-type-conflict",
     lambda: RotaryEmbedding(8, scaling={"type": "linear", "rope_type": "yarn", "factor": 2}),
     ValueError, r"scaling has type='linear' and rope_type='yarn'"),
    ("rope-theta-nan", lambda: RotaryEmbedding(8, scaling={"rope_theta": NAN}), ValueError,
     r"base must be a finite number > 0, got nan"),
    ("rope-theta-conflict",
     lambda: RotaryEmbedding(8, base=500.0, scaling={"rope_theta": 100.0}), ValueError,
     r"base=500\.0 conflicts with scaling\['rope_theta'\]=100\.0"),
    ("rope-partial-zero",
     lambda: RotaryEmbedding(8, scaling={"partial_rotary_factor": 0.0}), ValueError,
     r"partial_rotary_factor'\] must be a finite number > 0, got 0\.0"),
    ("rope-partial-nan",
     lambda: RotaryEmbedding(8, scaling={"partial_rotary_factor": NAN}), ValueError,
     r"partial_rotary_factor'\] must be a finite number > 0, got nan"),
    ("rope-learned-dynamic",
     lambda: RotaryEmbedding(8, learned_freq=True, max_position_embeddings=16,
                             scaling={"rope_type": "dynamic", "factor": 2}), ValueError,
     r"learned_freq cannot be combined with rope_type 'dynamic'"),
    ("rope-q-rank", lambda: RotaryEmbedding(4)(Q[0], Q[0]), ValueError,
     r"q must have shape \(batch, heads, seq, head_dim\), got \(2, 5, 4\)"),
    ("rope-q-int", lambda: RotaryEmbedding(4)(Q.long(), Q.long()), TypeError,
     r"q must be a floating-point tensor, got dtype torch\.int64"),
    ("rope-q-list", lambda: RotaryEmbedding(4)([1.0], [1.0]), TypeError,
     r"q must be a torch\.Tensor, got list"),
    ("rope-head-dim-mismatch", lambda: RotaryEmbedding(8)(Q, Q), ValueError,
     r"q has head_dim 4, expected 8"),
    ("rope-seq-mismatch", lambda: RotaryEmbedding(4)(Q, Q[:, :, :4]), ValueError,
     r"q and k must share batch and seq"),
    ("rope-positions-nan", lambda: RotaryEmbedding(4)(Q, Q, FRAC_NAN), ValueError,
     r"positions must be finite, got nan"),
    ("rope-rotate-positions-inf", lambda: RotaryEmbedding(4).rotate(Q, FRAC_INF), ValueError,
     r"positions must be finite, got inf"),
    ("apply-rotary-cos-int",
     lambda: posenc.apply_rotary(Q, torch.ones(5, 2, dtype=torch.long),
                                 torch.ones(5, 2, dtype=torch.long)), TypeError,
     r"cos must be a floating-point tensor"),
    ("apply-rotary-too-wide",
     lambda: posenc.apply_rotary(Q, torch.ones(5, 5), torch.ones(5, 5)), ValueError,
     r"cos/sin of shape \(5, 5\) need x with at least 2 \* 5 channels"),
    ("xpos-scale-base-zero", lambda: XPos(8, scale_base=0), ValueError,
     r"scale_base must be a finite number > 0, got 0\.0"),
    ("xpos-center-nan", lambda: XPos(8, center=NAN), ValueError,
     r"center must be a finite number, got nan"),
    ("xpos-center-str", lambda: XPos(8, center="0"), TypeError,
     r"center must be a number or None, got '0'"),
    ("axial-ndim-zero", lambda: posenc.AxialRotaryEmbedding(8, ndim=0), ValueError,
     r"ndim must be >= 1, got 0"),
    ("axial-head-dim", lambda: Rotary2DEmbedding(6), ValueError,
     r"head_dim \(6\) must be divisible by 4"),
    ("axial-positions-shape", lambda: Rotary2DEmbedding(4)(Q, Q, torch.zeros(5, 3)),
     ValueError, r"positions must be coordinates of shape \(seq, 2\).*got \(5, 3\)"),
    ("axial-positions-nan", lambda: Rotary2DEmbedding(4)(Q, Q, torch.full((5, 2), NAN)),
     ValueError, r"positions must be finite, got nan"),
    ("rope-parameters-dim-zero", lambda: posenc.rope_parameters(None, 0, 10000.0), ValueError,
     r"dim must be >= 1, got 0"),
    ("rope-parameters-dim-odd", lambda: posenc.rope_parameters(None, 7, 10000.0), ValueError,
     r"dim \(7\) must be even"),
    ("rope-parameters-base-nan", lambda: posenc.rope_parameters(None, 8, NAN), ValueError,
     r"base must be a finite number > 0, got nan"),
    # bias
    ("alibi-heads-zero", lambda: ALiBi(0), ValueError, r"num_heads must be >= 1, got 0"),
    ("alibi-heads-float", lambda: ALiBi(2.0), TypeError,
     r"num_heads must be an int, got float \(2\.0\)"),
    ("alibi-causal-str", lambda: ALiBi(2, causal="yes"), TypeError,
     r"causal must be a bool, got str"),
    ("alibi-positions-list", lambda: ALiBi(2).bias([0, 1], [0, 1]), TypeError,
     r"q_positions must be a torch\.Tensor, got list"),
    ("alibi-positions-nan", lambda: ALiBi(2).bias(torch.tensor([0.0, NAN]), torch.arange(2)),
     ValueError, r"q_positions must be finite, got nan"),
    ("alibi-k-positions-inf",
     lambda: ALiBi(2).bias(torch.arange(2), torch.tensor([0.0, -INF])), ValueError,
     r"k_positions must be finite, got -inf"),
    ("alibi-positions-rank", lambda: ALiBi(2).bias(torch.zeros(1, 1, 2), torch.arange(2)),
     ValueError, r"q_positions must have shape \(seq,\) or \(batch, seq\), got \(1, 1, 2\)"),
    ("alibi-batch-mismatch", lambda: ALiBi(2).bias(torch.zeros(2, 2), torch.zeros(3, 2)),
     ValueError, r"mismatched batch sizes \(2 vs 3\)"),
    ("alibi-positions-bool",
     lambda: ALiBi(2).bias(torch.ones(2, dtype=torch.bool), torch.arange(2)), TypeError,
     r"q_positions must be an integer or float tensor, got dtype torch\.bool"),
    ("t5-buckets-one", lambda: T5RelativeBias(2, num_buckets=1), ValueError,
     r"num_buckets must be >= 2, got 1"),
    ("t5-buckets-odd", lambda: T5RelativeBias(2, num_buckets=5), ValueError,
     r"num_buckets must be even with bidirectional=True .*got 5"),
    ("t5-max-distance", lambda: T5RelativeBias(2, max_distance=8), ValueError,
     r"max_distance \(8\) must be >= num_buckets \(32\)"),
    ("t5-bidirectional-str", lambda: T5RelativeBias(2, bidirectional="yes"), TypeError,
     r"bidirectional must be a bool, got str"),
    ("t5-bucket-float", lambda: T5RelativeBias(2).relative_position_bucket(torch.tensor([0.5])),
     TypeError, r"relative_position must be an integer tensor, got torch\.float32"),
    ("t5-bucket-list", lambda: T5RelativeBias(2).relative_position_bucket([1, 2]), TypeError,
     r"relative_position must be a torch\.Tensor, got list"),
    ("t5-fractional",
     lambda: T5RelativeBias(2).bias(torch.tensor([0.5, 1.0]), torch.arange(2)), ValueError,
     r"q_positions must hold whole numbers for T5RelativeBias"),
    ("kerple-kernel", lambda: KERPLE(2, kernel="exp"), ValueError,
     r"kernel must be 'log' or 'power', got 'exp'"),
    ("kerple-eps-nan", lambda: KERPLE(2, eps=NAN), ValueError,
     r"eps must be a finite number > 0, got nan"),
    ("kerple-positions-nan",
     lambda: KERPLE(2).bias(torch.tensor([0.0, NAN]), torch.arange(2)), ValueError,
     r"q_positions must be finite, got nan"),
    ("fire-c-nan", lambda: FIRE(2, c=NAN), ValueError, r"c must be a finite number > 0, got nan"),
    ("fire-threshold-zero", lambda: FIRE(2, threshold=0), ValueError,
     r"threshold must be a finite number > 0, got 0\.0"),
    ("fire-positions-nan", lambda: FIRE(2).bias(torch.tensor([0.0, NAN]), torch.arange(2)),
     ValueError, r"q_positions must be finite, got nan"),
    ("dpb-depth-zero", lambda: DynamicPositionBias(2, depth=0), ValueError,
     r"depth must be >= 1, got 0"),
    ("dpb-positions-inf",
     lambda: DynamicPositionBias(2).bias(torch.tensor([0.0, INF]), torch.arange(2)),
     ValueError, r"q_positions must be finite, got inf"),
    ("shaw-max-distance-zero", lambda: ShawRelativeBias(2, 4, max_distance=0), ValueError,
     r"max_distance must be >= 1, got 0"),
    ("shaw-no-q", lambda: ShawRelativeBias(2, 4).bias(torch.arange(3), torch.arange(3)),
     ValueError, r"ShawRelativeBias\.bias needs q="),
    ("shaw-q-heads",
     lambda: ShawRelativeBias(2, 4).bias(torch.arange(3), torch.arange(3),
                                         q=torch.randn(1, 3, 3, 4)), ValueError,
     r"ShawRelativeBias expects q of shape \(b, h=2, n, d=4\), got \(1, 3, 3, 4\)"),
    ("shaw-q-list",
     lambda: ShawRelativeBias(2, 4).bias(torch.arange(3), torch.arange(3), q=[1.0]), TypeError,
     r"ShawRelativeBias needs q as a torch\.Tensor, got list"),
    ("shaw-q-int",
     lambda: ShawRelativeBias(2, 4).bias(torch.arange(3), torch.arange(3),
                                         q=torch.ones(1, 2, 3, 4, dtype=torch.long)), TypeError,
     r"ShawRelativeBias needs a floating-point q, got dtype torch\.int64"),
    ("shaw-q-length",
     lambda: ShawRelativeBias(2, 4).bias(torch.arange(3), torch.arange(3),
                                         q=torch.randn(1, 2, 4, 4)), ValueError,
     r"ShawRelativeBias: q has 4 positions but its positions hold 3"),
    ("shaw-value-term",
     lambda: ShawRelativeBias(2, 4).value_term(torch.rand(1, 2, 3, 3), torch.arange(3),
                                               torch.arange(3)), ValueError,
     r"value_term needs ShawRelativeBias\(\.\.\., values=True\)"),
    ("xl-base-one", lambda: TransformerXLRelativeBias(2, 4, base=1.0), ValueError,
     r"base must not be 1\.0"),
    ("xl-rel-dim-zero", lambda: TransformerXLRelativeBias(2, 4, rel_dim=0), ValueError,
     r"rel_dim must be >= 1, got 0"),
    ("xl-no-k",
     lambda: TransformerXLRelativeBias(2, 4).bias(torch.arange(3), torch.arange(3),
                                                  q=torch.randn(1, 2, 3, 4)), ValueError,
     r"TransformerXLRelativeBias\.bias needs k="),
    ("xl-q-length",
     lambda: TransformerXLRelativeBias(2, 4).bias(torch.arange(3), torch.arange(3),
                                                  q=torch.randn(1, 2, 4, 4),
                                                  k=torch.randn(1, 2, 3, 4)), ValueError,
     r"TransformerXLRelativeBias: q has 4 positions but its positions hold 3"),
    ("cope-max-positions-zero", lambda: CoPE(2, 4, max_positions=0), ValueError,
     r"max_positions must be >= 1, got 0"),
    ("cope-q-list",
     lambda: CoPE(2, 4).bias(torch.arange(3), torch.arange(3), q=[1.0], k=[1.0]), TypeError,
     r"CoPE needs q as a floating-point torch\.Tensor, got list"),
    ("cope-q-int",
     lambda: CoPE(2, 4).bias(torch.arange(3), torch.arange(3),
                             q=torch.ones(1, 2, 3, 4, dtype=torch.long),
                             k=torch.ones(1, 2, 3, 4, dtype=torch.long)), TypeError,
     r"CoPE needs q as a floating-point torch\.Tensor, got torch\.int64"),
    # registry
    ("build-unknown", lambda: posenc.build("nope"), ValueError,
     r"unknown positional encoding 'nope'; known: alibi"),
    ("build-name-int", lambda: posenc.build(3), TypeError,
     r"encoding name must be a str, got int"),
    ("build-bad-kwarg", lambda: posenc.build("sinusoidal", dim=8, foo=1), TypeError,
     r"unexpected keyword argument 'foo'"),
    ("build-for-model-heads-zero", lambda: posenc.build_for_model("rope", 8, 0), ValueError,
     r"num_heads must be >= 1, got 0"),
    ("build-for-model-dim-str", lambda: posenc.build_for_model("rope", "8", 2), TypeError,
     r"dim must be an int, got str \('8'\)"),
    ("build-for-model-indivisible", lambda: posenc.build_for_model("rope", 10, 3), ValueError,
     r"num_heads \(3\) must divide dim \(10\) for rotary encoding 'rope'"),
    # attention and model
    ("mha-heads-indivisible", lambda: MultiHeadAttention(8, 3), ValueError,
     r"num_heads \(3\) must divide dim \(8\)"),
    ("mha-backend", lambda: MultiHeadAttention(8, 2, backend="cuda"), ValueError,
     r"backend must be one of auto, flex, sdpa, math; got 'cuda'"),
    ("mha-dropout-nan", lambda: MultiHeadAttention(8, 2, dropout=NAN), ValueError,
     r"dropout must be in \[0, 1\), got nan"),
    ("mha-pe-additive", lambda: MultiHeadAttention(8, 2, pe=SinusoidalPositionalEncoding(8)),
     TypeError, r"pe=SinusoidalPositionalEncoding is additive"),
    ("mha-pe-heads", lambda: MultiHeadAttention(8, 2, pe=ALiBi(4)), ValueError,
     r"pe=ALiBi has num_heads=4 but attention has num_heads=2"),
    ("mha-pe-head-dim", lambda: MultiHeadAttention(8, 2, pe=RotaryEmbedding(8)), ValueError,
     r"pe=RotaryEmbedding has head_dim=8 but attention has head_dim=4"),
    ("mha-pe-str", lambda: MultiHeadAttention(8, 2, pe="rope"), TypeError,
     r"pe must be a posenc PositionalEncoding, got str"),
    ("mha-causal-str", lambda: MultiHeadAttention(8, 2, causal="yes"), TypeError,
     r"causal must be a bool, got str \('yes'\)"),
    ("mha-mask-shape",
     lambda: MultiHeadAttention(8, 2)(X, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)),
     ValueError, r"key_padding_mask must have shape \(batch, seq\) = \(2, 5\), got \(2, 4\)"),
    ("mha-mask-float", lambda: MultiHeadAttention(8, 2)(X, key_padding_mask=torch.zeros(2, 5)),
     TypeError, r"key_padding_mask must be a bool tensor \(True = padding\), got torch\.float32"),
    ("mha-positions-nan",
     lambda: MultiHeadAttention(8, 2, pe=RotaryEmbedding(4))(X, positions=FRAC_NAN),
     ValueError, r"positions must be finite, got nan"),
    ("sdpa-q-list", lambda: posenc.scaled_dot_product_attention([1.0], Q, Q), TypeError,
     r"q must be a floating-point tensor"),
    ("sdpa-shapes",
     lambda: posenc.scaled_dot_product_attention(Q, Q[..., :3], Q), ValueError,
     r"q \(\.\.\., nq, d\), k \(\.\.\., nk, d\) and v \(\.\.\., nk, dv\) disagree"),
    ("sdpa-dropout", lambda: posenc.scaled_dot_product_attention(Q, Q, Q, dropout_p=2.0),
     ValueError, r"dropout_p must be in \[0, 1\), got 2\.0"),
    ("encoder-depth-zero", lambda: Encoder(8, 0, 2), ValueError, r"depth must be >= 1, got 0"),
    ("encoder-pe-unknown", lambda: Encoder(8, 1, 2, pe="nope"), ValueError,
     r"unknown positional encoding 'nope'"),
    ("encoder-pe-int", lambda: Encoder(8, 1, 2, pe=3), TypeError,
     r"pe must be a registry name or a PositionalEncoding, got int"),
    ("encoder-ffn-zero", lambda: Encoder(8, 1, 2, ffn_dim=0), ValueError,
     r"ffn_dim must be >= 1, got 0"),
    ("encoder-dropout-nan", lambda: Encoder(8, 1, 2, dropout=NAN), ValueError,
     r"dropout must be in \[0, 1\), got nan"),
    ("encoder-activation", lambda: Encoder(8, 1, 2, activation="tanh"), ValueError,
     r"activation must be 'relu' or 'gelu', got 'tanh'"),
    ("encoder-pe-head-dim", lambda: Encoder(8, 1, 2, pe=RotaryEmbedding(8)), ValueError,
     r"pe=RotaryEmbedding has head_dim=8 but attention has head_dim=4"),
    ("encoder-norm-first-str", lambda: Encoder(8, 1, 2, norm_first="no"), TypeError,
     r"norm_first must be a bool, got str \('no'\)"),
    ("encoder-causal-int", lambda: Encoder(8, 1, 2, causal=1), TypeError,
     r"causal must be a bool, got int \(1\)"),
    ("encoder-pe-kwargs-list", lambda: Encoder(8, 1, 2, pe="rope", pe_kwargs=[1]), TypeError,
     r"pe_kwargs must be a dict or None, got list"),
    ("encoder-pe-kwargs-module", lambda: Encoder(8, 1, 2, pe=ALiBi(2), pe_kwargs={"a": 1}),
     TypeError, r"pe_kwargs apply only when pe is a registry name"),
    ("encoder-learned-too-long",
     lambda: Encoder(8, 1, 2, pe="learned", pe_kwargs={"max_len": 4})(X), ValueError,
     r"input has 5 positions but the learned table has max_len=4"),
    ("encoder-positions-negative", lambda: Encoder(8, 1, 2)(X, positions=torch.arange(-2, 3)),
     ValueError, r"positions must be >= 0, got a minimum of -2"),
    ("encoder-alibi-positions-inf",
     lambda: Encoder(8, 1, 2, pe="alibi")(X, positions=FRAC_INF), ValueError,
     r"positions must be finite, got inf"),
    ("model-vocab-zero", lambda: TransformerModel(0, 8, 1, 2), ValueError,
     r"vocab_size must be >= 1, got 0"),
    ("model-dim-zero", lambda: TransformerModel(10, 0, 1, 2), ValueError,
     r"dim must be >= 1, got 0"),
    ("model-padding-idx", lambda: TransformerModel(10, 8, 1, 2, padding_idx=20), ValueError,
     r"padding_idx must be in \[-10, 10\), got 20"),
    ("model-num-outputs-zero", lambda: TransformerModel(10, 8, 1, 2, num_outputs=0),
     ValueError, r"num_outputs must be >= 1, got 0"),
    ("model-tokens-float", lambda: TransformerModel(10, 8, 1, 2)(torch.zeros(2, 3)), TypeError,
     r"tokens must be an int64 or int32 tensor"),
    ("model-tokens-range",
     lambda: TransformerModel(10, 8, 1, 2)(torch.full((2, 3), 10)), ValueError,
     r"token ids must be in \[0, 10\), got range \[10, 10\]"),
    ("ffn-hidden-zero", lambda: FeedForward(8, 0), ValueError, r"hidden must be >= 1, got 0"),
    ("layer-norm-first-str", lambda: EncoderLayer(8, 2, norm_first="yes"), TypeError,
     r"norm_first must be a bool, got str \('yes'\)"),
    # absurd sizes: refused before allocating, naming the argument, its value and the bytes
    ("size-table", lambda: posenc.sinusoidal_table(10**9, 64), MemoryBudgetError,
     r"num_positions x dim=1000000000 x 64 would need [\d.]+ [KMGTP]iB"),
    ("size-sinusoidal-dim", lambda: SinusoidalPositionalEncoding(10**9), MemoryBudgetError,
     r"max_len x dim=2048 x 1000000000 would need [\d.]+ [KMGTP]iB"),
    ("size-sinusoidal-max-len", lambda: SinusoidalPositionalEncoding(64, max_len=10**9),
     MemoryBudgetError, r"max_len x dim=1000000000 x 64 would need [\d.]+ [KMGTP]iB"),
    ("size-learned", lambda: LearnedPositionalEncoding(64, max_len=10**10), MemoryBudgetError,
     r"max_len x dim=10000000000 x 64 would need [\d.]+ [KMGTP]iB"),
    ("size-nd-table", lambda: posenc.sinusoidal_nd_table((10**5, 10**5), 8),
     MemoryBudgetError, r"shape x dim=\(100000, 100000\) x 8 would need"),
    ("size-alibi-bias", lambda: ALiBi(8).bias(torch.arange(10**6), torch.arange(10**6)),
     MemoryBudgetError, r"q_positions x k_positions=1000000 x 1000000 .* would need"),
    ("size-t5-bias", lambda: T5RelativeBias(8).bias(torch.arange(10**6), torch.arange(10**6)),
     MemoryBudgetError, r"q_positions x k_positions=1000000 x 1000000 .* would need"),
    ("size-rope-head-dim", lambda: RotaryEmbedding(10**10), MemoryBudgetError,
     r"head_dim=10000000000 would need [\d.]+ [KMGTP]iB"),
    ("size-attention",
     lambda: posenc.scaled_dot_product_attention(*(torch.zeros(1, 10**5, 1),) * 3),
     MemoryBudgetError, r"q x k=100000 x 100000 .* would need [\d.]+ [KMGTP]iB"),
    ("size-encoder", lambda: Encoder(10**6, 2, 4), MemoryBudgetError,
     r"dim x depth x ffn_dim=1000000 x 2 x 4000000 would need [\d.]+ [KMGTP]iB"),
    ("size-model-vocab", lambda: TransformerModel(10**9, 64, 2, 4), MemoryBudgetError,
     r"vocab_size x dim=1000000000 x 64 would need [\d.]+ [KMGTP]iB"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("thunk", "error", "match"),
    [pytest.param(t, e, m, id=i) for i, t, e, m in API_CASES],
)
def test_api_misuse_raises_naming_argument_and_value(
    thunk: Callable[[], Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match) as info:
        thunk()
    # posenc's own class (so the command reports it as a caller's mistake), and a subclass of
    # the built-in error the table names (so library callers can catch that)
    assert isinstance(info.value, PosencError)
    assert isinstance(info.value, ValueError if error is MemoryBudgetError else error)


# --------------------------------------------------------------------------- CLI


class Ran(BaseException):
    """Raised by the stubs of heavy work: validation let the call through."""


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Replace the expensive bodies of the commands (training, benchmarks, the tour, the
    report, the analysis) by ``Ran``, and work in a temporary folder."""
    import posenc.analysis
    import posenc.bench.harness
    import posenc.lengthgen.train
    import posenc.report
    import posenc.tour

    def stop(*args: Any, **kwargs: Any) -> Any:
        raise Ran

    monkeypatch.setattr(posenc.lengthgen.train, "run_sweep", stop)
    monkeypatch.setattr(posenc.bench.harness, "environment", stop)
    monkeypatch.setattr(posenc.tour, "run_tour", stop)
    monkeypatch.setattr(posenc.report, "_tour_section", stop)
    monkeypatch.setattr(posenc.analysis, "analyze", stop)
    monkeypatch.chdir(tmp_path)
    yield tmp_path


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int | str, str]:
    """``main(argv)`` in-process: (exit status, or "ran" when the stubbed work was reached;
    stderr)."""
    try:
        status: int | str = main(argv)
    except Ran:
        status = "ran"
    captured = capsys.readouterr()
    return status, captured.err


CLI_CASES: list[tuple[list[str], str]] = [
    (["plot", "nosuch", "-o", "x.png"], r"unknown positional encoding 'nosuch'"),
    (
        ["plot", "sinusoidal", "--dim", "0", "-o", "x.png"],
        r"--dim: expected a positive integer, got 0",
    ),
    (
        ["plot", "sinusoidal", "--positions", "-3", "-o", "x.png"],
        r"--positions: expected a positive integer, got -3",
    ),
    (
        ["plot", "sinusoidal", "--positions", "100000000", "-o", "x.png"],
        r"--positions: expected at most 4096, got 100000000",
    ),
    (
        ["plot", "sinusoidal", "--dpi", "100000", "-o", "x.png"],
        r"--dpi: expected at most 1200, got 100000",
    ),
    (
        ["plot", "sinusoidal", "--heads", "x", "-o", "x.png"],
        r"--heads: expected a positive integer, got 'x'",
    ),
    (
        ["plot", "sinusoidal", "-o", "x.txt"],
        r"output must end in \.png, \.svg or \.pdf, got 'x\.txt'",
    ),
    (["plot", "sinusoidal", "-o", "/proc/posenc/x.png"], r"posenc: error: .*'/proc/posenc'"),
    (
        ["plot", "rope", "--dim", "30", "-o", "x.png"],
        r"num_heads \(4\) must divide dim \(30\) for rotary encoding 'rope'",
    ),
    (["plot", "alibi", "--kind", "dims", "-o", "x.png"], r"kind 'dims' does not apply to alibi"),
    (
        ["plot", "learned", "--positions", "3000", "-o", "x.png"],
        r"input has 3000 positions but the learned table has max_len=2048",
    ),
    (["analyze", "--length", "0"], r"--length: expected a positive integer, got 0"),
    (["analyze", "--length", "99999999999999999999999"], r"--length: expected at most 2048"),
    (["analyze", "--seed", "abc"], r"--seed: expected an integer seed, got 'abc'"),
    (["analyze", "--seed", "99999999999999999999999"], r"--seed: expected a seed in"),
    (["analyze", "bogus"], r"unknown positional encoding 'bogus'"),
    (["tour", "--format", "gif"], r"argument --format: invalid choice: 'gif'"),
    (["frobnicate"], r"invalid choice: 'frobnicate'"),
    ([], r"the following arguments are required: COMMAND"),
    (["bench", "nosuch"], r"unknown bench suite 'nosuch'"),
    (
        ["bench", "--output", "x.txt"],
        r"--output must be a markdown file ending in \.md, got 'x\.txt'",
    ),
    (["bench", "--repeats", "0"], r"--repeats must be a positive number, got '0'"),
    (
        ["bench", "--max-call-seconds", "nan"],
        r"--max-call-seconds must be a positive number, got 'nan'",
    ),
    (["report", "nosuch"], r"unknown positional encoding 'nosuch'"),
    (["lengthgen", "--steps", "0"], r"steps must be >= 1, got 0"),
    (["lengthgen", "--steps", "1e3"], r"--steps: invalid int value: '1e3'"),
    (["lengthgen", "--lr", "nan"], r"lr must be a finite number > 0, got nan"),
    (["lengthgen", "--weight-decay", "nan"], r"weight_decay must be a finite number >= 0, got nan"),
    (["lengthgen", "--grad-clip", "inf"], r"grad_clip must be a finite number >= 0, got inf"),
    (["lengthgen", "--warmup", "nan"], r"warmup is a fraction of the steps in \[0, 1\), got nan"),
    (["lengthgen", "--dropout", "nan"], r"dropout must be in \[0, 1\), got nan"),
    (["lengthgen", "--valid-threshold", "nan"], r"valid_threshold must be in \(0, 1\], got nan"),
    (["lengthgen", "--pe", "nosuch"], r"unknown positional encoding 'nosuch'"),
    (
        ["lengthgen", "--pe", "rope+foo"],
        r"pe 'rope\+foo': the only suffixes are '\+random', '\+coupled' and "
        r"'\+random\+coupled', got '\+foo'",
    ),
    (["lengthgen", "--pe", "rope2d"], r"pe 'rope2d' encodes 2-D coordinates"),
    (["lengthgen", "--task", "nosuch"], r"unknown task 'nosuch'"),
    (
        ["lengthgen", "--seeds", "100000000"],
        r"seeds must be a count >= 1 \(at most 1000\) or a list, got 100000000",
    ),
    (
        ["lengthgen", "--seeds", "5000000000,1"],
        r"seeds must be at most 1000 ints below 2\*\*32, got '5000000000,1'",
    ),
    (["lengthgen", "--jobs", "x"], r"jobs must be an int >= 1 or 'auto', got 'x'"),
    (
        ["lengthgen", "--train-lengths", "5-1"],
        r"--train-lengths must be A-B with 1 <= A <= B, got '5-1'",
    ),
    (["lengthgen", "--test-lengths", "21-100000"], r"test_max_length must be <= 4096 .*got 100000"),
    (
        ["lengthgen", "--pe-option", "rope"],
        r"--pe-option must look like NAME\.KEY=VALUE, got 'rope'",
    ),
    (
        ["lengthgen", "--pe", "rope", "--pe-option", "rope.foo=1"],
        r"pe 'rope' with options \{'foo': 1\}: .*'foo'",
    ),
    (
        ["lengthgen", "--pe", "alibi", "--pe-option", "alibi.causal=1"],
        r"pe 'alibi' with options \{'causal': 1\}: causal must be a bool, got int",
    ),
    (
        ["lengthgen", "--pe", "rope", "--pe-option", "rope.rotary_dim=3"],
        r"rotary_dim \(3\) must be divisible by 2",
    ),
    (
        ["lengthgen", "--pe", "rope", "--dim", "12", "--heads", "4"],
        r"pe 'rope' at dim=12, heads=4: head_dim \(3\) must be divisible by 2",
    ),
    (
        ["lengthgen", "--pe", "learned", "--pe-option", "learned.max_len=8"],
        r"encoding 'learned' cannot handle the test sequences: its table holds max_len=8",
    ),
    (["lengthgen", "--threads", "-1"], r"--threads must be >= 0, got -1"),
    (["lengthgen", "--config", "missing.toml"], r"--config: 'missing\.toml' is not a file"),
]


@pytest.mark.parametrize(
    ("argv", "match"), [pytest.param(a, m, id=" ".join(a)) for a, m in CLI_CASES]
)
def test_cli_bad_arguments_exit_2_with_one_line(
    argv: list[str], match: str, stubbed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import re

    status, err = run_main(argv, capsys)
    assert status == 2, (status, err)  # in particular never "ran": no work before the error
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert re.search(match, lines[0]), lines[0]


#: The subprocess imports the posenc this test imported, whatever the working folder.
SUBPROCESS_ENV = {**os.environ, "PYTHONPATH": str(Path(posenc.__file__).resolve().parents[1])}


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        ["plot", "sinusoidal", "--dpi", "100000", "-o", "x.png"],
        ["analyze", "--length", "99999999999999999999999"],
        ["lengthgen", "--weight-decay", "nan", "--steps", "1"],
        ["plot", "sinusoidal", "-o", "/proc/posenc/x.png"],
    ],
)
def test_cli_subprocess_exit_2_one_line(argv: list[str], tmp_path: Path) -> None:
    """The console script itself (``python -m posenc.cli``), for the cases that used to end
    in a traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "posenc.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=SUBPROCESS_ENV,
    )
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "lengthgen-results").exists()


@pytest.mark.slow
def test_lengthgen_module_entry_point_one_line(tmp_path: Path) -> None:
    """``python -m posenc.lengthgen`` (the torchrun entry point) used to print argparse's
    usage block; a bad argument is now one line and status 2, as for ``posenc``."""
    done = subprocess.run(
        [sys.executable, "-m", "posenc.lengthgen", "--steps", "many"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=SUBPROCESS_ENV,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--steps: invalid int value: 'many'" in lines[0], done.stderr


def test_help_and_version_return_0_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("posenc ")
    assert main(["plot", "--help"]) == 0
    assert "--positions" in capsys.readouterr().out


# --------------------------------------------------------------------------- CLI fuzzing

GARBAGE = st.sampled_from(
    ["", "0", "-1", "1", "3", "16", "x", "nan", "inf", "-inf", "1e3", "2.5", "99999999999999999999",
     "4097", "--", "-", "a,b", "1-2", "5-1", "rope", "alibi", "none+random", "\x00", "é", " "]
)  # fmt: skip
NAMES = st.sampled_from([*posenc.available(), "nosuch", ""])
FLAG_VALUES: dict[str, list[st.SearchStrategy[str]]] = {
    "plot": [
        st.just("--kind"), st.sampled_from(["heatmap", "dims", "similarity", "distance", "heads",
                                            "spectrum", "decay", "grid", "bars"]),
        st.just("--positions"), st.sampled_from(["1", "8", "0", "-2", "4097", "x"]),
        st.just("--dim"), st.sampled_from(["1", "7", "12", "24", "0", "x"]),
        st.just("--heads"), st.sampled_from(["1", "2", "3", "0"]),
        st.just("--dpi"), st.sampled_from(["10", "20", "0", "5000"]),
        st.just("-o"), st.sampled_from(["x.png", "x.svg", "x.txt", "", "sub/x.png",
                                        "/proc/posenc/x.png"]),
    ],
    "analyze": [st.just("--length"), GARBAGE, st.just("--seed"), GARBAGE, st.just("--json")],
    "lengthgen": [
        st.sampled_from(["--steps", "--batch-size", "--lr", "--weight-decay", "--warmup",
                         "--grad-clip", "--dim", "--depth", "--heads", "--ffn-dim", "--dropout",
                         "--random-max", "--eval-every", "--test-samples", "--seeds", "--jobs",
                         "--train-lengths", "--test-lengths", "--pe", "--task", "--pe-option",
                         "--threads", "--decay", "--valid-threshold", "--out"]),
        GARBAGE,
    ],
    "bench": [st.sampled_from(["--repeats", "--threads", "--max-call-seconds", "--output"]),
              GARBAGE],
    "tour": [st.sampled_from(["--format", "--out"]), st.sampled_from(["png", "svg", "gif", ""])],
    "report": [st.sampled_from(["-o", "--results"]), GARBAGE],
    "list": [GARBAGE],
}  # fmt: skip


ONE_D = [n for n in posenc.available() if posenc.entry(n).cls.axes == 1]
#: A valid call of each command (cheap: plots are small, heavy work is stubbed).
VALID: dict[str, Callable[[str], list[str]]] = {
    "plot": lambda name: ["plot", name, "--positions", "8", "--dpi", "20", "-o", "fuzz.png"],
    "analyze": lambda name: ["analyze", name, "--length", "4", "--json"],
    "lengthgen": lambda name: ["lengthgen", "--pe", name, "--steps", "1", "--no-progress"],
    "list": lambda name: ["list"],
    "bench": lambda name: ["bench", "--quick", "rope"],
    "tour": lambda name: ["tour", "--out", "tour"],
    "report": lambda name: ["report", name, "-o", "report.html"],
}


@st.composite
def argvs(draw: st.DrawFn) -> list[str]:
    """A third valid calls, a third valid calls with one token replaced or one flag and value
    inserted, a third flags and values drawn at random."""
    mode = draw(st.sampled_from(["valid", "mutated", "random"]))
    command = draw(st.sampled_from(sorted(VALID)))
    if mode != "random":
        name = draw(st.sampled_from(ONE_D if command == "lengthgen" else posenc.available()))
        argv = VALID[command](name)
        if mode == "mutated":
            pieces = FLAG_VALUES[command]
            if draw(st.booleans()):
                argv[draw(st.integers(0, len(argv) - 1))] = draw(st.one_of(GARBAGE, *pieces))
            else:
                where = draw(st.integers(1, len(argv)))
                argv[where:where] = [draw(st.one_of(*pieces)), draw(GARBAGE)]
        return argv
    command = draw(st.sampled_from([*FLAG_VALUES, "frobnicate", "--version", ""]))
    argv = [command] if command else []
    if command in ("plot", "analyze", "report"):
        argv += draw(st.lists(NAMES, max_size=2))
    pieces = FLAG_VALUES.get(command, [GARBAGE])
    for _ in range(draw(st.integers(0, 4))):
        argv.append(draw(st.one_of(*pieces)))
    return argv


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(argv=argvs())
def test_fuzz_cli_arguments(
    argv: list[str], stubbed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Any argv: status 0 (or the stubbed work reached) or 2, and on 2 exactly one line on
    stderr; never a traceback."""
    status, err = run_main(argv, capsys)
    event(f"{argv[0] if argv else '(none)'}: status {status}")
    assert status in (0, 2, "ran"), (argv, status, err)
    assert "Traceback" not in err, (argv, err)
    if status == 2:
        assert len(err.strip().splitlines()) == 1, (argv, err)


# --------------------------------------------------------------------------- TOML fuzzing


def _toml_value(value: Any) -> str:
    """A minimal TOML writer for the values the fuzzer makes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f'"{k}" = {_toml_value(v)}' for k, v in value.items()) + "}"
    raise TypeError(value)


SCALARS = st.one_of(
    st.booleans(),
    st.integers(-3, 50),
    st.sampled_from([0, 10**9, 2**40]),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from(["", "none", "rope", "alibi,t5", "rope+random", "copy-v1", "auto", "x"]),
)
VALUES = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=3),
    st.dictionaries(st.sampled_from(["rope", "t5", "x"]),
                    st.dictionaries(st.sampled_from(["rotary_dim", "max_len", "causal", "bad"]),
                                    SCALARS, max_size=2), max_size=2),
)  # fmt: skip
KEYS = st.sampled_from(
    ["task", "pe", "seeds", "jobs", "out", "pe_options", "steps", "batch_size", "lr", "dim",
     "heads", "depth", "dropout", "warmup", "grad_clip", "weight_decay", "decay",
     "train_min_length", "train_max_length", "test_min_length", "test_max_length",
     "random_max", "eval_every", "valid_threshold", "seed", "random_positions", "bogus"]
)  # fmt: skip


@settings(
    max_examples=examples(120),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    base=st.booleans(),
    changes=st.dictionaries(KEYS, VALUES, max_size=4),
)
# found by fuzzing: a width of 10^9 reached the allocator instead of a one-line error
@example(base=True, changes={"dim": 10**9})
@example(base=True, changes={"dim": 2**40, "pe": "learned"})
@example(base=True, changes={"test_max_length": 2**40})
@example(base=True, changes={"batch_size": 10**9, "train_max_length": 50})
def test_fuzz_lengthgen_toml_config(
    base: bool, changes: dict[str, Any], stubbed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Any TOML settings file (a valid sweep with some keys changed, or only drawn keys):
    either every run validates (and the stubbed sweep is reached) or one line and status 2;
    never a traceback, never a run started on a bad value."""
    valid = {"task": "copy-v1", "pe": ["none", "alibi"], "seeds": 2, "steps": 1, "dim": 16}
    config = {**(valid if base else {}), **changes}
    path = stubbed / "sweep.toml"
    text = "\n".join(f"{key} = {_toml_value(value)}" for key, value in config.items())
    path.write_text(text + "\n", encoding="utf-8")
    status, err = run_main(["lengthgen", "--config", str(path), "--no-progress"], capsys)
    event(f"status {status}")
    assert status in (2, "ran"), (text, status, err)
    assert "Traceback" not in err, (text, err)
    if status == 2:
        assert len(err.strip().splitlines()) == 1, (text, err)
    else:  # everything validated: no value that must be rejected got through
        for key in ("lr", "dropout", "warmup", "grad_clip", "weight_decay", "valid_threshold"):
            value = config.get(key)
            assert not (isinstance(value, float) and not math.isfinite(value)), (key, value)


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(text=st.text(max_size=60))
def test_fuzz_lengthgen_toml_text(
    text: str, stubbed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Arbitrary text as a settings file: invalid TOML is one line naming the file."""
    path = stubbed / "sweep.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    status, err = run_main(["lengthgen", "--config", str(path)], capsys)
    assert status in (2, "ran"), (text, status, err)
    assert "Traceback" not in err
    if status == 2:
        assert len(err.strip().splitlines()) == 1, (text, err)
