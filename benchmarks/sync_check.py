"""Does a training step of ``posenc extrapolate`` make the host wait for the GPU? (issue #38)
Does a cached decode step? (issue #36 item 3)

    PYTHONPATH=src python benchmarks/sync_check.py            # on a machine with CUDA
    PYTHONPATH=src python benchmarks/sync_check.py --decode   # decode steps instead

Trains a small model of each kind of encoding (and a schedule) for a few steps on the GPU in
bf16, with CUDA's sync debug mode set to ``error`` inside every step after the first two
(the first ones build tables and warm caches): a step that reads a device value on the host
(``.item()``, ``.tolist()``, a pageable copy, a boolean mask) raises there, and the script
prints where. The trainer's own reads, once every ``READ_EVERY`` steps, fall outside the
steps and are allowed. Prints one line per encoding and exits 1 if any step synchronised.

``--decode``: an :class:`~posenc.Encoder` (bf16, 4 layers) per rotary scheme reads a prompt
(plain, left-padded with its positions, or packed documents) into a :class:`~posenc.KVCache`,
then decodes single steps; every step after the first is run in sync debug mode ``error``.
A rope type whose frequencies follow the length (dynamic NTK, LongRoPE) reads the largest
position once per step after a padded or packed prompt (its bound is not exact there): those
cases are expected to synchronise and are reported, not failed.
``tests/sequence/test_cached_reads.py``
counts the same reads on the CPU.
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
    parser.add_argument("--decode", action="store_true", help="check cached decode steps")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("sync_check: no CUDA device here", file=sys.stderr)
        return 2
    mode = torch.cuda.set_sync_debug_mode if cuda else (lambda _: None)
    if args.decode:
        return decode_check(args.device, mode)
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


#: Rotary schemes of the decode check: (pe, pe_kwargs).
DECODE_SCHEMES = {
    "rope": ("rope", {}),
    "rope-interleaved": ("rope-interleaved", {}),
    "xpos": ("xpos", {}),
    "yarn": ("rope", {"scaling": {"rope_type": "yarn", "factor": 4.0},
                      "max_position_embeddings": 64}),
    "dynamic": ("rope", {"scaling": {"rope_type": "dynamic", "factor": 2.0},
                         "max_position_embeddings": 16}),
}  # fmt: skip


def decode_check(device: str, mode: Any) -> int:
    """Decode steps of each scheme and prompt in sync debug mode ``error`` (see the module
    docstring); 1 if an unexpected one synchronised."""
    import posenc

    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    padding = torch.zeros(4, 12, dtype=torch.bool, device=device)
    padding[1, :3] = padding[3, :5] = True
    documents = torch.arange(12, device=device).div(5, rounding_mode="floor").expand(4, 12)
    prompts = {
        "plain": {},
        "padded": {"key_padding_mask": padding,
                   "positions": posenc.positions_from_padding(padding)},
        "packed": {"document_ids": documents},
    }  # fmt: skip
    failures = 0
    for scheme, (pe, kwargs) in DECODE_SCHEMES.items():
        for prompt, first in prompts.items():
            torch.manual_seed(0)
            encoder = posenc.Encoder(256, 4, 4, pe=pe, causal=True, pe_kwargs=kwargs)
            encoder = encoder.to(device=device, dtype=dtype).eval()
            cache = posenc.KVCache()
            x = torch.randn(4, 32, 256, device=device, dtype=dtype)
            moving = scheme == "dynamic" and prompt != "plain"
            try:
                with torch.no_grad():
                    encoder(x[:, :12], cache=cache, **first)
                    encoder(x[:, 12:13], cache=cache)
                    for step in range(13, 32):
                        mode("error")
                        try:
                            encoder(x[:, step : step + 1], cache=cache)
                        finally:
                            mode(0)
                if cuda:
                    torch.cuda.synchronize()
                checked = "no host synchronisation" if cuda else "ran (nothing checked off CUDA)"
                print(f"{scheme} {prompt}: {checked} in decode steps 2..20")
            except RuntimeError:
                failures += not moving
                kind = "(expected: the length is read once per step)" if moving else ""
                print(f"{scheme} {prompt}: a decode step synchronised {kind}:")
                print(traceback.format_exc(limit=-6))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
