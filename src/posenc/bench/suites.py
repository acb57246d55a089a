"""The suites of ``posenc bench``: each times one operation of posenc against the same
operation in the libraries people use instead, and against the memory-bandwidth floor.

=========  ====================================================================================
suite      what is timed
=========  ====================================================================================
table      sinusoidal table generation: posenc vs the usual float32 NumPy and torch versions
           and ``positional_encodings``' ``PositionalEncoding1D``; max error vs float64
add        adding an absolute encoding to embeddings, vs ``x + table`` and the copy floor
rope       RoPE on q and k, both layouts, fp32 and bf16, in place and not, eager and
           compiled, vs transformers, rotary-embedding-torch, x-transformers and the copy
           floor; the first call in a fresh process; a decode step vs transformers
bias       ALiBi attention per posenc backend vs ``torch.nn.MultiheadAttention`` given the
           materialised bias: time and peak memory against n
encoder    a whole ``posenc.Encoder``, forward and forward+backward, train and eval mode, vs
           ``torch.nn.TransformerEncoder`` of the same shape with the same encoding added
scaling    RoPE and bias attention as n doubles from 512 to 16k, with the fitted exponent
=========  ====================================================================================

Every suite returns a :class:`~posenc.bench.harness.Section`; ``posenc bench`` prints them
and writes them as markdown. The ``bias`` and ``scaling`` suites measure in a subprocess
(:mod:`posenc.bench.worker`), the others in this process.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import PosencValueError
from .harness import Case, Section, Table, fit_exponent, ms, ratio, round_robin, spread
from .timing import copy_floor

SUITES = ("table", "add", "rope", "bias", "encoder", "scaling")


@dataclass(frozen=True)
class Settings:
    """Sizes and repetitions of every suite; :data:`DEFAULT` and :data:`QUICK` below."""

    warmup: int = 2  # untimed calls per case before timing
    repeats: int = 10  # timed calls per case (round-robin)
    table: tuple[int, int] = (8192, 512)  # positions, width
    add: tuple[int, int, int] = (8, 1024, 512)  # batch, n, width
    # RoPE: the shapes of q and k (batch, heads, n, head dim), one table each
    rope: tuple[tuple[int, int, int, int], ...] = ((4, 16, 2048, 128), (1, 32, 4096, 128))
    rope_compile: bool = True  # RoPE: also time a module the user compiles (inductor)
    attn_dim: int = 128  # bias attention: width ...
    attn_heads: int = 2  # ... and heads (head dim 64)
    bias_sizes: tuple[int, ...] = (512, 1024, 2048)
    # encoder: width, depth, heads, ffn width, batch, n
    encoder: tuple[int, int, int, int, int, int] = (256, 2, 4, 1024, 4, 128)
    encoder_repeats: int = 21
    scaling_sizes: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
    rope_scaling_heads: int = 16  # RoPE scaling: q, k of shape (1, heads, n, 64)
    max_call_s: float = 3.0  # scaling/bias: skip a size predicted slower than this per call
    size_budget_s: float = 4.0  # scaling/bias: time spent on the timed rounds of one size
    compile_flex: bool = True  # False runs flex_attention eagerly (no compilation)
    threads: int = 0  # 0: torch's default


DEFAULT = Settings()
QUICK = Settings(
    warmup=1,
    repeats=2,
    table=(128, 32),
    add=(2, 32, 32),
    rope=((1, 2, 16, 8),),
    rope_compile=False,
    attn_dim=32,
    attn_heads=2,
    bias_sizes=(32, 64),
    encoder=(32, 1, 2, 64, 2, 16),
    encoder_repeats=2,
    scaling_sizes=(32, 64),
    rope_scaling_heads=2,
    max_call_s=1.0,
    size_budget_s=0.2,
    compile_flex=False,
)


def _timing_line(s: Settings) -> str:
    return (
        f"Medians over {s.repeats} timed calls per case, taken round-robin (one call of each "
        f"case per round) after {s.warmup} untimed warm-up call(s) of each; `range` is the "
        "fastest and slowest call. Ratios compare medians from this one run."
    )


def _missing(dist: str, what: str) -> str:
    return f"{what}: skipped, `{dist}` is not installed (`pip install posenc[bench]`)"


# --------------------------------------------------------------------------- table


def numpy_table_fp32(num_positions: int, dim: int, base: float = 10000.0) -> np.ndarray:
    """The sinusoidal table as tutorials write it in NumPy, angles in float32
    (Vaswani et al. 2017, §3.5): ``PE[p, 2i] = sin(p / base^(2i/d))``, ``PE[p, 2i+1]`` cos."""
    exponent = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    inv_freq = np.float32(base) ** -exponent  # (ceil(d/2),)
    angles = np.arange(num_positions, dtype=np.float32)[:, None] * inv_freq[None, :]  # (n, d/2)
    table = np.empty((num_positions, 2 * inv_freq.size), dtype=np.float32)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table[:, :dim]


def torch_table_fp32(num_positions: int, dim: int, base: float = 10000.0) -> Tensor:
    """The sinusoidal table as the PyTorch tutorials write it (``div_term = exp(-2i ln(base)
    / d)``), angles in float32."""
    position = torch.arange(num_positions, dtype=torch.float32).unsqueeze(1)  # (n, 1)
    div_term = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(base) / dim))
    table = torch.zeros(num_positions, 2 * div_term.numel())
    table[:, 0::2] = torch.sin(position * div_term)
    table[:, 1::2] = torch.cos(position * div_term)
    return table[:, :dim]


def float64_table(num_positions: int, dim: int, base: float = 10000.0) -> np.ndarray:
    """The exact table: the formula transcribed in float64, angles ``p / base**(2i/d)``."""
    denominators = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = np.arange(num_positions, dtype=np.float64)[:, None] / denominators[None, :]
    table = np.empty((num_positions, 2 * denominators.size))
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table[:, :dim]


def suite_table(s: Settings) -> Section:
    from ..encodings.sinusoidal import sinusoidal_table

    n, d = s.table
    section = Section("table", "Sinusoidal table generation and its accuracy")
    section.intro = [
        f"A table of {n} positions × {d} channels (float32 output). posenc forms the angles in "
        "float64 and casts once; the usual NumPy and torch versions (written out in "
        "`posenc.bench.suites`) and `positional-encodings` form them in float32. "
        "`max error` is the largest absolute difference from the formula evaluated in "
        "float64, over the whole table. " + _timing_line(s),
    ]
    cases = [
        Case("posenc sinusoidal_table", lambda: sinusoidal_table(n, d)),
        Case("NumPy, float32 angles", lambda: numpy_table_fp32(n, d)),
        Case("torch, float32 angles", lambda: torch_table_fp32(n, d)),
    ]
    try:
        from positional_encodings.torch_encodings import PositionalEncoding1D

        penc = PositionalEncoding1D(d)
        probe = torch.zeros(1, n, d)

        def peer_table() -> Tensor:
            penc.cached_penc = None  # it caches the last table: time the generation
            return penc(probe)[0]

        cases.append(Case("positional-encodings PositionalEncoding1D", peer_table))
    except ImportError:
        section.notes.append(_missing("positional-encodings", "PositionalEncoding1D"))
    timings = round_robin(cases, warmup=s.warmup, repeats=s.repeats)
    exact = float64_table(n, d)
    ours = timings[0]
    table = Table(["implementation", "median ms", "range ms", "x posenc time", "max error"])
    for case, t in zip(cases, timings, strict=True):
        with torch.inference_mode():
            values = case.fn()
        values = values.numpy() if isinstance(values, Tensor) else values
        error = float(np.abs(values.astype(np.float64) - exact).max())
        table.rows.append(
            [case.name, ms(t.median), spread(t), ratio(t.median, ours.median), f"{error:.1e}"]
        )
    section.tables.append(table)
    section.notes.append(
        "`x posenc time` above 1 means slower than posenc. float32 angles lose accuracy as the "
        "position grows (the angle `p · ω` is rounded to float32 before the sine); posenc "
        "pays for float64 angles once per table, which the modules cache."
    )
    return section


# --------------------------------------------------------------------------- add


def suite_add(s: Settings) -> Section:
    from ..encodings.sinusoidal import SinusoidalPositionalEncoding, sinusoidal_table

    b, n, d = s.add
    section = Section("add", "Adding an absolute encoding to the embeddings")
    section.intro = [
        f"`x` of shape ({b}, {n}, {d}); each implementation returns `x + PE[:n]`. The copy "
        "floor is `x.clone()` (the same bytes read and written once). posenc "
        "`SinusoidalPositionalEncoding.forward` includes its checks, the table slice and the "
        "dropout module (p = 0); `x + table` is the bare add with a precomputed table. "
        "bfloat16 inputs are added in float32 and cast once by posenc. " + _timing_line(s),
    ]
    table = Table(
        ["dtype", "implementation", "median ms", "range ms", "x floor", "x posenc time"],
        text_columns=2,
    )
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(b, n, d).to(dtype)
        pe = SinusoidalPositionalEncoding(d, max_len=n)
        fixed = sinusoidal_table(n, d, dtype=dtype)
        cases = [
            Case("copy floor", copy_floor(x)),
            Case("posenc SinusoidalPositionalEncoding", lambda x=x, pe=pe: pe(x)),
            Case("x + table (plain torch)", lambda x=x, t=fixed: x + t),
        ]
        if dtype == torch.float32:
            try:
                from positional_encodings.torch_encodings import PositionalEncoding1D, Summer

                summer = Summer(PositionalEncoding1D(d))
                cases.append(Case("positional-encodings Summer", lambda x=x, f=summer: f(x)))
            except ImportError:
                section.notes.append(_missing("positional-encodings", "Summer"))
        timings = round_robin(cases, warmup=s.warmup, repeats=s.repeats)
        floor, ours = timings[0], timings[1]
        name = str(dtype).removeprefix("torch.")
        for case, t in zip(cases, timings, strict=True):
            table.rows.append(
                [name, case.name, ms(t.median), spread(t), ratio(t.median, floor.median),
                 "-" if case.name == "copy floor" else ratio(t.median, ours.median)]
            )  # fmt: skip
    section.tables.append(table)
    return section


# --------------------------------------------------------------------------- rope


def suite_rope(s: Settings) -> Section:
    from .rope import suite

    return suite(s)


# --------------------------------------------------------------------------- worker sweeps


#: Rows measured by the worker in this run, by (kind, settings key, variant, n), so the
#: scaling suite reuses the sizes the bias suite already measured.
_MEASURED: dict[tuple[Any, ...], dict[str, Any]] = {}


def _worker_rows(
    kind: str, spec: dict[str, Any], sizes: tuple[int, ...], variants: tuple[str, ...]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows for every (size, variant), from this run's earlier measurements where every
    variant of a size was measured together, else from a worker subprocess."""
    key = json.dumps(spec, sort_keys=True)
    rows: list[dict[str, Any]] = []
    todo: list[int] = []
    for n in sizes:
        known = [_MEASURED.get((kind, key, v, n)) for v in variants]
        if all(r is not None for r in known):
            rows += [r for r in known if r is not None]
        else:
            todo.append(n)
    notes: list[str] = []
    if todo:
        last = {
            r["variant"]: [r["n"], r["median_s"]]
            for r in sorted(rows, key=lambda r: r["n"])
            if "median_s" in r
        }
        full = dict(spec, kind=kind, sizes=todo, variants=list(variants), last=last)
        fresh, error = _run_worker(full)
        if error:
            notes.append(error)
        for r in fresh:
            _MEASURED[(kind, key, r["variant"], r["n"])] = r
        rows += fresh
    rows.sort(key=lambda r: (r["n"], variants.index(r["variant"])))
    return rows, notes


