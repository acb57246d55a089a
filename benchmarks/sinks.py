"""Time flex attention with learned sinks against flex without, on the CPU (the section
"Sinks on flex" of benchmarks/bias.md): q, k, v of 1 x 4 x 2048 x 64 fp32, compiled,
inference, unmasked and causal; SDPA with and without sinks beside it. Calls interleave
(one of each per round) so their ratio is measured under the same load.

    PYTHONPATH=src python benchmarks/sinks.py [--n 2048] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from posenc.attention import backends
from posenc.attention.backends import AttentionCall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    n, h, d = args.n, 4, 64
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, d, generator=gen) for _ in range(3))
    sinks = torch.randn(h, generator=gen)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, 1 x {h} x {n} x {d}")
    for causal in (False, True):
        runs = {
            f"{name} {'sinks' if s is not None else 'plain'}": (fn, s)
            for name, fn in (("flex", backends.flex_backend), ("sdpa", backends.sdpa_backend))
            for s in (None, sinks)
        }
        times: dict[str, list[float]] = {key: [] for key in runs}
        outs = {}
        with torch.no_grad():
            for key, (fn, s) in runs.items():  # warm-up: compiles
                start = time.perf_counter()
                outs[key] = fn(q, k, v, AttentionCall(batch=1, nq=n, causal=causal, sinks=s))[0]
                print(f"  first call {key}: {time.perf_counter() - start:.1f} s")
            for _ in range(args.rounds):
                for key, (fn, s) in runs.items():
                    call = AttentionCall(batch=1, nq=n, causal=causal, sinks=s)
                    start = time.perf_counter()
                    fn(q, k, v, call)
                    times[key].append(time.perf_counter() - start)
        median = {key: statistics.median(t) for key, t in times.items()}
        print(f"causal={causal}")
        for key, t in times.items():
            print(f"  {key:12s} median {median[key] * 1e3:7.1f} ms  range "
                  f"{min(t) * 1e3:.1f}-{max(t) * 1e3:.1f} ms")  # fmt: skip
        for name in ("flex", "sdpa"):
            ratio = median[f"{name} sinks"] / median[f"{name} plain"]
            diff = (outs[f"{name} sinks"] - outs["sdpa sinks"]).abs().max().item()
            print(f"  {name}: sinks / plain = {ratio:.3f}; max |out - sdpa sinks| = {diff:.1e}")


if __name__ == "__main__":
    main()
