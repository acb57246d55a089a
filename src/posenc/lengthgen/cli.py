"""``posenc lengthgen``: train tiny models per encoding and measure accuracy past the trained
length.

    posenc lengthgen --task copy-v1 --pe none,alibi,rope,rope+random --seeds 3
    posenc lengthgen --preset kazemnejad --task copy-v1 --jobs 2
    posenc lengthgen --config sweep.toml --resume
    posenc lengthgen --task add --pe abacus,fire+abacus,rope    # --preset abacus: McLeish 2024
    posenc lengthgen --device cuda --precision bf16

Settings are layered: built-in defaults, then ``--preset``, then ``--config FILE.toml``, then
the command-line options. A TOML file holds the sweep keys ``task``, ``pe`` (a string with
commas or a list), ``seeds`` (a count or a list), ``out``, ``jobs``, ``device``, a
``[pe_options.NAME]`` table of constructor arguments per encoding, and any
:class:`TrainConfig` field by name (``precision`` among them)::

    task = ["copy-v1", "reverse-v1"]
    pe = ["none", "rope", "rope+random"]
    seeds = 3
    steps = 1000
    random_max = 256

    [pe_options.rope]
    rotary_dim = 4

Under ``torchrun`` (``python -m torch.distributed.run --nproc_per_node N -m posenc.lengthgen
...``) each run is spread over the N processes (NCCL on GPUs, each process on
``cuda:LOCAL_RANK``; gloo on CPUs), with the same global batch.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

from ..errors import PosencTypeError, PosencValueError
from ..runs import cli as shared

#: What ``--pe`` defaults to: these, where registered (the table of Kazemnejad et al. 2023).
DEFAULT_PES = ("none", "t5", "alibi", "rope", "sinusoidal", "learned")
SWEEP_KEYS = ("task", "pe", "seeds", "out", "jobs", "pe_options", "device")
DEFAULT_OUT = "lengthgen-results"


#: Named settings; ``kazemnejad`` is the reproduction of Kazemnejad et al. 2023, appendix F
#: (decoder-only, trained on lengths <= 20, tested on 21-40) at 0.1M parameters, with the
#: paper's five encodings plus learned absolute. Their RoPE rotates 25% of each head's
#: dimensions: 4 of 16 here; their T5 bias is the decoder's one-directional bucketing.
PRESETS: dict[str, dict[str, Any]] = {
    "kazemnejad": {
        "task": ["copy-v1", "copy-v2", "copy-v3", "reverse-v1"],
        "pe": ["none", "t5", "alibi", "rope", "sinusoidal", "learned"],
        "seeds": [0, 1, 2],
        "jobs": "auto",
        "pe_options": {"rope": {"rotary_dim": 4}, "t5": {"bidirectional": False}},
        "dim": 64,
        "depth": 2,
        "heads": 4,
        "steps": 1000,
        "batch_size": 64,
        "lr": 1e-3,
        "train_min_length": 1,
        "train_max_length": 20,
        "test_min_length": 21,
        "test_max_length": 40,
    },
    # McLeish et al. 2024 at CPU scale: reversed-digit addition trained on operands of
    # 1-20 digits, tested on 21-100 (2x at 40, 5x at 100), Abacus positions alone (NoPE in
    # attention) and beside FIRE, against NoPE, RoPE and FIRE; one seed, one process.
    "abacus": {
        "task": ["add"],
        "pe": ["abacus", "fire+abacus", "none", "rope", "fire"],
        "seeds": [0],
        "jobs": 1,
        "dim": 64,
        "depth": 4,
        "heads": 4,
        "steps": 4000,
        "batch_size": 64,
        "lr": 1e-3,
        "warmup": 0.05,
        "train_min_length": 1,
        "train_max_length": 20,
        "test_min_length": 21,
        "test_max_length": 100,
        "eval_every": 0,
        "test_samples": 20,
    },
}

# lengthgen's own TrainConfig flags
_TRAIN_OPTIONS = (
    *shared.MODEL_FLAGS,
    ("--random-max", "random_max", int, "L for +random: positions drawn from [0, L)"),
    ("--eval-every", "eval_every", int, "periodic evaluation every N steps, 0 = off"),
    ("--eval-samples", "eval_samples", int, "examples per length, periodic evaluation"),
    ("--test-samples", "test_samples", int, "examples per length, final evaluation"),
    ("--valid-threshold", "valid_threshold", float, "in-distribution exact match for a valid run"),
)


def add_subcommand(subparsers: argparse._SubParsersAction) -> None:
    """Add ``lengthgen`` to the ``posenc`` command."""
    p = subparsers.add_parser(
        "lengthgen",
        help="train tiny models per encoding and measure accuracy beyond the trained length",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument(
        "--task",
        help="task name(s), comma-separated, or path/to/file.py:ClassName "
        "(default copy-v1; see --list-tasks)",
    )
    p.add_argument(
        "--pe",
        help="encodings, comma-separated; each a registry name or a per-layer schedule "
        "(rope/rope/rope/none, repeated to the depth; none:temp a NoPE layer with Llama 4's "
        "query temperature); NAME+random adds randomized positions, "
        "NAME+coupled coupled ones (tasks with answer_sources), NAME+random+coupled both, "
        "NAME+abacus Abacus digit positions on the embeddings (abacus alone: with NoPE; "
        "tasks with digit_tokens) "
        "(default: none,t5,alibi,rope,sinusoidal,learned where registered)",
    )
    p.add_argument("--seeds", help="number of seeds (3 = 0,1,2) or a list (0,5,7)")
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="named settings (kazemnejad: the Kazemnejad et al. 2023 reproduction, four tasks; "
        "abacus: McLeish et al. 2024's addition, 20 digits to 100)",
    )
    p.add_argument("--config", metavar="FILE.toml", help="settings file (see module docs)")
    p.add_argument("--resume", action="store_true", help="continue runs from their checkpoints")
    p.add_argument("--jobs", help="runs in parallel processes (an int or 'auto'; default 1)")
    p.add_argument("--out", help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--train-lengths", metavar="A-B", help="training input lengths (default 1-20)")
    p.add_argument("--test-lengths", metavar="A-B", help="test input lengths (default 21-40)")
    p.add_argument("--decay", choices=("cosine", "linear", "constant"), help="after warm-up")
    from .config import TrainConfig

    shared.add_field_flags(p, _TRAIN_OPTIONS, TrainConfig().to_dict())
    shared.add_device_flag(p)
    p.add_argument(
        "--pe-option",
        action="append",
        default=[],
        metavar="NAME.KEY=VALUE",
        help="constructor argument for an encoding, e.g. rope.rotary_dim=4",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per run (default 1: "
        "tiny models gain little from more; --jobs uses the other cores)",
    )
    p.add_argument(
        "--greedy-eval",
        action="store_const",
        const=True,
        default=None,
        help="score decoder tasks by greedy decoding (slower; same exact match)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-plot", action="store_true", help="do not draw accuracy.png")
    p.add_argument("--list-tasks", action="store_true", help="list the tasks and exit")
    p.set_defaults(func=run)


# --------------------------------------------------------------------------- parsing


def parse_range(name: str, text: str) -> tuple[int, int]:
    """``"1-20"`` -> ``(1, 20)``."""
    low, dash, high = str(text).partition("-")
    try:
        lo, hi = int(low), int(high)
    except ValueError:
        raise PosencValueError(f"{name} must look like A-B (e.g. 1-20), got {text!r}") from None
    if not dash or lo < 1 or hi < lo:
        raise PosencValueError(f"{name} must be A-B with 1 <= A <= B, got {text!r}")
    return lo, hi


def parse_pes(text: str | list[str]) -> list[tuple[str, str, bool]]:
    """``"rope,fire+abacus,abacus+random"`` -> ``[("rope", "", False), ("fire", "", True),
    ("none", "random", True)]``: each entry as :func:`posenc.runs.cli.parse_pe_list` reads
    it, with ``+abacus`` (Abacus positions on the embeddings) taken out first; ``abacus``
    as the encoding is NoPE with Abacus positions.

    >>> parse_pes("rope,fire+abacus,abacus+random")
    [('rope', '', False), ('fire', '', True), ('none', 'random', True)]
    """
    items = text if isinstance(text, list) else str(text).split(",")
    out = []
    for raw in items:
        if not isinstance(raw, str):
            raise PosencTypeError(f"pe entries must be strings, got {raw!r}")
        if not raw.strip():
            raise PosencValueError(f"pe list {text!r} has an empty entry")
        parts = raw.strip().split("+")
        abacus = "abacus" in parts
        if parts[0] == "abacus":
            parts[0] = "none"
        parts = parts[:1] + [part for part in parts[1:] if part != "abacus"]
        ((name, suffix),) = shared.parse_pe_list(["+".join(parts)])
        out.append((name, suffix, abacus))
    if len(set(out)) != len(out):
        raise PosencValueError(f"pe list {text!r} names an encoding twice")
    return out


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a settings file; a missing file or bad TOML is a ValueError naming it."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
        import tomli as tomllib  # type: ignore[no-redef]

    path = Path(path)
    if not path.is_file():
        raise PosencValueError(f"--config: {str(path)!r} is not a file")
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise PosencValueError(f"--config {str(path)!r}: invalid TOML: {exc}") from None


def resolve_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Merge defaults, preset, TOML and command line into one flat settings mapping."""
    from posenc import available

    settings: dict[str, Any] = {
        "task": ["copy-v1"],
        "pe": [p for p in DEFAULT_PES if p in available()],
        "seeds": [0],
        "out": DEFAULT_OUT,
        "jobs": 1,
        "pe_options": {},
        "device": "auto",
    }
    layers: list[dict[str, Any]] = []
    if args.preset:
        layers.append(PRESETS[args.preset])
    if args.config:
        layers.append(load_toml(args.config))
    cli: dict[str, Any] = {}
    for key in ("task", "pe", "seeds", "out", "jobs", "device"):
        if getattr(args, key) is not None:
            cli[key] = getattr(args, key)
    cli.update(shared.read_field_flags(args, _TRAIN_OPTIONS))
    if args.decay is not None:
        cli["decay"] = args.decay
    if args.greedy_eval is not None:
        cli["greedy_eval"] = True
    if args.train_lengths is not None:
        cli["train_min_length"], cli["train_max_length"] = parse_range(
            "--train-lengths", args.train_lengths
        )
    if args.test_lengths is not None:
        cli["test_min_length"], cli["test_max_length"] = parse_range(
            "--test-lengths", args.test_lengths
        )
    options: dict[str, dict[str, Any]] = {}
    for text in args.pe_option:
        name, key, value = shared.parse_pe_option(text)
        options.setdefault(name, {})[key] = value
    if options:
        cli["pe_options"] = options
    layers.append(cli)
    for layer in layers:
        for key, value in layer.items():
            if key == "pe_options":
                if not isinstance(value, dict) or not all(
                    isinstance(v, dict) for v in value.values()
                ):
                    raise PosencTypeError(f"pe_options must be a table of tables, got {value!r}")
                merged = {k: dict(v) for k, v in settings["pe_options"].items()}
                for name, kw in value.items():
                    merged.setdefault(name, {}).update(kw)
                settings["pe_options"] = merged
            else:
                settings[key] = value
    if args.preset:
        # a preset's options fit the preset's encodings: drop those for encodings the pe list
        # no longer names (options the user gave are kept, and checked in build_configs)
        named = shared.pe_names([(name, suffix) for name, suffix, _ in parse_pes(settings["pe"])])
        given = {name for layer in layers[1:] for name in layer.get("pe_options", {})}
        settings["pe_options"] = {
            name: kw
            for name, kw in settings["pe_options"].items()
            if name in named or name in given
        }
    return settings