def _run_worker(spec: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [sys.executable, "-m", "posenc.bench.worker", json.dumps(spec)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    error = None
    if done.returncode:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no message)"]
        error = f"the measuring subprocess stopped (exit {done.returncode}): {tail[0]}"
    return rows, error


def _attention_spec(s: Settings) -> dict[str, Any]:
    return {
        "dim": s.attn_dim,
        "heads": s.attn_heads,
        "compile_flex": s.compile_flex,
        "threads": s.threads or torch.get_num_threads(),
        "max_call_s": s.max_call_s,
        "repeats": s.repeats,
        "size_budget_s": s.size_budget_s,
    }


_VARIANT_LABELS = {
    "flex": "posenc flex",
    "sdpa": "posenc sdpa",
    "math": "posenc math",
    "torch-mha": "torch MultiheadAttention + bias",
    "posenc": "posenc RotaryEmbedding",
    "copy floor": "copy floor",
    "transformers": "transformers apply_rotary_pos_emb",
}


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


_MEMORY_LINE = (
    "`extra MiB` is the peak resident memory of one call above the resident memory before "
    "it (inputs and weights excluded, output and temporaries included), measured in a "
    "subprocess: glibc returns freed blocks at once (`MALLOC_MMAP_THRESHOLD_=65536`) and "
    "the kernel's peak-RSS mark is reset (`/proc/self/clear_refs`) before the call, so "
    "each figure stands alone although the sizes share the process (a fresh process per "
    "size would recompile flex attention each time). Sizes are timed round-robin across "
    "the variants, after two untimed calls of each (the first compiles); the number of "
    "timed rounds per size fits a time budget (at least 2)."
)


def _skips(rows: list[dict[str, Any]]) -> list[str]:
    return [
        f"n = {r['n']}, {_VARIANT_LABELS.get(r['variant'], r['variant'])}: skipped, {r['skipped']}"
        for r in rows
        if "skipped" in r
    ]


# --------------------------------------------------------------------------- bias


def suite_bias(s: Settings) -> Section:
    section = Section("bias", "Attention with a bias (ALiBi) per backend")
    flex = "compiled flex_attention" if s.compile_flex else "flex_attention run eagerly"
    section.intro = [
        f"`posenc.MultiHeadAttention(dim={s.attn_dim}, num_heads={s.attn_heads}, "
        f'pe=posenc.build("alibi", num_heads={s.attn_heads}), backend=...)`, batch 1, fp32, '
        "inference, no mask, against `torch.nn.MultiheadAttention` with the same weights, "
        "given the ALiBi bias materialised as its float `attn_mask` (formed on every call, "
        "as posenc's materialising backends form theirs). Backends: `flex` is "
        f"{flex} with ALiBi's `score_mod` (no n × n tensor); `sdpa` materialises the "
        "`(h, n, n)` bias and calls `F.scaled_dot_product_attention`; `math` materialises it "
        "and runs the explicit softmax. " + _MEMORY_LINE,
    ]
    variants = ("flex", "sdpa", "math", "torch-mha")
    rows, notes = _worker_rows("attention", _attention_spec(s), s.bias_sizes, variants)
    section.notes += notes + _skips(rows)
    rows = [r for r in rows if "median_s" in r]
    peer = {r["n"]: r for r in rows if r["variant"] == "torch-mha"}
    table = Table(
        ["n", "implementation", "median ms", "range ms", "x torch time", "extra MiB",
         "x torch memory", "first call s"],
        text_columns=2,
    )  # fmt: skip
    for r in rows:
        ref = peer.get(r["n"])
        time_ratio = ratio(r["median_s"], ref["median_s"]) if ref else "-"
        mem_ratio = "-"
        if ref and r["extra_mib"] is not None and ref["extra_mib"]:
            mem_ratio = ratio(r["extra_mib"], ref["extra_mib"])
        table.rows.append(
            [str(r["n"]), _VARIANT_LABELS[r["variant"]], ms(r["median_s"]),
             f"{ms(r['low_s'])}–{ms(r['high_s'])}", time_ratio, _mib(r["extra_mib"]),
             mem_ratio, f"{r['first_s']:.2f}"]
        )  # fmt: skip
    section.tables.append(table)
    for r in rows:
        used = r.get("backend_used")
        if used is not None and used != r["variant"]:
            section.notes.append(
                f"n = {r['n']}: backend `{r['variant']}` could not run here and fell back to "
                f"`{used}`; its row times `{used}`."
            )
    diffs = [r["max_abs_diff"] for r in rows if "max_abs_diff" in r]
    if diffs:
        section.notes.append(
            f"torch's and posenc's outputs agree to {max(diffs):.1e} (max absolute difference "
            "over all sizes): the same computation is being timed."
        )
    section.notes.append(
        "`x torch` columns: posenc's figure over torch's (below 1: posenc is faster / "
        "smaller). `first call` includes compiling flex attention for that shape."
    )
    section.data["rows"] = rows
    return section


# --------------------------------------------------------------------------- encoder


def _torch_encoder(dim: int, depth: int, heads: int, ffn: int, dropout: float) -> nn.Module:
    """``nn.TransformerEncoder`` shaped like ``posenc.Encoder``: pre-norm, ReLU, a final
    LayerNorm, batch first, with posenc's sinusoidal encoding added to its input."""
    from ..encodings.sinusoidal import SinusoidalPositionalEncoding

    layer = nn.TransformerEncoderLayer(
        dim, heads, ffn, dropout, activation="relu", batch_first=True, norm_first=True
    )
    encoder = nn.TransformerEncoder(
        layer, depth, norm=nn.LayerNorm(dim), enable_nested_tensor=False
    )
    return nn.Sequential(SinusoidalPositionalEncoding(dim), encoder)


def _step(model: nn.Module, x: Tensor, backward: bool) -> Callable[[], object]:
    def forward() -> object:
        return model(x)

    def forward_backward() -> object:
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()
        return None

    return forward_backward if backward else forward


def _profile(fn: Callable[[], object], grad: bool, calls: int = 3) -> dict[str, tuple[float, int]]:
    """Self CPU time (ms) and call count per operator per call of ``fn``, averaged over
    ``calls`` profiled calls."""
    from contextlib import nullcontext

    from torch.profiler import ProfilerActivity, profile

    with nullcontext() if grad else torch.inference_mode():
        fn()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(calls):
                fn()
    return {
        e.key: (e.self_cpu_time_total / 1e3 / calls, round(e.count / calls))
        for e in prof.key_averages()
    }


def _breakdown(
    title: str, mine: Callable[[], object], peer: Callable[[], object], grad: bool, k: int = 8
) -> Table:
    """The operators whose self CPU time differs most between posenc and torch: the ``k``
    where posenc spends the most extra, then the ``k // 2`` where torch does (its fused
    kernels appear there)."""
    ours, theirs = _profile(mine, grad), _profile(peer, grad)
    keys = sorted(
        set(ours) | set(theirs),
        key=lambda key: ours.get(key, (0.0, 0))[0] - theirs.get(key, (0.0, 0))[0],
        reverse=True,
    )
    table = Table(
        ["operator", "posenc self ms", "posenc calls", "torch self ms", "torch calls",
         "difference ms"],
        caption=f"Where the time goes, {title} (posenc slower by more than 5%): self CPU time "
        "per operator and call, averaged over 3 profiled calls of each (`torch.profiler`), "
        "posenc's largest excess "
        "first, torch's last. "
        f"Totals: posenc {sum(v[0] for v in ours.values()):.1f} ms, torch "
        f"{sum(v[0] for v in theirs.values()):.1f} ms.",
    )  # fmt: skip
    shown = keys[:k] + [key for key in keys[-(k // 2) :] if key not in keys[:k]]
    for key in shown:
        (a, na), (b, nb) = ours.get(key, (0.0, 0)), theirs.get(key, (0.0, 0))
        table.rows.append([f"`{key}`", f"{a:.2f}", str(na), f"{b:.2f}", str(nb), f"{a - b:+.2f}"])
    return table


def suite_encoder(s: Settings) -> Section:
    from ..model import Encoder

    dim, depth, heads, ffn, batch, n = s.encoder
    dropout = 0.1
    section = Section("encoder", "A whole encoder: posenc.Encoder vs torch.nn.TransformerEncoder")
    section.intro = [
        f"Width {dim}, depth {depth}, {heads} heads, feed-forward {ffn}, dropout {dropout}, "
        f"input ({batch}, {n}, {dim}) fp32 ({batch * n} tokens). Both are pre-norm with ReLU "
        "and a final LayerNorm; both add the same sinusoidal encoding (posenc's, "
        '`pe="sinusoidal"`) to their input; torch\'s is `nn.TransformerEncoder` '
        "(`batch_first=True, norm_first=True, enable_nested_tensor=False`). Modes: `eval` "
        "(no dropout; its forward runs under `torch.inference_mode`, where torch takes its "
        "fused fast path) and `train` (dropout on). `forward+backward` is "
        "`zero_grad; model(x).sum().backward()`. Tokens/s = batch × n / median. "
        f"Medians over {s.encoder_repeats} timed calls per case, posenc and torch "
        f"alternating, after {s.warmup} warm-up call(s) of each.",
    ]
    torch.manual_seed(0)
    ours = Encoder(dim, depth, heads, pe="sinusoidal", ffn_dim=ffn, dropout=dropout)
    theirs = _torch_encoder(dim, depth, heads, ffn, dropout)
    x = torch.randn(batch, n, dim)
    table = Table(
        ["mode", "pass", "implementation", "median ms", "range ms", "tokens/s",
         "posenc speed-up"],
        text_columns=3,
    )  # fmt: skip
    slower: list[tuple[str, str, Callable[[], object], Callable[[], object], bool]] = []
    for mode in ("eval", "train"):
        ours.train(mode == "train")
        theirs.train(mode == "train")
        for backward in (False, True):
            grad = backward or mode == "train"
            cases = [
                Case("posenc Encoder", _step(ours, x, backward)),
                Case("torch TransformerEncoder", _step(theirs, x, backward)),
            ]
            mine, peer = round_robin(cases, warmup=s.warmup, repeats=s.encoder_repeats, grad=grad)
            label = "forward+backward" if backward else "forward"
            for case, t in zip(cases, (mine, peer), strict=True):
                table.rows.append(
                    [mode, label, case.name, ms(t.median), spread(t),
                     f"{batch * n / t.median:,.0f}",
                     ratio(peer.median, mine.median) if t is mine else "-"]
                )  # fmt: skip
            if mine.median > 1.05 * peer.median:
                slower.append((mode, label, cases[0].fn, cases[1].fn, grad))
    section.tables.append(table)
    section.notes.append(
        "`posenc speed-up` is torch's median over posenc's (above 1: posenc is faster)."
    )
    for mode, label, mine_fn, peer_fn, grad in slower:
        ours.train(mode == "train")
        theirs.train(mode == "train")
        section.tables.append(_breakdown(f"{mode} {label}", mine_fn, peer_fn, grad))
    return section


# --------------------------------------------------------------------------- scaling


def _exponents(rows: list[dict[str, Any]], variants: tuple[str, ...]) -> list[str]:
    lines = []
    for v in variants:
        mine = [r for r in rows if r["variant"] == v]
        if not mine:
            continue
        sizes = [r["n"] for r in mine]
        t = fit_exponent(sizes, [r["median_s"] for r in mine])
        mem = [r for r in mine if r["extra_mib"]]
        m = fit_exponent([r["n"] for r in mem], [r["extra_mib"] for r in mem])
        t_text = "n/a" if t is None else f"n^{t:.2f}"
        m_text = "n/a" if m is None else f"n^{m:.2f}"
        lines.append(
            f"fitted growth, {_VARIANT_LABELS[v]}: time ∝ {t_text}, memory ∝ {m_text} "
            f"(least-squares fit of log cost on log n over n = {min(sizes)}…{max(sizes)}, "
            f"{len(mine)} sizes)"
        )
    return lines


def _scaling_table(rows: list[dict[str, Any]], variants: tuple[str, ...], caption: str) -> Table:
    present = [v for v in variants if any(r["variant"] == v for r in rows)]
    headers = ["n"]
    for v in present:
        headers += [f"{_VARIANT_LABELS[v]} ms", f"{_VARIANT_LABELS[v]} MiB"]
    table = Table(headers, caption=caption)
    for n in sorted({r["n"] for r in rows}):
        cells = [str(n)]
        for v in present:
            r = next((r for r in rows if r["n"] == n and r["variant"] == v), None)
            cells += ["skipped", "-"] if r is None else [ms(r["median_s"]), _mib(r["extra_mib"])]
        table.rows.append(cells)
    return table


def suite_scaling(s: Settings) -> Section:
    section = Section("scaling", "Scaling with sequence length: RoPE and bias attention")
    sizes = s.scaling_sizes
    section.intro = [
        f"n doubles from {sizes[0]} to {sizes[-1]}. RoPE: posenc `RotaryEmbedding` (half "
        f"layout, fp32, tables included) on q and k of shape (1, {s.rope_scaling_heads}, n, 64), "
        "against transformers' `apply_rotary_pos_emb` and the copy floor; the work grows as n, "
        "so time and memory should grow as n¹. Bias attention: ALiBi in "
        f"`posenc.MultiHeadAttention(dim={s.attn_dim}, num_heads={s.attn_heads})` with the "
        "`flex` and `sdpa` backends and torch's `nn.MultiheadAttention` with the materialised "
        "bias; the work grows as n², so time should grow as n², and memory as n² wherever an "
        "n × n bias is materialised, but only as n for flex. A size is skipped when its "
        f"predicted time per call exceeds {s.max_call_s:g} s or its predicted memory half of "
        "what is available. " + _MEMORY_LINE,
    ]
    rope_variants = ("posenc", "copy floor", "transformers")
    rope_spec = {
        "heads": s.rope_scaling_heads,
        "head_dim": 64,
        "threads": s.threads or torch.get_num_threads(),
        "max_call_s": s.max_call_s,
        "repeats": s.repeats,
        "size_budget_s": s.size_budget_s,
    }
    rope_rows, notes = _worker_rows("rope", rope_spec, sizes, rope_variants)
    attn_variants = ("flex", "sdpa", "torch-mha")
    attn_rows, more = _worker_rows("attention", _attention_spec(s), sizes, attn_variants)
    skipped = _skips(rope_rows) + _skips(attn_rows)
    rope_rows = [r for r in rope_rows if "median_s" in r]
    attn_rows = [r for r in attn_rows if "median_s" in r]
    section.tables.append(_scaling_table(rope_rows, rope_variants, "RoPE, fp32, half layout:"))
    section.tables.append(_scaling_table(attn_rows, attn_variants, "Bias (ALiBi) attention:"))
    section.notes += _exponents(rope_rows, rope_variants) + _exponents(attn_rows, attn_variants)
    section.notes += notes + more + skipped
    section.notes.append(
        "Memory exponents at small n are flattened by fixed costs (the output, allocator "
        "granularity), and the fitted time exponent is only as good as the sizes that fit."
    )
    section.data.update(rope=rope_rows, attention=attn_rows)
    return section


RUNNERS: dict[str, Callable[[Settings], Section]] = {
    "table": suite_table,
    "add": suite_add,
    "rope": suite_rope,
    "bias": suite_bias,
    "encoder": suite_encoder,
    "scaling": suite_scaling,
}


def run_suites(names: list[str], settings: Settings) -> list[Section]:
    """Run the named suites in order, timing each; unknown names raise ``ValueError``."""
    for name in names:
        if name not in RUNNERS:
            raise PosencValueError(f"unknown bench suite {name!r}; known: {', '.join(SUITES)}")
    sections = []
    for name in names:
        start = time.perf_counter()
        section = RUNNERS[name](settings)
        section.seconds = time.perf_counter() - start
        sections.append(section)
    return sections


def settings_for(quick: bool, **overrides: Any) -> Settings:
    """:data:`QUICK` or :data:`DEFAULT`, with the given fields replaced (``None`` skipped)."""
    base = QUICK if quick else DEFAULT
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})


__all__ = [
    "DEFAULT",
    "QUICK",
    "SUITES",
    "Settings",
    "float64_table",
    "numpy_table_fp32",
    "run_suites",
    "settings_for",
    "torch_table_fp32",
]
