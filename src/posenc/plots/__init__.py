"""Matplotlib figures for every encoding. Each function returns a ``Figure``; nothing here
shows a window, and only :func:`save_figure` writes a file (PNG, SVG or PDF, byte for byte
the same on every run).

:func:`plot_encoding` draws any registered encoding by name with a kind that suits it
(:data:`KINDS`); several names give a side-by-side figure.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

from ..encodings.base import FAMILIES, PositionalEncoding
from ..encodings.checks import check_positive_int
from ..encodings.registry import available, build_for_model, entry
from ..errors import PosencValueError

matplotlib.use("Agg")  # no window, ever: figures are returned or saved

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure

from . import diagnostics
from .absolute import dimension_waves, heatmap

Draw = Callable[[PositionalEncoding, str, int], Figure]

#: Per format, the metadata that would make two saves of one figure differ (dates).
_NO_DATES = {".svg": {"Date": None}, ".pdf": {"CreationDate": None}}


def save_figure(fig: Figure, path: str | Path, *, dpi: int) -> None:
    """Save ``fig`` so that the same figure always gives the same bytes: no creation date in
    SVG or PDF, and a fixed salt for the ids matplotlib hashes into SVG (random otherwise)."""
    path = Path(path)
    with matplotlib.rc_context({"svg.hashsalt": "posenc"}):
        fig.savefig(path, dpi=dpi, metadata=_NO_DATES.get(path.suffix.lower()))


def figure_to_data_uri(fig: Figure, *, dpi: int = 90) -> str:
    """``fig`` as an inline PNG ``data:`` URI (for HTML that loads nothing), and close it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@dataclass(frozen=True)
class Kind:
    """One kind of picture: which encodings it applies to and how to draw it."""

    name: str
    help: str
    families: tuple[str, ...]
    draw: Draw
    grid_only: bool = False
    sequence_only: bool = False

    def applies_to(self, pe: PositionalEncoding) -> bool:
        return self.applies(pe.family, pe.axes)

    def applies(self, family: str, axes: int) -> bool:
        """Whether this kind draws an encoding of ``family`` on ``axes`` coordinates."""
        if self.grid_only and axes == 1:
            return False
        if self.sequence_only and axes != 1:
            return False
        return family in self.families


ALL: tuple[str, ...] = FAMILIES  # kinds that work through every family's hook
#: The families whose logit contribution comes from positions alone (a conditional
#: encoding's term reads the hidden states: only the ``grid`` kind draws it).
POSITIONAL: tuple[str, ...] = tuple(family for family in FAMILIES if family != "conditional")


def _table(pe: PositionalEncoding, positions: int) -> torch.Tensor:
    width = int(pe.dim)  # type: ignore[attr-defined]
    with torch.no_grad():
        return pe.eval()(torch.zeros(1, positions, width, dtype=torch.float64))[0]


def _heatmap(pe: PositionalEncoding, name: str, positions: int) -> Figure:
    table = _table(pe, positions)
    return heatmap(table, title=f"{name} encoding ({positions} positions x {table.shape[1]} dims)")


