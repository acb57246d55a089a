"""The subprocess in which ``posenc bench`` sweeps attention with a bias and RoPE over sequence
lengths, measuring time and peak memory per configuration.

    python -m posenc.bench.worker '<json spec>'     # one JSON object per line on stdout

Why a separate process: peak memory needs an allocator that gives freed memory back at once
and a peak counter that can be reset, neither of which the parent process can promise, and
a configuration that runs out of memory must not take the whole run down with it. The parent
starts this worker with ``MALLOC_MMAP_THRESHOLD_=65536``, so glibc serves every allocation
above 64 KiB with ``mmap`` and a freed tensor leaves the resident set at once. Per
configuration: one call (the first, which compiles where the backend compiles) and then the
kernel's peak-RSS mark is reset (``echo 5 > /proc/self/clear_refs``), one more call runs,
and ``VmHWM - VmRSS(before)`` is its extra memory: inputs and weights exist before and are
excluded, the output and every temporary are included. All sizes run in this one process,
because compiling flex attention costs seconds per shape and a fresh process per size would
pay the start-up (tens of seconds) again each time; the reset makes each figure independent
of what ran before it.

All variants of one size are timed round-robin (a call of each per round), so their ratios are
measured under the same load. A variant is skipped at a size when its predicted time per call
(from the previous size and the expected growth) exceeds the budget, or its predicted memory
exceeds half of the memory available; each skip is reported as a line of its own.

Dimension legend: ``b`` batch (1), ``h`` heads, ``n`` sequence, ``d`` head dim, ``D`` width.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from .harness import Case, round_robin

ATTENTION_VARIANTS = ("flex", "sdpa", "math", "torch-mha")
ROPE_VARIANTS = ("posenc", "copy floor", "transformers")
MIB = 2**20
#: The backend each posenc attention variant actually ran (``MultiHeadAttention.last_backend``):
#: flex falls back to sdpa where it cannot compile, and the report must say so.
BACKEND_USED: dict[str, str | None] = {}


def status_kib(field: str) -> int | None:
    """A ``VmRSS``/``VmHWM`` figure of this process in KiB, or ``None`` off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux ``clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def extra_memory_mib(fn: Callable[[], object]) -> float | None:
    """Peak resident memory of one call of ``fn`` above the resident memory before it."""
    before = status_kib("VmRSS")
    if before is None or not reset_peak():
        return None
    fn()
    peak = status_kib("VmHWM")
    return None if peak is None else (peak - before) / 1024


def available_mib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 8 * 1024.0


# --------------------------------------------------------------------------- attention


def alibi_bias_reference(slopes: torch.Tensor, n: int) -> torch.Tensor:
    """The ALiBi bias as a user of plain torch materialises it (Press et al. 2022, §3):
    ``bias[h, i, j] = -slopes[h] * |i - j|``, shape ``(h, n, n)``, float32."""
    pos = torch.arange(n, dtype=torch.float32)
    distance = (pos[None, :] - pos[:, None]).abs()  # (n, n)
    return -slopes.to(torch.float32).view(-1, 1, 1) * distance  # (h, n, n)


def attention_calls(spec: dict[str, Any], n: int) -> dict[str, Callable[[], object]]:
    """One callable per attention variant at length ``n``, all on the same input and the same
    weights: posenc ``MultiHeadAttention`` with ALiBi per backend, and
    ``torch.nn.MultiheadAttention`` given the materialised bias as its float mask."""
    import posenc

    dim, heads = spec["dim"], spec["heads"]
    torch.manual_seed(0)
    pe = posenc.build("alibi", num_heads=heads)
    x = torch.randn(1, n, dim)  # (b, n, D)
    calls: dict[str, Callable[[], object]] = {}
    reference: posenc.MultiHeadAttention | None = None
    for backend in ("flex", "sdpa", "math"):
        if backend not in spec["variants"]:
            continue
        module = posenc.MultiHeadAttention(
            dim, heads, pe=pe, backend=backend, compile_flex=spec.get("compile_flex", True)
        ).eval()
        if reference is None:
            reference = module
        else:
            module.load_state_dict(reference.state_dict())

        def call(m: posenc.MultiHeadAttention = module, name: str = backend) -> object:
            out = m(x)
            BACKEND_USED[name] = m.last_backend
            return out

        calls[backend] = call
    if "torch-mha" in spec["variants"]:
        peer = torch.nn.MultiheadAttention(dim, heads, batch_first=True).eval()
        if reference is not None:  # the same weights: the outputs must agree
            with torch.no_grad():
                peer.in_proj_weight.copy_(reference.qkv.weight)
                peer.in_proj_bias.copy_(reference.qkv.bias)
                peer.out_proj.weight.copy_(reference.out.weight)
                peer.out_proj.bias.copy_(reference.out.bias)
        slopes = pe.slopes  # type: ignore[union-attr]

        def torch_mha() -> object:
            bias = alibi_bias_reference(slopes, n)  # (h, n, n) == (b*h, n, n) for b = 1
            return peer(x, x, x, attn_mask=bias, need_weights=False)[0]

        calls["torch-mha"] = torch_mha
    return calls


