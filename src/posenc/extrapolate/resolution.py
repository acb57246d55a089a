"""A small resolution study: tiny ViTs trained on one grid, tested on larger grids.

The task (:func:`make_batch`): a grid of patches, all background except two marked ones, A
and B, on different rows and different columns. The answer is where B lies from A, one of
four classes (up-left, up-right, down-left, down-right), so it depends on positions alone:
the two marks' contents never change. The model reads its answer at A's output token, so
the readout is the same token whatever the grid's size.

Each scheme is a tiny bidirectional :class:`~posenc.Encoder` over the patch tokens:

- ``learned-2d``: a :class:`~posenc.LearnedPositionalEncoding2D` table added to the
  patches, resampled (bicubic) to each test grid;
- ``sinusoidal-2d``, ``rope2d``, ``rope-dinov3``: the registered schemes on the grid's
  ``(row, col)`` coordinates;
- ``rope-mixed``: :class:`~posenc.encodings.rotary.mixed.RotaryMixed`, one set of learned
  frequencies per layer (Heo et al. 2024).

Every scheme gets the same seed, data, width, depth, steps and optimiser. The accuracy at
each grid is measured on a fixed set of examples drawn for that grid.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from ..encodings.absolute.learned_2d import LearnedPositionalEncoding2D
from ..encodings.rotary.mixed import RotaryMixed
from ..errors import PosencValueError
from ..model.encoder import Encoder
from ..runs.cli import bounded_int, seed_in
from ..vision import grid_coordinates

#: The schemes the study compares, in the order the table shows them.
SCHEMES = ("learned-2d", "sinusoidal-2d", "rope2d", "rope-mixed", "rope-dinov3")

#: Token ids of the patches: background, mark A, mark B.
BACKGROUND, MARK_A, MARK_B = 0, 1, 2


@dataclass(frozen=True)
class StudyConfig:
    """The study's settings (the defaults are what ``posenc resolution`` runs)."""

    grid: int = 8  # training grid side, in patches
    scales: tuple[float, ...] = (1.0, 1.5, 2.0)  # test grids: side * scale, rounded
    dim: int = 64  # model width
    depth: int = 2  # encoder layers
    heads: int = 4  # attention heads
    steps: int = 400  # optimiser steps
    batch: int = 64  # examples per step
    lr: float = 2e-3  # AdamW learning rate (cosine to 0)
    eval_examples: int = 512  # test examples per grid
    seed: int = 0
    schemes: tuple[str, ...] = field(default=SCHEMES)

    def __post_init__(self) -> None:
        for name in ("grid", "dim", "depth", "heads", "steps", "batch", "eval_examples"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise PosencValueError(f"{name} must be a positive integer, got {value!r}")
        if self.grid < 2:
            raise PosencValueError(f"grid must be >= 2 (marks on two rows), got {self.grid}")
        if self.dim % (4 * self.heads):
            raise PosencValueError(
                f"dim ({self.dim}) must be a multiple of 4 * heads ({4 * self.heads}): "
                "2-D rotary splits each head into row and column pairs"
            )
        if not self.scales or any(not (s >= 1.0 and math.isfinite(s)) for s in self.scales):
            raise PosencValueError(f"scales must be finite and >= 1, got {list(self.scales)}")
        unknown = [s for s in self.schemes if s not in SCHEMES]
        if unknown or not self.schemes:
            raise PosencValueError(f"schemes must be among {', '.join(SCHEMES)}, got {unknown}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise PosencValueError(f"lr must be a positive number, got {self.lr}")

    def sides(self) -> list[int]:
        """The test grids' sides, one per scale."""
        return [round(self.grid * s) for s in self.scales]


def make_batch(side: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """``count`` examples on a ``side x side`` grid: token ids ``(count, side * side)``, the
    index of mark A ``(count,)`` and the label ``(count,)``: ``2 * (B below A) + (B right
    of A)``. A and B are on different rows and different columns."""
    rows = torch.stack([torch.randperm(side, generator=generator)[:2] for _ in range(count)])
    cols = torch.stack([torch.randperm(side, generator=generator)[:2] for _ in range(count)])
    tokens = torch.full((count, side * side), BACKGROUND, dtype=torch.long)
    a = rows[:, 0] * side + cols[:, 0]
    b = rows[:, 1] * side + cols[:, 1]
    idx = torch.arange(count)
    tokens[idx, a] = MARK_A
    tokens[idx, b] = MARK_B
    label = 2 * (rows[:, 1] > rows[:, 0]).long() + (cols[:, 1] > cols[:, 0]).long()
    return tokens, a, label


class TinyViT(nn.Module):
    """Patch tokens -> (an added 2-D table) -> Encoder -> the output at mark A -> 4 logits."""

    def __init__(self, scheme: str, config: StudyConfig) -> None:
        super().__init__()
        self.scheme = scheme
        dim, depth, heads = config.dim, config.depth, config.heads
        self.embed = nn.Embedding(3, dim)
        self.table: LearnedPositionalEncoding2D | None = None
        if scheme == "learned-2d":
            self.table = LearnedPositionalEncoding2D(dim, grid=(config.grid,) * 2, cls_tokens=0)
            pe: object = "none"
        elif scheme == "rope-mixed":
            pe = RotaryMixed.per_layer(depth, dim // heads, heads)
        else:
            pe = scheme
        self.encoder = Encoder(dim, depth, heads, pe=pe)  # type: ignore[arg-type]
        self.head = nn.Linear(dim, 4)
        self.train_grid = config.grid

    def forward(self, tokens: Tensor, mark: Tensor, side: int) -> Tensor:
        # tokens: (b, side * side); mark: (b,) -> logits (b, 4)
        x = self.embed(tokens)  # (b, n, d)
        coords = grid_coordinates([[1, side, side]])  # (n, 2) row-major (row, col)
        if self.table is not None:
            table = self.table
            if side != self.train_grid:
                table = table.resample((side, side))
            x = table(x)
        out = self.encoder(x, positions=coords)  # (b, n, d)
        return self.head(out[torch.arange(out.shape[0]), mark])


@dataclass(frozen=True)
class SchemeResult:
    scheme: str
    accuracy: dict[int, float]  # test grid side -> accuracy
    final_loss: float  # mean training loss over the last 50 steps
    seconds: float  # training and testing wall time


def train_scheme(scheme: str, config: StudyConfig) -> tuple[TinyViT, float]:
    """Train one model; returns it and its mean loss over the last 50 steps."""
    torch.manual_seed(config.seed)
    model = TinyViT(scheme, config)
    optimiser = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, config.steps)
    data = torch.Generator().manual_seed(config.seed + 1)  # the same batches for every scheme
    losses = []
    model.train()
    for _ in range(config.steps):
        tokens, mark, label = make_batch(config.grid, config.batch, data)
        loss = nn.functional.cross_entropy(model(tokens, mark, config.grid), label)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        schedule.step()
        losses.append(loss.item())
    tail = losses[-50:]
    return model, sum(tail) / len(tail)


@torch.no_grad()
def accuracy(model: TinyViT, side: int, config: StudyConfig) -> float:
    """Accuracy on ``config.eval_examples`` examples drawn for a ``side x side`` grid (the
    same examples for every model)."""
    model.eval()
    data = torch.Generator().manual_seed(config.seed + 1000 + side)
    tokens, mark, label = make_batch(side, config.eval_examples, data)
    correct = 0
    for start in range(0, len(label), 128):
        stop = start + 128
        logits = model(tokens[start:stop], mark[start:stop], side)
        correct += int((logits.argmax(-1) == label[start:stop]).sum())
    return correct / len(label)


def run_study(config: StudyConfig, *, log: bool = False) -> list[SchemeResult]:
    """Train and test every scheme of ``config``; one result per scheme."""
    results = []
    for scheme in config.schemes:
        start = time.perf_counter()
        model, loss = train_scheme(scheme, config)
        acc = {side: accuracy(model, side, config) for side in config.sides()}
        results.append(SchemeResult(scheme, acc, loss, time.perf_counter() - start))
        if log:
            cells = "  ".join(f"{s}x{s} {a:.3f}" for s, a in acc.items())
            print(f"{scheme:<14} loss {loss:.3f}  {cells}  ({results[-1].seconds:.1f} s)")
    return results


def format_table(results: Sequence[SchemeResult], config: StudyConfig) -> str:
    """The results as a Markdown table: accuracy per scheme at each test grid."""
    sides = config.sides()
    head = " | ".join(f"{s}x{s} ({c:g}x)" for s, c in zip(sides, config.scales, strict=True))
    lines = [f"| scheme | {head} | final train loss | seconds |"]
    lines.append("| --- |" + " ---: |" * (len(sides) + 2))
    for r in results:
        cells = " | ".join(f"{r.accuracy[s]:.3f}" for s in sides)
        lines.append(f"| {r.scheme} | {cells} | {r.final_loss:.3f} | {r.seconds:.1f} |")
    return "\n".join(lines)


def plot_results(results: Sequence[SchemeResult], config: StudyConfig, path: str) -> None:
    """Accuracy against the test grid's scale, one line per scheme, saved to ``path``."""
    import matplotlib.pyplot as plt

    from ..plots import save_figure

    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    for r in results:
        ax.plot(config.scales, [r.accuracy[s] for s in config.sides()], marker="o", label=r.scheme)
    ax.axhline(0.25, color="grey", lw=0.8, ls="--", label="chance")
    ax.set_xlabel(f"test grid / training grid ({config.grid}x{config.grid})")
    ax.set_ylabel("accuracy (where is B from A)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    save_figure(fig, path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- command


#: The data seeds add up to seed + 1000 + side.
_seed = seed_in(0, 2**62)


def _figure_path(text: str) -> str:
    if not text.lower().endswith((".png", ".svg", ".pdf")):
        raise argparse.ArgumentTypeError(f"output must end in .png, .svg or .pdf, got {text!r}")
    return text


def _cmd(args: argparse.Namespace) -> int:
    import json

    config = StudyConfig(
        grid=args.grid,
        steps=args.steps,
        dim=args.dim,
        eval_examples=args.examples,
        seed=args.seed,
        schemes=tuple(args.schemes),
    )
    for path in (args.json, args.plot):  # folders made now: a bad path fails before training
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    results = run_study(config, log=True)
    print(format_table(results, config))
    print(f"wall time {time.perf_counter() - start:.1f} s on {args.threads} thread(s)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"config": asdict(config), "results": [asdict(r) for r in results]}, handle)
        print(f"wrote {args.json}")
    if args.plot:
        plot_results(results, config, args.plot)
        print(f"wrote {args.plot}")
    return 0


def add_subcommand(sub: argparse._SubParsersAction) -> None:
    """``posenc resolution``: the study, its table on stdout, optionally JSON and a figure."""
    p = sub.add_parser(
        "resolution",
        help="train tiny ViTs on one grid, test them on larger grids",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument(
        "--schemes", nargs="+", choices=SCHEMES, default=list(SCHEMES), help="schemes to compare"
    )
    p.add_argument("--grid", type=bounded_int(64), default=8, help="training grid side")
    p.add_argument("--steps", type=bounded_int(100_000), default=400, help="training steps")
    p.add_argument("--dim", type=bounded_int(1024), default=64, help="model width")
    p.add_argument("--examples", type=bounded_int(100_000), default=512, help="test examples/grid")
    p.add_argument("--seed", type=_seed, default=0, help="seed of weights and data")
    p.add_argument("--threads", type=bounded_int(256), default=1, help="torch threads")
    p.add_argument("--json", default=None, help="write the results as JSON here")
    p.add_argument("--plot", type=_figure_path, default=None, help="write the figure here")
    p.set_defaults(func=_cmd)
