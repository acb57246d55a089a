"""The ``rope`` suite of ``posenc bench``: RoPE on queries and keys, both layouts, fp32 and
bf16, against transformers, rotary-embedding-torch, x-transformers and the copy floor (the
cases themselves are :func:`posenc.bench.rope.rope_cases`)."""

from __future__ import annotations

import torch

from ..harness import Case, Section, Table, ms, ratio, round_robin, spread
from .settings import Settings, missing_peer, timing_line


def suite_rope(s: Settings) -> Section:
    from ..rope import rope_cases

    section = Section("rope", "RoPE applied to queries and keys")
    shape = s.rope
    section.intro = [
        f"q and k of shape {shape} (batch, heads, n, head dim), rotated together. posenc "
        "`RotaryEmbedding.forward` includes forming cos/sin from its cached table; "
        "`apply_rotary` and the peers get precomputed tables, so only the rotation is timed. "
        "Each peer runs in its native layout: transformers' `apply_rotary_pos_emb` in the "
        "half (GPT-NeoX/Llama) layout, rotary-embedding-torch and x-transformers in the "
        "interleaved (GPT-J) one. The copy floor is `q.clone(); k.clone()` in the same dtype; "
        "`copy into existing buffers` is the same copy without the page faults of fresh "
        "outputs. `eager` is posenc with compilation switched off. " + timing_line(s),
    ]
    table = Table(
        ["dtype", "implementation", "layout", "median ms", "range ms", "x floor",
         "x posenc time"],
        text_columns=3,
    )  # fmt: skip
    first_calls: list[tuple[str, str, float]] = []
    for dtype in (torch.float32, torch.bfloat16):
        q, k = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
        triples = rope_cases(q, k, first_calls)
        timings = round_robin(
            [Case(f"{name}|{layout}", fn) for name, layout, fn in triples],
            warmup=s.warmup,
            repeats=s.repeats,
        )
        floor = timings[0]
        ours = {
            layout: t
            for (name, layout, _), t in zip(triples, timings, strict=True)
            if name == "posenc RotaryEmbedding"
        }
        for (name, layout, _), t in zip(triples, timings, strict=True):
            relative = "-" if layout not in ours else ratio(t.median, ours[layout].median)
            table.rows.append(
                [str(dtype).removeprefix("torch."), name, layout, ms(t.median), spread(t),
                 ratio(t.median, floor.median), relative]
            )  # fmt: skip
    section.tables.append(table)
    present = {row[1] for row in table.rows}
    for dist, label in (
        ("transformers", "transformers"),
        ("rotary-embedding-torch", "rotary-embedding-torch"),
        ("x-transformers", "x-transformers"),
    ):
        if label not in present:
            section.notes.append(missing_peer(dist, label))
    section.notes.append(
        "`x posenc time` is the time over posenc `RotaryEmbedding.forward` in the same layout "
        "and dtype (above 1: slower than posenc). First posenc call per dtype and layout "
        "(tables, and `torch.compile` of the fused kernel where used), not in the medians: "
        + ", ".join(f"{d} {layout} {sec:.2f} s" for d, layout, sec in first_calls)
    )
    return section
