"""What every benchmark reports a timing as (:class:`Timing`: the median and range of repeated
calls; :func:`posenc.bench.harness.round_robin` takes them), and the memory-bandwidth floor
the timings are compared with (:func:`copy_floor`, a plain copy of the same bytes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    """Seconds per call over ``repeats`` timed calls."""

    label: str
    median: float
    low: float
    high: float
    repeats: int

    def ratio(self, other: Timing) -> float:
        """How many times slower this is than ``other`` (median over median)."""
        return self.median / other.median


def copy_floor(*tensors: torch.Tensor) -> Callable[[], object]:
    """The memory-bandwidth floor for an op that reads and writes ``tensors`` once:
    ``t.clone()`` of each."""
    return lambda: [t.clone() for t in tensors]
