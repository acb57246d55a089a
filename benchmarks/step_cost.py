"""Step-cost probe of ``posenc extrapolate``'s training loop (issue #38): a few hundred steps of
a small model, timed per step, under each change of the loop, and the cost of one checkpoint
of the ``scale`` preset's model.

    PYTHONPATH=src python benchmarks/step_cost.py --steps 300 --device cpu
    PYTHONPATH=src python benchmarks/step_cost.py --device cuda --dim 512 --depth 8 \\
        --train-len 256 --batch-size 32 --precision bf16      # the preset's model, on a GPU

Variants, each a fresh run from the same seed (in this order, so later ones are not helped
by a warmer cache than the first):

- ``before``: the loop as it was: the host reads the loss and accuracy after every step
  (``READ_EVERY = 1``) and a checkpoint every 100 steps;
- ``bulk-read``: the numbers read every 50 steps, still a checkpoint every 100 steps;
- ``wall-time``: and checkpoints by wall time (every 5 minutes: none within the probe)
  plus the last one;
- ``compile``: and ``torch.compile`` of the step; its first step holds the compilation
  (compiled in the first round only: a second compile would hit the first's caches).

For each: the first step (compilation, warm-up), the median of the steps after the first
10% (a step's steady cost), and the whole run; the variants run round-robin ``--rounds``
times and the table keeps each one's best round (the machine may be shared). On a CPU the
host waits for every kernel anyway, so ``bulk-read`` can only save the Python float
conversions there; on a GPU it saves the device draining each step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posenc.extrapolate import train as ex_train
from posenc.extrapolate.config import ExtrapolateConfig
from posenc.extrapolate.corpus import prepare_corpus
from posenc.runs import trainer as trainer_module
from posenc.runs.checkpoint import save_checkpoint
from posenc.runs.trainer import make_optimizer

VARIANTS = {
    "before": {"read_every": 1, "checkpoint_every": 100, "checkpoint_minutes": 0.0},
    "bulk-read": {"read_every": 50, "checkpoint_every": 100, "checkpoint_minutes": 0.0},
    "wall-time": {"read_every": 50, "checkpoint_every": 0, "checkpoint_minutes": 5.0},
    "compile": {"read_every": 50, "checkpoint_every": 0, "checkpoint_minutes": 5.0, "compile": 1},
}


def toy_text(folder: Path) -> Path:
    """40 files of random code-like words (the probe times steps, not learning)."""
    rng = np.random.default_rng(1)
    words = ["def", "return", "value", "self", "x", "\n", "    ", "(", ")", ":", "import"]
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(40):
        (folder / f"{i:02d}.txt").write_text(" ".join(rng.choice(words, size=3000)), "utf-8")
    return folder


def timed_run(config: ExtrapolateConfig, corpus: Any, out: Path, read_every: int, device: str):
    """Train ``config`` into ``out``; the wall time of each step (from the end of the one
    before, the first from the start of training) and of the whole run, in seconds."""
    stamps: list[float] = []
    real = ex_train.lm_step

    def stamped(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        if device.startswith("cuda"):
            torch.cuda.synchronize()  # (the probe's own wait, to time each step)
        stamps.append(time.perf_counter())
        return result

    ex_train.lm_step, trainer_module.READ_EVERY = stamped, read_every
    try:
        started = time.perf_counter()
        ex_train.train_model(config, corpus, out, device=device)
        total = time.perf_counter() - started
    finally:
        ex_train.lm_step, trainer_module.READ_EVERY = real, 50
    steps = np.diff([started, *stamps])
    return steps, total


def checkpoint_cost(dim: int, depth: int, heads: int, folder: Path, repeats: int = 3) -> dict:
    """Seconds to write one checkpoint (weights and AdamW state) of a byte-level model of
    this size, and its size in bytes."""
    from posenc import TransformerModel

    model = TransformerModel(256, dim, depth, heads, pe="rope", causal=True)
    optimizer, _ = make_optimizer(
        model, lr=1e-3, weight_decay=0.1, steps=10, warmup=0.0, decay="cosine"
    )
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    optimizer.step()
    payload = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    path = folder / "probe.pt"
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        save_checkpoint(path, payload)
        times.append(time.perf_counter() - started)
    return {"seconds": statistics.median(times), "bytes": path.stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--train-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=3, help="round-robin repeats (best kept)")
    parser.add_argument("--checkpoint-size", default="512,8,8", help="dim,depth,heads or none")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        import os

        os.environ.setdefault("POSENC_CACHE_DIR", str(root / "cache"))
        corpus = prepare_corpus(toy_text(root / "text"))
        names = args.variants.split(",")
        for round_ in range(args.rounds):  # round-robin: a busy spell hits every variant
            for name in names:
                variant = VARIANTS[name]
                if variant.get("compile") and round_:
                    continue  # compiled once: a second compile would hit the first's caches
                config = ExtrapolateConfig(
                    pe="rope", dim=args.dim, depth=args.depth, heads=args.heads,
                    steps=args.steps, batch_size=args.batch_size, train_len=args.train_len,
                    precision=args.precision, checkpoint_every=variant["checkpoint_every"],
                    checkpoint_minutes=variant["checkpoint_minutes"],
                    compile=bool(variant.get("compile")),
                )  # fmt: skip
                out = root / f"{name}-{round_}"
                steps, total = timed_run(config, corpus, out, variant["read_every"], args.device)
                steady = steps[max(1, len(steps) // 10) :]
                rows.append(
                    {
                        "variant": name,
                        "round": round_,
                        "first_step_s": round(float(steps[0]), 3),
                        "median_step_ms": round(1000 * float(np.median(steady)), 3),
                        "mean_step_ms": round(1000 * float(np.mean(steady)), 3),
                        "total_s": round(total, 3),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
        if args.checkpoint_size != "none":
            dim, depth, heads = (int(x) for x in args.checkpoint_size.split(","))
            cost = checkpoint_cost(dim, depth, heads, root)
            rows.append({"variant": f"checkpoint of dim {dim}, depth {depth}", **cost})
            print(json.dumps(rows[-1]), flush=True)
    shape = f"dim {args.dim}, depth {args.depth}, L {args.train_len}, batch {args.batch_size}"
    where = f"{args.precision} on {args.device}, {args.threads} thread(s)"
    print(f"\n{args.steps} steps, {shape}, {where}; the best of {args.rounds} round(s)\n")
    print("| variant | first step s | median step ms | mean step ms | total s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in args.variants.split(","):
        mine = [r for r in rows if r["variant"] == name]
        best = min(mine, key=lambda r: r["median_step_ms"])
        print(f"| {name} | {best['first_step_s']} | {best['median_step_ms']} | "
              f"{best['mean_step_ms']} | {best['total_s']} |")  # fmt: skip
    for row in rows:
        if "bytes" in row:
            print(f"\n{row['variant']}: {row['bytes'] / 2**20:.0f} MiB in {row['seconds']:.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