def attention_predicted_mib(spec: dict[str, Any], variant: str, n: int) -> float:
    """fp32 ``(h, n, n)`` tensors a variant holds at once (the bias, plus scores and weights
    for math and for eager flex)."""
    one = spec["heads"] * n * n * 4 / MIB
    if variant == "flex":
        return 0.0 if spec.get("compile_flex", True) else 3.2 * one
    return {"sdpa": 1.2, "math": 3.2, "torch-mha": 2.2}[variant] * one


# --------------------------------------------------------------------------- rope


def rope_calls(spec: dict[str, Any], n: int) -> dict[str, Callable[[], object]]:
    """posenc ``RotaryEmbedding`` (half layout, fp32, tables included), the copy floor and
    transformers' ``apply_rotary_pos_emb`` (tables precomputed) on q, k ``(1, h, n, d)``."""
    from ..encodings.rotary.rope import RotaryEmbedding
    from .rope import rope_peers
    from .timing import copy_floor

    torch.manual_seed(0)
    shape = (1, spec["heads"], n, spec["head_dim"])
    q, k = torch.randn(shape), torch.randn(shape)
    rope = RotaryEmbedding(spec["head_dim"])
    calls: dict[str, Callable[[], object]] = {
        "posenc": lambda: rope(q, k),
        "copy floor": copy_floor(q, k),
    }
    for name, fn in rope_peers(q, k, interleaved=False):
        calls[name] = fn
    return {v: calls[v] for v in spec["variants"] if v in calls}


def rope_predicted_mib(spec: dict[str, Any], variant: str, n: int) -> float:
    return 4 * spec["heads"] * n * spec["head_dim"] * 4 / MIB


# --------------------------------------------------------------------------- sweep


def sweep(spec: dict[str, Any], emit: Callable[[dict[str, Any]], None]) -> None:
    """Every size of ``spec["sizes"]``: build the variants, skip those predicted too slow or
    too big, measure first call and memory, then time the rest round-robin."""
    kind = spec["kind"]
    make, predict_mib, growth = {
        "attention": (attention_calls, attention_predicted_mib, 2.0),
        "rope": (rope_calls, rope_predicted_mib, 1.0),
    }[kind]
    torch.set_num_threads(spec["threads"])
    last: dict[str, tuple[int, float]] = {v: (n, t) for v, (n, t) in spec.get("last", {}).items()}
    for n in spec["sizes"]:
        keep = []
        for variant in spec["variants"]:
            need, room = predict_mib(spec, variant, n), 0.5 * available_mib()
            if need > room:
                emit(
                    {
                        "n": n,
                        "variant": variant,
                        "skipped": f"needs about {need:.0f} MiB, "
                        f"over half of the {2 * room:.0f} MiB available",
                    }
                )
                continue
            if variant in last:
                n0, t0 = last[variant]
                predicted = t0 * (n / n0) ** growth
                if predicted > spec["max_call_s"]:
                    emit(
                        {
                            "n": n,
                            "variant": variant,
                            "skipped": f"predicted {predicted:.1f} s "
                            f"per call, over the {spec['max_call_s']:g} s budget",
                        }
                    )
                    continue
            keep.append(variant)
        if not keep:
            continue
        calls = make(spec, n)
        rows: dict[str, dict[str, Any]] = {}
        with torch.inference_mode():
            for variant in keep:
                if variant not in calls:
                    emit({"n": n, "variant": variant, "skipped": "not installed"})
                    continue
                start = time.perf_counter()
                calls[variant]()  # the first call: tables, compilation
                first = time.perf_counter() - start
                start = time.perf_counter()
                extra = extra_memory_mib(calls[variant])
                rows[variant] = {
                    "n": n,
                    "variant": variant,
                    "first_s": first,
                    "second_s": time.perf_counter() - start,
                    "extra_mib": extra,
                }
                if variant in BACKEND_USED:
                    rows[variant]["backend_used"] = BACKEND_USED[variant]
        if kind == "attention" and "torch-mha" in rows and len(rows) > 1:
            with torch.inference_mode():
                ours = next(calls[v] for v in rows if v != "torch-mha")()
                theirs = calls["torch-mha"]()
            rows["torch-mha"]["max_abs_diff"] = float((ours - theirs).abs().max())  # type: ignore[operator]
        per_round = sum(r["second_s"] for r in rows.values())
        repeats = max(2, min(spec["repeats"], int(spec["size_budget_s"] / max(per_round, 1e-9))))
        names = list(rows)
        timings = round_robin([Case(v, calls[v]) for v in names], warmup=0, repeats=repeats)
        for variant, t in zip(names, timings, strict=True):
            row = rows[variant]
            row.update(median_s=t.median, low_s=t.low, high_s=t.high, repeats=t.repeats)
            last[variant] = (n, t.median)
            emit(row)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m posenc.bench.worker '<json spec>'")
    spec = json.loads(args[0])

    def emit(row: dict[str, Any]) -> None:
        print(json.dumps(row), flush=True)

    sweep(spec, emit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
