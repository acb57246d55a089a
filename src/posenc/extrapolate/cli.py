"""``posenc extrapolate``: train small causal language models per encoding at length L on real
text and score bits per byte at L, 2L, 4L, 8L, 16L (Press et al. 2022, "Train Short, Test
Long", Fig. 1), with RoPE's context extensions applied at evaluation time.

    posenc extrapolate --preset press
    posenc extrapolate --text ~/books --pe rope,alibi --steps 2000 --out runs/books
    posenc extrapolate --pe rope --finetune-steps 200 --finetune-len 256 --resume

Settings are layered: built-in defaults, then ``--preset``, then the command-line options.
With no ``--text`` the corpus is the running Python's standard library (its ``.py`` files,
tests and installed packages left out). Under ``torchrun`` (``python -m
torch.distributed.run --nproc_per_node N -m posenc.extrapolate ...``) each model is trained
over the N processes (NCCL on GPUs, each process on ``cuda:LOCAL_RANK``; gloo on CPUs), with
the same global batch. ``--device`` (default ``auto``: CUDA when available) and
``--precision bf16`` (bfloat16 autocast) apply to training and evaluation alike.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from ..errors import PosencTypeError, PosencValueError
from ..runs.cli import (
    MODEL_FLAGS,
    add_device_flag,
    add_field_flags,
    options_for,
    parse_jobs,
    parse_pe_list,
    parse_pe_option,
    parse_seeds,
    pe_names,
    read_field_flags,
    sweep_options,
)
from .config import DEFAULT_PES, PRESETS, SCALINGS, EvalSettings, ExtrapolateConfig

DEFAULT_OUT = "extrapolate-results"
SWEEP_KEYS = ("pe", "seeds", "jobs", "pe_options")
EVAL_KEYS = tuple(EvalSettings().to_dict())

# (flag, field, type, help); the field is an ExtrapolateConfig or EvalSettings field
_OPTIONS = (
    *MODEL_FLAGS,
    ("--train-len", "train_len", int, "L, tokens per training window"),
    ("--eval-tokens", "eval_tokens", int, "most validation tokens scored"),
    ("--batch-tokens", "batch_tokens", int, "tokens per evaluation forward"),
    ("--sliding", "sliding", int, "also score sliding windows with this stride, 0 = off"),
    ("--finetune-steps", "finetune_steps", int, "fine-tune RoPE models N steps"),
    ("--finetune-len", "finetune_len", int, "fine-tuning length, 0 = the longest eval length"),
    ("--finetune-lr", "finetune_lr", float, "fine-tuning peak learning rate"),
    ("--needle-share", "needle_share", float, "share of training windows with a repeated needle"),
    ("--needle-len", "needle_len", int, "tokens per needle (training and --retrieval)"),
    ("--context-blocks", "context_blocks", int, "target blocks of the context gain, 0 = off"),
    ("--retrieval-trials", "retrieval_trials", int, "windows per length and depth of --retrieval"),
    ("--checkpoint-minutes", "checkpoint_minutes", float, "checkpoint every N minutes, 0 = off"),
)


def add_subcommand(subparsers: argparse._SubParsersAction) -> None:
    """Add ``extrapolate`` to the ``posenc`` command."""
    p = subparsers.add_parser(
        "extrapolate",
        help="train short, test long on real text: bits per byte past the trained length",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument(
        "--pe",
        help="encodings, comma-separated; each a registry name or a per-layer schedule of "
        "names joined by '/', repeated to the depth (rope/rope/rope/none: Llama 4's 3:1; "
        f"none:temp a NoPE layer with Llama 4's query temperature) (default "
        f"{','.join(DEFAULT_PES)})",
    )
    p.add_argument("--seeds", help="number of seeds (3 = 0,1,2) or a list (0,5,7); default 1")
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="named settings (press: the shape of Press et al. 2022's Fig. 1, "
        "about 30 CPU-minutes; scale: wider, deeper, longer, with needles and retrieval, "
        "for a GPU)",
    )
    p.add_argument(
        "--retrieval",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also score copying a needle back from depths of every evaluation length",
    )
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="train through torch.compile (compiled once per model: pays on long GPU runs)",
    )
    p.add_argument("--text", help="a UTF-8 file or a folder (default: the Python stdlib)")
    p.add_argument("--tokenizer", default="bytes", help="bytes (default) or bpe:N")
    p.add_argument("--eval-lens", help="evaluation lengths, comma-separated (default L,2L,..16L)")
    p.add_argument(
        "--scalings",
        help=f"zero-shot RoPE scalings, comma-separated, or none (default {','.join(SCALINGS)})",
    )
    p.add_argument("--out", help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--resume", action="store_true", help="continue runs from their checkpoints")
    p.add_argument("--jobs", help="models trained in parallel processes (an int or 'auto')")
    p.add_argument("--valid-fraction", type=float, default=0.05, help="share of validation text")
    add_field_flags(p, _OPTIONS, {**ExtrapolateConfig().to_dict(), **EvalSettings().to_dict()})
    add_device_flag(p)
    p.add_argument(
        "--pe-option",
        action="append",
        default=[],
        metavar="NAME.KEY=VALUE",
        help="constructor argument for an encoding (every entry of that name in a schedule), "
        "e.g. t5.max_distance=64",
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads per model (0: auto)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-plot", action="store_true", help="do not draw extrapolate.png")
    p.set_defaults(func=run)


def parse_lengths(text: str) -> list[int]:
    """``"64,128,256"`` -> ``[64, 128, 256]``."""
    try:
        lengths = [int(part) for part in str(text).split(",")]
    except ValueError:
        raise PosencValueError(f"--eval-lens must be a comma list of ints, got {text!r}") from None
    if not lengths or min(lengths) < 1:
        raise PosencValueError(f"--eval-lens must be ints >= 1, got {text!r}")
    return lengths


def parse_scalings(text: str | list[str]) -> list[str]:
    """``"linear,yarn"`` -> ``["linear", "yarn"]``; ``"none"`` -> ``[]``."""
    items = text if isinstance(text, list) else [s.strip() for s in str(text).split(",")]
    if items == ["none"]:
        return []
    unknown = [s for s in items if s not in SCALINGS]
    if unknown or len(set(items)) != len(items):
        raise PosencValueError(
            f"--scalings must be distinct names among {', '.join(SCALINGS)}, or none; got {text!r}"
        )
    return items


def resolve_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Merge defaults, preset and command line into one flat settings mapping."""
    from posenc import available

    settings: dict[str, Any] = {
        "pe": [p for p in DEFAULT_PES if p in available()],
        "seeds": 1,
        "jobs": 1,
        "pe_options": {},
        "out": DEFAULT_OUT,
    }
    if args.preset:
        settings.update(PRESETS[args.preset])
        settings["out"] = f"{DEFAULT_OUT}-{args.preset}"
    for key in ("pe", "seeds", "jobs", "out"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    if args.eval_lens is not None:
        settings["eval_lens"] = parse_lengths(args.eval_lens)
    if args.scalings is not None:
        settings["scalings"] = parse_scalings(args.scalings)
    for key in ("retrieval", "compile"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    settings.update(read_field_flags(args, _OPTIONS))
    # a preset's options fit the preset's encodings: keep those of the encodings still named
    named = pe_names(parse_pe_list(settings["pe"]))
    options = {k: dict(v) for k, v in settings["pe_options"].items() if k in named}
    for text in args.pe_option:
        name, key, value = parse_pe_option(text)
        options.setdefault(name, {})[key] = value
    settings["pe_options"] = options
    return settings


def build_configs(
    settings: dict[str, Any],
) -> tuple[list[ExtrapolateConfig], EvalSettings]:
    """One :class:`ExtrapolateConfig` per (encoding, seed), and the evaluation settings."""
    pes = parse_pe_list(settings["pe"])
    if any(suffix for _, suffix in pes):
        raise PosencValueError(
            f"--pe takes registry names and schedules only (no +random, +coupled), got "
            f"{settings['pe']!r}"
        )
    names = [name for name, _ in pes]
    seeds = parse_seeds(settings["seeds"])
    options = settings["pe_options"]
    unknown = sorted(set(options) - pe_names(pes))
    if unknown:
        raise PosencValueError(f"pe options for {', '.join(unknown)}, which is not in the pe list")
    fields = {
        k: v for k, v in settings.items() if k not in (*SWEEP_KEYS, *EVAL_KEYS, "out", "text")
    }
    base = ExtrapolateConfig.from_dict(fields)
    evaluation = {k: settings[k] for k in EVAL_KEYS if k in settings}
    if "scalings" in evaluation:
        evaluation["scalings"] = parse_scalings(evaluation["scalings"])
    eval_settings = EvalSettings(**evaluation)
    configs = [
        ExtrapolateConfig.from_dict(
            {**base.to_dict(), "pe": name, "seed": seed, "pe_options": options_for(name, options)}
        )
        for name in names
        for seed in seeds
    ]
    for config in configs:
        config.validate()
    eval_settings.validate(base.train_len)
    return configs, eval_settings


def sweep_config(
    settings: dict[str, Any], configs: list[ExtrapolateConfig], evaluation: EvalSettings
) -> dict[str, Any]:
    """The ``config`` of ``results.json``: the model and optimiser settings, the encodings,
    seeds and options, and the evaluation settings with the lengths spelt out."""
    base = {k: v for k, v in configs[0].to_dict().items() if k not in ("pe", "seed", "pe_options")}
    return {
        **base,
        "pe": list(dict.fromkeys(c.pe for c in configs)),
        "seeds": sorted({c.seed for c in configs}),
        "pe_options": settings["pe_options"],
        **evaluation.to_dict(),
        "eval_lens": evaluation.lengths(base["train_len"]),
        "finetune_len": evaluation.finetune_length(base["train_len"]),
        "preset": settings.get("preset"),
    }


def command_line(args: argparse.Namespace) -> str:
    """The ``posenc extrapolate`` command that gives these settings (for ``results.md``)."""
    defaults = {"tokenizer": "bytes", "valid_fraction": 0.05, "threads": 0}
    parts = ["posenc", "extrapolate"]
    for key, value in vars(args).items():
        if key in ("retrieval", "compile") and value is False:
            parts.append(f"--no-{key}")
            continue
        if key in ("func", "command", "resume") or value in (None, False, []):
            continue
        if defaults.get(key) == value:
            continue
        flag = "--" + key.replace("_", "-")
        values = value if isinstance(value, list) else [value]
        for item in values:
            parts += [flag] if item is True else [flag, str(item)]
    return shlex.join(parts)


class ResultsWriter:
    """Rewrites ``results.json``, ``results.md`` and the figures in ``out`` as each model
    finishes (:meth:`add`, called on rank 0 in the order of ``configs``), so a sweep stopped
    at any moment keeps every finished model's numbers; ``config["pending"]`` names the
    models still to run (empty once the sweep is done), and ``--resume`` completes it."""

    def __init__(
        self,
        out: Path,
        config: dict[str, Any],
        corpus: Any,
        configs: list[ExtrapolateConfig],
        *,
        plot: bool,
        command: str,
    ) -> None:
        from .results import corpus_summary

        self.out, self.config, self.corpus = out, config, corpus_summary(corpus)
        self.labels = [f"{c.pe} seed {c.seed}" for c in configs]
        self.plot, self.command = plot, command
        self.done: dict[int, dict[str, Any]] = {}
        self.written: list[Path] = []

    def document(self) -> dict[str, Any]:
        """``results.json`` of the models finished so far, in the order of the configs."""
        pending = [label for i, label in enumerate(self.labels) if i not in self.done]
        return {
            "config": {**self.config, "pending": pending},
            "corpus": self.corpus,
            "runs": [run for i in sorted(self.done) for run in self.done[i]["runs"]],
        }

    def timings(self) -> list[dict[str, Any]]:
        return [self.done[i]["timing"] for i in sorted(self.done)]

    def add(self, index: int, result: dict[str, Any]) -> None:
        """Record model ``index``'s result and rewrite the files (rank 0's results only)."""
        if not result:  # another rank's
            return
        from .results import write_results

        self.done[index] = result
        self.written = write_results(
            self.out, self.document(), self.timings(), plot=self.plot, command=self.command
        )


def run(args: argparse.Namespace) -> int:
    """Carry out ``posenc extrapolate``; returns the exit status."""
    from rich.console import Console

    from ..runs.device import placement
    from ..runs.distributed import close_distributed, init_distributed, world
    from ..runs.sweep import check_sweep_start
    from .corpus import prepare_corpus
    from .sweep import check_sweep, eval_tokens, run_sweep

    console = Console(stderr=True)
    if args.threads < 0:
        raise PosencValueError(f"--threads must be >= 0, got {args.threads}")
    settings = resolve_settings(args)
    settings["preset"] = args.preset
    configs, evaluation = build_configs({k: v for k, v in settings.items() if k != "preset"})
    jobs = min(parse_jobs(settings["jobs"]), len(configs))
    out = Path(str(settings["out"]))
    if not isinstance(args.valid_fraction, float):
        raise PosencTypeError(f"--valid-fraction must be a number, got {args.valid_fraction!r}")
    device = placement(
        "auto" if args.device is None else args.device, [c.precision for c in configs]
    )  # no corpus yet
    corpus = prepare_corpus(args.text, tokenizer=args.tokenizer, valid_fraction=args.valid_fraction)
    train_len = configs[0].train_len
    lengths = evaluation.lengths(train_len)
    dirs = check_sweep(configs, corpus, evaluation, out)  # every mistake before any work
    check_sweep_start(dirs, out, resume=args.resume, jobs=jobs)
    joined = init_distributed(device)
    try:
        rank, _ = world()
        if rank == 0:
            console.log(
                f"corpus {corpus.name}: {len(corpus.train):,} training and "
                f"{len(corpus.valid):,} validation tokens ({corpus.documents} documents, "
                f"{corpus.skipped} files skipped); {len(configs)} model(s) into {out} "
                f"({jobs} at a time) on {device}"
            )
        options = sweep_options(args, jobs, console, device)
        config = sweep_config(settings, configs, evaluation)
        config["eval_tokens"] = eval_tokens(corpus, lengths, evaluation)
        config["device"] = str(device)  # where the numbers came from (precision: above)
        writer = ResultsWriter(
            out, config, corpus, configs, plot=not args.no_plot, command=command_line(args)
        )
        run_sweep(configs, corpus, evaluation, out, on_result=writer.add, **options)
        if rank == 0:
            from .results import markdown_report

            print(markdown_report(writer.document(), writer.timings(), figure=None))
            print("wrote " + ", ".join(str(path) for path in writer.written))
    finally:
        close_distributed(joined)
    return 0
