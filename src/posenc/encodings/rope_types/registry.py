"""RoPE context extension: the ``rope_type`` registry, one record per type.

A ``rope_type`` (the ``"rope_type"`` of a Hugging Face ``rope_scaling`` / ``rope_parameters``
dictionary) is one :class:`RopeType` record, and :data:`ROPE_TYPES` is the registry: a
read-only mapping from name to record, in the order the types were registered. Validation,
:class:`~posenc.RotaryEmbedding`, ``from_hf_config``, ``Encoder.with_rope_scaling`` and
``posenc extrapolate`` ask the record what a type needs, never test its name.
:func:`register_rope_type` adds a type; the nine built-in ones (pure functions in
:mod:`~.builtin`) are registered through it too, at the end of this module. A record holds:

``init``
    ``init(dim, base, params, *, max_position_embeddings=None, seq_len=None)
    -> (inv_freq: float64 Tensor[dim // 2], attention_factor: float)``, a pure function.
    ``params`` is the validated dictionary; ``dim`` the rotary dimension (``head_dim *
    partial_rotary_factor``). The attention factor multiplies cos and sin, as Hugging Face
    applies it.
``keys``, ``optional``
    the keys the dictionary must have and those it may have, besides ``rope_type``,
    ``rope_theta`` and ``partial_rotary_factor``. An optional key may be ``None`` (unset).
``validate``
    ``validate(params, *, rotary_dim, max_position_embeddings) -> None``: the type's own
    checks on the normalised dictionary (read-only), run after the common ones (known keys,
    required keys, ``factor`` and ``attention_factor`` finite and > 0, ``rope_theta``, the
    original context an int >= 1); it raises
    :class:`~posenc.PosencValueError` / :class:`~posenc.PosencTypeError` naming the key.
``needs_original``
    the type needs the original context, ``original_max_position_embeddings``: a missing one
    is filled from ``max_position_embeddings``, and one of the two must be given.
``uses_length``
    the frequencies depend on the sequence length, ``seq_len``: ``RotaryEmbedding`` passes
    ``None`` until a call's length passes the original context, then the longest length
    seen, until a call is shorter than the original context again; it keeps no cos/sin table
    for such a type. Needs ``needs_original``.
``switches_at_original``
    with ``uses_length``: only which side of the original context the length lies on matters
    (``seq_len`` is ``None``, or ``original + 1`` past it), so ``RotaryEmbedding`` keeps a
    table for each side.
``hf_ignores_original``
    transformers' own function for the type reads the original context from the config's
    ``max_position_embeddings`` only; ``from_hf_config`` then drops the dictionary's
    ``original_max_position_embeddings`` to give what transformers gives.
``spans_head``
    the rotation spans the whole head whatever ``partial_rotary_factor`` says: the factor
    stays in the dictionary for ``init`` to read (proportional RoPE zeroes the frequencies
    past it) instead of setting a smaller rotary dimension.

The built-in types reproduce the function of the same ``rope_type`` in transformers'
``modeling_rope_utils`` (checked against transformers 5.23,
``tests/encodings/rope_types/test_registry.py``), computed in float64 instead of float32:

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
           (Ding et al. 2024, LongRoPE; Phi-3), or, given ``short_mscale`` and
           ``long_mscale`` (PhiMoE), the first up to the original context, the second
           beyond it
llama3     keep high frequencies, divide low ones by ``factor``, smooth in between
           (Meta 2024, Llama 3.1)
=========  ==============================================================================

``ntk_alpha`` (HunYuan's NTK-alpha: its checkpoints' ``dynamic`` with an ``alpha``) is a fixed
base ``base * alpha^(dim/(dim-2))`` at every length, as ``HunYuanDenseV1RotaryEmbedding`` has it.
``{"rope_type": "dynamic", "alpha": a}`` (vLLM's and HunYuan's spelling) is read as NTK-alpha
(:func:`ntk_alpha_scaling`).

``proportional`` (p-RoPE: Gemma 4's global layers, LFM3) keeps the first
``int(partial_rotary_factor * dim / 2)`` frequencies, sets the rest to 0 (those pairs are not
turned) and divides every one by ``factor``. Its pairs still span the whole head, unlike
partial RoPE's, whose exponent's denominator is the rotated width (``spans_head``).

Unlike Hugging Face, which logs a warning and carries on, invalid parameters (a
non-positive factor, a missing key, factor lists of the wrong length, ...) raise
``ValueError``/``TypeError`` naming the key and the value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from torch import Tensor

from ...errors import PosencTypeError, PosencValueError
from ..checks import check_bool, check_positive_float, check_positive_int
from .builtin import (
    ORIGINAL,
    check_base_scaling,
    check_llama3,
    check_longrope,
    check_ntk_alpha,
    check_number,
    check_proportional,
    check_yarn,
    init_default,
    init_dynamic,
    init_linear,
    init_llama3,
    init_longrope,
    init_ntk,
    init_ntk_alpha,
    init_proportional,
    init_yarn,
)

__all__ = [
    "ROPE_TYPES",
    "RopeInitFunction",
    "RopeType",
    "RopeValidateFunction",
    "get_rope_type",
    "ntk_alpha_scaling",
    "register_rope_type",
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


class RopeValidateFunction(Protocol):
    def __call__(
        self, params: Mapping[str, Any], *, rotary_dim: int, max_position_embeddings: int | None
    ) -> None: ...


#: The keys every ``rope_type`` takes (``type`` is the legacy spelling of ``rope_type``).
_COMMON = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})


@dataclass(frozen=True)
class RopeType:
    """One ``rope_type``: how to compute its frequencies and what its dictionary holds (the
    fields are described in the module docstring)."""

    name: str  # the "rope_type" string
    init: RopeInitFunction  # (dim, base, params, *, ...) -> (inv_freq float64, attention factor)
    keys: frozenset[str] = frozenset()  # required keys of the dictionary
    optional: frozenset[str] = frozenset()  # keys it may have
    validate: RopeValidateFunction | None = None  # type-specific checks, after the common ones
    uses_length: bool = False  # the frequencies depend on the sequence length
    needs_original: bool = False  # needs original_max_position_embeddings
    switches_at_original: bool = False  # only the side of the original context matters
    hf_ignores_original: bool = False  # transformers reads max_position_embeddings instead
    spans_head: bool = False  # partial_rotary_factor is the init's, the rotation spans the head

    @property
    def caches_table(self) -> bool:
        """Whether one cos/sin table serves every length: the frequencies are fixed, or take
        one value on each side of the original context (not so for dynamic NTK)."""
        return not self.uses_length or self.switches_at_original


_TYPES: dict[str, RopeType] = {}

#: ``rope_type`` -> :class:`RopeType`, in registration order; read-only (add a type with
#: :func:`register_rope_type`). Iterating it gives the names.
ROPE_TYPES: Mapping[str, RopeType] = MappingProxyType(_TYPES)


def _key_names(argument: str, names: object) -> frozenset[str]:
    """``names`` (an iterable of key names, not one string) as a frozenset, checked."""
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise PosencTypeError(
            f"register_rope_type: {argument} must be a tuple of key names, got {names!r}"
        )
    names = tuple(names)
    for key in names:
        if not isinstance(key, str):
            raise PosencTypeError(
                f"register_rope_type: {argument} must hold str key names, got {key!r} in {names!r}"
            )
    common = sorted(_COMMON.intersection(names))
    if common:
        raise PosencValueError(
            f"register_rope_type: {argument} must not name {common}: every rope_type takes them"
        )
    return frozenset(names)


def register_rope_type(
    name: str,
    init: RopeInitFunction,
    *,
    keys: Iterable[str] = (),
    optional: Iterable[str] = (),
    validate: RopeValidateFunction | None = None,
    uses_length: bool = False,
    needs_original: bool = False,
    switches_at_original: bool = False,
    hf_ignores_original: bool = False,
    spans_head: bool = False,
) -> RopeType:
    """Add a ``rope_type`` to :data:`ROPE_TYPES` and return its record; from then on
    ``RotaryEmbedding(scaling={"rope_type": name, ...})``, ``from_hf_config``,
    :func:`validate_rope_scaling` and :func:`rope_parameters` accept it. The arguments are the
    record's fields (see the module docstring); with ``needs_original``,
    ``original_max_position_embeddings`` is an optional key unless ``keys`` names it.

    For example, a type that halves every frequency from the pair ``start`` on::

        def halved(dim, base, params, *, max_position_embeddings=None, seq_len=None):
            inv_freq = default_inv_freq(dim, base)
            inv_freq[params["start"]:] /= 2
            return inv_freq, 1.0

        def check_start(params, *, rotary_dim, max_position_embeddings):
            if not 0 <= params["start"] < rotary_dim // 2:
                raise PosencValueError(f"'start' must be a pair index, got {params['start']!r}")

        register_rope_type("halved", halved, keys=("start",), validate=check_start)
        RotaryEmbedding(64, scaling={"rope_type": "halved", "start": 8})

    A name is registered once: replacing a type would change the frequencies of the rotary
    modules already built with it the next time they rebuild their tables. Raises
    :class:`~posenc.PosencValueError` / :class:`~posenc.PosencTypeError` naming the argument.
    """
    if not isinstance(name, str):
        raise PosencTypeError(
            f"register_rope_type: name must be a str, got {type(name).__name__} ({name!r})"
        )
    if not name.strip():
        raise PosencValueError(f"register_rope_type: name must not be blank, got {name!r}")
    if name in _TYPES:
        raise PosencValueError(f"rope_type {name!r} is already registered")
    if not callable(init):
        raise PosencTypeError(f"register_rope_type: init must be callable, got {init!r}")
    if validate is not None and not callable(validate):
        raise PosencTypeError(
            f"register_rope_type: validate must be callable or None, got {validate!r}"
        )
    required, allowed = _key_names("keys", keys), _key_names("optional", optional)
    if required & allowed:
        raise PosencValueError(
            f"register_rope_type: keys and optional share {sorted(required & allowed)}"
        )
    flags = {
        "uses_length": uses_length,
        "needs_original": needs_original,
        "switches_at_original": switches_at_original,
        "hf_ignores_original": hf_ignores_original,
        "spans_head": spans_head,
    }
    for flag, value in flags.items():
        check_bool(f"register_rope_type: {flag}", value)
    for flag, needed in (
        ("uses_length", "needs_original"),  # the length is followed from the original context on
        ("switches_at_original", "uses_length"),
        ("hf_ignores_original", "needs_original"),
    ):
        if flags[flag] and not flags[needed]:
            raise PosencValueError(f"register_rope_type: {flag}=True needs {needed}=True")
    if needs_original and ORIGINAL not in required:
        allowed |= {ORIGINAL}
    spec = RopeType(
        name=name,
        init=init,
        keys=required,
        optional=allowed,
        validate=validate,
        uses_length=uses_length,
        needs_original=needs_original,
        switches_at_original=switches_at_original,
        hf_ignores_original=hf_ignores_original,
        spans_head=spans_head,
    )
    _TYPES[name] = spec
    return spec


def _unregister_rope_type(name: str) -> None:
    """Remove ``name`` from the registry (for tests that register their own)."""
    del _TYPES[name]


def get_rope_type(rope_type: object) -> RopeType:
    """The record of a registered ``rope_type``; an unknown name lists the known ones.

    >>> get_rope_type("dynamic").uses_length
    True
    """
    spec = _TYPES.get(rope_type) if isinstance(rope_type, str) else None
    if spec is None:
        raise PosencValueError(f"unknown rope_type {rope_type!r}; known: {', '.join(_TYPES)}")
    return spec


# --------------------------------------------------------------------------- the built-in types

register_rope_type("default", init_default)
register_rope_type("linear", init_linear, keys=("factor",))
register_rope_type("ntk", init_ntk, keys=("factor",), validate=check_base_scaling)
register_rope_type(
    "dynamic",
    init_dynamic,
    keys=("factor",),
    optional=(ORIGINAL,),
    validate=check_base_scaling,
    uses_length=True,
    needs_original=True,
    hf_ignores_original=True,  # transformers' dynamic NTK reads max_position_embeddings
)
register_rope_type(
    "yarn",
    init_yarn,
    keys=(ORIGINAL,),
    optional=(
        "factor",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    ),
    validate=check_yarn,
    needs_original=True,
)
register_rope_type(
    "longrope",
    init_longrope,
    keys=("short_factor", "long_factor", ORIGINAL),
    optional=("factor", "attention_factor", "short_mscale", "long_mscale"),
    validate=check_longrope,
    uses_length=True,
    needs_original=True,
    switches_at_original=True,  # short factors up to the original context, long ones past it
)
register_rope_type(
    "llama3",
    init_llama3,
    keys=("factor", "low_freq_factor", "high_freq_factor", ORIGINAL),
    validate=check_llama3,
    needs_original=True,
)

register_rope_type(
    "proportional",
    init_proportional,
    optional=("factor",),
    validate=check_proportional,
    spans_head=True,
)
register_rope_type("ntk_alpha", init_ntk_alpha, keys=("alpha",), validate=check_ntk_alpha)

# --------------------------------------------------------------------------- validation


def rope_type_keys(rope_type: str) -> tuple[frozenset[str], frozenset[str]]:
    """The keys a ``rope_type``'s dictionary must have and those it may have, besides
    ``rope_type``, ``rope_theta`` and ``partial_rotary_factor``.

    >>> [sorted(keys) for keys in rope_type_keys("llama3")][0]
    ['factor', 'high_freq_factor', 'low_freq_factor', 'original_max_position_embeddings']
    """
    spec = get_rope_type(rope_type)
    return spec.keys, spec.optional


def ntk_alpha_scaling(scaling: Mapping[str, Any]) -> dict[str, Any]:
    """``dynamic`` with a non-zero ``alpha`` (vLLM's ``DynamicNTKAlphaRotaryEmbedding``, HunYuan's
    rotary module) is NTK-alpha, which reads ``alpha`` alone (and ``rope_theta``, kept where the
    dictionary holds it); a zero or missing ``alpha`` is plain dynamic NTK. Other dictionaries are
    returned as they are."""
    scaling = dict(scaling)
    if scaling.get("rope_type", scaling.get("type")) != "dynamic" or "alpha" not in scaling:
        return scaling
    if scaling["alpha"]:
        theta = {"rope_theta": scaling["rope_theta"]} if "rope_theta" in scaling else {}
        return {**theta, "rope_type": "ntk_alpha", "alpha": scaling["alpha"]}
    return {key: value for key, value in scaling.items() if key != "alpha"}


def validate_rope_scaling(
    scaling: Mapping[str, Any] | None,
    *,
    rotary_dim: int,
    max_position_embeddings: int | None = None,
) -> dict[str, Any]:
    """Check a Hugging Face ``rope_scaling`` / ``rope_parameters`` dictionary and return a
    normalised copy (``"type"`` renamed ``"rope_type"``, a missing
    ``original_max_position_embeddings`` filled from ``max_position_embeddings`` as
    transformers does, for every type that needs the original context: for ``dynamic`` too,
    so that one dictionary shape, with the original context in it, serves ``dynamic`` and
    ``yarn``). ``None`` means ``{"rope_type": "default"}``.

    The common checks (known and required keys, ``factor`` and ``attention_factor``,
    ``rope_theta``, the original context) come first, then the type's own ``validate``.
    Raises ``ValueError``/``TypeError`` naming the offending key and value.
    """
    if scaling is None:
        return {"rope_type": "default"}
    if not isinstance(scaling, Mapping):
        raise PosencTypeError(f"scaling must be a dict or None, got {type(scaling).__name__}")
    params = ntk_alpha_scaling(scaling)
    if "type" in params:
        legacy = params.pop("type")
        if params.setdefault("rope_type", legacy) != legacy:
            raise PosencValueError(
                f"scaling has type={legacy!r} and rope_type={params['rope_type']!r}"
            )
    rope_type = params.pop("rope_type", "default")
    params = {"rope_type": rope_type, **params}  # one order, however the dictionary was spelled
    spec = get_rope_type(rope_type)

    if spec.needs_original and max_position_embeddings is not None:
        params.setdefault(ORIGINAL, max_position_embeddings)
    unknown = set(params) - spec.keys - spec.optional - _COMMON
    if unknown:
        allowed = ", ".join(sorted(spec.keys | spec.optional | (_COMMON - {"type"})))
        raise PosencValueError(
            f"unknown key(s) {sorted(unknown)} for rope_type {rope_type!r}; allowed: {allowed}"
        )
    missing = spec.keys - set(params)
    if missing:
        raise PosencValueError(f"rope_type {rope_type!r} needs the key(s) {sorted(missing)}")

    for key in ("factor", "attention_factor"):
        if key in params:  # None stands for "unset" where the key is optional
            check_number(key, params[key], allow_none=key not in spec.keys)
    if "rope_theta" in params:
        check_number("rope_theta", params["rope_theta"])
    if ORIGINAL in params:
        value = params[ORIGINAL]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PosencValueError(
                f"original_max_position_embeddings must be an int >= 1, got {value!r}"
            )
    if spec.needs_original and ORIGINAL not in params:
        raise PosencValueError(
            f"rope_type {rope_type!r} needs max_position_embeddings or "
            "scaling['original_max_position_embeddings'] (the original context)"
        )
    if spec.validate is not None:
        spec.validate(
            MappingProxyType(params),
            rotary_dim=rotary_dim,
            max_position_embeddings=max_position_embeddings,
        )
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

    ``seq_len`` is the current length (the largest position + 1): it matters only to the
    types that use it (``dynamic``: the base grows past the original context; ``longrope``:
    the long factors apply past ``original_max_position_embeddings``).

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
    spec = _TYPES[params["rope_type"]]
    return spec.init(
        dim, base, params, max_position_embeddings=max_position_embeddings, seq_len=seq_len
    )
