"""The RoPE conformance cases, as data (``posenc conformance``; :mod:`posenc.app.conformance`
writes them).

Each :class:`ConformanceCase` is a Hugging Face-style ``rope_parameters`` dictionary, the head
size, ``max_position_embeddings``, the positions the table is for, and one line on what
runtimes get wrong there. :func:`conformance_cases` lists them: every built-in rope type at a
plain setting, then the edges (LongRoPE and dynamic NTK at and one past the original context,
YaRN's attention factor and ``mscale``, Gemma 3's two tables, partial rotary, the interleaved
layout, HunYuan's ``ntk_alpha`` and multimodal RoPE).

A case's table, with ``inv_freq`` from :meth:`RotarySpec.frequencies
<posenc.encodings.rotary.spec.RotarySpec.frequencies>` (float64) and its attention factor ``a``::

    cos[j, i] = a * cos(positions[j] * inv_freq[i])      (n, r/2), float64
    sin[j, i] = a * sin(positions[j] * inv_freq[i])

(the factor folded in, as transformers' rotary modules return them). A type whose frequencies
follow the length (dynamic NTK, LongRoPE) uses ``seq_len = max(positions) + 1``, the length
transformers' ``dynamic_rope_update`` reads from ``position_ids``. With multimodal RoPE the
positions are ``(3, n)`` (temporal, height, width) and pair ``i`` turns with the row its
``mrope_section`` band names. Checked against transformers' rotary modules and
``ROPE_INIT_FUNCTIONS``, and against a float64 transcription of each formula, in
``tests/app/test_conformance.py``.

Dimension legend: ``n`` positions, ``d`` head dim, ``r`` rotary dim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..encodings.rotary.spec import RotarySpec
from ..errors import PosencValueError
from ..hf.model_types import CHECKED_TRANSFORMERS_VERSION

__all__ = ["ConformanceCase", "conformance_cases"]

#: What a case of a type transformers lacks is checked against.
_NOT_IN_TRANSFORMERS = "the float64 formula (not a transformers rope_type)"


@dataclass(frozen=True)
class ConformanceCase:
    """One table: the settings a runtime is configured with and the positions it is asked for.

    Attributes:
        name: the file stem and ``--cases`` name.
        rope_parameters: the Hugging Face ``rope_parameters`` dictionary (``rope_theta``
            included); nested by layer type for per-layer models (Gemma 3).
        head_dim: channels per head ``d`` (the rotary dim ``r`` follows from
            ``partial_rotary_factor``).
        max_position_embeddings: the config's context length.
        positions: the positions of the table's rows, ``(n,)``, or ``(3, n)`` rows of
            temporal, height and width positions for multimodal RoPE.
        note: what runtimes get wrong here, in one line.
        hf_reference: the transformers rotary module (or function) it is checked against
            (``None``: a type transformers lacks; the formula is checked instead).
        layer_type: the entry of a per-layer ``rope_parameters`` this table is for.
        layout: ``"half"`` (pair ``i`` is channels ``i, i + r/2``) or ``"interleaved"``
            (``2i, 2i + 1``); the table is the same, only the pairing differs.
    """

    name: str
    rope_parameters: Mapping[str, Any]
    head_dim: int
    max_position_embeddings: int
    positions: tuple[int, ...] | tuple[tuple[int, ...], ...]
    note: str
    hf_reference: str | None = "LlamaRotaryEmbedding"
    layer_type: str | None = None
    layout: str = "half"

    def _own(self) -> Mapping[str, Any]:
        """This table's entry of ``rope_parameters`` (the whole of it unless per layer)."""
        params = self.rope_parameters
        return params[self.layer_type] if self.layer_type is not None else params

    def scaling(self) -> dict[str, Any]:
        """This table's own dictionary, without ``mrope_section`` (read by :meth:`tables`)."""
        return {k: v for k, v in self._own().items() if k != "mrope_section"}

    @property
    def mrope_section(self) -> tuple[int, ...] | None:
        """The pairs turned by the temporal, height and width positions, or ``None``."""
        section = self._own().get("mrope_section")
        return None if section is None else tuple(int(s) for s in section)

    def spec(self) -> RotarySpec:
        """The checked settings (:meth:`RotarySpec.build`), as a RotaryEmbedding would hold them."""
        return RotarySpec.build(
            self.head_dim,
            scaling=self.scaling(),
            interleaved=self.layout == "interleaved",
            max_position_embeddings=self.max_position_embeddings,
        )

    def seq_len(self) -> int:
        """``max(positions) + 1``: the length a length-dependent type's frequencies are for."""
        return int(torch.tensor(self.positions).max()) + 1

    def tables(self) -> dict[str, Tensor]:
        """``inv_freq (r/2,)``, ``cos``/``sin (n, r/2)`` (attention factor folded in),
        ``attention_factor ()`` in float64, and ``positions`` in int64."""
        spec = self.spec()
        length = self.seq_len() if spec.record.uses_length else None
        inv_freq, factor = spec.frequencies(length)  # (r/2,) float64
        positions = torch.tensor(self.positions, dtype=torch.int64)  # (n,) or (3, n)
        angles = positions.to(torch.float64)[..., None] * inv_freq  # (n, r/2) or (3, n, r/2)
        section = self.mrope_section
        if section is not None:
            if positions.dim() != 2 or positions.shape[0] != len(section):
                raise PosencValueError(
                    f"case {self.name!r}: multimodal positions must be ({len(section)}, n), "
                    f"got {tuple(positions.shape)}"
                )
            if sum(section) != inv_freq.numel():
                raise PosencValueError(
                    f"case {self.name!r}: mrope_section {list(section)} must sum to "
                    f"rotary_dim / 2 = {inv_freq.numel()}"
                )
            # pair i turns with the position row of the band it falls in
            axis = torch.repeat_interleave(torch.arange(len(section)), torch.tensor(section))
            pairs = torch.arange(inv_freq.numel())
            angles = angles.permute(1, 2, 0)[:, pairs, axis]  # (3, n, r/2) -> (n, r/2)
        elif positions.dim() != 1:
            raise PosencValueError(
                f"case {self.name!r}: positions must be (n,), got {tuple(positions.shape)}"
            )
        return {
            "inv_freq": inv_freq.contiguous(),
            "cos": (factor * torch.cos(angles)).contiguous(),
            "sin": (factor * torch.sin(angles)).contiguous(),
            "attention_factor": torch.tensor(float(factor), dtype=torch.float64),
            "positions": positions,
        }

    def entry(self, tables: Mapping[str, Tensor]) -> dict[str, Any]:
        """The case's record in ``index.json`` (without its file and hash)."""
        spec = self.spec()
        return {
            "rope_type": spec.rope_type,
            "rope_parameters": _plain(self.rope_parameters),
            "layer_type": self.layer_type,
            "mrope_section": None if self.mrope_section is None else list(self.mrope_section),
            "layout": self.layout,
            "head_dim": self.head_dim,
            "rotary_dim": spec.rotary_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "positions": _plain(self.positions),
            "seq_len": self.seq_len(),
            "length_dependent": spec.record.uses_length,
            "attention_factor": float(tables["attention_factor"]),
            "attention_factor_folded": True,
            "checked_against": (
                f"transformers {CHECKED_TRANSFORMERS_VERSION} {self.hf_reference}"
                if self.hf_reference
                else _NOT_IN_TRANSFORMERS
            ),
            "note": self.note,
        }


