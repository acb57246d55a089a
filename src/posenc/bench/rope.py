"""``posenc bench rope``: RoPE on q and k on CPU, posenc against the copy floor and its peers.

For each shape (default (4, 16, 2048, 128) and (1, 32, 4096, 128)), dtype (float32, bfloat16)
and pair layout (half, interleaved), round-robin in one process:

* the floor ``q.clone(); k.clone()`` and the same copy into buffers that already exist;
* posenc ``RotaryEmbedding.forward`` (cos/sin from its table included), out of place and with
  ``inplace=True``, eager: what a user gets without compiling;
* the same forward inside a module the user compiles (``torch.compile(fullgraph=True)``,
  inductor), out of place and in place (compilation in the warm-up, not in the medians);
* transformers' ``apply_rotary_pos_emb`` (half layout, its own) and rotary-embedding-torch's
  ``apply_rotary_emb`` and x-transformers' ``apply_rotary_pos_emb`` (interleaved), each with
  its tables precomputed so that only its rotation is timed.

Then the first call in a fresh process (a subprocess per dtype and layout: building the
table, then the first rotation), and a decode step: one new token at position 4095 of q
``(8, 32, 1, 128)`` and k ``(8, 8, 1, 128)``, posenc ``RotaryEmbedding`` against
transformers' ``LlamaRotaryEmbedding`` forward + ``apply_rotary_pos_emb``.

``python -m posenc.bench.rope`` runs the suite with its default sizes and writes
``benchmarks/rope.md``; the header records the CPU's vector instruction flags and the
transparent-huge-page mode, which both move these numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..encodings.rotary.kernels.select import select
from ..encodings.rotary.rope import RotaryEmbedding
from .harness import Case, Section, Table, environment, load_average, ms, ratio, round_robin
from .rope_calls import (
    FORWARD,
    IN_PLACE,
    decode_cases,
    decode_table,
    first_call_table,
    first_calls,
    forced_kernel,
)
from .timing import Timing, copy_floor

if TYPE_CHECKING:
    from .suites.settings import Settings

COMPILED, COMPILED_IN_PLACE = "posenc compiled", "posenc compiled, in place"
TORCH_PATH = "posenc pure-torch path (no native kernel)"
TORCH_PATH_IN_PLACE = "posenc pure-torch path, in place"


def rope_peers(q: Tensor, k: Tensor, interleaved: bool) -> list[tuple[str, Callable[[], object]]]:
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


class _Rotate(nn.Module):
    """What a user compiles: a module that rotates q and k (in place or not)."""

    def __init__(self, rope: RotaryEmbedding, inplace: bool) -> None:
        super().__init__()
        self.rope, self.inplace = rope, inplace

    def forward(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return self.rope(q, k, inplace=self.inplace)


def rope_cases(
    q: Tensor, k: Tensor, notes: list[str], *, compile: bool = True
) -> list[tuple[str, str, Callable[[], object]]]:
    """The copy floor, posenc's rows per layout and every installed peer, as
    ``(name, layout, fn)``. Compiled rows are compiled here (their time goes to ``notes``),
    so that compilation stays out of the warm-up."""
    cases: list[tuple[str, str, Callable[[], object]]] = [("copy floor", "-", copy_floor(q, k))]
    # the same copy into memory that is already mapped: what the floor costs without the page
    # faults of fresh output buffers (no function returning new tensors can get this low)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    cases.append(("copy into existing buffers", "-", lambda: (q_out.copy_(q), k_out.copy_(k))))
    dtype = str(q.dtype).removeprefix("torch.")
    if compile:  # the modules compiled for earlier shapes and dtypes are not called again
        torch._dynamo.reset()
    for interleaved in (False, True):
        layout = "interleaved" if interleaved else "half"
        rope = RotaryEmbedding(q.shape[-1], interleaved=interleaved)
        with torch.inference_mode():
            rope(q, k)  # builds the table
        cases.append((FORWARD, layout, lambda rope=rope: rope(q, k)))
        cases.append((IN_PLACE, layout, lambda rope=rope: rope(q, k, inplace=True)))
        kernel = select(q, inplace=False, pair=k).kernel
        if kernel is not None and kernel.name == "native":  # the same calls without it
            cases += _torch_path_rows(rope, q, k, layout)
        if compile:
            for name, inplace in ((COMPILED, False), (COMPILED_IN_PLACE, True)):
                compiled = torch.compile(_Rotate(rope, inplace), fullgraph=True, dynamic=False)
                start = time.perf_counter()
                with torch.inference_mode():
                    compiled(q, k)
                notes.append(f"{dtype} {layout} {name}: {time.perf_counter() - start:.1f} s")
                cases.append((name, layout, lambda compiled=compiled: compiled(q, k)))
        cases += [(name, layout, fn) for name, fn in rope_peers(q, k, interleaved)]
    return cases


def _torch_path_rows(
    rope: RotaryEmbedding, q: Tensor, k: Tensor, layout: str
) -> list[tuple[str, str, Callable[[], object]]]:
    """The module's forward on the pure-torch path (``POSENC_ROTARY_KERNEL=torch``, the
    fallback where the native kernel is not built), out of place and in place: what the
    native kernel is measured against."""

    def new() -> object:
        with forced_kernel("torch"):
            return rope(q, k)

    def in_place() -> object:
        with forced_kernel("torch"):
            return rope(q, k, inplace=True)

    return [(TORCH_PATH, layout, new), (TORCH_PATH_IN_PLACE, layout, in_place)]


# --------------------------------------------------------------------------- the suite


def cpu_flags() -> str:
    """The vector instruction flags of this CPU (``/proc/cpuinfo``), or ``n/a``."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "n/a"
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags = line.split(":", 1)[1].split()
            wanted = ("avx", "sse4", "fma", "f16c", "amx", "asimd", "sve", "neon")
            return " ".join(sorted(f for f in flags if f.startswith(wanted))) or "none"
    return "n/a"


