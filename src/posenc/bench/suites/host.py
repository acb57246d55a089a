"""The ``host`` suite: the Python around one eager rotary call (:mod:`posenc.bench.host`)."""

from __future__ import annotations

import importlib.util

from ..harness import Section
from .settings import Settings


def suite_host(s: Settings) -> Section:
    if importlib.util.find_spec("triton") is None:
        return Section(
            "host",
            "Host time per eager rotary call",
            notes=["skipped: triton is not installed (it ships Linux x86-64 wheels only)"],
        )
    from ..host import suite

    return suite(calls=s.host_calls, rounds=max(3, s.repeats))
