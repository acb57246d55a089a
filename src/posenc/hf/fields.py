"""Reading fields from a transformers config object or a ``config.json`` dict, one way for
both: :class:`Fields` (absent and ``None`` alike; a raw ``config.json``'s GPT-J-style names),
the number checks, and per-layer configs.

Per-layer configs (``per_layer_config``: the Gemma 4 family, dots3): transformers keeps some
fields per layer (Gemma 4: ``head_dim`` 256 on sliding layers, ``global_head_dim`` 512 on
full-attention ones) and builds each layer type's rotary tables from that layer type's view of
the config (``config.per_layer_config[layer_type]``). A config object refuses to read such a
field globally; in a ``config.json`` the global value is the one some layers override, so
:class:`Fields` refuses it there too, and :func:`for_layer_type` gives a layer type's view.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..errors import PosencTypeError, PosencValueError

__all__ = ["Fields", "for_layer_type", "number", "per_layer_keys", "positive_int"]

#: Names a raw ``config.json`` uses where a config object has an ``attribute_map`` alias.
_ALIASES = {
    "hidden_size": ("n_embd", "d_model"),
    "num_attention_heads": ("n_head", "n_heads", "decoder_num_attention_heads"),  # Moonshine
    "num_hidden_layers": ("n_layer", "decoder_num_hidden_layers"),  # GPT-J, Moonshine
    "num_key_value_heads": ("decoder_num_key_value_heads",),
    "max_position_embeddings": ("n_positions",),
}


class Fields:
    """Uniform read access to a config object or a ``config.json`` dict; ``None`` = absent."""

    def __init__(self, config: Any) -> None:
        self.raw = config
        #: the fields a per_layer_config sets (read them through a layer type's view)
        self.per_layer = per_layer_keys(config)

    def _per_layer(self, key: str) -> str:
        if isinstance(self.raw, Mapping):
            types = self.raw.get("layer_types") or ()
        else:
            types = getattr(self.raw, "layer_types", None) or ()
        return (
            f"config sets {key} per layer (per_layer_config); pass layer_type= (one of "
            f"{sorted(set(types))})"
        )

    def get(self, name: str) -> Any:
        for key in (name, *_ALIASES.get(name, ())):
            if key in self.per_layer:  # (a config object refuses to read it too)
                raise PosencValueError(self._per_layer(key))
            if isinstance(self.raw, Mapping):
                value = self.raw.get(key)
            else:
                try:
                    value = getattr(self.raw, key, None)
                except Exception as error:
                    raise PosencValueError(
                        f"config {key} cannot be read as one value "
                        f"({type(error).__name__}: {error})"
                    ) from error
            if value is not None:
                return value
        return None


def number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PosencTypeError(f"config {field} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise PosencValueError(f"config {field} must be finite, got {value!r}")
    return float(value)


def positive_int(field: str, value: Any) -> int:
    if isinstance(value, float) and value.is_integer():  # 2048.0 from some JSON writers
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PosencTypeError(f"config {field} must be an int, got {value!r}")
    if value < 1:
        raise PosencValueError(f"config {field} must be >= 1, got {value!r}")
    return value


def _overrides(config: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    """A ``config.json``'s ``per_layer_config`` (layer index, zero-padded as a string ->
    the fields that layer sets), checked."""
    found = config.get("per_layer_config") or {}
    if not isinstance(found, Mapping):
        raise PosencTypeError(f"config per_layer_config must be a dict, got {found!r}")
    overrides = {}
    for key, values in found.items():
        if not isinstance(values, Mapping) or not str(key).isdigit():
            raise PosencValueError(
                f"config per_layer_config must map layer indices to dicts, got {key!r}: {values!r}"
            )
        overrides[int(key)] = values
    return overrides


#: Per-layer fields that cannot change a rotation (NeoMME sets only ``sliding_window`` per
#: layer and builds its rotary tables from the global config): a config whose layers differ
#: only in these is read as one config. Any other per-layer field is read per layer type.
NOT_ROTARY_PER_LAYER = frozenset(
    {"sliding_window", "attention_chunk_size", "intermediate_size", "moe_intermediate_size"}
)


def per_layer_keys(config: Any) -> frozenset[str]:
    """The fields ``config`` sets per layer that may change its rotation (empty for a config
    without a ``per_layer_config``, or one whose layers differ only in
    :data:`NOT_ROTARY_PER_LAYER`)."""
    if isinstance(config, Mapping):
        keys = frozenset(key for values in _overrides(config).values() for key in values)
        return keys - NOT_ROTARY_PER_LAYER
    if getattr(config, "is_heterogeneous", False) is True:
        keys = frozenset(getattr(config, "per_layer_attributes", None) or ())
        return keys - NOT_ROTARY_PER_LAYER
    return frozenset()


def for_layer_type(config: Any, layer_type: str) -> Any:
    """``config`` as the layers of ``layer_type`` see it: what its ``per_layer_config`` sets
    for them applied (a config object's ``per_layer_config[layer_type]``; for a
    ``config.json`` dict, a copy with those fields replaced). A config that sets nothing per
    layer is returned as it is. Every layer of the type must set the same fields, as
    transformers asks."""
    keys = per_layer_keys(config)
    if not keys:
        return config
    if isinstance(config, Mapping):
        layer_types = config.get("layer_types") or ()
    else:
        layer_types = getattr(config, "layer_types", None) or ()
    if layer_type not in layer_types:
        raise PosencValueError(
            f"config sets {sorted(keys)} per layer (per_layer_config), and "
            f"layer_type={layer_type!r} is not one of its layer_types {sorted(set(layer_types))}"
        )
    if not isinstance(config, Mapping):
        try:
            return config.per_layer_config[layer_type]
        except ValueError as error:  # transformers: the layers of that type differ
            raise PosencValueError(f"config per_layer_config: {error}") from error
    overrides = {
        i: {key: value for key, value in values.items() if key in keys}
        for i, values in _overrides(config).items()
    }
    indices = [i for i, kind in enumerate(layer_types) if kind == layer_type]
    first = overrides.get(indices[0], {})
    for i in indices[1:]:
        if overrides.get(i, {}) != first:
            raise PosencValueError(
                f"config per_layer_config sets layer {i} of type {layer_type!r} differently "
                f"from layer {indices[0]}: {overrides.get(i, {})!r} vs {first!r}"
            )
    view = {key: value for key, value in config.items() if key != "per_layer_config"}
    view.update(first)
    return view
