"""``posenc bench [SUITE...]``: time posenc against its peers and the memory-bandwidth floor,
print the tables, and optionally write them (with PNG plots) as markdown.

    posenc bench                                   # every suite, default sizes (minutes)
    posenc bench rope encoder                      # some suites
    posenc bench --quick                           # tiny sizes: checks that it runs (CI)
    posenc bench --output benchmarks/RESULTS.md    # also write the tables and plots
    posenc bench rope --device cuda                # RoPE on a GPU (CUDA-event timings)
    posenc bench hf                                # a transformers Llama, posenc.hf.patch'd
    posenc bench bias encoder --device cuda        # bias attention, training step on a GPU
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import PosencValueError
from .attention_cuda import CUDA_SUITES as ATTENTION_CUDA_SUITES
from .suites import SUITES, run_suites
from .suites.settings import settings_for

#: The suites that run on a GPU with ``--device cuda``: ``rope`` and ``hf`` through their own
#: suites (which
#: reads the settings' device), ``bias`` and ``encoder`` through :mod:`.attention_cuda`.
CUDA_SUITES = ("rope", "hf", *ATTENTION_CUDA_SUITES)


def add_subcommand(subparsers: Any) -> None:
    """Add ``bench`` to the ``posenc`` command's subparsers."""
    p = subparsers.add_parser(
        "bench",
        help="time posenc against its peers and the copy floor",
        description=__doc__.splitlines()[0],
    )
    p.add_argument(
        "suites",
        nargs="*",
        metavar="SUITE",
        help=f"suites to run, in order (default: all): {', '.join(SUITES)}",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, for CI)")
    p.add_argument("--output", default=None, help="write the tables here as markdown (.md)")
    p.add_argument("--repeats", default=None, help="timed calls per case (default 10)")
    p.add_argument("--threads", default=None, help="torch threads (default: torch's choice)")
    p.add_argument(
        "--device",
        default="cpu",
        help=f"where to time: cpu (default) or cuda (suites: {', '.join(CUDA_SUITES)})",
    )
    p.add_argument(
        "--max-call-seconds",
        default=None,
        help="bias/scaling: skip a size predicted to take longer per call (default 3)",
    )
    p.set_defaults(func=run)


def _positive(name: str, text: str | None, kind: type) -> Any:
    if text is None:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise PosencValueError(f"{name} must be a positive number, got {text!r}") from None
    if not value > 0:  # NaN too
        raise PosencValueError(f"{name} must be a positive number, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    """Run the chosen suites, print them, and write ``--output`` (markdown and PNGs)."""
    import torch

    names = list(args.suites) or list(CUDA_SUITES if args.device == "cuda" else SUITES)
    for name in names:
        if name not in SUITES:
            raise PosencValueError(f"unknown bench suite {name!r}; known: {', '.join(SUITES)}")
    _check_device(args.device, names)
    output = None if args.output is None else Path(args.output)
    if output is not None and output.suffix.lower() != ".md":
        raise PosencValueError(
            f"--output must be a markdown file ending in .md, got {args.output!r}"
        )
    threads = _positive("--threads", args.threads, int)
    settings = settings_for(
        args.quick,
        device=args.device,
        repeats=_positive("--repeats", args.repeats, int),
        threads=threads,
        max_call_s=_positive("--max-call-seconds", args.max_call_seconds, float),
    )
    if threads:
        torch.set_num_threads(threads)

    from .harness import environment, load_average, load_warning

    start = time.perf_counter()
    load_before = load_average()
    header = [
        "# posenc bench",
        "",
        f"`{_command_line()}`, {time.strftime('%Y-%m-%d %H:%M')}"
        + (" (`--quick`: tiny sizes, a smoke run; the numbers mean nothing)" if args.quick else ""),
        "",
        *environment(),
        f"- load average (1, 5, 15 min) at the start: {load_before}",
    ]
    warning = load_warning()
    if warning:
        header.append(warning)
    print("\n".join(header), flush=True)
    sections = []
    for name in names:
        print(f"\n[{name}] running ...", file=sys.stderr, flush=True)
        if args.device == "cuda" and name in ATTENTION_CUDA_SUITES:
            section = ATTENTION_CUDA_SUITES[name](quick=args.quick, repeats=settings.repeats)
        else:
            (section,) = run_suites([name], settings)
        sections.append(section)
        print("\n" + section.markdown(), flush=True)
    total = time.perf_counter() - start
    footer = [
        f"- load average at the end: {load_average()}; total {total:.0f} s",
        "- the machine may be shared with other jobs: absolute times are noisy, ratios "
        "(measured round-robin in one process) much less so",
    ]
    print("\n" + "\n".join(footer))
    if output is not None:
        _write(output, header, sections, footer)
        print(f"\nwrote {output}")
    return 0


def _check_device(device: str, names: list[str]) -> None:
    """Raise unless ``--device`` is cpu, or cuda with a GPU present and only suites that run
    there."""
    import torch

    if device not in ("cpu", "cuda"):
        raise PosencValueError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cpu":
        return
    others = [name for name in names if name not in CUDA_SUITES]
    if others:
        raise PosencValueError(
            f"--device cuda runs the suites {', '.join(CUDA_SUITES)} only, got {', '.join(others)}"
        )
    if not torch.cuda.is_available():
        raise PosencValueError("--device cuda: torch sees no CUDA device on this machine")


def _command_line() -> str:
    argv = ["posenc", *sys.argv[1:]] if Path(sys.argv[0]).name == "posenc" else sys.argv
    if Path(argv[0]).name != "posenc":
        argv = ["posenc", "bench"]
    return shlex.join(argv)


def _write(output: Path, header: list[str], sections: list[Any], footer: list[str]) -> None:
    from .plots import scaling_figure, time_memory_figure

    output.parent.mkdir(parents=True, exist_ok=True)
    parts = [*header, *footer, ""]
    for section in sections:
        figure = None
        if section.name == "bias" and section.data.get("rows"):
            figure = time_memory_figure(section.data["rows"], "Bias (ALiBi) attention per backend")
        elif section.name == "scaling" and (
            section.data.get("rope") or section.data.get("attention")
        ):
            figure = scaling_figure(section.data["rope"], section.data["attention"])
        parts += [section.markdown(), ""]
        if figure is not None:
            image = output.with_name(f"{output.stem}_{section.name}.png")
            figure.savefig(image, dpi=100)
            parts += [f"![{section.title}]({image.name})", ""]
    output.write_text("\n".join(parts))
