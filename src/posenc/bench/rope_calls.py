"""The first call and the decode step of ``posenc bench rope`` (``rope.py`` has the rest of the
suite): the first posenc call in a fresh process per dtype and layout, and one new token at a
far position with grouped-query heads, posenc against transformers and the clone floor.
"""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from ..encodings.rotary.rope import RotaryEmbedding
from .harness import Case, Table, ratio
from .timing import Timing, copy_floor

#: Decode step: q and k of one new token (grouped-query heads) at this position.
DECODE_Q, DECODE_K, DECODE_POSITION = (8, 32, 1, 128), (8, 8, 1, 128), 4095
#: Names of the posenc rows, as the tables show them.
FORWARD, IN_PLACE = "posenc RotaryEmbedding", "posenc RotaryEmbedding, in place"


_FIRST_CALL = """
import json, sys, time
import torch
from posenc import RotaryEmbedding
torch.set_num_threads({threads})
dtype, interleaved = getattr(torch, {dtype!r}), {interleaved}
q, k = torch.randn({shape}).to(dtype), torch.randn({shape}).to(dtype)
start = time.perf_counter()
rope = RotaryEmbedding({head_dim}, interleaved=interleaved)  # builds its table
rope.cos_sin(None, {n}, dtype=torch.float32)
table = time.perf_counter()
rope(q, k)
first = time.perf_counter()
rope(q, k)
second = time.perf_counter()
rope(q, k, inplace=True)
inplace = time.perf_counter()
print(json.dumps({{"table": table - start, "first": first - table, "second": second - first,
                  "inplace": inplace - second}}))
"""


def first_calls(shape: tuple[int, ...], threads: int) -> list[dict[str, object]]:
    """The first posenc call per dtype and layout, each in a fresh Python process."""
    rows: list[dict[str, object]] = []
    for dtype in ("float32", "bfloat16"):
        for interleaved in (False, True):
            script = _FIRST_CALL.format(
                threads=threads,
                dtype=dtype,
                interleaved=interleaved,
                shape=tuple(shape),
                head_dim=shape[-1],
                n=shape[-2],
            )
            done = subprocess.run(
                [sys.executable, "-c", script], capture_output=True, text=True, check=False
            )
            layout = "interleaved" if interleaved else "half"
            row: dict[str, object] = {"dtype": dtype, "layout": layout}
            if done.returncode == 0:
                row.update(json.loads(done.stdout.strip().splitlines()[-1]))
            else:
                row["error"] = (done.stderr.strip().splitlines() or ["?"])[-1]
            rows.append(row)
    return rows


# --------------------------------------------------------------------------- decode


def decode_cases() -> list[Case]:
    """A decode step: posenc out of place and in place, transformers, and the clone floor."""
    torch.manual_seed(0)
    q, k = torch.randn(DECODE_Q), torch.randn(DECODE_K)
    position = torch.tensor([DECODE_POSITION])
    rope = RotaryEmbedding(DECODE_Q[-1])
    with torch.inference_mode():
        rope(q, k, position)  # builds the table
    cases = [
        Case("q.clone(); k.clone()", copy_floor(q, k)),
        Case(FORWARD, lambda: rope(q, k, position)),
        Case(IN_PLACE, lambda: rope(q, k, position, inplace=True)),
    ]
    try:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import (
            LlamaRotaryEmbedding,
            apply_rotary_pos_emb,
        )
    except ImportError:
        return cases
    config = LlamaConfig(
        hidden_size=DECODE_Q[1] * DECODE_Q[-1],
        num_attention_heads=DECODE_Q[1],
        num_key_value_heads=DECODE_K[1],
        max_position_embeddings=8192,
    )
    llama = LlamaRotaryEmbedding(config)
    ids = position[None]

    def transformers_step() -> object:
        cos, sin = llama(q, ids)
        return apply_rotary_pos_emb(q, k, cos, sin)

    cases.append(
        Case("transformers LlamaRotaryEmbedding + apply_rotary_pos_emb", transformers_step)
    )
    return cases


def first_call_table(rows: list[dict[str, object]], shape: tuple[int, ...]) -> Table:
    table = Table(
        ["dtype", "layout", "table s", "first call s", "second call s", "first in place s"],
        caption=f"First call in a fresh process, q and k of shape {tuple(shape)} (a subprocess "
        "per row: constructing the module, which builds its cos/sin table; the first "
        "out-of-place forward and a second one, whose difference is what a first call costs "
        "beyond the work itself; then the first in-place forward):",
        text_columns=2,
    )
    for row in rows:
        if "error" in row:
            table.rows.append(
                [str(row["dtype"]), str(row["layout"]), str(row["error"]), "", "", ""]
            )
            continue
        keys = ("table", "first", "second", "inplace")
        cells = [f"{float(row[key]):.3f}" for key in keys]  # type: ignore[arg-type]
        table.rows.append([str(row["dtype"]), str(row["layout"]), *cells])
    return table


def decode_table(cases: list[Case], timings: list[Timing]) -> Table:
    table = Table(
        ["implementation", "median µs", "range µs", "x clone", "x posenc time"],
        caption=f"Decode step: one new token at position {DECODE_POSITION}, q {DECODE_Q} and "
        f"k {DECODE_K}, float32, half layout (`positions=torch.tensor([{DECODE_POSITION}])`; "
        "transformers: its rotary module's forward and `apply_rotary_pos_emb`):",
    )
    floor = timings[0]
    ours = next(t for case, t in zip(cases, timings, strict=True) if case.name == FORWARD)
    for case, t in zip(cases, timings, strict=True):
        relative = "-" if case is cases[0] else ratio(t.median, ours.median)
        table.rows.append(
            [case.name, f"{t.median * 1e6:.1f}", f"{t.low * 1e6:.0f}–{t.high * 1e6:.0f}",
             ratio(t.median, floor.median), relative]
        )  # fmt: skip
    return table
