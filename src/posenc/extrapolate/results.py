"""``results.json`` (the contract that scripts and ``posenc report`` read), ``results.md`` and
the checks of Press et al. 2022 and Peng et al. 2023 against a sweep's numbers.

``results.json``::

    {"config": {...},
     "corpus": {"name", "sha256", "tokenizer", "train_tokens", "valid_tokens"},
     "runs": [{"pe": "rope", "scaling": null | {"rope_type": "yarn", ...},
               "finetune_steps": 0, "seed": 0, "skipped_lengths": [],
               "eval": [{"length": 256, "factor": 4.0, "bpb": 2.80,
                         "by_position": {"0-64": 2.05, "64-128": 2.33, "128-256": 3.40}}],
               "by_context": {"0": 2.54, "16": 2.39, "64": 2.38, ...},
               "retrieval": [{"length": 512, "depth": 0.1, "copy_accuracy": 0.42,
                              "bits_saved": 1.9}, ...]}]}

Every ``bpb`` number is bits per byte. ``factor`` is the RoPE scaling factor in use at that
length (``null`` for a model evaluated as trained); ``by_position`` keys are
``"start-end"`` in tokens; an ``eval`` row has ``"sliding_bpb"`` too when the sweep asked
for sliding windows. ``by_context`` (unless ``context_blocks`` is 0): bits per byte over
the same target blocks given ``c`` tokens of context, keyed by ``c``
(:mod:`~posenc.extrapolate.context_gain`). ``retrieval`` (with ``--retrieval``): per
length and needle depth, the greedy copy accuracy on a repeated needle and the bits per
needle token the first occurrence saves (:mod:`~posenc.extrapolate.retrieval`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import PosencValueError
from .context_gain import block_len
from .corpus import Corpus
from .retrieval import cue_len
from .summary import context_curves, curves, lengths_of, mean, position_curves, retrieval_grid

RESULTS = "results.json"
MARKDOWN = "results.md"
FIGURE = "extrapolate.png"
RETRIEVAL_FIGURE = "retrieval.png"

_RUN_KEYS = {"pe", "scaling", "finetune_steps", "seed", "skipped_lengths", "eval"}
_OPTIONAL_RUN_KEYS = {"by_context", "retrieval"}
_RETRIEVAL_KEYS = {"length", "depth", "copy_accuracy", "bits_saved"}
_EVAL_KEYS = {"length", "factor", "bpb", "by_position"}
_CORPUS_KEYS = {"name", "sha256", "tokenizer", "train_tokens", "valid_tokens"}


def corpus_summary(corpus: Corpus) -> dict[str, Any]:
    return {
        "name": corpus.name,
        "sha256": corpus.sha256,
        "tokenizer": corpus.tokenizer,
        "train_tokens": len(corpus.train),
        "valid_tokens": len(corpus.valid),
    }


def check_results(results: Any) -> None:
    """Raise :class:`~posenc.errors.PosencValueError` naming the first place where
    ``results`` departs from the schema of the module docstring."""

    def need(ok: bool, where: str, value: Any) -> None:
        if not ok:
            raise PosencValueError(f"results.json: {where} is not as the schema says: {value!r}")

    need(isinstance(results, dict) and set(results) == {"config", "corpus", "runs"}, "top", results)
    need(isinstance(results["config"], dict), "config", results["config"])
    need(set(results["corpus"]) == _CORPUS_KEYS, "corpus", results["corpus"])
    need(isinstance(results["runs"], list), "runs", results["runs"])
    for i, run in enumerate(results["runs"]):
        need(
            isinstance(run, dict) and set(run) - _OPTIONAL_RUN_KEYS == _RUN_KEYS, f"runs[{i}]", run
        )
        context = run.get("by_context", {})
        need(
            isinstance(context, dict)
            and all(k.isdigit() and _finite(v) for k, v in context.items()),
            f"runs[{i}].by_context",
            context,
        )
        for j, row in enumerate(run.get("retrieval", [])):
            need(
                isinstance(row, dict)
                and set(row) == _RETRIEVAL_KEYS
                and isinstance(row["length"], int)
                and _finite(row["depth"])
                and 0 <= row["depth"] <= 1
                and _finite(row["copy_accuracy"])
                and 0 <= row["copy_accuracy"] <= 1
                and _finite(row["bits_saved"]),
                f"runs[{i}].retrieval[{j}]",
                row,
            )
        scaling = run["scaling"]
        need(scaling is None or "rope_type" in scaling, f"runs[{i}].scaling", scaling)
        for j, row in enumerate(run["eval"]):
            where = f"runs[{i}].eval[{j}]"
            need(set(row) - {"sliding_bpb"} == _EVAL_KEYS, where, row)
            need(isinstance(row["bpb"], float) and math.isfinite(row["bpb"]), where, row)
            buckets = [key.split("-") for key in row["by_position"]]
            need(
                all(len(b) == 2 and b[0].isdigit() and b[1].isdigit() for b in buckets), where, row
            )
            need(max(int(b[1]) for b in buckets) == row["length"], where, row)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def write_results(
    out: Path | str,
    results: dict[str, Any],
    timings: Sequence[dict[str, Any]] = (),
    *,
    plot: bool = True,
    command: str | None = None,
) -> list[Path]:
    """Write ``results.json``, ``results.md`` and (``plot``) ``extrapolate.png`` and, when
    the runs carry ``retrieval``, ``retrieval.png`` in ``out``; return their paths."""
    check_results(results)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{RESULTS}.tmp"  # keys in their order: buckets by position, not by text
    tmp.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out / RESULTS)
    written = [out / RESULTS, out / MARKDOWN]
    retrieved = any("retrieval" in run for run in results["runs"])
    if plot:
        from .plots import plot_extrapolation, plot_retrieval

        figures = [(FIGURE, plot_extrapolation(results))]
        if retrieved:
            figures.append((RETRIEVAL_FIGURE, plot_retrieval(results)))
        for name, fig in figures:
            fig.savefig(out / name, dpi=120)
            written.append(out / name)
    text = markdown_report(
        results,
        timings,
        figure=FIGURE if plot else None,
        retrieval_figure=RETRIEVAL_FIGURE if plot and retrieved else None,
        command=command,
    )
    (out / MARKDOWN).write_text(text, encoding="utf-8")
    return written


def read_results(path: Path | str) -> dict[str, Any]:
    """Read and check a ``results.json`` (or the one in a folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS
    try:
        results = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise PosencValueError(f"cannot read {str(path)!r}: {exc}") from None
    check_results(results)
    return results


def _cell(values: Sequence[float] | None) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    m = mean(values)
    std = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
    return f"{m:.3f} ± {std:.3f}"


# --------------------------------------------------------------------------- the checks


def press_checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each statement of the issue's item 5 (Press et al. 2022, Fig. 1; Chen et al. 2023;
    Peng et al. 2023) with ``holds`` (True, False, or None when the sweep lacks the runs or
    the lengths it needs: "not measured") and the numbers behind it, from the mean over
    seeds."""
    L = results["config"]["train_len"]
    c = {label: {n: mean(v) for n, v in per.items()} for label, per in curves(results).items()}
    lengths = lengths_of(results)
    longest = max(lengths, default=0)
    checks: list[dict[str, Any]] = []

    def add(statement: str, holds: bool | None, numbers: str) -> None:
        checks.append({"statement": statement, "holds": holds, "numbers": numbers})

    def bpb(label: str, n: int) -> float | None:
        return c.get(label, {}).get(n)

    def measured(labels: Sequence[str], ns: Sequence[int]) -> bool:
        """Whether every label was evaluated at every length (and there is a length)."""
        return bool(ns) and all(bpb(x, n) is not None for x in labels for n in ns)

    def fmt(label: str, ns: Sequence[int]) -> str:
        return ", ".join(f"{n}: {bpb(label, n):.3f}" for n in ns if bpb(label, n) is not None)

    statement = f"sinusoidal: loss on positions {L}-{2 * L} at least 1.5x its loss on 0-{L}"
    buckets = {k: mean(v) for k, v in position_curves(results, 2 * L).get("sinusoidal", {}).items()}
    first, second = buckets.get(f"0-{L}"), buckets.get(f"{L}-{2 * L}")
    if first is None or second is None:
        add(statement, None, f"needs sinusoidal evaluated at {2 * L}")
    else:
        add(
            statement,
            second >= 1.5 * first,
            f"at length {2 * L}: 0-{L} {first:.3f}, {L}-{2 * L} {second:.3f} bpb "
            f"(ratio {second / first:.2f})",
        )

    statement = f"alibi: bits per byte at {longest} no worse than at {L}"
    a_long, a_short = bpb("alibi", longest), bpb("alibi", L)
    if a_long is None or a_short is None or longest <= L:
        add(statement, None, "needs alibi evaluated at L and a longer length")
    else:
        add(statement, a_long <= a_short, f"alibi {L}: {a_short:.3f}, {longest}: {a_long:.3f}")

    far = [n for n in lengths if n >= 8 * L]
    statement = "rope between alibi and sinusoidal at 8L and beyond"
    if not measured(("rope", "alibi", "sinusoidal"), far):
        add(statement, None, "needs rope, alibi and sinusoidal at 8L or longer")
    else:
        holds = all(bpb("alibi", n) < bpb("rope", n) < bpb("sinusoidal", n) for n in far)  # type: ignore[operator]
        numbers = "; ".join(
            f"{n}: alibi {bpb('alibi', n):.3f} < rope {bpb('rope', n):.3f} < sinusoidal "
            f"{bpb('sinusoidal', n):.3f}"
            for n in far
        )
        add(statement, holds, numbers)

    beyond = [n for n in lengths if n >= 4 * L]
    statement = "YaRN or dynamic NTK (zero-shot) below plain rope at 4L and beyond"
    scaled = [x for x in ("rope+yarn", "rope+dynamic") if x in c]
    if not scaled or not measured(("rope", *scaled), beyond):
        add(statement, None, "needs rope and rope+yarn or rope+dynamic at 4L or longer")
    else:
        holds = all(min(bpb(x, n) for x in scaled) < bpb("rope", n) for n in beyond)  # type: ignore[type-var,operator]
        numbers = "; ".join(
            f"{n}: rope {bpb('rope', n):.3f}, "
            + ", ".join(f"{x.split('+')[1]} {bpb(x, n):.3f}" for x in scaled)
            for n in beyond
        )
        add(statement, holds, numbers)

    longer = [n for n in lengths if n > L]
    statement = "linear PI without fine-tuning worse than plain rope (every length past L)"
    if not measured(("rope", "rope+linear"), longer):
        add(statement, None, "needs rope and rope+linear past L")
    else:
        holds = all(bpb("rope+linear", n) > bpb("rope", n) for n in longer)  # type: ignore[operator]
        numbers = "; ".join(
            f"{n}: rope {bpb('rope', n):.3f}, linear {bpb('rope+linear', n):.3f}" for n in longer
        )
        add(statement, holds, numbers)

    statement = f"linear PI fine-tuned at {4 * L} better than plain rope at {4 * L}"
    tuned = [x for x in c if x.startswith("rope+linear ft") and x.endswith(f"@{4 * L}")]
    if not tuned or bpb(tuned[0], 4 * L) is None or bpb("rope", 4 * L) is None:
        add(statement, None, f"needs a rope run fine-tuned with linear PI at {4 * L}")
    else:
        got, plain = bpb(tuned[0], 4 * L), bpb("rope", 4 * L)
        add(statement, got < plain, f"at {4 * L}: rope {plain:.3f}, {tuned[0]} {got:.3f}")  # type: ignore[operator]

    statement = f"t5 bias at {longest}: between alibi and rope (Press et al.'s order)"
    if not measured(("t5", "alibi", "rope"), [longest]):
        add(statement, None, f"needs t5, alibi and rope at {longest}")
    else:
        t5, alibi, rope = (bpb(x, longest) for x in ("t5", "alibi", "rope"))
        t5_short = bpb("t5", L)
        add(
            statement,
            alibi <= t5 <= rope,  # type: ignore[operator]
            f"{longest}: alibi {alibi:.3f}, t5 {t5:.3f}, rope {rope:.3f}; t5 at {L}: "
            + ("not measured" if t5_short is None else f"{t5_short:.3f}"),
        )
    return checks


# --------------------------------------------------------------------------- markdown


def _context_section(results: dict[str, Any]) -> list[str]:
    """The context-gain table (empty when no run carries ``by_context``)."""
    table = context_curves(results)
    if not table:
        return []
    config = results["config"]
    L = config["train_len"]
    contexts = sorted({c for per in table.values() for c in per})
    return [
        "",
        "## Bits per byte by context length (context gain)",
        "",
        f"The same {config.get('context_blocks', '?')} blocks of {block_len(L)} validation "
        "tokens, each scored after c tokens of context (c = 0: the block alone; target j of "
        "a block sees c + j + 1 tokens; the window is c + T long, so from c = L on the "
        "targets sit past the training length). Falling past c = L: context past the "
        "training length is used; flat: the model survives there without using it; rising: "
        "it breaks.",
        "",
        "| encoding | " + " | ".join(f"c={c}" for c in contexts) + " |",
        "| --- |" + " ---: |" * len(contexts),
        *(
            f"| {label} | " + " | ".join(_cell(per.get(c)) for c in contexts) + " |"
            for label, per in table.items()
        ),
    ]


def _retrieval_section(results: dict[str, Any], figure: str | None) -> list[str]:
    """The retrieval tables, copy accuracy and bits saved (empty without ``retrieval``)."""
    accuracy = retrieval_grid(results, "copy_accuracy")
    if not accuracy:
        return []
    saved = retrieval_grid(results, "bits_saved")
    config = results["config"]
    needle = config.get("needle_len", "?")
    cue = cue_len(needle) if isinstance(needle, int) else "?"
    lengths = sorted({n for per in accuracy.values() for _, n in per})
    lines = [
        "",
        "## Retrieval at length",
        "",
        f"A random needle of {needle} tokens written at a depth of each window "
        f"({config.get('retrieval_trials', '?')} windows of validation text per length and "
        "depth) and repeated over the window's last tokens. Copy accuracy: the share of the "
        f"repeat's tokens past its cue (its first {cue}) that the greedy prediction gets "
        "right; bits saved: bits per such token on a fresh needle minus on the repeat. "
        "Depth 0.1 puts the needle about 0.9 n tokens back from the repeat. Share of the "
        "training windows that held a needle and its repeat: "
        f"{config.get('needle_share', 0.0):g}.",
    ]
    if figure:
        lines += ["", f"![copy accuracy by needle depth and window length]({figure})"]
    for title, grid in (("Copy accuracy", accuracy), ("Bits saved per needle token", saved)):
        lines += [
            "",
            f"{title}:",
            "",
            "| encoding | depth | " + " | ".join(str(n) for n in lengths) + " |",
            "| --- | ---: |" + " ---: |" * len(lengths),
        ]
        for label, per in grid.items():
            for depth in sorted({d for d, _ in per}):
                cells = " | ".join(_cell(per.get((depth, n))) for n in lengths)
                lines.append(f"| {label} | {depth:g} | {cells} |")
    return lines


def markdown_report(
    results: dict[str, Any],
    timings: Sequence[dict[str, Any]] = (),
    *,
    figure: str | None = FIGURE,
    retrieval_figure: str | None = None,
    command: str | None = None,
) -> str:
    """``results.md``: the corpus, the bits-per-byte table, the table by position at the
    longest length (and what it mixes), the context-gain table, the retrieval tables (and
    ``retrieval_figure``), the checks, and the time each run took."""
    config, corpus = results["config"], results["corpus"]
    L = config["train_len"]
    lengths = lengths_of(results)
    table = curves(results)
    lines = [
        f"# Train short, test long: {corpus['name']}",
        "",
        f"Corpus `{corpus['name']}` (sha256 `{corpus['sha256'][:12]}`, {corpus['tokenizer']}): "
        f"{corpus['train_tokens']:,} training and {corpus['valid_tokens']:,} validation tokens; "
        f"every length scores the same {config.get('eval_tokens', 0):,} validation tokens. "
        f"Trained at L = {L} for {config['steps']} steps of {config['batch_size']} windows "
        f"(dim {config['dim']}, depth {config['depth']}, {config['heads']} heads), "
        f"seeds {config.get('seeds')}.",
    ]
    if command:
        lines += ["", f"    {command}"]
    pending = config.get("pending") or []
    if pending:
        lines += [
            "",
            f"**Partial**: {len(pending)} model(s) still to run ({', '.join(pending)}); the "
            "same command with `--resume` completes the sweep.",
        ]
    if figure:
        lines += ["", f"![bits per byte against evaluation length]({figure})"]
    lines += [
        "",
        "## Bits per byte by evaluation length",
        "",
        "| encoding | " + " | ".join(str(n) for n in lengths) + " |",
        "| --- |" + " ---: |" * len(lengths),
    ]
    for label, per in table.items():
        lines.append(f"| {label} | " + " | ".join(_cell(per.get(n)) for n in lengths) + " |")
    lines += [
        "",
        "`+linear`, `+dynamic`, `+yarn`: the RoPE model evaluated zero-shot with that scaling "
        "at factor n / L; `ftN@n`: fine-tuned N steps at length n with it. `–`: beyond a "
        "learned table (not evaluated).",
    ]
    if lengths:
        longest = max(lengths)
        positions = position_curves(results, longest)
        buckets = list(next(iter(positions.values()), {}).keys())
        lines += [
            "",
            f"## Bits per byte by position at length {longest}",
            "",
            "| encoding | " + " | ".join(buckets) + " |",
            "| --- |" + " ---: |" * len(buckets),
        ]
        for label, per in positions.items():
            lines.append(f"| {label} | " + " | ".join(_cell(per.get(b)) for b in buckets) + " |")
        lines += [
            "",
            "A token at position p of a window has p tokens of context *and* the position "
            "index p, so a bucket mixes the two: a bucket past L that is worse than 0-L may be "
            "positions the model never saw or context it cannot use, a better one more "
            "context used. The windows are cut at fixed offsets of the validation text, "
            "wherever its documents start, so how much of that context is the token's own "
            "document varies too."
            + (
                " The context-gain table below holds the targets fixed and varies only the context."
                if context_curves(results)
                else ""
            ),
        ]
    lines += _context_section(results)
    lines += _retrieval_section(results, retrieval_figure)
    lines += ["", "## Checks (Press et al. 2022; Chen et al. 2023; Peng et al. 2023)", ""]
    for check in press_checks(results):
        verdict = {True: "holds", False: "does not hold", None: "not measured"}[check["holds"]]
        lines.append(f"- {check['statement']}: **{verdict}** ({check['numbers']})")
    if timings:
        lines += ["", "## Time", "", "| encoding | seed | train s | fine-tune s | eval s |"]
        lines.append("| --- | ---: | ---: | ---: | ---: |")
        for t in timings:
            lines.append(
                f"| {t['pe']} | {t['seed']} | {t['train_seconds']:.0f} | "
                f"{t['finetune_seconds']:.0f} | {t['eval_seconds']:.0f} |"
            )
    return "\n".join(lines) + "\n"