def _dims(pe: PositionalEncoding, name: str, positions: int) -> Figure:
    table = _table(pe, positions)
    dim = table.shape[1]
    dims = sorted({d for d in (0, 1, dim // 2 - 2, dim // 2 - 1) if 0 <= d < dim})
    return dimension_waves(table, dims, title=f"{name}: value against position")


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind(
            "heatmap",
            "the table: position down, dimension across",
            ("additive",),
            _heatmap,
            sequence_only=True,
        ),
        Kind(
            "dims",
            "value against position for a few dimensions",
            ("additive",),
            _dims,
            sequence_only=True,
        ),
        Kind(
            "similarity",
            "the (i, j) logit contribution as a matrix",
            POSITIONAL,
            diagnostics.similarity,
        ),
        Kind(
            "distance",
            "the logit contribution against |i - j|, per head",
            POSITIONAL,
            diagnostics.distance,
        ),
        Kind("heads", "the bias matrix of each head", ("bias",), diagnostics.heads),
        Kind(
            "grid",
            "similarity of each patch to the centre and a corner",
            ALL,
            lambda pe, n, p: diagnostics.grid(pe, n),
            grid_only=True,
        ),
    )
}


def _spectrum(pe: PositionalEncoding, name: str, positions: int) -> Figure:
    from .rotary import rope_scaling_spectrum

    return rope_scaling_spectrum(
        head_dim=int(getattr(pe, "head_dim", 128)), base=float(getattr(pe, "base", 10000.0))
    )


def _decay(pe: PositionalEncoding, name: str, positions: int) -> Figure:
    from .rotary import rope_long_term_decay

    return rope_long_term_decay(
        head_dim=int(getattr(pe, "head_dim", 128)),
        base=float(getattr(pe, "base", 10000.0)),
        max_distance=max(positions, 2),
    )


for _kind in (
    Kind(
        "spectrum",
        "wavelength per rotary pair under each context-extension method",
        ("rotary",),
        _spectrum,
        sequence_only=True,
    ),
    Kind(
        "decay",
        "RoFormer's long-term decay of the relative upper bound",
        ("rotary",),
        _decay,
        sequence_only=True,
    ),
):
    KINDS[_kind.name] = _kind

#: The kind drawn when none is asked for, by family (grid encodings default to ``grid``).
DEFAULT_KIND = {"additive": "heatmap", "rotary": "distance", "bias": "heads", "none": "similarity"}


def register_kind(kind: Kind) -> None:
    """Add a kind of picture (the rotary and bias modules add their own)."""
    KINDS[kind.name] = kind


def kinds_for(pe: PositionalEncoding) -> list[str]:
    return [k.name for k in KINDS.values() if k.applies_to(pe)]


def default_kind(pe: PositionalEncoding) -> str:
    """The kind drawn when none is asked for: ``grid`` for grid encodings, else by family."""
    return "grid" if pe.axes != 1 else DEFAULT_KIND[pe.family]


def kinds_help() -> str:
    """The kinds of picture, and for each registered scheme the kinds it supports (its
    default first), as ``posenc plot --help`` shows them. Read from the registry's classes:
    nothing is built."""
    lines = ["kinds (--kind):"]
    lines += [f"  {kind.name:<11} {kind.help}" for kind in KINDS.values()]
    lines += ["", "kinds each scheme supports (its default first):"]
    for name in available():
        cls = entry(name).cls
        kinds = [k.name for k in KINDS.values() if k.applies(cls.family, cls.axes)]
        default = "grid" if cls.axes != 1 else DEFAULT_KIND[cls.family]
        kinds.sort(key=lambda k: k != default)
        lines.append(f"  {name:<18} {', '.join(kinds)}")
    return "\n".join(lines)


def build_for_plot(name: str, dim: int | None = None, num_heads: int = 4) -> PositionalEncoding:
    """Build ``name`` at a size that suits a picture (width 64, or 96 for 3-axis encodings,
    whose head dim must split into three rotary pairs), seeded for learned weights."""
    cls = entry(name).cls
    width = dim if dim is not None else (96 if cls.axes == 3 else 64)
    check_positive_int("dim", width)
    torch.manual_seed(0)
    return build_for_model(name, width, num_heads).double()


def plot_encoding(
    names: str | Sequence[str],
    *,
    kind: str | None = None,
    positions: int = 100,
    dim: int | None = None,
    num_heads: int = 4,
    grid: Sequence[int] | None = None,
) -> Figure:
    """Draw the encoding(s) registered under ``names``.

    One name: ``kind`` from :func:`kinds_for` (default by family). Several names: a
    side-by-side figure of kind ``similarity`` (default) or ``distance``; or, when every name
    is a grid encoding and ``kind`` is ``grid`` or ``grid`` is given, each one's similarity to
    the centre and to a corner over the grid. ``grid`` is the ``grid`` kind's shape, ``(h,
    w)`` (a 3-D encoding's volume is ``h`` deep) or ``(t, h, w)``; default 16 per side.
    """
    check_positive_int("positions", positions)
    if isinstance(names, str):
        names = [names]
    if not names:
        raise PosencValueError("names must hold at least one encoding name")
    if grid is not None:
        if len(grid) not in (2, 3) or any(not isinstance(s, int) or s < 2 for s in grid):
            raise PosencValueError(f"grid must be 2 or 3 sides of at least 2, got {list(grid)}")
        if kind not in (None, "grid"):
            raise PosencValueError(f"grid= draws the kind 'grid', got kind {kind!r}")
        kind = "grid"
    encodings = [(name, build_for_plot(name, dim, num_heads)) for name in names]
    if kind == "grid":
        flat = [name for name, pe in encodings if pe.axes == 1]
        if flat:
            raise PosencValueError(
                f"grid= (--grid) and kind 'grid' draw 2-D/3-D encodings; {', '.join(flat)} "
                f"{'encodes' if len(flat) == 1 else 'encode'} sequences (1-D): drop the grid "
                "or name a 2-D/3-D scheme"
            )
        if len(grid or ()) == 3 and any(pe.axes == 2 for _, pe in encodings):
            raise PosencValueError(f"a 2-D encoding takes a grid of 2 sides, got {list(grid)}")
        shape = list(grid) if grid is not None else [16, 16]
        if len(encodings) > 1:
            return diagnostics.compare_grids(encodings, shape)
        name, pe = encodings[0]
        return diagnostics.grid(pe, name, shape=shape)
    if len(encodings) > 1:
        return diagnostics.compare(encodings, kind=kind or "similarity", positions=positions)
    name, pe = encodings[0]
    if kind is None:
        kind = default_kind(pe)
    offered = kinds_for(pe)
    if kind not in offered:
        raise PosencValueError(
            f"kind {kind!r} does not apply to {name} ({pe.family}); kinds: {', '.join(offered)}"
        )
    return KINDS[kind].draw(pe, name, positions)


__all__ = [
    "DEFAULT_KIND",
    "KINDS",
    "Kind",
    "build_for_plot",
    "default_kind",
    "figure_to_data_uri",
    "kinds_for",
    "plot_encoding",
    "register_kind",
]
