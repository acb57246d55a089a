"""Attention with a positional bias: time and peak extra memory per backend against sequence
length, written to ``benchmarks/bias.md``.

    python -m posenc.bench.bias            # the full sweep (minutes)
    python -m posenc.bench.bias --quick    # n = 1024, 2048 only

Backends (16 heads, head dim 64, batch 1, fp32, inference, no mask):

* ``flex``: compiled ``flex_attention`` with the scheme's ``score_mod`` (no ``n × n`` tensor);
* ``sdpa``: the bias materialised, ``(h, n, n)``, then ``F.scaled_dot_product_attention``
  with it as the float mask (what peers do);
* ``math``: the bias materialised, then the explicit softmax.

Each size runs in a fresh subprocess, so compilation caches and allocator state of one
cannot affect another; within it the backends are timed interleaved (one call of each per
round), so a busy CPU slows them alike.

Memory: glibc is told to serve every allocation above 64 KiB with ``mmap``
(``MALLOC_MMAP_THRESHOLD_``), so freed tensors leave the resident set at once; after the
warm-up (and compilation) the kernel's high-water mark is reset (``/proc/self/clear_refs``)
and one call is run; the peak resident set minus the resident set before it is the extra
memory that call needed: the inputs exist before and are excluded, the output (``h·n·d``
floats, 4 MiB per 1024 tokens here) is included.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HEADS, HEAD_DIM = 16, 64
SIZES = (1024, 2048, 4096, 8192, 16384)
BACKENDS = ("flex", "sdpa", "math")
#: A configuration is skipped when its predicted time per call exceeds this.
MAX_SECONDS_PER_CALL = 60.0
GIB = 2**30


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def run_size(scheme: str, n: int, backends: list[str], repeats: int) -> list[dict[str, Any]]:
    """Every backend at one size, in this process: warm up (compiling flex), measure the peak
    extra memory of one call of each, then time them interleaved, ``repeats`` rounds of one
    call each, so a busy CPU slows them alike and their ratio stays fair."""
    import statistics

    import torch
    import torch.nn.functional as F

    from posenc.attention.flex import flex_attention_forward, flex_block_mask
    from posenc.attention.sdpa import scaled_dot_product_attention
    from posenc.bench.timing import Timing
    from posenc.encodings.registry import build_for_model

    torch.manual_seed(0)
    pe = build_for_model(scheme, HEADS * HEAD_DIM, HEADS)
    q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM) for _ in range(3))
    pos = torch.arange(n)
    # what MultiHeadAttention passes: 128 x 128 blocks, all full here (no mask)
    blocks = flex_block_mask(1, n, n, causal=False, key_padding_mask=None, device=q.device)

    def call(backend: str) -> torch.Tensor:
        if backend == "flex":
            out = flex_attention_forward(
                q, k, v, score_mod=pe.score_mod(pos, pos, q=q, k=k), block_mask=blocks
            )
            if out is None:
                raise RuntimeError("flex_attention could not be compiled here")
            return out
        bias = pe.bias(pos, pos, q=q, k=k)  # (h, n, n): the materialised bias
        if backend == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return scaled_dot_product_attention(q, k, v, bias=bias)[0]

    rows: dict[str, dict[str, Any]] = {}
    samples: dict[str, list[float]] = {b: [] for b in backends}
    outputs: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        for backend in backends:
            start = time.perf_counter()
            outputs[backend] = call(backend)  # compiles flex
            first = time.perf_counter() - start
            rss_before = _status_kib("VmRSS")
            exact = _reset_peak()
            call(backend)
            peak = _status_kib("VmHWM")
            rows[backend] = {
                "scheme": scheme,
                "backend": backend,
                "n": n,
                "first_call_s": first,
                "extra_gib": (peak - rss_before) / 2**20,
                "peak_reset": exact,
                "repeats": repeats,
                # a sanity check, not a test: largest difference from the first backend
                "max_abs_diff": float((outputs[backend] - outputs[backends[0]]).abs().max()),
            }
            if backend != backends[0]:
                del outputs[backend]
        for _ in range(repeats):
            for backend in backends:
                start = time.perf_counter()
                call(backend)
                samples[backend].append(time.perf_counter() - start)
    for backend in backends:
        times = samples[backend]
        timing = Timing(
            f"{scheme}/{backend}/{n}", statistics.median(times), min(times), max(times), repeats
        )
        rows[backend].update(median_s=timing.median, low_s=timing.low, high_s=timing.high)
    return [rows[b] for b in backends]


def _predicted_extra_gib(backend: str, n: int) -> float:
    """fp32 ``(h, n, n)`` tensors a materialising backend holds at once: the bias, plus for
    math the scores and the weights."""
    one = HEADS * n * n * 4 / GIB
    return {"flex": 0.0, "sdpa": 1.2 * one, "math": 3.2 * one}[backend]


def _available_gib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return 8.0


def _subprocess(scheme: str, n: int, backends: list[str], repeats: int) -> list[dict[str, Any]]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [sys.executable, "-m", "posenc.bench.bias", "--size", scheme, str(n), str(repeats)]
    done = subprocess.run([*cmd, *backends], env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(done.stderr[-400:].strip())
    return json.loads(done.stdout.strip().splitlines()[-1])


def sweep(
    sizes: tuple[int, ...], schemes: dict[str, tuple[int, ...]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Run every size of every scheme (``schemes`` maps a scheme to the sizes it runs at),
    skipping backends predicted to run out of memory or past ``MAX_SECONDS_PER_CALL``."""
    results: list[dict[str, Any]] = []
    skipped: list[str] = []
    for scheme, scheme_sizes in schemes.items():
        last_time: dict[str, tuple[int, float]] = {}
        for n in (s for s in sizes if s in scheme_sizes):
            backends = []
            for backend in BACKENDS:
                need = _predicted_extra_gib(backend, n)
                if need > 0.6 * _available_gib():
                    skipped.append(
                        f"{scheme}/{backend} at n={n}: needs about {need:.1f} GiB, "
                        f"{_available_gib():.1f} GiB available"
                    )
                    continue
                if backend in last_time:
                    n0, t0 = last_time[backend]
                    predicted = t0 * (n / n0) ** 2
                    if predicted > MAX_SECONDS_PER_CALL:
                        skipped.append(
                            f"{scheme}/{backend} at n={n}: predicted {predicted:.0f} s per call "
                            f"(> {MAX_SECONDS_PER_CALL:.0f} s)"
                        )
                        continue
                backends.append(backend)
            if not backends:
                continue
            repeats = 5 if n <= 2048 else 3 if n <= 4096 else 2
            print(f"{scheme:6s} n={n:6d} {'/'.join(backends)} ...", end=" ", flush=True)
            try:
                rows = _subprocess(scheme, n, backends, repeats)
            except RuntimeError as error:
                print("failed")
                skipped.append(f"{scheme} at n={n}: failed: {error}")
                continue
            print(", ".join(f"{r['backend']} {r['median_s']:.3f} s" for r in rows))
            results += rows
            for r in rows:
                last_time[r["backend"]] = (n, r["median_s"])
    return results, skipped


