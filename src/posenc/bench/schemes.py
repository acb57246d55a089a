"""``posenc bench schemes``: one ``posenc.Encoder`` forward per registered encoding.

The registry decides what is timed, so a scheme registered by a user is timed beside the
built-in ones; grid encodings (2-D/3-D coordinates) are left out, as the encoder here reads a
sequence. The baseline is the encoder without positions (``none``).
"""

from __future__ import annotations

import torch

from ..encodings.registry import available, entry
from ..model.encoder import Encoder
from .harness import Case, Section, Table, ms, ratio, round_robin, spread


def sequence_schemes() -> list[str]:
    """Every registered encoding that takes a sequence (one coordinate per position)."""
    return [name for name in available() if entry(name).cls.axes == 1]


def suite_schemes(
    encoder: tuple[int, int, int, int, int, int], *, warmup: int, repeats: int
) -> Section:
    """Time ``Encoder(dim, depth, heads, pe=name, ffn_dim=ffn)`` in eval mode on a
    ``(batch, n, dim)`` input for every sequence scheme; ``encoder`` is ``(dim, depth, heads,
    ffn, batch, n)``."""
    dim, depth, heads, ffn, batch, n = encoder
    names = sequence_schemes()
    section = Section("schemes", "Every registered encoding in one encoder")
    section.intro = [
        f"`posenc.Encoder({dim}, {depth}, {heads}, pe=NAME, ffn_dim={ffn})` in eval mode, "
        f"forward only, on a ({batch}, {n}, {dim}) fp32 input, for every registered encoding "
        "that takes a sequence (`posenc list`). `x none`: its median over that of "
        f'`pe="none"`. Medians over {repeats} timed calls per case, taken round-robin, after '
        f"{warmup} warm-up call(s) of each.",
    ]
    x = torch.randn(batch, n, dim)
    cases = []
    for name in names:
        torch.manual_seed(0)
        model = Encoder(dim, depth, heads, pe=name, ffn_dim=ffn).eval()
        cases.append(Case(name, lambda model=model: model(x)))
    timings = round_robin(cases, warmup=warmup, repeats=repeats)
    baseline = dict(zip(names, timings, strict=True)).get("none")
    table = Table(["encoding", "family", "median ms", "range ms", "x none"], text_columns=2)
    for name, t in zip(names, timings, strict=True):
        against = "-" if baseline is None else ratio(t.median, baseline.median)
        table.rows.append([name, entry(name).family, ms(t.median), spread(t), against])
    section.tables.append(table)
    return section
