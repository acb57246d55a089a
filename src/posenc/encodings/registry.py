"""The registry: name -> encoding class, and building an encoding by its name.

It is the only list of schemes in posenc: the Encoder's ``pe="name"``, ``posenc list``,
``plot``, ``analyze`` and ``report`` all read it, so a class decorated with :func:`register`
appears everywhere without another edit.

A registered class is a subclass of one of the family classes of :mod:`.base`
(``AdditiveEncoding``, ``RotaryEncoding``, ``BiasEncoding``, ``ConditionalEncoding``,
``NoPE``). The registry reads
only its ``family``, ``paper`` and ``for_model``, and imports none of the classes it lists.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import PosencTypeError, PosencValueError
from .checks import check_positive_int


@dataclass(frozen=True)
class Entry:
    """One registered scheme: its name, its class (a ``PositionalEncoding`` subclass) and the
    one-line summary ``posenc list`` shows."""

    name: str
    cls: type[Any]
    summary: str

    @property
    def family(self) -> str:
        """``"additive"``, ``"rotary"``, ``"bias"``, ``"conditional"`` or ``"none"`` (the
        class's ``family``)."""
        return str(self.cls.family)

    @property
    def paper(self) -> str:
        return str(self.cls.paper)


_REGISTRY: dict[str, Entry] = {}


def register(name: str, summary: str) -> Callable[[type[Any]], Any]:
    """Class decorator: make ``cls`` available as ``build(name, ...)``."""

    def wrap(cls: type[Any]) -> type[Any]:
        if name in _REGISTRY and _REGISTRY[name].cls is not cls:
            raise PosencValueError(f"encoding name {name!r} is already registered")
        _REGISTRY[name] = Entry(name, cls, summary)
        return cls

    return wrap


def _unregister(name: str) -> None:
    """Remove ``name`` from the registry (for tests that register a scheme of their own)."""
    del _REGISTRY[name]


def available(family: str | None = None) -> list[str]:
    """Names of every registered encoding, sorted; with ``family``, only that family's.

    >>> available("none")
    ['none']
    """
    if family is None:
        return sorted(_REGISTRY)
    known = sorted({e.family for e in _REGISTRY.values()})
    if family not in known:
        raise PosencValueError(f"unknown family {family!r}; known: {', '.join(known)}")
    return sorted(name for name, e in _REGISTRY.items() if e.family == family)


def entry(name: str) -> Entry:
    """The registry entry for ``name``; an unknown name lists the known ones."""
    if not isinstance(name, str):
        raise PosencTypeError(f"encoding name must be a str, got {type(name).__name__}")
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PosencValueError(
            f"unknown positional encoding {name!r}; known: {', '.join(available())}"
        ) from None


def build(name: str, **kwargs: Any) -> Any:
    """Construct the encoding registered as ``name`` with its own constructor's arguments.

    >>> import torch
    >>> build("sinusoidal", dim=8)(torch.zeros(1, 3, 8)).shape
    torch.Size([1, 3, 8])
    """
    cls = entry(name).cls
    _check_arguments(name, cls, kwargs, partial=False)
    return cls(**kwargs)


def _check_arguments(name: str, cls: type, kwargs: dict[str, Any], *, partial: bool) -> None:
    """Raise naming the encoding when its constructor cannot take ``kwargs`` (an unknown
    keyword; with ``partial=False`` also a missing argument), before anything is built."""
    signature = inspect.signature(cls)
    try:
        signature.bind_partial(**kwargs) if partial else signature.bind(**kwargs)
    except TypeError as exc:
        raise PosencTypeError(f"encoding {name!r}: {exc}") from None


def build_for_model(name: str, dim: int, num_heads: int, **kwargs: Any) -> Any:
    """Construct ``name`` sized for a model: additive and conditional get ``dim``, rotary
    ``dim // num_heads``, bias ``num_heads``. Rotary and bias encodings need ``num_heads``
    to divide ``dim``."""
    cls = entry(name).cls
    check_positive_int("dim", dim)
    check_positive_int("num_heads", num_heads)
    if cls.family in ("rotary", "bias") and dim % num_heads:
        raise PosencValueError(
            f"num_heads ({num_heads}) must divide dim ({dim}) for {cls.family} encoding {name!r}"
        )
    _check_arguments(name, cls, kwargs, partial=True)
    return cls.for_model(dim, num_heads, **kwargs)
