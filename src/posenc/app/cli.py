"""The ``posenc`` command. Thin: it parses arguments and calls the library.

Every error a user can cause (a bad argument, an unknown encoding, a bad value deep in the
library, an unusable path) ends as one line on stderr and exit status 2; anything else is a
bug and keeps its traceback (exit status 1).
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from ..errors import PosencError, PosencValueError
from ..runs.cli import bounded_int, seed_in

EXIT_USAGE = 2

#: Modules that contribute subcommands through ``add_subcommand(subparsers)``.
_SUBCOMMAND_MODULES = {
    "lengthgen": "posenc.lengthgen.cli",
    "extrapolate": "posenc.extrapolate.cli",
    "bench": "posenc.bench.cli",
    "report": "posenc.app.report",
    "hf": "posenc.app.hf_command",
    "conformance": "posenc.app.conformance",
    "probe": "posenc.app.probe_command",
    "resolution": "posenc.extrapolate.resolution",
}

#: What the command needs beyond posenc's core (torch alone): the ``app`` extra,
#: ``pip install 'posenc[app]'``. A command that meets one of them missing says so in one line.
APP_EXTRA = ("numpy", "matplotlib", "rich", "markdown")


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The package of the ``app`` extra whose absence ``exc`` reports, or ``None``."""
    top = (exc.name or "").split(".")[0]
    return top if top in APP_EXTRA else None


def _needs_extra(command: str, package: str) -> str:
    return (
        f"posenc {command} needs {package}, which posenc's core install leaves out: "
        "pip install 'posenc[app]'"
    )


class UsageError(Exception):
    """A mistake in how the command was called; reported in one line with exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line (no usage dump) and exit with status 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: subcommands whose modules need a package of the app extra that is missing
        self.missing_extras: dict[str, str] = {}

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


#: Torch seeds are 64-bit; analyze also uses seed + 1.
_seed = seed_in(-(2**63), 2**63 - 1)


#: Upper bounds of the size arguments.
MAX_POSITIONS, MAX_DIM, MAX_HEADS, MAX_DPI, MAX_LENGTH = 4096, 4096, 256, 1200, 2048


#: The largest grid side (``--grid``): the grid measures hold (h·w)² pairs.
MAX_GRID_SIDE = 64


def _grid_shape(text: str) -> tuple[int, ...]:
    """``HxW`` or ``TxHxW``, each side 2 .. :data:`MAX_GRID_SIDE`."""
    parts = text.lower().split("x")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if len(shape) not in (2, 3) or any(not 2 <= s <= MAX_GRID_SIDE for s in shape):
        raise argparse.ArgumentTypeError(
            f"expected HxW or TxHxW with sides in [2, {MAX_GRID_SIDE}], got {text!r}"
        )
    return shape


def _figure_path(text: str) -> Path:
    path = Path(text)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise argparse.ArgumentTypeError(f"output must end in .png, .svg or .pdf, got {text!r}")
    return path


# --------------------------------------------------------------------------- list


def cmd_list(args: argparse.Namespace) -> int:
    from ..encodings.registry import available, entry

    rows = [
        (name, entry(name).family, entry(name).paper, entry(name).summary)
        for name in available(args.family)
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for name, family, paper, summary in rows:
        print(f"{name:<{widths[0]}}  {family:<{widths[1]}}  {paper:<{widths[2]}}  {summary}")
    return 0


# --------------------------------------------------------------------------- plot

#: Stands for the plot command's epilog until its help is shown (see :class:`_PlotHelp`).
_KINDS_EPILOG = "<kinds of picture, per scheme>"


class _PlotHelp(argparse.RawDescriptionHelpFormatter):
    """Fills ``posenc plot --help``'s epilog with the kinds each scheme supports, importing
    the plotting package (matplotlib) only when the help is shown."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text == _KINDS_EPILOG:
            from ..plots import kinds_help

            text = kinds_help()
        return super()._fill_text(text, width, indent)


def cmd_plot(args: argparse.Namespace) -> int:
    import matplotlib.pyplot as plt

    from ..plots import plot_encoding, save_figure

    fig = plot_encoding(
        args.names,
        kind=args.kind,
        positions=args.positions,
        dim=args.dim,
        num_heads=args.heads,
        grid=args.grid,
    )
    try:
        args.output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PosencValueError(
            f"-o/--output {str(args.output)!r}: cannot create its folder ({exc.strerror})"
        ) from None
    save_figure(fig, args.output, dpi=args.dpi)
    plt.close(fig)
    print(f"wrote {args.output}")
    return 0


