"""Does a training step of ``posenc extrapolate`` make the host wait for the GPU? (issue #38)

    PYTHONPATH=src python benchmarks/sync_check.py            # on a machine with CUDA

Trains a small model of each kind of encoding (and a schedule) for a few steps on the GPU in
bf16, with CUDA's sync debug mode set to ``error`` inside every step after the first two
(the first ones build tables and warm caches): a step that reads a device value on the host
(``.item()``, ``.tolist()``, a pageable copy, a boolean mask) raises there, and the script
prints where. The trainer's own reads, once every ``READ_EVERY`` steps, fall outside the
steps and are allowed. Prints one line per encoding and exits 1 if any step synchronised.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posenc.extrapolate import train as ex_train
from posenc.extrapolate.config import ExtrapolateConfig
from posenc.extrapolate.corpus import prepare_corpus


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pe", default="rope,alibi,t5,sinusoidal,none,rope/rope/rope/none:temp")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--device", default="cuda", help="cpu: run the steps, check nothing")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("sync_check: no CUDA device here", file=sys.stderr)
        return 2
    mode = torch.cuda.set_sync_debug_mode if cuda else (lambda _: None)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("POSENC_CACHE_DIR", str(Path(tmp) / "cache"))
        text = Path(tmp) / "text"
        text.mkdir()
        rng = np.random.default_rng(1)
        for i in range(20):
            (text / f"{i}.txt").write_text(" ".join(rng.choice(["a", "bc", "\n"], 4000)))
        corpus = prepare_corpus(text)
        real = ex_train.lm_step
        for pe in args.pe.split(","):
            calls = {"n": 0}

            def watched(*a: Any, calls: dict = calls, **k: Any) -> Any:
                calls["n"] += 1
                if calls["n"] <= 2:
                    return real(*a, **k)
                mode("error")
                try:
                    return real(*a, **k)
                finally:
                    mode(0)

            config = ExtrapolateConfig(pe=pe, dim=128, depth=4, heads=4, train_len=128,
                                       batch_size=8, steps=args.steps,
                                       precision="bf16" if cuda else "fp32",
                                       needle_share=0.5)  # fmt: skip
            ex_train.lm_step = watched
            try:
                ex_train.train_model(config, corpus, None, device=args.device)
                checked = "no host synchronisation" if cuda else "ran (nothing checked off CUDA)"
                print(f"{pe}: {checked} in steps 3..{args.steps}")
            except RuntimeError:
                failures += 1
                print(f"{pe}: a step synchronised:\n{traceback.format_exc(limit=-6)}")
            finally:
                ex_train.lm_step = real
                mode(0)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
