"""Names that moved to :mod:`posenc.runs` stay importable from their old modules for a
release, with a ``DeprecationWarning``: the old module sets ``__getattr__ = moved(...)``."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

#: The release that removes the old names.
REMOVED_IN = "0.3"


def moved(old: str, new: Mapping[str, ModuleType]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for the module named ``old``: each name of ``new``
    (name -> the module it now lives in) warns with a ``DeprecationWarning`` naming both
    places and returns the object itself; any other name is an ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        module = new.get(name)
        if module is None:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(
            f"{old}.{name} moved to {module.__name__}.{name}; the old name is removed in "
            f"{REMOVED_IN}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(module, name)

    return __getattr__


def all_of(module: ModuleType, names: tuple[str, ...]) -> dict[str, ModuleType]:
    """``{name: module}`` for each of ``names`` (a module's moved names, all in one place)."""
    return dict.fromkeys(names, module)
