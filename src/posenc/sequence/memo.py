"""What the layers of one forward share: a :class:`ForwardMemo` holds what the first layer that
needs it makes (a layer's mask made into an additive one, flex's block mask), for the others to
find, keyed by what it was made from. A cached, packed or windowed forward's
:class:`~posenc.sequence.context.SequenceContext` holds one; an Encoder's plain forward opens
one with :func:`sharing_within_forward`, which :func:`forward_memo` returns inside it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor

__all__ = ["ForwardMemo", "forward_memo", "sharing_within_forward"]


class ForwardMemo:
    """What the layers of one forward share, made by the first layer that needs it: a
    layer's mask made into an additive one, flex's block mask."""

    def __init__(self) -> None:
        self._kept: list[tuple[tuple[Any, ...], Any]] = []

    def keep(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """``make()`` kept under ``key`` for the rest of this forward. ``key``'s tensors are
        compared by identity (the forward hands every layer the same ones), its other items
        by type and value."""
        for stored, value in self._kept:
            if len(stored) == len(key) and all(map(_same, stored, key)):
                return value
        value = make()
        self._kept.append((key, value))
        return value


def _same(a: object, b: object) -> bool:
    if a is b:
        return True
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return False
    return type(a) is type(b) and a == b


#: The memo of the forward under way (an Encoder's, over all its layers), or None.
_FORWARD_MEMO: ContextVar[ForwardMemo | None] = ContextVar("posenc_forward_memo", default=None)


@contextlib.contextmanager
def sharing_within_forward() -> Iterator[ForwardMemo]:
    """Within it, :func:`forward_memo` is one new :class:`ForwardMemo`: the scope of one
    forward over many layers that has no :class:`SequenceContext` (an Encoder's plain
    forward), whose layers then share what they would each make alike."""
    memo = ForwardMemo()
    token = _FORWARD_MEMO.set(memo)
    try:
        yield memo
    finally:
        _FORWARD_MEMO.reset(token)


def forward_memo() -> ForwardMemo | None:
    """The memo of the forward under way (:func:`sharing_within_forward`), or ``None``
    (inside a captured graph the compiler shares what is made alike itself)."""
    if torch.compiler.is_compiling():
        return None
    return _FORWARD_MEMO.get()
