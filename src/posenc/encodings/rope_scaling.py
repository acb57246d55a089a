"""RoPE context extension: the Hugging Face ``rope_type`` registry as pure functions.

Every function has one signature,

    fn(dim, base, params, *, max_position_embeddings=None, seq_len=None)
        -> (inv_freq: float64 Tensor[dim // 2], attention_factor: float)

and reproduces the function of the same ``rope_type`` in transformers'
``modeling_rope_utils`` (checked against transformers 5.23,
``tests/encodings/test_rope_scaling.py``), computed in float64 instead of float32.
``params`` is the Hugging Face ``rope_scaling`` /
``rope_parameters`` dictionary; ``dim`` is the rotary dimension (``head_dim *
partial_rotary_factor``). The attention factor multiplies cos and sin, as Hugging Face
applies it.

=========  ==============================================================================
rope_type  what it does to ``inv_freq[i] = base^(-2i/dim)``
=========  ==============================================================================
default    nothing (Su et al. 2021, RoFormer, eq. 15)
linear     divides every frequency by ``factor`` (position interpolation, Chen et al. 2023)
ntk        NTK-aware base scaling ``base * factor^(dim/(dim-2))`` (bloc97 2023; not an HF
           type; rotary-embedding-torch's ``theta_rescale_factor``)
dynamic    NTK scaling whose factor follows the sequence length (emozilla 2023):
           ``base * (factor * L / L0 - (factor - 1))^(dim/(dim-2))`` for ``L > L0``, where
           ``L0`` is ``original_max_position_embeddings`` (from the dictionary, else
           ``max_position_embeddings``, which is all transformers reads)
yarn       per-frequency blend of interpolation and extrapolation by a linear ramp between
           the dimensions that turn ``beta_fast`` and ``beta_slow`` times over the original
           context, plus the attention factor ``0.1 ln(factor) + 1`` (Peng et al. 2023, §3.4)
longrope   per-frequency factors: ``short_factor`` up to the original context,
           ``long_factor`` beyond it; attention factor ``sqrt(1 + ln f / ln L0)``
           (Ding et al. 2024, LongRoPE; Phi-3)
llama3     keep high frequencies, divide low ones by ``factor``, smooth in between
           (Meta 2024, Llama 3.1)
=========  ==============================================================================

Unlike Hugging Face, which logs a warning and carries on, invalid parameters (a
non-positive factor, a missing key, factor lists of the wrong length, ...) raise
``ValueError``/``TypeError`` naming the key and the value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch
from torch import Tensor

from ..errors import PosencTypeError, PosencValueError
from .base import check_positive_float, check_positive_int

__all__ = [
    "ROPE_TYPES",
    "RopeInitFunction",
    "default_inv_freq",
    "rope_parameters",
    "rope_type_keys",
    "validate_rope_scaling",
]


class RopeInitFunction(Protocol):
    def __call__(
        self,
        dim: int,
        base: float,
        params: Mapping[str, Any],
        *,
        max_position_embeddings: int | None = None,
        seq_len: float | None = None,
    ) -> tuple[Tensor, float]: ...


def default_inv_freq(dim: int, base: float, *, device: Any = None) -> Tensor:
    """``base^(-2i/dim)`` for ``i = 0 .. dim/2 - 1`` in float64 (RoFormer eq. 15)."""
    exponent = torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim  # (dim/2,)
    return base**-exponent


# --------------------------------------------------------------------------- the functions


def _default(
    dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    max_position_embeddings: int | None = None,
    seq_len: float | None = None,
) -> tuple[Tensor, float]:
    return default_inv_freq(dim, base), 1.0


def _linear(
    dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    max_position_embeddings: int | None = None,
    seq_len: float | None = None,
) -> tuple[Tensor, float]:
    # Position interpolation: m -> m / factor, folded into the frequencies.
    return default_inv_freq(dim, base) / float(params["factor"]), 1.0


def _ntk(
    dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    max_position_embeddings: int | None = None,
    seq_len: float | None = None,
) -> tuple[Tensor, float]:
    scaled_base = base * float(params["factor"]) ** (dim / (dim - 2))
    return default_inv_freq(dim, scaled_base), 1.0


def _dynamic(
    dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    max_position_embeddings: int | None = None,
    seq_len: float | None = None,
) -> tuple[Tensor, float]:
    # the original context: the dictionary's, else max_position_embeddings (transformers
    # reads only the latter; validate_rope_scaling copies it into the dictionary)
    original = params.get("original_max_position_embeddings", max_position_embeddings)
    if original is None:
        raise PosencValueError(
            "rope_type 'dynamic' needs max_position_embeddings or "
            "scaling['original_max_position_embeddings']"
        )
    factor = float(params["factor"])
    length = original if seq_len is None else max(seq_len, original)
    stretch = factor * length / original - (factor - 1)
    return default_inv_freq(dim, base * stretch ** (dim / (dim - 2))), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``0.1 * mscale * ln(scale) + 1`` (Peng et al. 2023, eq. 22)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(
    dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    max_position_embeddings: int | None = None,
    seq_len: float | None = None,
) -> tuple[Tensor, float]:
    original = int(params["original_max_position_embeddings"])
    factor = params.get("factor")
    if factor is None:  # DeepSeek-V3 style: the ratio of the two context lengths
        factor = max_position_embeddings / original  # type: ignore[operator]
    factor = float(factor)

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    # A zero counts as unset, as in transformers (``get("beta_fast") or 32``).
    beta_fast = float(params.get("beta_fast") or 32)
    beta_slow = float(params.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        # The dimension index whose wavelength fits ``rotations`` times in the original
        # context (Peng et al. 2023, eq. 17 solved for d).
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid 0/0, as transformers does

    extrapolation = default_inv_freq(dim, base)  # (dim/2,) the original frequencies
    interpolation = extrapolation / factor
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    # ramp = 0: keep the original frequency (high frequencies); 1: interpolate (low ones)
    inv_freq = extrapolation * (1 - ramp) + interpolation * ramp
    return inv_freq, float(attention_factor)


def _longrope(
    dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    max_position_embeddings: int | None = None,
    seq_len: float | None = None,
) -> tuple[Tensor, float]:
    original = int(params["original_max_position_embeddings"])
    factor = params.get("factor")
    if factor is None:  # Phi-3 style: the ratio of the two context lengths
        factor = max_position_embeddings / original  # type: ignore[operator]
    factor = float(factor)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = (
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        )
    key = "long_factor" if seq_len and seq_len > original else "short_factor"
    ext = torch.tensor([float(f) for f in params[key]], dtype=torch.float64)
    return default_inv_freq(dim, base) / ext, float(attention_factor)


def _llama3(
    dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    max_position_embeddings: int | None = None,
    seq_len: float | None = None,
) -> tuple[Tensor, float]:
    factor = float(params["factor"])
    low_freq_factor = float(params["low_freq_factor"])
    high_freq_factor = float(params["high_freq_factor"])
    original = float(params["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = original / low_freq_factor, original / high_freq_factor

    inv_freq = default_inv_freq(dim, base)
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are interpolated, short ones kept, the band between blended smoothly
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled), 1.0


#: ``rope_type`` -> function computing ``(inv_freq, attention_factor)``.
ROPE_TYPES: dict[str, RopeInitFunction] = {
    "default": _default,
    "linear": _linear,
    "ntk": _ntk,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "longrope": _longrope,
    "llama3": _llama3,
}

# --------------------------------------------------------------------------- validation

_COMMON = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
_KEYS: dict[str, tuple[set[str], set[str]]] = {  # rope_type -> (required, optional)
    "default": (set(), set()),
    "linear": ({"factor"}, set()),
    "ntk": ({"factor"}, set()),
    "dynamic": ({"factor"}, {"original_max_position_embeddings"}),
    "yarn": (
        {"original_max_position_embeddings"},
        {
            "factor",
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "truncate",
        },
    ),
    "longrope": (
        {"short_factor", "long_factor", "original_max_position_embeddings"},
        {"factor", "attention_factor"},
    ),
    "llama3": (
        {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
        set(),
    ),
}


def rope_type_keys(rope_type: str) -> tuple[frozenset[str], frozenset[str]]:
    """The keys a ``rope_type``'s dictionary must have and those it may have, besides
    ``rope_type``, ``rope_theta`` and ``partial_rotary_factor``.

    >>> [sorted(keys) for keys in rope_type_keys("llama3")][0]
    ['factor', 'high_freq_factor', 'low_freq_factor', 'original_max_position_embeddings']
    """
    if rope_type not in ROPE_TYPES:
        raise PosencValueError(f"unknown rope_type {rope_type!r}; known: {', '.join(ROPE_TYPES)}")
    required, optional = _KEYS[rope_type]
    return frozenset(required), frozenset(optional)


def _number(key: str, value: object, *, positive: bool = True, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PosencTypeError(f"rope scaling {key!r} must be a number, got {value!r}")
    if not math.isfinite(value) or (positive and value <= 0):
        raise PosencValueError(f"rope scaling {key!r} must be a finite number > 0, got {value!r}")


def validate_rope_scaling(
    scaling: Mapping[str, Any] | None,
    *,
    rotary_dim: int,
    max_position_embeddings: int | None = None,
) -> dict[str, Any]:
    """Check a Hugging Face ``rope_scaling`` / ``rope_parameters`` dictionary and return a
    normalised copy (``"type"`` renamed ``"rope_type"``, a missing
    ``original_max_position_embeddings`` filled from ``max_position_embeddings`` as
    transformers does; for ``dynamic`` too, so that one dictionary shape, with the original
    context in it, serves ``dynamic`` and ``yarn``). ``None`` means ``{"rope_type": "default"}``.

    Raises ``ValueError``/``TypeError`` naming the offending key and value.
    """
    if scaling is None:
        return {"rope_type": "default"}
    if not isinstance(scaling, Mapping):
        raise PosencTypeError(f"scaling must be a dict or None, got {type(scaling).__name__}")
    params = dict(scaling)
    if "type" in params:
        legacy = params.pop("type")
        if params.setdefault("rope_type", legacy) != legacy:
            raise PosencValueError(
                f"scaling has type={legacy!r} and rope_type={params['rope_type']!r}"
            )
    rope_type = params.setdefault("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        raise PosencValueError(f"unknown rope_type {rope_type!r}; known: {', '.join(ROPE_TYPES)}")

    required, optional = _KEYS[rope_type]
    extended = ("dynamic", "yarn", "longrope", "llama3")
    if rope_type in extended and max_position_embeddings is not None:
        params.setdefault("original_max_position_embeddings", max_position_embeddings)
    unknown = set(params) - required - optional - _COMMON
    if unknown:
        allowed = ", ".join(sorted(required | optional | (_COMMON - {"type"})))
        raise PosencValueError(
            f"unknown key(s) {sorted(unknown)} for rope_type {rope_type!r}; allowed: {allowed}"
        )
    missing = required - set(params)
    if missing:
        raise PosencValueError(f"rope_type {rope_type!r} needs the key(s) {sorted(missing)}")

    for key in ("factor", "attention_factor", "mscale", "mscale_all_dim"):
        if key in params:
            _number(
                key, params[key], allow_none=key != "factor" or rope_type in ("yarn", "longrope")
            )
    for key in ("beta_fast", "beta_slow"):
        if key in params:
            _number(key, params[key], positive=False, allow_none=True)
    if "rope_theta" in params:
        _number("rope_theta", params["rope_theta"])
    if "original_max_position_embeddings" in params:
        value = params["original_max_position_embeddings"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PosencValueError(
                f"original_max_position_embeddings must be an int >= 1, got {value!r}"
            )

    if rope_type in ("ntk", "dynamic") and rotary_dim <= 2:
        raise PosencValueError(f"rope_type {rope_type!r} needs rotary_dim > 2, got {rotary_dim}")
    if rope_type == "dynamic" and "original_max_position_embeddings" not in params:
        raise PosencValueError(
            "rope_type 'dynamic' needs max_position_embeddings or "
            "scaling['original_max_position_embeddings'] (the original context)"
        )
    if rope_type in ("yarn", "longrope") and params.get("factor") is None:
        if max_position_embeddings is None:
            raise PosencValueError(
                f"rope_type {rope_type!r} without a factor needs max_position_embeddings "
                "(factor = max_position_embeddings / original_max_position_embeddings)"
            )
        implied = max_position_embeddings / params["original_max_position_embeddings"]
        _number("factor (max_position_embeddings / original_max_position_embeddings)", implied)
    if rope_type == "yarn":
        fast, slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1
        if fast < slow:
            raise PosencValueError(f"beta_fast ({fast}) must be >= beta_slow ({slow})")
        if not isinstance(params.get("truncate", True), bool):
            raise PosencTypeError(
                f"rope scaling 'truncate' must be a bool, got {params['truncate']!r}"
            )
    if rope_type == "llama3":
        for key in ("low_freq_factor", "high_freq_factor"):
            _number(key, params[key])
        if params["high_freq_factor"] <= params["low_freq_factor"]:
            raise PosencValueError(
                f"high_freq_factor ({params['high_freq_factor']}) must be > low_freq_factor "
                f"({params['low_freq_factor']})"
            )
    if rope_type == "longrope":
        for key in ("short_factor", "long_factor"):
            factors = params[key]
            if not isinstance(factors, (list, tuple)) or len(factors) != rotary_dim // 2:
                raise PosencValueError(
                    f"rope scaling {key!r} must be a list of rotary_dim // 2 = {rotary_dim // 2} "
                    f"numbers, got {factors!r}"
                )
            for i, value in enumerate(factors):
                _number(f"{key}[{i}]", value)
    return params


def rope_parameters(
    scaling: Mapping[str, Any] | None,
    dim: int,
    base: float,
    *,
    max_position_embeddings: int | None = None,
    seq_len: float | None = None,
) -> tuple[Tensor, float]:
    """Validate ``scaling`` and return ``(inv_freq float64 (dim/2,), attention_factor)``.

    ``seq_len`` is the current length (the largest position + 1): it matters only to
    ``dynamic`` (the base grows past ``max_position_embeddings``) and ``longrope`` (the long
    factors apply past ``original_max_position_embeddings``).

    >>> inv_freq, factor = rope_parameters({"rope_type": "linear", "factor": 4.0}, 8, 10000.0)
    >>> inv_freq.tolist(), factor
    ([0.25, 0.025, 0.0025, 0.00025], 1.0)
    """
    if check_positive_int("dim", dim) % 2:
        raise PosencValueError(f"dim ({dim}) must be even for rotary embeddings")
    if check_positive_float("base", base) == 1.0:
        raise PosencValueError("base must not be 1.0 (every frequency would be equal)")
    params = validate_rope_scaling(
        scaling, rotary_dim=dim, max_position_embeddings=max_position_embeddings
    )
    fn: Callable[..., tuple[Tensor, float]] = ROPE_TYPES[params["rope_type"]]
    return fn(dim, base, params, max_position_embeddings=max_position_embeddings, seq_len=seq_len)
