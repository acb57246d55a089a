"""The ``table`` and ``add`` suites of ``posenc bench``: sinusoidal table generation and its
accuracy against the usual float32 NumPy and torch versions (written out here) and
``positional_encodings``; adding an absolute encoding against ``x + table`` and the copy
floor."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from ..harness import Case, Section, Table, ms, ratio, round_robin, spread
from ..timing import copy_floor
from .settings import Settings, missing_peer, timing_line


def numpy_table_fp32(num_positions: int, dim: int, base: float = 10000.0) -> np.ndarray:
    """The sinusoidal table as tutorials write it in NumPy, angles in float32
    (Vaswani et al. 2017, §3.5): ``PE[p, 2i] = sin(p / base^(2i/d))``, ``PE[p, 2i+1]`` cos."""
    exponent = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    inv_freq = np.float32(base) ** -exponent  # (ceil(d/2),)
    angles = np.arange(num_positions, dtype=np.float32)[:, None] * inv_freq[None, :]  # (n, d/2)
    table = np.empty((num_positions, 2 * inv_freq.size), dtype=np.float32)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table[:, :dim]


def torch_table_fp32(num_positions: int, dim: int, base: float = 10000.0) -> Tensor:
    """The sinusoidal table as the PyTorch tutorials write it (``div_term = exp(-2i ln(base)
    / d)``), angles in float32."""
    position = torch.arange(num_positions, dtype=torch.float32).unsqueeze(1)  # (n, 1)
    div_term = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(base) / dim))
    table = torch.zeros(num_positions, 2 * div_term.numel())
    table[:, 0::2] = torch.sin(position * div_term)
    table[:, 1::2] = torch.cos(position * div_term)
    return table[:, :dim]


def float64_table(num_positions: int, dim: int, base: float = 10000.0) -> np.ndarray:
    """The exact table: the formula transcribed in float64, angles ``p / base**(2i/d)``."""
    denominators = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = np.arange(num_positions, dtype=np.float64)[:, None] / denominators[None, :]
    table = np.empty((num_positions, 2 * denominators.size))
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table[:, :dim]


def suite_table(s: Settings) -> Section:
    from ...encodings.absolute.sinusoidal import sinusoidal_table

    n, d = s.table
    section = Section("table", "Sinusoidal table generation and its accuracy")
    section.intro = [
        f"A table of {n} positions × {d} channels (float32 output). posenc forms the angles in "
        "float64 and casts once; the usual NumPy and torch versions (written out in "
        "`posenc.bench.suites`) and `positional-encodings` form them in float32. "
        "`max error` is the largest absolute difference from the formula evaluated in "
        "float64, over the whole table. " + timing_line(s),
    ]
    cases = [
        Case("posenc sinusoidal_table", lambda: sinusoidal_table(n, d)),
        Case("NumPy, float32 angles", lambda: numpy_table_fp32(n, d)),
        Case("torch, float32 angles", lambda: torch_table_fp32(n, d)),
    ]
    try:
        from positional_encodings.torch_encodings import PositionalEncoding1D

        penc = PositionalEncoding1D(d)
        probe = torch.zeros(1, n, d)

        def peer_table() -> Tensor:
            penc.cached_penc = None  # it caches the last table: time the generation
            return penc(probe)[0]

        cases.append(Case("positional-encodings PositionalEncoding1D", peer_table))
    except ImportError:
        section.notes.append(missing_peer("positional-encodings", "PositionalEncoding1D"))
    timings = round_robin(cases, warmup=s.warmup, repeats=s.repeats)
    exact = float64_table(n, d)
    ours = timings[0]
    table = Table(["implementation", "median ms", "range ms", "x posenc time", "max error"])
    for case, t in zip(cases, timings, strict=True):
        with torch.inference_mode():
            values = case.fn()
        values = values.numpy() if isinstance(values, Tensor) else values
        error = float(np.abs(values.astype(np.float64) - exact).max())
        table.rows.append(
            [case.name, ms(t.median), spread(t), ratio(t.median, ours.median), f"{error:.1e}"]
        )
    section.tables.append(table)
    section.notes.append(
        "`x posenc time` above 1 means slower than posenc. float32 angles lose accuracy as the "
        "position grows (the angle `p · ω` is rounded to float32 before the sine); posenc "
        "pays for float64 angles once per table, which the modules cache."
    )
    return section


# --------------------------------------------------------------------------- add


def suite_add(s: Settings) -> Section:
    from ...encodings.absolute.sinusoidal import SinusoidalPositionalEncoding, sinusoidal_table

    b, n, d = s.add
    section = Section("add", "Adding an absolute encoding to the embeddings")
    section.intro = [
        f"`x` of shape ({b}, {n}, {d}); each implementation returns `x + PE[:n]`. The copy "
        "floor is `x.clone()` (the same bytes read and written once). posenc "
        "`SinusoidalPositionalEncoding.forward` includes its checks, the table slice and the "
        "dropout module (p = 0); `x + table` is the bare add with a precomputed table. "
        "bfloat16 inputs are added in float32 and cast once by posenc. " + timing_line(s),
    ]
    table = Table(
        ["dtype", "implementation", "median ms", "range ms", "x floor", "x posenc time"],
        text_columns=2,
    )
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(b, n, d).to(dtype)
        pe = SinusoidalPositionalEncoding(d, max_len=n)
        fixed = sinusoidal_table(n, d, dtype=dtype)
        cases = [
            Case("copy floor", copy_floor(x)),
            Case("posenc SinusoidalPositionalEncoding", lambda x=x, pe=pe: pe(x)),
            Case("x + table (plain torch)", lambda x=x, t=fixed: x + t),
        ]
        if dtype == torch.float32:
            try:
                from positional_encodings.torch_encodings import PositionalEncoding1D, Summer

                summer = Summer(PositionalEncoding1D(d))
                cases.append(Case("positional-encodings Summer", lambda x=x, f=summer: f(x)))
            except ImportError:
                section.notes.append(missing_peer("positional-encodings", "Summer"))
        timings = round_robin(cases, warmup=s.warmup, repeats=s.repeats)
        floor, ours = timings[0], timings[1]
        name = str(dtype).removeprefix("torch.")
        for case, t in zip(cases, timings, strict=True):
            table.rows.append(
                [name, case.name, ms(t.median), spread(t), ratio(t.median, floor.median),
                 "-" if case.name == "copy floor" else ratio(t.median, ours.median)]
            )  # fmt: skip
    section.tables.append(table)
    return section
