"""``posenc tour``: every demonstration of the seed tutorials, run with the library, with its
pictures saved and a table printed per demonstration.

1. the sinusoidal table, and how exact it is against float64 (and the usual float32 code);
2. its heatmap and per-dimension waves;
3. attention is blind to order without positions ("cat sat mat" vs "mat cat sat");
4. the relative-shift property: ``PE(p + k) = M_k PE(p)`` with one fixed ``M_k``;
5. every position has its own encoding (uniqueness);
6. an encoder stack run end to end with every registered encoding;
7. the seed's learnable-encoding block (input and output shapes).
"""

from __future__ import annotations

import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from rich.console import Console
from rich.table import Table

from .. import analysis, plots
from ..bench.suites.absolute import torch_table_fp32
from ..encodings.absolute.sinusoidal import SinusoidalPositionalEncoding, sinusoidal_table
from ..encodings.registry import available, build_for_model, entry
from ..model.encoder import Encoder
from ..model.transformer import TransformerModel
from ..plots.absolute import dimension_waves, heatmap, permutation_weights


def _matrix(title: str, labels: tuple[str, ...], weights: torch.Tensor) -> Table:
    table = Table(title=title, title_style="bold")
    table.add_column("query \\ key")
    for label in labels:
        table.add_column(label, justify="right")
    for label, row in zip(labels, weights.tolist(), strict=True):
        table.add_row(label, *(f"{v:.3f}" for v in row))
    return table