def report(results: list[dict[str, Any]], skipped: list[str], seconds: float) -> str:
    import torch

    lines = [
        "# Attention with a positional bias: time and memory per backend",
        "",
        f"Produced by `python -m posenc.bench.bias` in {seconds / 60:.1f} min "
        f"(torch {torch.__version__}, {os.cpu_count()} CPU cores, "
        f"{torch.get_num_threads()} threads). "
        f"{HEADS} heads, head dim {HEAD_DIM}, batch 1, fp32, inference, no mask.",
        "",
        "The CPU is shared with other jobs, so absolute times are noisy; the backends of one "
        "size run in one process, timed interleaved (a call of each per round), so their "
        "ratio is measured under the same load. `flex` is compiled `flex_attention` with "
        "the scheme's `score_mod`; `sdpa` materialises the `(h, n, n)` bias and passes it to "
        "`F.scaled_dot_product_attention`; `math` materialises it and runs the explicit "
        "softmax. Each time includes forming the bias (or the score_mod) on every call.",
        "",
        "**Memory** is the extra resident memory one call needs beyond its inputs (its "
        "output, 4 MiB per 1024 tokens, is included). Each size runs in a fresh process; "
        "glibc serves every allocation "
        "above 64 KiB with `mmap` (`MALLOC_MMAP_THRESHOLD_=65536`) so freed tensors leave the "
        "resident set at once; after warm-up and compilation the kernel's peak-RSS mark is "
        "reset (`echo 5 > /proc/self/clear_refs`), one call runs, and the reported figure is "
        "peak RSS (`VmHWM`) minus RSS before the call. `tracemalloc` cannot see torch's "
        "allocations and `ru_maxrss` cannot be reset (compilation would dominate it).",
        "",
        "`flex` is given a `BlockMask` of 128 x 128 blocks even without a mask (as "
        "`MultiHeadAttention` does): without one, the CPU kernel takes the whole `n x n` as "
        "one block and allocates an `n x n` buffer per thread (0.5 GiB at n = 8192 on two "
        "threads, and about 3x slower there).",
        "",
        "| scheme | n | backend | median s | range s | extra memory GiB | first call s | "
        "flex speed-up vs sdpa | max abs diff vs first |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    by_key = {(r["scheme"], r["n"], r["backend"]): r for r in results}
    for r in results:
        sdpa = by_key.get((r["scheme"], r["n"], "sdpa"))
        speedup = ""
        if r["backend"] == "flex" and sdpa is not None:
            speedup = f"{sdpa['median_s'] / r['median_s']:.2f}x"
        lines.append(
            f"| {r['scheme']} | {r['n']} | {r['backend']} | {r['median_s']:.3f} | "
            f"{r['low_s']:.3f}-{r['high_s']:.3f} | {r['extra_gib']:.3f} | "
            f"{r['first_call_s']:.1f} | {speedup} | {r['max_abs_diff']:.1e} |"
        )
    lines += [
        "",
        "The first call of `flex` includes compiling the kernel for that shape. The last "
        "column is a sanity check: the largest difference between a backend's output and "
        "that of the first backend run at that size.",
        "",
    ]
    if skipped:
        lines += ["## Skipped", ""] + [f"- {s}" for s in skipped] + [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posenc.bench.bias", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="n = 1024 and 2048 only")
    parser.add_argument("--out", default="benchmarks/bias.md", help="where to write the table")
    parser.add_argument("--size", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.size:  # internal: one size in a fresh process
        scheme, n, repeats, *backends = args.size
        print(json.dumps(run_size(scheme, int(n), backends, int(repeats))))
        return 0
    sizes = SIZES[:2] if args.quick else SIZES
    start = time.perf_counter()
    results, skipped = sweep(sizes, {"alibi": SIZES, "t5": (4096,)})
    text = report(results, skipped, time.perf_counter() - start)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
