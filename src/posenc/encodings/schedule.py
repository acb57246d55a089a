"""A model's position schedule: which encoding each layer applies, and which keys each layer's
attention may read (a sliding window, a chunk, or everything).

Models of 2025–26 do not give every layer the same positions: Gemma 3 alternates windowed
layers (θ = 10k) with global ones (θ = 1M, scaled), SmolLM3 and Command R7B leave every fourth
layer without positions (NoPE), Llama 4 interleaves chunked RoPE layers with NoPE ones. Here a
schedule is data: one entry per layer, resolved once when the model is built.

* ``pe``: a registry name, a module, ``"none"``/``None`` (a NoPE layer), or a list of those
  with one entry per layer. Equal names share one module (``["t5"] * 3`` is ``"t5"``, one bias
  table as in T5); pass modules to have separate ones. An additive scheme acts on the input,
  and a conditional one on the hidden states after a block, so either may only be the single
  model-wide ``pe``.
* ``window`` / ``chunk``: ``None``, an int for every layer, or a list with one entry per layer
  (``None`` there: full attention).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import PosencTypeError, PosencValueError
from .base import NoPE, PositionalEncoding
from .registry import build_for_model, entry

__all__ = [
    "layers_of_types",
    "per_layer",
    "per_layer_items",
    "rescaled_schedule",
    "resolve_pe",
    "resolve_schedule",
]

#: Builds one encoding from a registry name or module (the Encoder's ``resolve_pe`` with its
#: model's sizes bound).
Resolve = Callable[[Any], PositionalEncoding]


def resolve_schedule(
    pe: object, depth: int, resolve: Resolve
) -> tuple[list[PositionalEncoding], list[int]]:
    """The distinct encodings of a model (in order of first use) and, per layer, the index of
    the one it applies. A single ``pe`` gives one encoding for every layer."""
    if not isinstance(pe, (list, tuple)):
        return [resolve(pe)], [0] * depth
    if len(pe) != depth:
        raise PosencValueError(
            f"pe has {len(pe)} entries but the model has depth={depth}: give one per layer"
        )
    distinct: list[PositionalEncoding] = []
    by_key: dict[Any, int] = {}
    index = []
    for layer, item in enumerate(pe):
        if not (item is None or isinstance(item, (str, PositionalEncoding))):
            raise PosencTypeError(
                f"pe[{layer}] must be a registry name, a PositionalEncoding or None, got "
                f"{type(item).__name__}"
            )
        key = "none" if item is None else item if isinstance(item, str) else id(item)
        if key not in by_key:
            module = NoPE() if key == "none" else resolve(item)
            if module.family in ("additive", "conditional"):
                where = "the input" if module.family == "additive" else "the hidden states"
                raise PosencValueError(
                    f"pe[{layer}]={_name(item)} is {module.family}: it acts on {where}, so "
                    "it can only be the single model-wide pe (pe=" + repr(_name(item)) + "), "
                    "not one layer's entry"
                )
            by_key[key] = len(distinct)
            distinct.append(module)
        index.append(by_key[key])
    return distinct, index


def per_layer(name: str, value: object, depth: int) -> list[int | None]:
    """``value`` (``None``, a positive int, or a list of those with one entry per layer) as
    one entry per layer."""
    items = value if isinstance(value, (list, tuple)) else [value] * depth
    if len(items) != depth:
        raise PosencValueError(
            f"{name} has {len(items)} entries but the model has depth={depth}: give one per "
            "layer (None for full attention)"
        )
    for layer, item in enumerate(items):
        if item is None:
            continue
        where = name if not isinstance(value, (list, tuple)) else f"{name}[{layer}]"
        if isinstance(item, bool) or not isinstance(item, int):
            raise PosencTypeError(f"{where} must be a positive int or None, got {item!r}")
        if item < 1:
            raise PosencValueError(f"{where} must be >= 1, got {item}")
    return list(items)


def per_layer_items(
    name: str, value: object, depth: int, check: Callable[[str, Any], Any]
) -> list[Any]:
    """``value`` (one setting, or a list with one per layer) as one entry per layer, each
    passed through ``check(where, item)`` (which raises naming ``where``, e.g. ``sinks[2]``)."""
    if not isinstance(value, (list, tuple)):
        return [check(name, value)] * depth
    if len(value) != depth:
        raise PosencValueError(
            f"{name} has {len(value)} entries but the model has depth={depth}: give one per layer"
        )
    return [check(f"{name}[{layer}]", item) for layer, item in enumerate(value)]


def _name(item: object) -> str:
    return item if isinstance(item, str) else type(item).__name__


def layers_of_types(
    known: Sequence[str] | None, layer_types: Iterable[str] | None, depth: int
) -> list[int]:
    """The layers whose type (``known``, one per layer) is in ``layer_types``; every layer for
    ``None``."""
    if layer_types is None:
        return list(range(depth))
    if isinstance(layer_types, str):
        raise PosencTypeError(
            f"layer_types must be a collection of layer type names, got the string {layer_types!r}"
        )
    wanted = set(layer_types)
    if known is None:
        raise PosencValueError(
            "layer_types= needs an encoder whose layer_types are known (set "
            "Encoder.layer_types, or build it with from_hf_config)"
        )
    if len(known) != depth:
        raise PosencValueError(
            f"Encoder.layer_types has {len(known)} entries but the encoder has depth={depth}"
        )
    unknown = wanted - set(known)
    if unknown:
        raise PosencValueError(
            f"layer_types {sorted(unknown)} are not among this encoder's {sorted(set(known))}"
        )
    return [i for i, kind in enumerate(known) if kind in wanted]


def rescaled_schedule(
    pes: Sequence[PositionalEncoding],
    chosen: Sequence[int],
    scaling: Mapping[str, Any] | None,
    trained_length: int | None,
) -> tuple[list[PositionalEncoding], list[int]]:
    """The schedule ``pes`` (one encoding per layer) with the rotary encodings of the
    ``chosen`` layers rescaled (``with_scaling``; one new module per old one), as
    :func:`resolve_schedule` returns it."""
    targets = {i for i in chosen if hasattr(pes[i], "with_scaling")}
    if not targets:
        kinds = sorted({type(pes[i]).__name__ for i in chosen})
        raise PosencValueError(
            f"with_rope_scaling needs a rotary encoding; the layers asked for use "
            f"{', '.join(kinds) or 'nothing'}"
        )
    scaled: dict[int, PositionalEncoding] = {}  # id(old module) -> its rescaled copy
    for i in sorted(targets):
        if id(pes[i]) not in scaled:
            # (the rotary spec fills a missing original context with the trained length)
            scaled[id(pes[i])] = pes[i].with_scaling(  # type: ignore[operator]
                scaling, original_max_position_embeddings=trained_length
            )
    layer_pes = [scaled[id(pe)] if i in targets else pe for i, pe in enumerate(pes)]
    return resolve_schedule(layer_pes, len(layer_pes), lambda pe: pe)


def resolve_pe(
    pe: str | PositionalEncoding | None,
    dim: int,
    num_heads: int,
    *,
    causal: bool = False,
    head_dim: int | None = None,
    pe_kwargs: Mapping[str, Any] | None = None,
) -> PositionalEncoding:
    """A registry name, a module or ``None`` (NoPE) -> a module sized for the model, built
    with ``pe_kwargs`` (a scheme's own ``causal``, ALiBi's say, among them). A name built for
    a ``causal`` model starts from the scheme's ``causal_defaults``. An additive or
    conditional scheme, and
    a bias that reads the layer's input (``needs_x``), is as wide as the model; any other
    acting inside attention is sized for ``num_heads`` heads of ``head_dim`` (default
    ``dim / num_heads``)."""
    kwargs = dict(pe_kwargs or {})
    if pe is None:
        return NoPE()
    if isinstance(pe, str):
        found = entry(pe)
        defaults = found.cls.causal_defaults if causal else {}
        # additive schemes and data-dependent biases (which read the layer input) take the
        # model's width; the rest are sized by their heads
        model_wide = found.family in ("additive", "conditional") or getattr(
            found.cls, "needs_x", False
        )
        width = dim if head_dim is None or model_wide else num_heads * head_dim
        return build_for_model(pe, width, num_heads, **{**defaults, **kwargs})
    if isinstance(pe, PositionalEncoding):
        if kwargs:
            raise PosencTypeError(
                f"pe_kwargs apply only when pe is a registry name, got pe_kwargs={kwargs!r} "
                f"with pe={type(pe).__name__}"
            )
        return pe
    raise PosencTypeError(
        f"pe must be a registry name or a PositionalEncoding, got {type(pe).__name__}"
    )