def huge_pages() -> str:
    """The transparent-huge-page mode and torch's ``THP_MEM_ALLOC_ENABLE``."""
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    except OSError:
        mode = "n/a"
    torch_thp = os.environ.get("THP_MEM_ALLOC_ENABLE", "unset")
    return f"`{mode}` (torch's THP_MEM_ALLOC_ENABLE: {torch_thp})"


def suite(s: Settings) -> Section:
    """The rope section of ``posenc bench``: one table per shape, first calls, decode (on a
    GPU with ``--device cuda``: :func:`~.rope_cuda.cuda_suite`)."""
    if s.device == "cuda":
        from .rope_cuda import cuda_suite

        return cuda_suite(s)
    section = Section("rope", "RoPE applied to queries and keys")
    threads = s.threads or torch.get_num_threads()
    section.intro = [
        f"CPU flags: {cpu_flags()}; transparent huge pages: {huge_pages()}; "
        f"{threads} torch threads.",
        "",
        "q and k of each shape (batch, heads, n, head dim), rotated together. posenc rows "
        "include forming cos/sin from the module's cached table; the peers get precomputed "
        "tables, so only their rotation is timed, each in its native layout (transformers "
        "half, rotary-embedding-torch and x-transformers interleaved). `in place` is "
        "`RotaryEmbedding(...)(q, k, inplace=True)`; `compiled` is a module calling it, "
        "compiled by the user with `torch.compile(fullgraph=True)` (inductor). "
        "`x floor` is the time over `q.clone(); k.clone()` in the same dtype; "
        "`x posenc time` is the time over posenc's out-of-place eager forward in the same "
        "layout (above 1: slower than posenc). "
        f"Medians over {s.repeats} timed calls per case, round-robin after {s.warmup} "
        "warm-up call(s); ratios compare medians from this one run.",
    ]
    compile_notes: list[str] = []
    spans: dict[str, list[float]] = {}  # posenc row -> its "x floor" in every table
    for shape in s.rope:
        table = Table(
            ["dtype", "implementation", "layout", "median ms", "range ms", "x floor",
             "x posenc time"],
            caption=f"q and k of shape {tuple(shape)}:",
            text_columns=3,
        )  # fmt: skip
        for dtype in (torch.float32, torch.bfloat16):
            torch.manual_seed(0)
            q, k = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
            triples = rope_cases(q, k, compile_notes, compile=s.rope_compile)
            timings = round_robin(
                [Case(f"{name}|{layout}", fn) for name, layout, fn in triples],
                warmup=s.warmup,
                repeats=s.repeats,
            )
            _add_rows(table, str(dtype).removeprefix("torch."), triples, timings, spans)
            del q, k, triples
        section.tables.append(table)
        section.data.setdefault("shapes", []).append([tuple(shape), table.rows])
    first = first_calls(s.rope[0], threads)
    section.tables.append(first_call_table(first, s.rope[0]))
    decode = decode_cases()
    decode_timings = round_robin(decode, warmup=max(s.warmup, 20), repeats=max(20 * s.repeats, 50))
    section.tables.append(decode_table(decode, decode_timings))
    section.data.update(first_calls=first)
    section.notes += _summary(spans, first, decode, decode_timings)
    present = {row[1] for table in section.tables[: len(s.rope)] for row in table.rows}
    for dist in ("transformers", "rotary-embedding-torch", "x-transformers"):
        if dist not in present:
            section.notes.append(f"{dist}: skipped, `{dist}` is not installed")
    if compile_notes:
        section.notes.append(
            "compilation (first call of each compiled module, not in the medians): "
            + ", ".join(compile_notes)
        )
    return section