def build_configs(settings: dict[str, Any]) -> list:
    """One :class:`TrainConfig` per (task, encoding, seed), in that nesting order."""
    from .config import TrainConfig

    sweep = {k: settings[k] for k in SWEEP_KEYS}
    fields = {k: v for k, v in settings.items() if k not in SWEEP_KEYS}
    for key in ("random_positions", "coupled_positions", "abacus", "seed"):
        if key in fields:
            raise PosencValueError(
                f"{key!r} is set per run (got {key} = {fields[key]!r}): use pe = 'NAME+random', "
                "'NAME+coupled' or 'NAME+abacus' and seeds instead"
            )
    tasks = sweep["task"]
    if isinstance(tasks, str):
        tasks = [t.strip() for t in tasks.split(",")]
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) and t for t in tasks):
        raise PosencValueError(
            f"task must be a name, a comma list or a list of names, got {tasks!r}"
        )
    pes = parse_pes(sweep["pe"])
    if not pes:
        raise PosencValueError("no encodings to train: give --pe")
    seeds = shared.parse_seeds(sweep["seeds"])
    unknown = sorted(set(sweep["pe_options"]) - shared.pe_names([(n, s) for n, s, _ in pes]))
    if unknown:
        raise PosencValueError(f"pe_options for {', '.join(unknown)}, which is not in the pe list")
    base = TrainConfig.from_dict(fields)
    configs = []
    for task in tasks:
        for name, suffix, abacus in pes:
            for seed in seeds:
                values = {
                    **base.to_dict(),
                    "task": task,
                    "pe": name,
                    "random_positions": "random" in suffix.split("+"),
                    "coupled_positions": "coupled" in suffix.split("+"),
                    "abacus": abacus,
                    "seed": seed,
                    "pe_options": shared.options_for(name, sweep["pe_options"]),
                }
                configs.append(TrainConfig.from_dict(values))
    return configs


