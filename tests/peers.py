"""Reaching into a peer's internals, carefully.

Tests compare with a peer through its public API where one exists. Where a test must patch a
peer's internals (a transformers model's rotary step, say), it first states what it relies on
with :func:`require_internals`, so a new release that moved them fails with a message naming
the peer's version and what moved, not a ``TypeError`` deep inside the peer. The versions the
suite passes with are pinned in ``constraints.txt``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import pytest


def parameters(function: Callable[..., Any]) -> list[str]:
    """The names of ``function``'s parameters, in order."""
    return list(inspect.signature(function).parameters)


def require_internals(peer: Any, found: dict[str, bool]) -> None:
    """Fail naming ``peer``'s version and every entry of ``found`` (a description of what the
    test relies on, mapped to whether this version has it) that is false."""
    missing: Sequence[str] = [what for what, ok in found.items() if not ok]
    if missing:
        pytest.fail(
            f"{peer.__name__} {getattr(peer, '__version__', '?')} no longer has what this test "
            f"patches: {'; '.join(missing)}. Update the test to the new internals, or install "
            "the pinned versions (pip install -c constraints.txt)"
        )
