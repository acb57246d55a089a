"""The errors posenc raises for bad input, and the memory budget that sizes are checked against.

posenc tells a caller's mistake from its own bug by the class of the exception:

- :class:`PosencValueError` (a :class:`ValueError`) and :class:`PosencTypeError` (a
  :class:`TypeError`) mean "an argument is wrong"; the message names the argument and its
  value. Library callers can keep catching ``ValueError``/``TypeError``.
- :class:`MemoryBudgetError` (a :class:`PosencValueError`) means "this request would need more
  memory than allowed": it names the argument, its value and the bytes needed, and is raised
  before anything is allocated.

The ``posenc`` command turns these (and only these, besides its own argument errors and
unusable paths) into one line and exit status 2; any other exception is a bug and keeps its
traceback (exit status 1).

The budget is the machine's physical memory unless set by :func:`set_memory_budget` or the
``POSENC_MEMORY_BUDGET`` environment variable (bytes, or with a ``K``/``M``/``G``/``T`` suffix
in powers of 1024, e.g. ``POSENC_MEMORY_BUDGET=2G``). Tensors on the ``meta`` device hold no
memory and are never checked.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

__all__ = [
    "MemoryBudgetError",
    "PosencError",
    "PosencTypeError",
    "PosencValueError",
    "check_bytes",
    "get_memory_budget",
    "set_memory_budget",
]

ENV_VAR = "POSENC_MEMORY_BUDGET"


class PosencError(Exception):
    """Base of every error posenc raises for bad input (never for its own bugs)."""


class PosencValueError(PosencError, ValueError):
    """An argument has a bad value; the message names the argument and the value."""


class PosencTypeError(PosencError, TypeError):
    """An argument has a bad type; the message names the argument and the type."""


class MemoryBudgetError(PosencValueError):
    """A request would allocate more than the memory budget (:func:`get_memory_budget`)."""


# --------------------------------------------------------------------------- the budget

_budget: int | None = None  # set by set_memory_budget; None: the environment or the machine
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str, *, name: str = ENV_VAR) -> int:
    """``"1536"``, ``"512M"``, ``"2G"``, ``"1.5GiB"`` -> bytes (powers of 1024)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise PosencValueError(f"{name} must be a number of bytes such as 2G or 512M, got {text!r}")
    value = float(match.group(1)) * _UNITS[match.group(2).upper()]
    if not math.isfinite(value) or value < 1:
        raise PosencValueError(f"{name} must be at least 1 byte, got {text!r}")
    return int(value)


def physical_memory() -> int:
    """Bytes of physical memory on this machine (a large number where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no cap beyond the allocator's
        return 1 << 50


def set_memory_budget(nbytes: int | str | None) -> None:
    """Cap what one posenc request may allocate: bytes as an int, a string such as ``"2G"``,
    or ``None`` to go back to ``POSENC_MEMORY_BUDGET`` or, without it, physical memory.

    >>> set_memory_budget("1G"); get_memory_budget()
    1073741824
    >>> set_memory_budget(None)
    """
    global _budget
    if nbytes is None:
        _budget = None
    elif isinstance(nbytes, str):
        _budget = parse_bytes(nbytes, name="nbytes")
    elif isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise PosencTypeError(
            f"nbytes must be an int, a str such as '2G', or None, got {type(nbytes).__name__}"
        )
    elif nbytes < 1:
        raise PosencValueError(f"nbytes must be >= 1, got {nbytes}")
    else:
        _budget = nbytes


def get_memory_budget() -> int:
    """The bytes one request may allocate: :func:`set_memory_budget`'s value, else
    ``POSENC_MEMORY_BUDGET``, else the machine's physical memory."""
    if _budget is not None:
        return _budget
    text = os.environ.get(ENV_VAR)
    if text:
        return parse_bytes(text)
    return physical_memory()


def format_bytes(nbytes: float) -> str:
    """``3221225472`` -> ``"3.0 GiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(nbytes) < 1024 or unit == "PiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def check_bytes(name: str, value: Any, nbytes: float, *, device: Any = None) -> None:
    """Raise :class:`MemoryBudgetError` if allocating ``nbytes`` would pass the budget.

    ``name`` and ``value`` are the argument that asked for the memory, as the caller knows
    it (``"max_len"``, ``10**10``), or several at once (``"max_len x dim"``, ``"2048 x 10**9"``;
    a str value is shown as it is). Nothing is checked for the ``meta`` device (``device``,
    or torch's default device when ``device`` is None), nor inside ``torch.compile``, where
    sizes are symbolic.
    """
    import torch  # here, so that this module stays importable on its own

    if torch.compiler.is_compiling():
        return  # sizes are symbolic there; the eager call before compiling checked them
    if device is None:
        device = torch.get_default_device()  # `with torch.device("meta"):` builds nothing
    if str(device).startswith("meta"):
        return
    budget = get_memory_budget()
    if nbytes > budget:
        shown = value if isinstance(value, str) else repr(value)
        raise MemoryBudgetError(
            f"{name}={shown} would need {format_bytes(nbytes)}, more than the memory budget "
            f"of {format_bytes(budget)} (set it with posenc.set_memory_budget or "
            f"{ENV_VAR})"
        )