# --------------------------------------------------------------------------- run


def run(args: argparse.Namespace) -> int:
    """Carry out ``posenc lengthgen``; returns the exit status."""
    from rich.console import Console

    console = Console(stderr=True)
    if args.list_tasks:
        from .tasks import available_tasks, get_task, task_summary

        for name in available_tasks():
            print(f"{name:<18} {get_task(name).kind:<8} {task_summary(name)}")
        return 0
    if args.threads < 0:
        raise PosencValueError(f"--threads must be >= 0, got {args.threads}")
    from .config import InDistributionWarning

    settings = resolve_settings(args)
    configs = build_configs(settings)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InDistributionWarning)
        for config in configs:  # every mistake surfaces before any training
            config.validate()
    jobs = shared.parse_jobs(settings["jobs"])
    out = Path(str(settings["out"]))
    from ..runs.device import placement
    from ..runs.distributed import close_distributed, init_distributed, world

    if not isinstance(settings["device"], str):
        raise PosencTypeError(f"device must be a string, got {settings['device']!r}")
    precisions = [config.precision for config in configs]
    device = placement(settings["device"], precisions)  # before any work
    # every check passed: each warning once, one line (an error above is the only line)
    for message in dict.fromkeys(str(w.message) for w in caught):
        print(f"posenc lengthgen: warning: {message}", file=sys.stderr)
    joined = init_distributed(device)
    try:
        from .train import run_sweep

        rank, _ = world()
        jobs = min(jobs, len(configs))
        if rank == 0:
            console.log(
                f"{len(configs)} run(s) into {out} ({jobs} at a time) on {device}, "
                f"{', '.join(dict.fromkeys(precisions))}"
            )
        with warnings.catch_warnings():  # said above, once
            warnings.simplefilter("ignore", InDistributionWarning)
            records = run_sweep(configs, out, **shared.sweep_options(args, jobs, console, device))
        if rank == 0:
            write_outputs(out, records, plot=not args.no_plot)
            from .evaluate import aggregate, wide_table

            print(wide_table(aggregate(records)))
            print(
                f"\nwrote {out / 'results.jsonl'}, {out / 'results.md'}"
                + ("" if args.no_plot else f", {out / 'accuracy.png'}")
            )
    finally:
        close_distributed(joined)
    return 0


def write_outputs(out: Path, records: list[dict[str, Any]], *, plot: bool = True) -> None:
    """``results.jsonl`` (one run per line), ``results.md`` and ``accuracy.png`` in ``out``."""
    from .evaluate import markdown_report, write_jsonl

    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "results.jsonl", records)
    (out / "results.md").write_text(markdown_report(records), encoding="utf-8")
    if plot:
        from .plots import plot_accuracy_vs_length

        plot_accuracy_vs_length(records).savefig(out / "accuracy.png", dpi=120)