def _plain(value: Any) -> Any:
    """``value`` with tuples and read-only mappings as JSON lists and dicts."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _around(*far: int) -> tuple[int, ...]:
    """Positions 0..15, then ``far`` (the places a context boundary or float32 shows)."""
    return (*range(16), *far)


# --------------------------------------------------------------------------- the cases

_LONGROPE_PAIRS = 48  # Phi-3-mini: head 96
_LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "original_max_position_embeddings": 4096,
    # smooth made-up factors of Phi-3's shape: near 1 for short, growing for long
    "short_factor": [round(1.0 + 0.01 * i, 4) for i in range(_LONGROPE_PAIRS)],
    "long_factor": [round(1.0 + 0.9 * i, 4) for i in range(_LONGROPE_PAIRS)],
}
_YARN_DEEPSEEK = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32,
    "beta_slow": 1,
}
_GEMMA3 = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
}

# Each built-in rope type at a plain setting (registry order), its edges beside it, then the
# cases of layout and per-layer parameters.
_CASES: tuple[ConformanceCase, ...] = (
    ConformanceCase(
        "default",
        {"rope_type": "default", "rope_theta": 10000.0},
        128,
        4096,
        _around(1000, 4095),
        "plain RoPE, θ_i = base^(-2i/d): the reference the other cases depart from",
    ),
    ConformanceCase(
        "linear",
        {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
        128,
        16384,
        _around(4095, 16383),
        "position interpolation: every frequency divided by factor (a runtime dividing integer "
        "positions instead must not round them)",
    ),
    ConformanceCase(
        "ntk",
        {"rope_type": "ntk", "factor": 4.0, "rope_theta": 10000.0},
        128,
        8192,
        _around(2047, 8191),
        "NTK-aware base·factor^(d/(d-2)), fixed; not a transformers rope_type "
        "(rotary-embedding-torch's theta_rescale_factor)",
        hf_reference=None,
    ),
    ConformanceCase(
        "dynamic_at_original",
        {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
        128,
        2048,
        _around(2047),
        "seq_len = max_position_embeddings: still the default frequencies; a runtime that "
        "fixes the scaled base once (a 'dynamic' that is static) differs here",
    ),
    ConformanceCase(
        "dynamic_past_original",
        {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
        128,
        2048,
        _around(2048),
        "one past: base·(factor·L/L0 - (factor-1))^(d/(d-2)) with L = max position + 1 = 2049, "
        "L0 = max_position_embeddings, for every position of the sequence",
    ),
    ConformanceCase(
        "yarn",
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
            "rope_theta": 1000000.0,
        },
        128,
        131072,
        _around(32767, 32768, 131071),
        "attention factor 0.1·ln(factor) + 1 scales cos and sin once (squaring it, or also the "
        "softmax, is the bug); ramp bounds floor/ceil'd (truncate defaults to true)",
    ),
    ConformanceCase(
        "yarn_no_truncate",
        {
            "rope_type": "yarn",
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "rope_theta": 150000.0,
        },
        64,
        131072,
        _around(4095, 4096, 131071),
        "truncate: false (gpt-oss) keeps the ramp bounds fractional; always flooring/ceiling "
        "them changes the blended middle frequencies",
    ),
    ConformanceCase(
        "yarn_attention_factor",
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 8192,
            "attention_factor": 1.0,
            "rope_theta": 1000000.0,
        },
        128,
        65536,
        _around(8191, 65535),
        "an explicit attention_factor replaces 0.1·ln(factor) + 1 (here 1.0: no temperature)",
    ),
    ConformanceCase(
        "yarn_mscale",
        {**_YARN_DEEPSEEK, "mscale": 1.0, "mscale_all_dim": 1.0},
        64,
        163840,
        _around(4095, 4096, 163839),
        "mscale = mscale_all_dim (DeepSeek-V3): cos/sin take their ratio, 1.0; DeepSeek puts "
        "mscale² on the softmax scale, so also folding mscale into cos/sin squares it",
    ),
    ConformanceCase(
        "yarn_mscale_ratio",
        {**_YARN_DEEPSEEK, "mscale": 1.0, "mscale_all_dim": 0.8},
        64,
        163840,
        _around(4096, 163839),
        "the factor is mscale(f, mscale) / mscale(f, mscale_all_dim), mscale(f, m) = "
        "0.1·m·ln f + 1: neither term alone",
    ),
    ConformanceCase(
        "longrope_at_original",
        {**_LONGROPE, "factor": 32.0},
        96,
        131072,
        _around(4095),
        "seq_len = original (max position 4095): still short_factor; transformers switches "
        "when seq_len > original, not >=",
    ),
    ConformanceCase(
        "longrope_past_original",
        {**_LONGROPE, "factor": 32.0},
        96,
        131072,
        _around(4096),
        "seq_len = original + 1: long_factor for every position of the sequence, the early ones "
        "too; attention factor sqrt(1 + ln(factor)/ln(original)) on both sides",
    ),
    ConformanceCase(
        "llama3",
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_theta": 500000.0,
        },
        128,
        131072,
        _around(8191, 8192, 131071),
        "long wavelengths (> original/low_freq_factor) divided by factor, short ones kept, the "
        "band between blended; the band's edges are inclusive",
    ),
    ConformanceCase(
        "proportional",
        {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        256,
        131072,
        _around(8191, 131071),
        "p-RoPE (Gemma 4 global layers): the first int(p·d/2) frequencies with exponent over the "
        "whole head d, the rest exactly 0; not partial rotary (exponent over r)",
    ),
    ConformanceCase(
        "gemma3_sliding_attention",
        _GEMMA3,
        256,
        131072,
        _around(1023, 131071),
        "Gemma 3 has two tables: sliding layers keep θ = 10000 unscaled; using the "
        "full-attention parameters here (or a model-wide rope_scaling) is the bug",
        hf_reference="Gemma3RotaryEmbedding",
        layer_type="sliding_attention",
    ),
    ConformanceCase(
        "gemma3_full_attention",
        _GEMMA3,
        256,
        131072,
        _around(1023, 131071),
        "Gemma 3's full-attention layers: θ = 1e6 and linear factor 8, their own entry",
        hf_reference="Gemma3RotaryEmbedding",
        layer_type="full_attention",
    ),
    ConformanceCase(
        "partial_rotary",
        {"rope_type": "default", "partial_rotary_factor": 0.4, "rope_theta": 10000.0},
        80,
        2048,
        _around(2047),
        "Phi-2: r = int(d·0.4) = 32 channels rotate, the exponent's denominator is r, not d; "
        "the other 48 channels pass through",
        hf_reference="PhiRotaryEmbedding",
    ),
    ConformanceCase(
        "interleaved",
        {"rope_type": "default", "partial_rotary_factor": 0.25, "rope_theta": 10000.0},
        256,
        2048,
        _around(2047),
        "GPT-J: the same table, but pair i is channels (2i, 2i+1), not (i, i + r/2); r = 64 of 256",
        hf_reference="GPT-J create_sinusoidal_positions",
        layout="interleaved",
    ),
)

#: HunYuan's NTK-α (``rope_type="ntk_alpha"``).
_NTK_ALPHA = ConformanceCase(
    "ntk_alpha",
    {"rope_type": "ntk_alpha", "alpha": 1000.0, "rope_theta": 10000.0},
    128,
    32768,
    _around(32767),
    "HunYuan's NTK-α: base·alpha^(d/(d-2)), fixed; checkpoints say rope_type 'dynamic' with "
    "an 'alpha', but the frequencies do not follow the length",
    hf_reference="HunYuanDenseV1RotaryEmbedding",
)

#: Qwen2-VL's multimodal RoPE: four
#: text tokens, a 2 x 3 image grid at temporal position 4, then text again.
_MROPE = ConformanceCase(
    "mrope",
    {"rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 1000000.0},
    128,
    32768,
    (
        (0, 1, 2, 3, 4, 4, 4, 4, 4, 4, 7, 8, 9),  # temporal
        (0, 1, 2, 3, 4, 4, 4, 5, 5, 5, 7, 8, 9),  # height
        (0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 8, 9),  # width
    ),
    "mrope_section counts pairs (16 + 24 + 24 = r/2), not channels: pairs 0-15 turn with the "
    "temporal row, 16-39 with height, 40-63 with width; text tokens have t = h = w",
    hf_reference="Qwen2VLRotaryEmbedding",
)


def conformance_cases() -> list[ConformanceCase]:
    """Every case: each built-in rope type at a plain setting with its edges (``ntk_alpha``
    after ``ntk``), then the cases of per-layer parameters and layout, ``mrope`` last. A
    registered type without a case is caught by ``tests/app/test_conformance.py``.

    >>> [case.name for case in conformance_cases()][:4]
    ['default', 'linear', 'ntk', 'ntk_alpha']
    """
    found = list(_CASES)
    found.insert([case.name for case in found].index("ntk") + 1, _NTK_ALPHA)
    found.append(_MROPE)
    return found
