"""Time the Encoder of two posenc source trees, alternately, on the same machine.

Used for issue #15 (positions computed once per forward): the tree before the change and
the tree after it each run in their own process (one package cannot be imported twice), in
``--rounds`` alternating rounds, so slow drift of the machine hits both alike.

    python benchmarks/encoder_versions.py BEFORE_SRC AFTER_SRC [--rounds 3] [--out FILE.md]

Each case is an Encoder of width 256, 4 heads, feed-forward 1024, input (4, 128, 256) fp32
(the shape of ``posenc bench encoder``), at depth 2 and 8, for sinusoidal, rope, alibi and
t5: ``eval`` is a forward under ``torch.inference_mode``, ``train`` a forward and backward
with dropout 0. Medians of 15 timed calls after 3 warm-up calls.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CASES = [(pe, depth) for depth in (2, 8) for pe in ("sinusoidal", "rope", "alibi", "t5")]


def worker() -> None:
    """Run in a child process with one tree on ``PYTHONPATH``: print one JSON line."""
    import torch

    import posenc

    torch.manual_seed(0)
    x = torch.randn(4, 128, 256)
    out: dict[str, float] = {}
    for pe, depth in CASES:
        for mode in ("eval", "train"):
            # a fresh model per mode: before the fix in this change, a RoPE table built under
            # inference_mode broke a later training step
            torch.manual_seed(0)
            enc = posenc.Encoder(256, depth, 4, pe=pe, ffn_dim=1024)
            enc.train(mode == "train")

            def call(enc: torch.nn.Module = enc, mode: str = mode) -> None:
                if mode == "eval":
                    with torch.inference_mode():
                        enc(x)
                else:
                    enc.zero_grad(set_to_none=True)
                    enc(x).sum().backward()

            for _ in range(3):
                call()
            times = []
            for _ in range(15):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            out[f"{pe}|{depth}|{mode}"] = statistics.median(times) * 1e3
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="the src/ folder of the tree before")
    parser.add_argument("after", help="the src/ folder of the tree after")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="write the markdown table here")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for name in ("before", "after"):
            env = {**os.environ, "PYTHONPATH": getattr(args, name)}
            text = subprocess.run(
                [sys.executable, __file__, "--worker"],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            runs[name].append(json.loads(text.strip().splitlines()[-1]))
    lines = [
        "| encoding | depth | mode | before ms (each round) | after ms (each round) | "
        "after / before (medians) |",
        "| --- | ---: | --- | --- | --- | ---: |",
    ]
    for key in runs["before"][0]:
        pe, depth, mode = key.split("|")
        before = [r[key] for r in runs["before"]]
        after = [r[key] for r in runs["after"]]
        ratio = statistics.median(after) / statistics.median(before)
        lines.append(
            f"| {pe} | {depth} | {mode} | {', '.join(f'{t:.2f}' for t in before)} | "
            f"{', '.join(f'{t:.2f}' for t in after)} | {ratio:.2f} |"
        )
    table = "\n".join(lines)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(table)
    print(f"\nload average at the end: {load}")
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(table + f"\n\nload average at the end: {load}\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        main()
