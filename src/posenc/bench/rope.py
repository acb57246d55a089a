"""Benchmark: rotating q and k of shape (4, 16, 2048, 128) on CPU, posenc against its peers.

Run ``python -m posenc.bench.rope`` (options: ``--threads``, ``--repeats``, ``--shape``,
``--out``). It times, per dtype (float32, bfloat16) and pair layout:

* the copy floor ``q.clone(); k.clone()`` (reads and writes the same bytes once);
* posenc's ``RotaryEmbedding.forward`` (table lookup included) and ``apply_rotary`` with
  precomputed tables;
* transformers' ``apply_rotary_pos_emb`` (half layout, its native one), and
  rotary-embedding-torch's ``apply_rotary_emb`` and x-transformers' ``apply_rotary_pos_emb``
  (interleaved, their native one), each with its tables precomputed so only the apply is timed.

Medians of repeated calls, taken round-robin over all cases after warm-up (the warm-up also
absorbs posenc's one-off ``torch.compile``; its cost is printed separately). Ratios come from
one run: timings on a shared machine are noisy, the ratios less so. Writes the table to
``benchmarks/rope.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..encodings import rotary
from ..encodings.rotary import RotaryEmbedding, apply_rotary, set_rotary_compile
from .harness import Case, round_robin
from .timing import Timing, copy_floor

Row = tuple[str, str, Timing]


def rope_peers(
    q: torch.Tensor, k: torch.Tensor, interleaved: bool
) -> list[tuple[str, Callable[[], object]]]:
    """Each installed peer's apply in its native layout, tables precomputed."""
    n, d = q.shape[-2], q.shape[-1]
    peers: list[tuple[str, Callable[[], object]]] = []
    if not interleaved:
        try:
            from transformers import LlamaConfig
            from transformers.models.llama.modeling_llama import (
                LlamaRotaryEmbedding,
                apply_rotary_pos_emb,
            )

            config = LlamaConfig(hidden_size=d, num_attention_heads=1, max_position_embeddings=n)
            cos, sin = LlamaRotaryEmbedding(config)(q, torch.arange(n)[None])  # in q's dtype
            peers.append(("transformers", lambda: apply_rotary_pos_emb(q, k, cos, sin)))
        except ImportError:
            pass
        return peers
    try:
        import rotary_embedding_torch as ret

        freqs = ret.RotaryEmbedding(d)(torch.arange(n, dtype=torch.float32), seq_len=n)
        peers.append(
            (
                "rotary-embedding-torch",
                lambda: (ret.apply_rotary_emb(freqs, q), ret.apply_rotary_emb(freqs, k)),
            )
        )
    except ImportError:
        pass
    try:
        from x_transformers.x_transformers import RotaryEmbedding as XRotary
        from x_transformers.x_transformers import apply_rotary_pos_emb as x_apply

        xfreqs, scale = XRotary(d)(torch.arange(n))
        peers.append(
            ("x-transformers", lambda: (x_apply(q, xfreqs, scale), x_apply(k, xfreqs, scale)))
        )
    except ImportError:
        pass
    return peers


def _round_robin(
    cases: list[tuple[str, str, Callable[[], object]]], *, warmup: int, repeats: int
) -> list[Row]:
    """Time every case once per round (see :func:`posenc.bench.harness.round_robin`)."""
    timings = round_robin([Case(name, fn) for name, _, fn in cases], warmup=warmup, repeats=repeats)
    return [(name, layout, t) for (name, layout, _), t in zip(cases, timings, strict=True)]


def rope_cases(
    q: torch.Tensor, k: torch.Tensor, notes: list[tuple[str, str, float]]
) -> list[tuple[str, str, Callable[[], object]]]:
    """The copy floor, posenc's two entry points per layout and every installed peer, as
    ``(name, layout, fn)``; the first posenc call per layout is run (and timed into ``notes``)
    here, so compilation stays out of the warm-up."""
    cases: list[tuple[str, str, Callable[[], object]]] = [("copy floor", "-", copy_floor(q, k))]
    # the same copy into memory that is already mapped: what the floor costs without the page
    # faults of fresh output buffers (no function returning new tensors can get this low)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    cases.append(("copy into existing buffers", "-", lambda: (q_out.copy_(q), k_out.copy_(k))))
    for interleaved in (False, True):
        layout = "interleaved" if interleaved else "half"
        rope = RotaryEmbedding(q.shape[-1], interleaved=interleaved)
        start = time.perf_counter()
        with torch.inference_mode():
            rope(q, k)  # first call: builds the tables, compiles where used
        notes.append((str(q.dtype).removeprefix("torch."), layout, time.perf_counter() - start))
        cos, sin = rope.cos_sin(None, q.shape[2], dtype=torch.float32)

        def forward(rope: RotaryEmbedding = rope) -> object:
            return rope(q, k)

        def functional(
            c: torch.Tensor = cos, s: torch.Tensor = sin, i: bool = interleaved
        ) -> object:
            return apply_rotary(q, c, s, interleaved=i), apply_rotary(k, c, s, interleaved=i)

        def eager(rope: RotaryEmbedding = rope) -> object:
            before = rotary._compile_enabled
            set_rotary_compile(False)
            try:
                return rope(q, k)
            finally:
                set_rotary_compile(before)

        cases.append(("posenc RotaryEmbedding", layout, forward))
        cases.append(("posenc apply_rotary", layout, functional))
        cases.append(("posenc RotaryEmbedding, eager", layout, eager))
        cases += [(name, layout, fn) for name, fn in rope_peers(q, k, interleaved)]
    return cases