def run_tour(out: Path, *, image_format: str = "png", console: Console | None = None) -> dict:
    """Run the tour, save pictures under ``out`` and print the tables; return the numbers."""
    console = console or Console()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    summary: dict = {}
    torch.manual_seed(0)

    # 1. precision -----------------------------------------------------------------------
    console.rule("1. The sinusoidal table, and how exact it is")
    dim, far = 64, 8192
    exact = sinusoidal_table(far + 1, dim, dtype=torch.float64)
    ours = sinusoidal_table(far + 1, dim)
    textbook = torch_table_fp32(far + 1, dim)
    precision = Table(title=f"max |error| against float64, positions 0..{far}, dim {dim}")
    precision.add_column("table")
    precision.add_column("max error", justify="right")
    err_ours = float((ours.double() - exact).abs().max())
    err_book = float((textbook.double() - exact).abs().max())
    precision.add_row("posenc (float64 angles, cast once)", f"{err_ours:.1e}")
    precision.add_row("float32 angles (the tutorials' code)", f"{err_book:.1e}")
    console.print(precision)
    summary["precision"] = {"posenc": err_ours, "float32_angles": err_book}

    # 2. pictures ------------------------------------------------------------------------
    console.rule("2. What the table looks like")
    table = sinusoidal_table(100, dim)
    saved = []
    for name, fig in (
        ("heatmap", heatmap(table, title="Sinusoidal encoding, 100 positions x 64 dims")),
        ("dimensions", dimension_waves(table, (0, 1, 30, 31))),
    ):
        path = out / f"{name}.{image_format}"
        plots.save_figure(fig, path, dpi=110)
        plt.close(fig)
        saved.append(path)
    console.print(
        "Low dimensions oscillate fast (they tell neighbours apart), high ones slowly "
        "(they place a token in the whole sequence)."
    )

    # 3. permutation ---------------------------------------------------------------------
    console.rule("3. Without positions, attention cannot see word order")
    perm = analysis.permutation_test()
    console.print(_matrix("'cat sat mat', no positions", perm.words, perm.weights_plain))
    console.print(
        _matrix("'mat cat sat', no positions", perm.shuffled_words, perm.weights_plain_shuffled)
    )
    console.print(_matrix("'cat sat mat', with positions", perm.words, perm.weights_pos))
    console.print(
        _matrix("'mat cat sat', with positions", perm.shuffled_words, perm.weights_pos_shuffled)
    )
    gaps = Table(title="largest change in any word's attention when the sentence is shuffled")
    gaps.add_column("model")
    gaps.add_column("order gap", justify="right")
    gaps.add_column("sees order?")
    gaps.add_row("attention, no positions", f"{perm.gap_plain:.1e}", "no")
    gaps.add_row("attention + sinusoidal", f"{perm.gap_pos:.3f}", "yes")
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    order = (5, 3, 0, 1, 4, 2)
    encoder_gaps = {}
    for name in ("none", "sinusoidal"):
        enc = Encoder(32, 2, 4, pe=name).double().eval()
        encoder_gaps[name] = analysis.encoder_permutation_gap(enc, x, order)
        gaps.add_row(
            f"2-layer encoder, pe={name}",
            f"{encoder_gaps[name]:.1e}",
            "yes" if encoder_gaps[name] > 1e-6 else "no",
        )
    console.print(gaps)
    fig = permutation_weights(perm)
    path = out / f"attention.{image_format}"
    plots.save_figure(fig, path, dpi=110)
    plt.close(fig)
    saved.append(path)
    summary["permutation"] = {"attention_gap": perm.gap_plain, "positions_gap": perm.gap_pos}
    summary["encoder_gap"] = encoder_gaps

    # 4. relative shift ------------------------------------------------------------------
    console.rule("4. A shift by k is one fixed linear map: PE(p + k) = M_k PE(p)")
    shift = Table(title="max over p < 100 of |PE(p+k) - M_k PE(p)|  (float64, dim 64)")
    shift.add_column("offset k", justify="right")
    shift.add_column("residual", justify="right")
    shift.add_column("|(PE(p+k)-PE(p)) - (PE(k)-PE(0))| max", justify="right")
    residuals = {}
    for k in (1, 3, 10, 50):
        res = analysis.relative_shift(k)
        residuals[k] = res.residual
        shift.add_row(str(k), f"{res.residual:.1e}", f"{res.difference_spread:.3f}")
    console.print(shift)
    console.print(
        "The residual is float64 round-off: the map is exact. The plain differences are not "
        "constant, so 'similar differences' is not the property; the rotation M_k is."
    )
    summary["shift_residuals"] = residuals

    # 5. uniqueness ----------------------------------------------------------------------
    console.rule("5. Every position has its own encoding")
    uniq = Table(title="smallest distance between two rows of the table")
    uniq.add_column("positions x dims")
    uniq.add_column("min distance", justify="right")
    uniq.add_column("closest pair")
    for n, d in ((100, 64), (1000, 64), (1000, 16)):
        dist, i, j = analysis.uniqueness(sinusoidal_table(n, d, dtype=torch.float64))
        uniq.add_row(f"{n} x {d}", f"{dist:.4f}", f"{i}, {j}")
    console.print(uniq)

    # 6. encoder stack with every encoding -----------------------------------------------
    console.rule("6. An encoder stack, end to end, with every registered encoding")
    stack = Table(title="Encoder(dim=64, depth=2, heads=4) on a (2, 16, 64) batch")
    for column in ("pe", "family", "output", "finite", "parameters"):
        stack.add_column(column)
    x = torch.randn(2, 16, 64)
    runs = {}
    for name in available():
        if entry(name).cls.axes != 1:
            continue  # grid encodings take coordinates, not a sequence
        enc = Encoder(64, 2, 4, pe=name).eval()
        with torch.no_grad():
            y = enc(x)
        params = sum(p.numel() for p in enc.parameters())
        ok = bool(torch.isfinite(y).all())
        runs[name] = ok
        stack.add_row(name, entry(name).family, str(tuple(y.shape)), str(ok), f"{params:,}")
    console.print(stack)
    summary["encoders"] = runs

    # 7. the learnable block -------------------------------------------------------------
    console.rule("7. A learnable-encoding model (token ids in, vectors out)")
    model = TransformerModel(1000, 32, 1, 4, pe="learned", pe_kwargs={"max_len": 20}).eval()
    tokens = torch.randint(0, 1000, (4, 12))
    with torch.no_grad():
        y = model(tokens)
    console.print(f"input shape {tuple(tokens.shape)} -> output shape {tuple(y.shape)}")
    learned = build_for_model("learned", 32, 4, max_len=20)
    try:
        learned(torch.zeros(1, 25, 32))
    except ValueError as exc:
        console.print(f"a 25-token input is refused clearly: [italic]{exc}[/italic]")
    # A sinusoidal module is not limited that way: it grows on demand.
    grown = SinusoidalPositionalEncoding(32, max_len=20)(torch.zeros(1, 25, 32))
    console.print(f"the sinusoidal module extends past max_len: {tuple(grown.shape)}")

    elapsed = time.perf_counter() - started
    console.rule(f"done in {elapsed:.1f} s; pictures in {out}")
    for path in saved:
        console.print(f"  {path}")
    summary["seconds"] = elapsed
    summary["pictures"] = [str(p) for p in saved]
    return summary
