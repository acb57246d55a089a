"""Counting host reads: the ``Tensor`` methods that bring a value to the host (on CUDA, each
one a device sync), patched to record every call while a test runs."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")
#: ``torch`` functions that answer with a host value computed from device tensors.
FUNCTION_READS = ("equal",)


@contextmanager
def host_reads(
    monkeypatch: pytest.MonkeyPatch, *, own: bool = False, named: bool = False
) -> Iterator[list[str]]:
    """The names of the host-reading ``Tensor`` methods (and ``torch.equal``) called inside
    the block, one per call.

    ``own``: only calls made from posenc's modules (torch's tracing of flex's eager reference
    reads the 0-d CPU tensors a mask_mod captures, which on CUDA it does not); ``named``:
    each entry is ``"module: method"``, the module that called."""
    calls: list[str] = []
    with monkeypatch.context() as patch:
        for name in READS:
            real = getattr(torch.Tensor, name)

            def counted(self, *args, _real=real, _name=name, **kwargs):  # type: ignore[no-untyped-def]
                caller = sys._getframe(1).f_globals.get("__name__", "")
                if not own or caller.startswith("posenc"):
                    calls.append(f"{caller}: {_name}" if named else _name)
                return _real(self, *args, **kwargs)

            patch.setattr(torch.Tensor, name, counted)
        for name in FUNCTION_READS:
            real = getattr(torch, name)

            def counted_function(*args, _real=real, _name=name, **kwargs):  # type: ignore[no-untyped-def]
                caller = sys._getframe(1).f_globals.get("__name__", "")
                if not own or caller.startswith("posenc"):
                    calls.append(f"{caller}: {_name}" if named else _name)
                return _real(*args, **kwargs)

            patch.setattr(torch, name, counted_function)
        yield calls
