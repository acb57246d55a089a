"""The ``bias`` and ``scaling`` suites of ``posenc bench``: ALiBi attention per posenc backend
against ``torch.nn.MultiheadAttention`` given the materialised bias (time and peak memory
against n); RoPE and bias attention as n doubles, with the fitted exponents."""

from __future__ import annotations

from typing import Any

import torch

from ..harness import Section, Table, fit_exponent, ms, ratio
from .settings import Settings
from .sweeps import MEMORY_LINE, VARIANT_LABELS, attention_spec, mib, skips, worker_rows


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
        "and runs the explicit softmax. " + MEMORY_LINE,
    ]
    variants = ("flex", "sdpa", "math", "torch-mha")
    rows, notes = worker_rows("attention", attention_spec(s), s.bias_sizes, variants)
    section.notes += notes + skips(rows)
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
            [str(r["n"]), VARIANT_LABELS[r["variant"]], ms(r["median_s"]),
             f"{ms(r['low_s'])}–{ms(r['high_s'])}", time_ratio, mib(r["extra_mib"]),
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
            f"fitted growth, {VARIANT_LABELS[v]}: time ∝ {t_text}, memory ∝ {m_text} "
            f"(least-squares fit of log cost on log n over n = {min(sizes)}…{max(sizes)}, "
            f"{len(mine)} sizes)"
        )
    return lines


def _scaling_table(rows: list[dict[str, Any]], variants: tuple[str, ...], caption: str) -> Table:
    present = [v for v in variants if any(r["variant"] == v for r in rows)]
    headers = ["n"]
    for v in present:
        headers += [f"{VARIANT_LABELS[v]} ms", f"{VARIANT_LABELS[v]} MiB"]
    table = Table(headers, caption=caption)
    for n in sorted({r["n"] for r in rows}):
        cells = [str(n)]
        for v in present:
            r = next((r for r in rows if r["n"] == n and r["variant"] == v), None)
            cells += ["skipped", "-"] if r is None else [ms(r["median_s"]), mib(r["extra_mib"])]
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
        "what is available. " + MEMORY_LINE,
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
    rope_rows, notes = worker_rows("rope", rope_spec, sizes, rope_variants)
    attn_variants = ("flex", "sdpa", "torch-mha")
    attn_rows, more = worker_rows("attention", attention_spec(s), sizes, attn_variants)
    skipped = skips(rope_rows) + skips(attn_rows)
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
