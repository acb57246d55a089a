"""The nine built-in RoPE context extensions, as pure functions: each ``init`` computes
``(inv_freq float64 (dim/2,), attention_factor)`` the way the ``rope_type`` of the same name
in transformers' ``modeling_rope_utils`` does, and each ``validate`` checks the type's own
parameters. :mod:`~.registry` registers them (its module docstring has the table of what
each type does); nothing here keeps state.

Dimension legend: ``dim`` the rotary dimension ``r``; frequencies are ``(dim/2,)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ...errors import PosencTypeError, PosencValueError

#: The key naming the context a model was trained at.
ORIGINAL = "original_max_position_embeddings"


def default_inv_freq(dim: int, base: float, *, device: Any = None) -> Tensor:
    """``base^(-2i/dim)`` for ``i = 0 .. dim/2 - 1`` in float64 (RoFormer eq. 15)."""
    exponent = torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim  # (dim/2,)
    return base**-exponent


def init_default(
    dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    max_position_embeddings: int | None = None,
    seq_len: float | None = None,
) -> tuple[Tensor, float]:
    return default_inv_freq(dim, base), 1.0


def init_proportional(
    dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    max_position_embeddings: int | None = None,
    seq_len: float | None = None,
) -> tuple[Tensor, float]:
    # p-RoPE: the pairs span the head (dim is the head dim); the lowest frequencies are 0
    proportion = params.get("partial_rotary_factor")
    kept = int((1.0 if proportion is None else float(proportion)) * dim // 2)
    inv_freq = default_inv_freq(dim, base)
    inv_freq[kept:] = 0.0
    factor = params.get("factor")
    return inv_freq / (1.0 if factor is None else float(factor)), 1.0


def check_proportional(
    params: Mapping[str, Any], *, rotary_dim: int, max_position_embeddings: int | None
) -> None:
    proportion = params.get("partial_rotary_factor")
    if proportion is None:
        return  # 1: every frequency kept, as linear scaling (transformers warns)
    check_number("partial_rotary_factor", proportion)
    if not 0.0 < float(proportion) <= 1.0:
        raise PosencValueError(
            f"rope_type 'proportional' needs partial_rotary_factor in (0, 1], got {proportion!r}"
        )


def init_linear(
    dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    max_position_embeddings: int | None = None,
    seq_len: float | None = None,
) -> tuple[Tensor, float]:
    # Position interpolation: m -> m / factor, folded into the frequencies.
    return default_inv_freq(dim, base) / float(params["factor"]), 1.0


def init_ntk(
    dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    max_position_embeddings: int | None = None,
    seq_len: float | None = None,
) -> tuple[Tensor, float]:
    scaled_base = base * float(params["factor"]) ** (dim / (dim - 2))
    return default_inv_freq(dim, scaled_base), 1.0


def init_ntk_alpha(
    dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    max_position_embeddings: int | None = None,
    seq_len: float | None = None,
) -> tuple[Tensor, float]:
    # HunYuan's NTK-alpha: static NTK's stretch of the base, base * alpha^(dim/(dim-2)), with
    # alpha in the place of factor
    return init_ntk(dim, base, {"factor": params["alpha"]})


def init_dynamic(
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


def init_yarn(
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


def init_longrope(
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
    long = bool(seq_len and seq_len > original)
    attention_factor = params.get("attention_factor")
    if params.get("short_mscale") is not None:  # PhiMoE: one factor on each side of original
        attention_factor = params["long_mscale" if long else "short_mscale"]
    elif attention_factor is None:
        attention_factor = (
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        )
    key = "long_factor" if long else "short_factor"
    ext = torch.tensor([float(f) for f in params[key]], dtype=torch.float64)
    return default_inv_freq(dim, base) / ext, float(attention_factor)


def init_llama3(
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


# --------------------------------------------------------------------------- their checks


def check_number(
    key: str, value: object, *, positive: bool = True, allow_none: bool = False
) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PosencTypeError(f"rope scaling {key!r} must be a number, got {value!r}")
    if not math.isfinite(value) or (positive and value <= 0):
        raise PosencValueError(f"rope scaling {key!r} must be a finite number > 0, got {value!r}")


def check_base_scaling(
    params: Mapping[str, Any], *, rotary_dim: int, max_position_embeddings: int | None
) -> None:
    """ntk, dynamic: the exponent ``dim / (dim - 2)`` needs ``dim > 2``."""
    if rotary_dim <= 2:
        raise PosencValueError(
            f"rope_type {params['rope_type']!r} needs rotary_dim > 2, got {rotary_dim}"
        )


def check_ntk_alpha(
    params: Mapping[str, Any], *, rotary_dim: int, max_position_embeddings: int | None
) -> None:
    check_number("alpha", params["alpha"])
    check_base_scaling(params, rotary_dim=rotary_dim, max_position_embeddings=None)


def _check_factor_or_lengths(
    params: Mapping[str, Any], max_position_embeddings: int | None
) -> None:
    """yarn, longrope: without a factor, the ratio of the two context lengths is the factor."""
    if params.get("factor") is not None:
        return
    if max_position_embeddings is None:
        raise PosencValueError(
            f"rope_type {params['rope_type']!r} without a factor needs max_position_embeddings "
            "(factor = max_position_embeddings / original_max_position_embeddings)"
        )
    implied = max_position_embeddings / params[ORIGINAL]
    check_number("factor (max_position_embeddings / original_max_position_embeddings)", implied)


def check_yarn(
    params: Mapping[str, Any], *, rotary_dim: int, max_position_embeddings: int | None
) -> None:
    for key in ("mscale", "mscale_all_dim"):
        if key in params:
            check_number(key, params[key], allow_none=True)
    for key in ("beta_fast", "beta_slow"):
        if key in params:
            check_number(key, params[key], positive=False, allow_none=True)
    _check_factor_or_lengths(params, max_position_embeddings)
    fast, slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1
    if fast < slow:
        raise PosencValueError(f"beta_fast ({fast}) must be >= beta_slow ({slow})")
    if not isinstance(params.get("truncate", True), bool):
        raise PosencTypeError(f"rope scaling 'truncate' must be a bool, got {params['truncate']!r}")


def check_longrope(
    params: Mapping[str, Any], *, rotary_dim: int, max_position_embeddings: int | None
) -> None:
    _check_factor_or_lengths(params, max_position_embeddings)
    for key in ("short_factor", "long_factor"):
        factors = params[key]
        if not isinstance(factors, (list, tuple)) or len(factors) != rotary_dim // 2:
            raise PosencValueError(
                f"rope scaling {key!r} must be a list of rotary_dim // 2 = {rotary_dim // 2} "
                f"numbers, got {factors!r}"
            )
        for i, value in enumerate(factors):
            check_number(f"{key}[{i}]", value)
    mscales = [key for key in ("short_mscale", "long_mscale") if params.get(key) is not None]
    if len(mscales) == 1:
        raise PosencValueError(
            f"rope scaling has {mscales[0]}={params[mscales[0]]!r} but not its pair: "
            "short_mscale and long_mscale go together"
        )
    for key in mscales:
        check_number(key, params[key])
    if mscales and params.get("attention_factor") is not None:
        raise PosencValueError(
            f"rope scaling has attention_factor={params['attention_factor']!r} and "
            "short_mscale/long_mscale, which replace it: give one or the other"
        )


def check_llama3(
    params: Mapping[str, Any], *, rotary_dim: int, max_position_embeddings: int | None
) -> None:
    for key in ("low_freq_factor", "high_freq_factor"):
        check_number(key, params[key])
    if params["high_freq_factor"] <= params["low_freq_factor"]:
        raise PosencValueError(
            f"high_freq_factor ({params['high_freq_factor']}) must be > low_freq_factor "
            f"({params['low_freq_factor']})"
        )