#: The speed goals of posenc's rotary code (issue 16), as "x floor" bounds per posenc row.
GOALS = {IN_PLACE: 0.6, FORWARD: 1.3, COMPILED_IN_PLACE: 0.4, COMPILED: 1.2}


def _summary(
    spans: dict[str, list[float]],
    first: list[dict[str, object]],
    decode: list[Case],
    decode_timings: list[Timing],
) -> list[str]:
    """One line per goal: the range measured in this run against the bound."""
    lines = [
        f"`{name}`: {min(spans[name]):.2f}–{max(spans[name]):.2f}x the clone floor over every "
        f"shape, dtype and layout (goal: at most {bound}x)"
        for name, bound in GOALS.items()
        if spans.get(name)
    ]
    for name in (FORWARD, IN_PLACE):
        if spans.get(f"native speed-up|{name}"):
            got = spans[f"native speed-up|{name}"]
            lines.append(
                f"`{name}` with the native kernel against the pure-torch path: "
                f"{min(got):.2f}–{max(got):.2f}x faster (it stays only at 1.5x or more)"
            )
    extra = [float(r["first"]) - float(r["second"]) for r in first if "first" in r]  # type: ignore[arg-type]
    if extra:
        lines.append(
            f"first call beyond a second one: at most {max(extra):.3f} s (goal: at most 0.3 s)"
        )
    times = {case.name: t.median for case, t in zip(decode, decode_timings, strict=True)}
    peer = next((name for name in times if name.startswith("transformers")), None)
    if peer is not None:
        lines.append(
            f"decode step: transformers takes {times[peer] / times[FORWARD]:.2f}x the time of "
            f"posenc (in place: {times[peer] / times[IN_PLACE]:.2f}x; goal: at least 3x)"
        )
    return lines


def _add_rows(
    table: Table,
    dtype: str,
    triples: list[tuple[str, str, Callable[[], object]]],
    t: list[Timing],
    spans: dict[str, list[float]],
) -> None:
    floor = t[0]
    ours = {layout: x for (name, layout, _), x in zip(triples, t, strict=True) if name == FORWARD}
    medians = {(name, layout): x.median for (name, layout, _), x in zip(triples, t, strict=True)}
    for fallback, fast in ((TORCH_PATH, FORWARD), (TORCH_PATH_IN_PLACE, IN_PLACE)):
        for layout in ("half", "interleaved"):
            if (fallback, layout) in medians:
                speedup = medians[(fallback, layout)] / medians[(fast, layout)]
                spans.setdefault(f"native speed-up|{fast}", []).append(speedup)
    for (name, layout, _), x in zip(triples, t, strict=True):
        if name in GOALS:
            spans.setdefault(name, []).append(x.median / floor.median)
        relative = "-" if layout not in ours else ratio(x.median, ours[layout].median)
        table.rows.append(
            [dtype, name, layout, ms(x.median), f"{ms(x.low)}–{ms(x.high)}",
             ratio(x.median, floor.median), relative]
        )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """``python -m posenc.bench.rope``: the suite at its default sizes, written as markdown."""
    from .suites.settings import DEFAULT

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=DEFAULT.repeats)
    parser.add_argument(
        "--shape",
        type=int,
        nargs=4,
        action="append",
        metavar=("B", "H", "N", "D"),
        help="q and k shape (batch, heads, n, head dim); repeat for several "
        f"(default: {' '.join(str(tuple(shape)) for shape in DEFAULT.rope)})",
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled rows")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/rope.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    settings = dataclasses.replace(
        DEFAULT,
        repeats=args.repeats,
        threads=args.threads,
        rope_compile=not args.no_compile,
        rope=tuple(tuple(shape) for shape in args.shape) if args.shape else DEFAULT.rope,
    )
    load = load_average()
    start = time.perf_counter()
    section = suite(settings)
    section.seconds = time.perf_counter() - start
    header = [
        "# RoPE on CPU: posenc vs the copy floor and its peers",
        "",
        f"`python -m posenc.bench.rope {' '.join(argv if argv is not None else sys.argv[1:])}`, "
        f"{time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}.",
        "",
        *environment(),
        f"- load average (1, 5, 15 min): {load} at the start, {load_average()} at the end",
        "- the machine may be shared with other jobs: absolute times are noisy; the ratios, "
        "measured round-robin in one process, much less so",
        "",
        "",
    ]
    report = "\n".join(header) + section.markdown() + "\n"
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)


if __name__ == "__main__":
    main()
