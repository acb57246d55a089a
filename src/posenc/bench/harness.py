"""What every suite of ``posenc bench`` shares: round-robin timing, the fitted exponent of
cost against size, the result sections and their markdown, and the description of the
machine a run happened on.

Timing is round-robin: after warm-up, every case runs once per round, ``repeats`` rounds, so
load from other processes falls on all cases alike and the ratios between them stay fair
even when absolute times are noisy.
"""

from __future__ import annotations

import math
import os
import platform
import random
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import torch

from .timing import Timing

#: Peer packages a suite compares against (pip distribution names); ``posenc[bench]``
#: installs them.
PEERS = ("transformers", "rotary-embedding-torch", "x-transformers", "positional-encodings")


@dataclass(frozen=True)
class Case:
    """One thing to time: ``fn()`` runs the operation once."""

    name: str
    fn: Callable[[], object]
    group: str = ""


def round_robin(
    cases: Sequence[Case], *, warmup: int, repeats: int, grad: bool = False, cuda: bool = False
) -> list[Timing]:
    """Time every case ``repeats`` times, one call of each per round, after ``warmup`` untimed
    calls of each. Without ``grad`` everything runs under ``torch.inference_mode``. With
    ``cuda`` a call's time is the GPU's, between two CUDA events around it, the device
    synchronised before it (nothing earlier queued) and after it (its kernels done):
    ``perf_counter`` alone would time the launches, not the work.

    Each round takes the cases in a new (seeded) order, so that no case always runs right
    after the same neighbour: a call that follows one which just freed hundreds of MB runs
    measurably slower (seen at 1.5x for the RoPE shapes), and a fixed order would charge that
    to whichever case comes first."""
    samples: list[list[float]] = [[] for _ in cases]
    order = list(range(len(cases)))
    shuffler = random.Random(0)
    with nullcontext() if grad else torch.inference_mode():
        for case in cases:
            for _ in range(warmup):
                case.fn()
        for _ in range(repeats):
            shuffler.shuffle(order)
            for i in order:
                samples[i].append(_timed(cases[i].fn, cuda))
    return [
        Timing(case.name, statistics.median(s), min(s), max(s), repeats)
        for case, s in zip(cases, samples, strict=True)
    ]


def _timed(fn: Callable[[], object], cuda: bool) -> float:
    """Seconds one call of ``fn`` takes (on the GPU, with ``cuda``)."""
    if not cuda:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3  # (milliseconds)


def fit_exponent(sizes: Sequence[float], costs: Sequence[float]) -> float | None:
    """Least-squares slope of ``log(cost)`` against ``log(size)``: cost grows as size**slope.
    ``None`` with fewer than two usable points."""
    points = [(math.log(s), math.log(c)) for s, c in zip(sizes, costs, strict=True) if c > 0]
    if len({x for x, _ in points}) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def peer_version(dist: str) -> str | None:
    """The installed version of a peer distribution, or ``None`` (without importing it)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------------- sections


@dataclass
class Table:
    """A markdown table: a header row and rows of already formatted cells."""

    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    caption: str = ""
    #: How many leading columns hold text (left-aligned); the rest are numbers.
    text_columns: int = 1
    #: Or the alignment of every column, ``"l"`` or ``"r"`` each (overrides text_columns).
    align: str = ""

    def markdown(self) -> str:
        lines = [f"{self.caption}", ""] if self.caption else []
        lines.append("| " + " | ".join(self.headers) + " |")
        sides = self.align or "l" * self.text_columns + "r" * len(self.headers)
        align = ["---" if side == "l" else "---:" for side in sides[: len(self.headers)]]
        lines.append("| " + " | ".join(align) + " |")
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)


@dataclass
class Section:
    """What one suite produced: prose, tables, notes (skips, missing peers), raw data for the
    plots, and how long the suite took."""

    name: str
    title: str
    intro: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def markdown(self) -> str:
        parts = [f"## {self.title}", "", *self.intro]
        for table in self.tables:
            parts += ["", table.markdown()]
        if self.notes:
            parts += ["", *[f"- {note}" for note in self.notes]]
        parts += ["", f"_suite `{self.name}` took {self.seconds:.0f} s_"]
        return "\n".join(parts)


# --------------------------------------------------------------------------- formatting


def ms(seconds: float) -> str:
    """Milliseconds with three significant figures."""
    value = seconds * 1e3
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def spread(t: Timing) -> str:
    """The range of the timed calls in milliseconds, ``min–max``."""
    return f"{ms(t.low)}–{ms(t.high)}"


def ratio(x: float, y: float) -> str:
    return f"{x / y:.2f}" if y > 0 else "-"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "n/a"
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def environment() -> list[str]:
    """Lines describing the machine and the software a run used."""
    peers = ", ".join(f"{p} {peer_version(p) or '(not installed)'}" for p in PEERS)
    lines = [
        f"- machine: {cpu_model()}, {os.cpu_count()} logical CPUs, "
        f"{platform.system()} {platform.machine()} "
        f"(torch CPU capability {torch.backends.cpu.get_cpu_capability()})",
        f"- torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"Python {platform.python_version()}",
        f"- peers: {peers}",
    ]
    return lines


def load_warning() -> str | None:
    """A warning when more processes want the CPUs than there are, which makes
    multi-threaded timings wait on descheduled threads."""
    try:
        one = os.getloadavg()[0]
    except OSError:
        return None
    cpus = os.cpu_count() or 1
    if one < cpus or torch.get_num_threads() < 2:
        return None
    return (
        f"- **warning**: the load average ({one:.1f}) is at least the number of CPUs ({cpus}): "
        f"other processes compete for the cores, and with {torch.get_num_threads()} threads "
        "an operation often waits for a descheduled thread, which adds multiples of the "
        "scheduler tick (several ms) to short calls. Ratios of long calls hold up; those of "
        "short calls do not. Rerun on a quiet machine (or with `--threads 1`)."
    )
