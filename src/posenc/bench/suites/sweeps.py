"""Measuring in a worker subprocess (:mod:`posenc.bench.worker`) for the ``bias`` and
``scaling`` suites: the rows of a sweep over sizes and variants, reused between the two suites
within one run, and the labels and sentences their tables share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import torch

from .settings import Settings

#: Rows measured by the worker in this run, by (kind, settings key, variant, n), so the
#: scaling suite reuses the sizes the bias suite already measured.
_MEASURED: dict[tuple[Any, ...], dict[str, Any]] = {}


def worker_rows(
    kind: str, spec: dict[str, Any], sizes: tuple[int, ...], variants: tuple[str, ...]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows for every (size, variant), from this run's earlier measurements where every
    variant of a size was measured together, else from a worker subprocess."""
    key = json.dumps(spec, sort_keys=True)
    rows: list[dict[str, Any]] = []
    todo: list[int] = []
    for n in sizes:
        known = [_MEASURED.get((kind, key, v, n)) for v in variants]
        if all(r is not None for r in known):
            rows += [r for r in known if r is not None]
        else:
            todo.append(n)
    notes: list[str] = []
    if todo:
        last = {
            r["variant"]: [r["n"], r["median_s"]]
            for r in sorted(rows, key=lambda r: r["n"])
            if "median_s" in r
        }
        full = dict(spec, kind=kind, sizes=todo, variants=list(variants), last=last)
        fresh, error = _run_worker(full)
        if error:
            notes.append(error)
        for r in fresh:
            _MEASURED[(kind, key, r["variant"], r["n"])] = r
        rows += fresh
    rows.sort(key=lambda r: (r["n"], variants.index(r["variant"])))
    return rows, notes


def _run_worker(spec: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [sys.executable, "-m", "posenc.bench.worker", json.dumps(spec)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    error = None
    if done.returncode:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no message)"]
        error = f"the measuring subprocess stopped (exit {done.returncode}): {tail[0]}"
    return rows, error


def attention_spec(s: Settings) -> dict[str, Any]:
    return {
        "dim": s.attn_dim,
        "heads": s.attn_heads,
        "compile_flex": s.compile_flex,
        "threads": s.threads or torch.get_num_threads(),
        "max_call_s": s.max_call_s,
        "repeats": s.repeats,
        "size_budget_s": s.size_budget_s,
    }


VARIANT_LABELS = {
    "flex": "posenc flex",
    "sdpa": "posenc sdpa",
    "math": "posenc math",
    "torch-mha": "torch MultiheadAttention + bias",
    "posenc": "posenc RotaryEmbedding",
    "copy floor": "copy floor",
    "transformers": "transformers apply_rotary_pos_emb",
}


def mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


MEMORY_LINE = (
    "`extra MiB` is the peak resident memory of one call above the resident memory before "
    "it (inputs and weights excluded, output and temporaries included), measured in a "
    "subprocess: glibc returns freed blocks at once (`MALLOC_MMAP_THRESHOLD_=65536`) and "
    "the kernel's peak-RSS mark is reset (`/proc/self/clear_refs`) before the call, so "
    "each figure stands alone although the sizes share the process (a fresh process per "
    "size would recompile flex attention each time). Sizes are timed round-robin across "
    "the variants, after two untimed calls of each (the first compiles); the number of "
    "timed rounds per size fits a time budget (at least 2)."
)


def skips(rows: list[dict[str, Any]]) -> list[str]:
    return [
        f"n = {r['n']}, {VARIANT_LABELS.get(r['variant'], r['variant'])}: skipped, {r['skipped']}"
        for r in rows
        if "skipped" in r
    ]