def run(
    shape: tuple[int, int, int, int] = (4, 16, 2048, 128), *, repeats: int = 15, warmup: int = 3
) -> tuple[str, list[tuple[str, list[Row], Timing]]]:
    """Time everything; return the markdown report and the raw rows per dtype."""
    results = []
    notes: list[tuple[str, str, float]] = []
    for dtype in (torch.float32, torch.bfloat16):
        q, k = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
        rows = _round_robin(rope_cases(q, k, notes), warmup=warmup, repeats=repeats)
        floor = rows.pop(0)[2]  # the clone floor; the preallocated copy stays as a row
        results.append((str(dtype).removeprefix("torch."), rows, floor))
    return _markdown(shape, results, notes), results


def _markdown(
    shape: tuple[int, ...],
    results: list[tuple[str, list[Row], Timing]],
    compile_notes: list[tuple[str, str, float]],
) -> str:
    lines = [
        "# RoPE apply on CPU: posenc vs peers",
        "",
        f"q and k of shape {tuple(shape)}, rotated together; `python -m posenc.bench.rope`.",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.machine()} ({torch.backends.cpu.get_cpu_capability()}), "
        f"{time.strftime('%Y-%m-%d')}. Medians of repeated calls (round-robin) after warm-up; "
        "ratios are from this one run (the machine may be shared: absolute times are noisy).",
        "",
        "`x floor` is the time over `q.clone(); k.clone()` in the same dtype; `posenc faster` "
        "is the peer's time over posenc `RotaryEmbedding.forward` in the same layout. "
        "posenc's half layout is one `torch.compile`-d kernel, its interleaved layout one "
        "complex multiply (float32) or its native C kernel (bfloat16; "
        "`posenc/encodings/rope_kernel.c`, built with the system compiler on first use); "
        "`eager` is the same forward with compiled kernels switched off "
        "(`posenc.set_rotary_compile(False)`, as where no compiler is available: torch's own "
        "kernels only).",
        "",
        "Allocator: "
        + (
            "`THP_MEM_ALLOC_ENABLE=1` (torch backs large tensors with transparent huge pages)."
            if os.environ.get("THP_MEM_ALLOC_ENABLE") == "1"
            else "torch's default. Every new output is fresh memory whose pages the kernel "
            "faults in and zeroes on first write; `copy into existing buffers` shows how much of "
            "the floor that is. An implementation that makes m full-size temporaries pays it "
            "m times, so its ratio to the floor is about m, and no implementation that returns "
            "new tensors can beat the clone floor."
        ),
    ]
    for dtype, rows, floor in results:
        ours = {layout: t for name, layout, t in rows if name == "posenc RotaryEmbedding"}
        lines += [
            "",
            f"## {dtype}",
            "",
            "| implementation | layout | median ms | x floor | posenc faster |",
            "| --- | --- | ---: | ---: | ---: |",
            f"| copy floor | - | {floor.median * 1e3:.1f} | 1.00 | - |",
        ]
        for name, layout, t in rows:
            faster = "-" if name.startswith(("posenc", "copy")) else f"{t.ratio(ours[layout]):.1f}x"
            lines.append(
                f"| {name} | {layout} | {t.median * 1e3:.1f} | {t.ratio(floor):.2f} | {faster} |"
            )
    lines += [
        "",
        "First posenc call per dtype and layout (tables, and building the native kernel "
        "where it is not cached yet):",
        "",
    ]
    lines += [f"- {d} {layout}: {s:.2f} s" for d, layout, s in compile_notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--shape", type=int, nargs=4, default=(4, 16, 2048, 128))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/rope.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    report, _ = run(tuple(args.shape), repeats=args.repeats)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)


if __name__ == "__main__":
    main()
