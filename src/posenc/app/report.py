"""``posenc report``: one self-contained HTML page with the tour's demonstrations, pictures of
the chosen encodings, the analysis table, and, where their files exist, the benchmark and
length-generalisation results.

Self-contained means every figure is an inline ``data:`` PNG and the page loads nothing
from anywhere: no scripts, fonts or style sheets from the network.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from .. import __version__
from ..analysis import analysis_html, analyze
from ..encodings.base import FAMILIES
from ..encodings.registry import available, entry
from ..plots import build_for_plot, default_kind, figure_to_data_uri, plot_encoding

STYLE = """
:root { color-scheme: light; --ink: #1d232a; --muted: #5a6470; --line: #d9dee4; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1100px; padding: 1rem; font: 16px/1.5 system-ui, sans-serif;
       color: var(--ink); background: #fff; }
h1 { font-size: 1.7rem; margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid var(--line); }
.meta { color: var(--muted); font-size: 0.9rem; }
figure { margin: 1rem 0; } figure img { width: 100%; height: auto; border: 1px solid var(--line); }
figcaption { color: var(--muted); font-size: 0.9rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.9rem; margin: 0.5rem 0; }
th, td { border: 1px solid var(--line); padding: 0.25rem 0.5rem; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(320px, 1fr)); gap: 1rem; }
pre, code { font-size: 0.85rem; } pre { overflow-x: auto; background: #f6f8fa; padding: 0.5rem; }
"""


def png_to_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _figure(uri: str, caption: str) -> str:
    alt = html.escape(caption)
    return f'<figure><img src="{uri}" alt="{alt}"><figcaption>{alt}</figcaption></figure>'


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return f'<div class="scroll">{table}</div>'


def markdown_to_html(text: str) -> str:
    """Render a results file (markdown with tables); links to elsewhere become plain text so
    the page never points off itself."""
    import markdown

    rendered = markdown.markdown(text, extensions=["tables", "fenced_code"])
    rendered = rendered.replace("<table>", '<div class="scroll"><table>')
    rendered = rendered.replace("</table>", "</table></div>")
    # drop images that are not inline data: the report must not request files or the network
    import re

    rendered = re.sub(r'<img [^>]*src="(?!data:)[^"]*"[^>]*>', "", rendered)
    return re.sub(r'<a href="[^"]*">(.*?)</a>', r"\1", rendered)


def _tour_section() -> str:
    from .tour import run_tour

    with tempfile.TemporaryDirectory() as tmp:
        summary = run_tour(Path(tmp), console=Console(file=io.StringIO()))
        pictures = {Path(p).stem: png_to_data_uri(Path(p)) for p in summary["pictures"]}
    parts = ["<h2>The tour</h2>"]
    parts.append(
        _table(
            ["table", "max error vs float64 (positions 0..8192, dim 64)"],
            [
                ["posenc (float64 angles, cast once)", f"{summary['precision']['posenc']:.1e}"],
                ["float32 angles (tutorial code)", f"{summary['precision']['float32_angles']:.1e}"],
            ],
        )
    )
    parts.append('<div class="grid">')
    parts.append(
        _figure(pictures["heatmap"], "The sinusoidal table: position down, dimension across")
    )
    parts.append(_figure(pictures["dimensions"], "Dimensions 0, 1, 30, 31 against position"))
    parts.append("</div>")
    parts.append("<h3>Attention is blind to order without positions</h3>")
    parts.append(
        _figure(
            pictures["attention"], "'cat sat mat' and 'mat cat sat', with and without positions"
        )
    )
    gaps = summary["permutation"]
    rows = [
        ["attention, no positions", f"{gaps['attention_gap']:.1e}"],
        ["attention + sinusoidal", f"{gaps['positions_gap']:.3f}"],
    ] + [[f"2-layer encoder, pe={k}", f"{v:.1e}"] for k, v in summary["encoder_gap"].items()]
    parts.append(_table(["model", "largest change when the sentence is shuffled"], rows))
    parts.append("<h3>A shift is one fixed linear map</h3>")
    parts.append(
        _table(
            ["offset k", "max |PE(p+k) − M_k PE(p)| (float64)"],
            [[str(k), f"{v:.1e}"] for k, v in summary["shift_residuals"].items()],
        )
    )
    return "\n".join(parts)


def _encodings_section(names: Sequence[str]) -> str:
    """Per family: the logit contribution against distance of its sequence encodings side by
    side, then one picture of each encoding: the kind :func:`~posenc.plots.default_kind`
    picks, or the similarity matrix where that is the distance profile already shown."""
    parts = ["<h2>The encodings</h2>"]
    for family in FAMILIES:
        members = [name for name in names if entry(name).family == family]
        if not members:
            continue
        parts.append(f"<h3>{html.escape(family)}</h3>")
        built = {name: build_for_plot(name) for name in members}
        sequences = [name for name in members if built[name].axes == 1]
        if sequences:
            fig = plot_encoding(sequences, kind="distance", positions=64)
            caption = f"{family}: logit contribution against distance, side by side"
            parts.append(_figure(figure_to_data_uri(fig), caption))
        parts.append('<div class="grid">')
        for name, pe in built.items():
            kind = default_kind(pe)
            if kind == "distance" and name in sequences:
                kind = "similarity"
            fig = plot_encoding(name, kind=kind, positions=64)
            caption = f"{name} ({entry(name).paper or 'no paper'}): {kind}"
            parts.append(_figure(figure_to_data_uri(fig), caption))
        parts.append("</div>")
    return "\n".join(parts)


def _analysis_section(names: Sequence[str]) -> str:
    rows = [analyze(name) for name in names]
    return (
        "<h2>Measured properties</h2>"
        '<div class="scroll">' + analysis_html(rows) + "</div>"
        "<p class='meta'>unique: smallest distance between two positions' representations; "
        "shift resid.: 0 when the logit contribution depends only on i − j; decay: share of "
        "distances where it does not rise; at 2L / drift past L: whether the encoding exists "
        "at twice the training length L = 64 and how much its structure changes there; perm. "
        "gap: 0 when a random bidirectional encoder cannot see order.</p>"
    )


def _results_section(results: Path) -> str:
    files = sorted(results.glob("*.md")) if results.is_dir() else []
    if not files:
        return ""
    parts = ["<h2>Benchmarks and length generalisation</h2>"]
    for path in files:
        parts.append(f"<section><p class='meta'>from {html.escape(path.name)}</p>")
        parts.append(markdown_to_html(inline_local_images(path.read_text(), results)))
        parts.append("</section>")
    return "\n".join(parts)


def inline_local_images(text: str, folder: Path) -> str:
    """Markdown images that name a PNG file in ``folder`` (``posenc extrapolate``'s figure,
    say) become inline data, so the page still loads nothing from anywhere."""
    import re

    def inline(match: re.Match[str]) -> str:
        path = folder / match.group(2)
        if path.suffix.lower() == ".png" and path.is_file() and path.parent == folder:
            return f"![{match.group(1)}]({png_to_data_uri(path)})"
        return match.group(0)

    return re.sub(r"!\[([^\]]*)\]\(([^)\s/]+)\)", inline, text)


def build_report(names: Sequence[str] | None = None, *, results: Path | None = None) -> str:
    """The report as one HTML string."""
    chosen = list(names) if names else available()
    for name in chosen:
        entry(name)  # unknown names fail before any work
    started = time.perf_counter()
    body = [
        "<h1>posenc report</h1>",
        f"<p class='meta'>posenc {__version__} · encodings: {html.escape(', '.join(chosen))}</p>",
        _tour_section(),
        _encodings_section(chosen),
        _analysis_section(chosen),
        _results_section(results or Path("benchmarks")),
        f"<p class='meta'>built in {time.perf_counter() - started:.1f} s</p>",
    ]
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<title>posenc report</title>"
        # nothing may be fetched: forbid every source except inline data
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
        "img-src data:; style-src 'unsafe-inline'\">"
        f"<style>{STYLE}</style></head><body>" + "\n".join(body) + "</body></html>"
    )


def cmd_report(args: argparse.Namespace) -> int:
    for name in args.names:
        entry(name)  # an unknown name fails before any work
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)  # an unusable folder too (OSError: exit 2)
    page = build_report(args.names, results=Path(args.results))
    out.write_text(page, encoding="utf-8")
    print(f"wrote {out} ({len(page) / 1e6:.1f} MB)")
    return 0


def add_subcommand(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write a self-contained HTML report")
    p.add_argument(
        "names", nargs="*", metavar="NAME", help="encodings (default: every registered one)"
    )
    p.add_argument("-o", "--output", default="report.html", help="HTML file to write")
    p.add_argument(
        "--results",
        default="benchmarks",
        help="folder of results (*.md, and the PNG figures they show) to include, e.g. a "
        "posenc extrapolate --out folder",
    )
    p.set_defaults(func=cmd_report)