# --------------------------------------------------------------------------- analyze


def cmd_analyze(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console
    from rich.table import Table

    from ..analysis import ANALYSIS_COLUMNS, analyze, format_analysis
    from ..analysis.grid import GRID_COLUMNS, analyze_grid, check_grid, format_grid_analysis
    from ..encodings.registry import available, entry

    names = args.names or available()
    for name in names:
        axes = entry(name).cls.axes  # an unknown name fails before any work
        if axes != 1:
            check_grid(args.grid, axes)  # and a grid that does not fit it
    rows = [analyze(name, length=args.length, seed=args.seed) for name in names]
    grids = {
        row.name: analyze_grid(row.name, grid=args.grid, seed=args.seed)
        for row in rows
        if entry(row.name).cls.axes != 1
    }
    if args.json:
        dicts = [row.to_dict() for row in rows]
        for entry_dict in dicts:
            if entry_dict["name"] in grids:
                entry_dict["grid"] = grids[str(entry_dict["name"])].to_dict()
        print(json.dumps(dicts, indent=2))
        return 0
    table = Table(title=f"measured properties (training length L = {args.length})")
    for column in ANALYSIS_COLUMNS:
        table.add_column(column, justify="left" if column in ("encoding", "family") else "right")
    for row in rows:
        table.add_row(*format_analysis(row))
    console = Console(width=max(Console().width, 110))
    console.print(table)
    console.print(
        "unique: smallest distance between two positions' representations; shift resid.: 0 "
        "when the logit contribution depends only on i - j; decay: share of distances where "
        "it does not rise; at 2L: defined at twice L; drift past L: change of that structure in "
        "[L, 2L) against [0, L); permutation gap: 0 when a random bidirectional encoder "
        "cannot see order."
    )
    if grids:
        table = Table(title="grid properties (2-D/3-D encodings)")
        for column in GRID_COLUMNS:
            left = column in ("encoding", "family")
            table.add_column(column, justify="left" if left else "right")
        for grid_row in grids.values():
            table.add_row(*format_grid_analysis(grid_row))
        console.print(table)
        console.print(
            "shift resid.: 0 when the contribution of two points is unchanged by shifting both; "
            "decay (Euclid.): share of Euclidean distances where the mean contribution does not "
            "rise; row/col gap: largest difference between offsets along rows and along columns."
        )
    return 0


# --------------------------------------------------------------------------- tour


def cmd_tour(args: argparse.Namespace) -> int:
    from .tour import run_tour

    run_tour(Path(args.out), image_format=args.format)
    return 0


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="posenc", description="Positional encodings for Transformers.")
    from .. import __version__
    from ..encodings.base import FAMILIES
    from ..encodings.registry import available
    from ..encodings.rope_types.registry import ROPE_TYPES

    names = ", ".join(available())

    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("tour", help="run every demonstration and save its pictures")
    p.add_argument("--out", default="posenc-tour", help="folder for pictures (default %(default)s)")
    p.add_argument("--format", choices=("png", "svg"), default="png", help="picture format")
    p.set_defaults(func=cmd_tour)

    p = sub.add_parser(
        "list",
        help="list every registered encoding, one line each",
        description="Every registered encoding: name, family, paper and summary. "
        f"RoPE context extension (RotaryEmbedding(scaling={{'rope_type': ...}})): "
        f"{', '.join(ROPE_TYPES)}.",
    )
    p.add_argument("--family", choices=FAMILIES, default=None, help="only this family")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "plot",
        help="plot encodings to a PNG/SVG/PDF file",
        epilog=_KINDS_EPILOG,
        formatter_class=_PlotHelp,
    )
    p.add_argument("names", nargs="+", metavar="NAME", help=f"registry names: {names}")
    p.add_argument(
        "--kind", default=None, help="what to draw (default: by family; the kinds are below)"
    )
    p.add_argument(
        "--positions",
        type=bounded_int(MAX_POSITIONS),
        default=100,
        help=f"positions shown (at most {MAX_POSITIONS})",
    )
    p.add_argument("--dim", type=bounded_int(MAX_DIM), default=None, help="model width")
    p.add_argument("--heads", type=bounded_int(MAX_HEADS), default=4, help="attention heads")
    p.add_argument("--dpi", type=bounded_int(MAX_DPI), default=120, help=f"at most {MAX_DPI}")
    p.add_argument(
        "--grid",
        type=_grid_shape,
        default=None,
        help="HxW (or TxHxW): draw each grid encoding's similarity to the centre and a corner "
        "patch over this grid (kind 'grid'; several names side by side)",
    )
    p.add_argument("-o", "--output", type=_figure_path, required=True, help="file to write")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("analyze", help="measure the properties of encodings, as a table")
    p.add_argument(
        "names", nargs="*", metavar="NAME", help=f"registry names (default: all): {names}"
    )
    p.add_argument(
        "--length",
        type=bounded_int(MAX_LENGTH),
        default=64,
        help=f"training length L (at most {MAX_LENGTH})",
    )
    p.add_argument("--seed", type=_seed, default=0, help="seed for random weights and probes")
    p.add_argument(
        "--grid",
        type=_grid_shape,
        default=(8, 8),
        help="HxW (or TxHxW) grid on which 2-D/3-D encodings are measured (default 8x8)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_analyze)

    for command, module_name in _SUBCOMMAND_MODULES.items():
        try:
            add: Callable[[argparse._SubParsersAction], None] = importlib.import_module(
                module_name
            ).add_subcommand
            add(sub)
        except ModuleNotFoundError as exc:
            package = missing_extra(exc)
            if package is None:
                raise
            # still a command, which says what to install, instead of an unknown choice
            sub._name_parser_map.pop(command, None)
            sub._choices_actions = [a for a in sub._choices_actions if a.dest != command]
            sub.add_parser(command, help=f"(needs {package}: pip install 'posenc[app]')")
            parser.missing_extras[command] = package  # run() answers before parsing
    return parser


def _stdout_gone() -> bool:
    """Whether standard output's reader went away (``posenc list | head``): its pipe reports an
    error to a poll. If so, stdout is pointed at devnull, so that Python's flush at exit does
    not fail again, and the command stops quietly, as other commands do."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):  # replaced by something without a file
        return False
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if not any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0)):
            return False
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    return True


def run(parser: argparse.ArgumentParser, argv: Sequence[str], prog: str) -> int:
    """Parse ``argv`` and run the chosen subcommand; returns the exit status.

    Only a caller's mistake becomes one line on stderr and status 2: argparse's errors, posenc's
    own validation errors (:class:`~posenc.errors.PosencError`) and a path the system refuses
    (an :class:`OSError` naming a file). Anything else is a bug in posenc: Python prints its
    traceback and the status is 1.
    """
    args = None
    missing = getattr(parser, "missing_extras", {})  # (a _Parser's; tests pass others)
    if argv and argv[0] in missing:
        print(f"{prog}: error: {_needs_extra(argv[0], missing[argv[0]])}", file=sys.stderr)
        return EXIT_USAGE
    try:
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:
        package = missing_extra(exc)
        if package is None:
            raise  # not the app extra: a bug or a broken install, keep the traceback
        command = getattr(args, "command", None) or prog.split()[-1]
        print(f"{prog}: error: {_needs_extra(command, package)}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help and --version: a status, not an exception, in-process
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        if not _stdout_gone():
            raise  # another pipe (a worker's): a bug or the system, keep the traceback
        return 141  # 128 + SIGPIPE, what a shell reports for a command its pipe closed
    except (PosencError, OSError) as exc:
        if isinstance(exc, OSError) and exc.filename is None:
            raise  # not a path the user gave: a bug or the system, keep the traceback
        if os.environ.get("POSENC_DEBUG"):
            raise
        # one line, the whole message (a refusal's reason may follow a line break)
        text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"{prog}: error: {text or type(exc).__name__}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def run_alone(name: str, add_subcommand: Callable[[Any], None], argv: Sequence[str] | None) -> int:
    """``python -m posenc.NAME ...``: the ``posenc NAME`` subcommand on its own (also the entry
    point for ``torchrun``), with the same boundary as ``posenc`` (:func:`run`)."""
    parser = _Parser(prog=f"python -m posenc.{name}")
    add_subcommand(parser.add_subparsers(dest="command", parser_class=_Parser))
    args = [name, *(sys.argv[1:] if argv is None else argv)]
    return run(parser, args, f"posenc {name}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``posenc`` console script; returns the exit status."""
    return run(build_parser(), sys.argv[1:] if argv is None else list(argv), "posenc")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
