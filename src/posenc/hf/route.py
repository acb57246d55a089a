"""A ``config.json`` dict read as transformers reads it: built into its family's config class.

Most ``config.json`` files were written before transformers stored derived fields: they say
``rope_theta``, ``rope_scaling``, ``sliding_window_pattern``, ``use_sliding_window`` and
``max_window_layers``, not ``layer_types``, ``no_rope_layers`` or nested ``rope_parameters``.
Each family's config class derives the per-layer schedule from those fields and its own
defaults (Gemma 3: every sixth layer global, ``rope_local_base_freq`` on the others; Llama 4: a
NoPE layer every fourth, chunks on the rest), and some keep a field as a property that
``to_dict()`` drops (ModernBERT's ``sliding_window = local_attention // 2``). So where
transformers is importable and knows the dict's ``model_type``, :func:`as_config` builds that
class from the dict (transformers' logging silenced) and posenc reads the object's attributes:
every derived field and default is then transformers' own, missing sizes included.

Without transformers, with the route switched off (``POSENC_HF_CONFIG_CLASS=0``, read per
call), or for a ``model_type`` transformers does not know, the dict is read by posenc's own
rules (:mod:`.legacy`), which derive the legacy fields and refuse, naming the field, what
they cannot.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import os
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import PosencValueError
from .legacy import derive

__all__ = ["ENV", "Read", "as_config", "route_enabled"]

#: Environment variable that switches the transformers route off (``0``, ``off``, ``false``,
#: ``no``) or on (unset, empty, ``1``, ``on``, ``true``, ``yes``); case and spaces aside.
ENV = "POSENC_HF_CONFIG_CLASS"
_ON, _OFF = ("", "1", "on", "true", "yes"), ("0", "off", "false", "no")


def route_enabled() -> bool:
    """Whether dicts are built into their transformers config class (:data:`ENV`, per call).

    Raises :class:`~posenc.errors.PosencValueError` naming the variable for any other value
    (a typo must not leave the route silently on)."""
    value = os.environ.get(ENV, "1")
    if value.strip().lower() in _OFF:
        return False
    if value.strip().lower() in _ON:
        return True
    raise PosencValueError(
        f"{ENV} must be one of {', '.join(_ON[1:])} (the transformers route) or "
        f"{', '.join(_OFF)} (posenc's own rules), got {value!r}"
    )


@dataclass(frozen=True)
class Read:
    """A config as posenc reads it: ``config`` (a config object or a dict) and ``via``, the
    words saying how (the transformers class and version, or posenc's own rules)."""

    config: Any
    via: str
    #: fields the config class filled with its defaults (a dict read through transformers)
    defaulted: tuple[str, ...] = ()
    #: per-layer fields the config class would derive but could not (it refused the dict):
    #: the rotation can be read, the schedule cannot
    underived: tuple[str, ...] = ()


@contextlib.contextmanager
def _quiet(logging: Any) -> Iterator[None]:
    """transformers' logging and Python warnings silenced (its config classes log about
    legacy fields they convert, which is what is asked of them here)."""
    level = logging.get_verbosity()
    logging.set_verbosity(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.set_verbosity(level)


def _config_class(model_type: Any) -> tuple[type, str, Any] | str:
    """``(config class, transformers version, its logging module)`` for ``model_type``, or
    why there is none (route off, transformers not importable, the type unknown to it)."""
    if not route_enabled():
        return f"{ENV}={os.environ.get(ENV)}"
    if not isinstance(model_type, str) or not model_type:
        return "no model_type"
    try:
        import transformers
        from transformers.utils import logging
    except ImportError:
        return "transformers not installed"
    cls = _class_named(model_type)
    if cls is None:
        return f"transformers {transformers.__version__} knows no model_type {model_type!r}"
    return cls, transformers.__version__, logging


#: Fields whose absence a reader of ``posenc hf`` should know was filled by the class.
SIZE_FIELDS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)


def as_config(config: Any) -> Read:
    """``config`` as posenc reads it. A config object is read as it is; a ``config.json``
    dict whose ``model_type`` transformers knows is built into that config class; any other
    dict, or one the class cannot build (its reason kept in ``via``), is read by posenc's own
    rules (:func:`~.legacy.derive`)."""
    if not isinstance(config, Mapping):
        return Read(config, f"the {type(config).__name__} given")
    found = _config_class(config.get("model_type"))
    _warn_near_misses(config, config.get("model_type"))
    if isinstance(found, str):
        return _own_rules(config, f"posenc's own rules ({found})")
    cls, version, logging = found
    try:
        with _quiet(logging):
            built = cls.from_dict(copy.deepcopy(dict(config)))  # (it edits nested dicts)
    except Exception as error:  # transformers' validation: ValueError, TypeError, its own
        # (Phi-3's first config.json, LongRoPE named "su", is one transformers 5 cannot build)
        why = _one_line(str(error))  # whole: transformers' reason is on its later lines
        read = _own_rules(
            config,
            f"posenc's own rules (transformers {version} {cls.__name__} refuses it: "
            f"{type(error).__name__}: {why})",
        )
        return Read(read.config, read.via, underived=_derived_by(cls, logging, config))
    text = getattr(built, "text_config", None)
    target = (
        text if text is not None and getattr(built, "num_hidden_layers", None) is None else built
    )
    stated = config.get("text_config") if text is target else config
    stated = stated if isinstance(stated, Mapping) else config
    defaulted = tuple(
        name
        for name in SIZE_FIELDS
        if stated.get(name) is None and getattr(target, name, None) is not None
    )
    return Read(built, f"transformers {version} {cls.__name__}", defaulted)


#: The fields that place a layer's window, chunk or rotation, whose misspelling
#: (:func:`_warn_near_misses`) would leave a default in their place.
LAYER_FIELDS = (
    "sliding_window",
    "sliding_window_pattern",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "no_rope_layers",
    "no_rope_layer_interval",
    "attention_chunk_size",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "rope_local_base_freq",
    "partial_rotary_factor",
    "num_hidden_layers",
    "head_dim",
)


def _warn_near_misses(config: Mapping[str, Any], model_type: Any) -> None:
    """A ``UserWarning`` for each key of ``config`` (and of its ``text_config``) that looks
    like a misspelt :data:`LAYER_FIELDS` entry the dict does not state (``slidng_window``):
    transformers keeps such a key as an attribute of its own and both read the field's
    default. Keys the config class of ``model_type`` defines (where transformers is
    installed, the route on or off), and longer names holding the field (``v_head_dim``), are
    fields of their own."""
    text = config.get("text_config")
    for raw in (config, text) if isinstance(text, Mapping) else (config,):
        cls = _class_named(raw.get("model_type", model_type))
        for key in raw:
            if not isinstance(key, str) or key in LAYER_FIELDS or (cls and hasattr(cls, key)):
                continue
            near = difflib.get_close_matches(key, LAYER_FIELDS, n=1, cutoff=0.85)
            if near and near[0] not in raw and near[0] not in key:
                warnings.warn(
                    f"config field {key!r} is not one posenc or transformers reads; "
                    f"{near[0]!r} is absent, so its default applies: did you mean {near[0]!r}?",
                    UserWarning,
                    stacklevel=4,
                )


def _class_named(model_type: Any) -> type | None:
    """transformers' config class of ``model_type``, where it is installed and knows it."""
    if not isinstance(model_type, str):
        return None
    try:
        from transformers import CONFIG_MAPPING
    except ImportError:
        return None
    # (its lazy mapping's .get answers None for every type: index it)
    return CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None  # noqa: SIM401


def _one_line(text: str) -> str:
    """``text`` whole, its lines joined by spaces (transformers' validation errors name the
    validator on the first line and the reason on the next)."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


#: Per-layer fields a config class may derive from others and its defaults.
PER_LAYER_FIELDS = ("layer_types", "no_rope_layers", "layer_rope_theta")


def _derived_by(cls: type, logging: Any, config: Mapping[str, Any]) -> tuple[str, ...]:
    """The per-layer fields ``cls`` sets (with its defaults) that ``config`` does not state:
    what its class would have derived had it built the dict (all of them if it cannot be
    built with its defaults either)."""
    try:
        with _quiet(logging):
            defaults = cls()
    except Exception:
        return tuple(name for name in PER_LAYER_FIELDS if config.get(name) is None)
    return tuple(
        name
        for name in PER_LAYER_FIELDS
        if getattr(defaults, name, None) is not None and config.get(name) is None
    )


def _own_rules(config: Mapping[str, Any], via: str) -> Read:
    return Read(derive(config), via)
