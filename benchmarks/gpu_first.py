"""The first script to run on a new GPU: what the GPU goals need, in about 8 minutes, each row
printed as it is measured (a run cut short keeps every row it printed).

    OUT=/some/folder bash benchmarks/gpu_first.sh      # or: python benchmarks/gpu_first.py

Sections, each within its share of ``--budget`` seconds (default 480; a case that would start
past its section's share is reported as skipped):

1. versions and the device;
2. RoPE (the Triton kernel) against a clone of q and k, three ways;
3. host time per eager rotary call (the Python around the launch);
4. a decode step against transformers' rotary step, three ways, and one step in CUDA's sync
   debug mode (a host synchronisation raises);
5. attention with an ALiBi, T5 and FIRE bias against flash attention without one, n = 4,096,
   forward and forward + backward;
6. one training step of posenc's Encoder against ``torch.nn.TransformerEncoder`` (none, rope,
   alibi, t5), bf16 autocast;
7. host synchronisations: one cached decoding step, one flex call with a causal mask (ALiBi,
   T5) and one training step (ALiBi, T5), each run in CUDA's sync debug mode ``"error"`` after
   a warm-up (pass, or the error), and which SDPA kernel takes grouped heads with and without
   a mask (each ``torch.nn.attention.sdpa_kernel`` backend alone: ran or refused; posenc folds
   the query groups where a mask would leave only the math kernel).

Three times per case: ``synced`` (each call followed by a synchronisation: latency), ``b2b``
(calls back to back, one synchronisation at the end: throughput) and ``kernel`` (the calls
captured in a CUDA graph and replayed: the device's own time, no host in the way; ``n/a`` where
capture fails, with the reason). The goals read: RoPE <= 1.2x a clone, ``b2b``; decode >= 3x
transformers, ``synced``; bias attention <= 1.5x flash forward and <= 2x forward + backward,
``b2b``; training step >= 1.0x ``nn.TransformerEncoder``, ``b2b``.

Needs torch with CUDA, triton and transformers (any 5.x); nothing from a package index.
``--device cpu --tiny`` runs every section on tiny sizes on the CPU (the suite's dry run).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import posenc

Fn = Callable[[], object]


def say(text: str = "") -> None:
    print(text, flush=True)


class Clock:
    """Times a call three ways on ``device`` (see the module docstring)."""

    def __init__(self, device: torch.device, repeats: int) -> None:
        self.device, self.repeats = device, repeats

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def synced(self, fn: Fn) -> float:
        times = []
        for _ in range(self.repeats):
            self.sync()
            start = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def back_to_back(self, fn: Fn) -> float:
        self.sync()
        start = time.perf_counter()
        for _ in range(self.repeats):
            fn()
        self.sync()
        return (time.perf_counter() - start) / self.repeats

    def kernel(self, fn: Fn) -> float | str:
        if self.device.type != "cuda":
            return "n/a (no CUDA graphs on this device)"
        try:
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                fn()  # warm up on the side stream, as capture needs
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
        except Exception as error:
            return f"n/a (capture failed: {type(error).__name__}: {str(error)[:60]})"
        self.sync()
        start = time.perf_counter()
        for _ in range(self.repeats):
            graph.replay()
        self.sync()
        return (time.perf_counter() - start) / self.repeats

    def three(self, fn: Fn) -> tuple[float, float, float | str]:
        fn()  # warm up (compilation, autotuning, allocations)
        return self.synced(fn), self.back_to_back(fn), self.kernel(fn)


def us(value: float | str) -> str:
    return value if isinstance(value, str) else f"{value * 1e6:10.1f}"


def ratio(a: float | str, b: float | str) -> str:
    if isinstance(a, str) or isinstance(b, str) or b == 0:
        return "   n/a"
    return f"{a / b:6.2f}x"


class Budget:
    """Each section's share of the run's seconds."""

    def __init__(self, total: float, shares: dict[str, float]) -> None:
        self.start, self.total, self.shares = time.perf_counter(), total, shares
        self.section_end = self.start

    def begin(self, name: str) -> None:
        done = sum(share for key, share in self.shares.items() if key < name)
        self.section_end = self.start + self.total * (done + self.shares[name])
        say(f"\n## {name} (until {self.section_end - self.start:.0f} s)")

    def left(self) -> bool:
        return time.perf_counter() < self.section_end


def versions(device: torch.device) -> None:
    say(f"python {platform.python_version()}, torch {torch.__version__}")
    say(f"posenc {posenc.__version__}")
    for name in ("triton", "transformers"):
        try:
            module = __import__(name)
            say(f"{name} {module.__version__}")
        except ImportError:
            say(f"{name} not installed")
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        say(f"device {props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}")
    else:
        say(f"device {device} (a dry run: tiny sizes, no CUDA graphs)")


def rope_vs_clone(clock: Clock, budget: Budget, tiny: bool, device: torch.device) -> None:
    shapes = [(1, 2, 8, 16)] if tiny else [(4, 32, 4096, 128), (1, 32, 4096, 128)]
    dtypes = [torch.float32] if tiny else [torch.bfloat16, torch.float32]
    say("| shape | dtype | case | synced us | b2b us | kernel us | b2b vs clone |")
    say("| --- | --- | --- | --- | --- | --- | --- |")
    for shape in shapes:
        for dtype in dtypes:
            if not budget.left():
                say(f"| {shape} | {dtype} | skipped (budget) |")
                continue
            q = torch.randn(shape, device=device, dtype=dtype)
            k = torch.randn(shape, device=device, dtype=dtype)
            floor = None
            for name, fn in _rope_cases(q, k).items():
                synced, b2b, kern = clock.three(fn)
                floor = b2b if floor is None else floor
                say(f"| {shape} | {str(dtype)[6:]} | {name} | {us(synced)} | {us(b2b)} | "
                    f"{us(kern)} | {ratio(b2b, floor)} |")  # fmt: skip


def _rope_cases(q: torch.Tensor, k: torch.Tensor) -> dict[str, Fn]:
    rope = posenc.RotaryEmbedding(q.shape[-1]).to(q.device)
    positions = torch.arange(q.shape[2], device=q.device)
    return {
        "clone q, k": lambda: (q.clone(), k.clone()),
        "posenc out of place": lambda: rope(q, k, positions),
        "posenc in place": lambda: rope(q, k, positions, inplace=True),
    }


def host_time(budget: Budget, tiny: bool, device: torch.device) -> None:
    """Host seconds per eager call: the calls are issued back to back and the clock stops
    before the device is waited for, so only the Python around each launch is counted."""
    q = torch.randn(8 if not tiny else 1, 32 if not tiny else 2, 1, 128, device=device)
    k = torch.randn(q.shape[0], q.shape[1] // 4 or 1, 1, 128, device=device)
    if not tiny:
        q, k = q.bfloat16(), k.bfloat16()
    rope = posenc.RotaryEmbedding(128).to(device)
    positions = torch.tensor([4095], device=device)
    rope(q, k, positions)
    say("| call | host us per call |")
    say("| --- | --- |")
    for name, fn in {
        "rope(q, k, positions)": lambda: rope(q, k, positions),
        "rope(q, k, positions, inplace=True)": lambda: rope(q, k, positions, inplace=True),
    }.items():
        if not budget.left():
            say(f"| {name} | skipped (budget) |")
            continue
        calls = 200 if not tiny else 5
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        host = (time.perf_counter() - start) / calls
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        say(f"| {name} | {host * 1e6:.1f} |")


def decode_vs_transformers(clock: Clock, budget: Budget, tiny: bool, device: torch.device) -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    b, h, g = (1, 2, 1) if tiny else (8, 32, 8)
    dtype = torch.float32 if tiny else torch.bfloat16
    q = torch.randn(b, h, 1, 128, device=device, dtype=dtype)
    k = torch.randn(b, g, 1, 128, device=device, dtype=dtype)
    config = LlamaConfig(hidden_size=128 * h, num_attention_heads=h, num_key_value_heads=g,
                         max_position_embeddings=8192)  # fmt: skip
    theirs = LlamaRotaryEmbedding(config).to(device)
    ids = torch.full((b, 1), 4095, device=device)
    rope = posenc.RotaryEmbedding(128).to(device)
    positions = ids[0]

    def transformers_step() -> object:
        cos, sin = theirs(q, ids)
        return apply_rotary_pos_emb(q, k, cos, sin)

    say("| case | synced us | b2b us | kernel us | synced vs posenc |")
    say("| --- | --- | --- | --- | --- |")
    rows = {}
    for name, fn in {
        "posenc rope, out of place": lambda: rope(q, k, positions),
        "posenc rope, in place": lambda: rope(q, k, positions, inplace=True),
        "transformers rotary module + apply_rotary_pos_emb": transformers_step,
    }.items():
        if not budget.left():
            say(f"| {name} | skipped (budget) |")
            continue
        rows[name] = clock.three(fn)
    first = next(iter(rows.values()), None)
    for name, (synced, b2b, kern) in rows.items():
        say(f"| {name} | {us(synced)} | {us(b2b)} | {us(kern)} | "
            f"{ratio(synced, first[0]) if first else 'n/a'} |")  # fmt: skip
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("error")
        try:
            rope(q, k, positions)
            say("decode step in sync debug mode 'error': no host synchronisation")
        except RuntimeError as error:
            say(f"decode step synchronised the host: {str(error)[:120]}")
        finally:
            torch.cuda.set_sync_debug_mode("default")


def bias_attention(clock: Clock, budget: Budget, tiny: bool, device: torch.device) -> None:
    n, dim, heads = (16, 32, 2) if tiny else (4096, 1024, 16)
    dtype = torch.float32 if tiny else torch.bfloat16
    x = torch.randn(2 if tiny else 4, n, dim, device=device, dtype=dtype, requires_grad=True)
    say(f"n = {n}, dim {dim}, {heads} heads, {x.dtype}, causal")
    say("| scheme | pass | synced us | b2b us | kernel us | b2b vs flash | backend |")
    say("| --- | --- | --- | --- | --- | --- | --- |")
    floors: dict[str, float] = {}
    for scheme in ("none", "alibi", "t5", "fire"):
        attn = posenc.MultiHeadAttention(dim, heads, pe=scheme, causal=True).to(device, dtype)
        passes = {
            "forward": lambda attn=attn: attn(x.detach()),
            "forward+backward": lambda attn=attn: attn(x).float().sum().backward(),
        }
        for name, fn in passes.items():
            if not budget.left():
                say(f"| {scheme} | {name} | skipped (budget) |")
                continue
            if name == "forward":
                with torch.no_grad():
                    synced, b2b, kern = clock.three(fn)
            else:
                synced, b2b, kern = clock.three(fn)
            floors.setdefault(name, b2b)
            label = "flash (no bias)" if scheme == "none" else scheme
            say(f"| {label} | {name} | {us(synced)} | {us(b2b)} | {us(kern)} | "
                f"{ratio(b2b, floors[name])} | {attn.last_backend} |")  # fmt: skip


def training_step(clock: Clock, budget: Budget, tiny: bool, device: torch.device) -> None:
    dim, depth, heads, n, batch = (32, 2, 2, 16, 2) if tiny else (512, 4, 8, 1024, 8)
    x = torch.randn(batch, n, dim, device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=not tiny)
    say(f"dim {dim}, depth {depth}, {heads} heads, batch {batch} x {n}, causal, bf16 autocast")
    say("| model | synced us | b2b us | kernel us | vs torch |")
    say("| --- | --- | --- | --- | --- |")

    def step_of(model: torch.nn.Module) -> Fn:
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(n, device=device)

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                if isinstance(model, posenc.Encoder):
                    out = model(x)
                else:
                    out = model(x, mask=mask, is_causal=True)
            out.float().square().mean().backward()
            optimizer.step()

        return step

    layer = torch.nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                             norm_first=True, device=device)  # fmt: skip
    torch_model = torch.nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
    models = {"torch.nn.TransformerEncoder": torch_model}
    for scheme in ("none", "rope", "alibi", "t5"):
        models[f"posenc {scheme}"] = posenc.Encoder(dim, depth, heads, pe=scheme, causal=True).to(
            device
        )
    floor = None
    for name, model in models.items():
        if not budget.left():
            say(f"| {name} | skipped (budget) |")
            continue
        synced, b2b, kern = clock.three(step_of(model))
        floor = b2b if floor is None else floor
        speed = "n/a" if floor is None else f"{floor / b2b:.2f}x"
        say(f"| {name} | {us(synced)} | {us(b2b)} | {us(kern)} | {speed} |")


def sync_check(budget: Budget, tiny: bool, device: torch.device) -> None:
    """Section 7, in ``gpu_first_sync.py`` beside this script."""
    from gpu_first_sync import sdpa_kernels, sync_paths

    sync_paths(budget.left, tiny, device)
    sdpa_kernels(tiny, device)


SECTIONS = {
    "1 versions": 0.01,
    "2 rope vs clone": 0.18,
    "3 host time": 0.05,
    "4 decode vs transformers": 0.13,
    "5 bias attention": 0.29,
    "6 training step": 0.29,
    "7 sync check and SDPA kernels": 0.05,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (a dry run)")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        say("torch sees no CUDA device: nothing measured (run with --device cpu --tiny to dry-run)")
        return 0
    clock = Clock(device, args.repeats or (3 if args.tiny else 20))
    budget = Budget(args.budget, SECTIONS)
    torch.manual_seed(0)
    say("# posenc on a new GPU")
    steps = [
        lambda: versions(device),
        lambda: rope_vs_clone(clock, budget, args.tiny, device),
        lambda: host_time(budget, args.tiny, device),
        lambda: decode_vs_transformers(clock, budget, args.tiny, device),
        lambda: bias_attention(clock, budget, args.tiny, device),
        lambda: training_step(clock, budget, args.tiny, device),
        lambda: sync_check(budget, args.tiny, device),
    ]
    failed = 0
    for name, step in zip(SECTIONS, steps, strict=True):
        budget.begin(name)
        try:
            step()
        except Exception as error:
            failed += 1
            say(f"section failed: {type(error).__name__}: {error}")
            import traceback

            traceback.print_exc(file=sys.stdout)
    say(f"\ndone in {time.perf_counter() - budget.start:.0f} s; {failed} section(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
