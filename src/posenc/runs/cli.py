"""The command-line pieces both training commands (``posenc lengthgen``, ``posenc
extrapolate``) share: the model, optimiser and precision flags, ``--device``, and the parsing
of encoding lists, seeds, job counts and encoding options."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from ..errors import PosencTypeError, PosencValueError
from .device import DEVICE_HELP, PRECISION_HELP
from .schedules import is_schedule, parse_schedule, schedule_names

#: More seeds than this is a typo, not a sweep (every seed is a full training run).
MAX_SEEDS = 1000

#: The model and optimiser flags both training harnesses (lengthgen, extrapolate) take:
#: ``(flag, config field, type, help)``; :func:`add_field_flags` appends each harness's
#: default to the help.
MODEL_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("--steps", "steps", int, "optimiser steps per run"),
    ("--batch-size", "batch_size", int, "global batch size"),
    ("--lr", "lr", float, "peak learning rate"),
    ("--weight-decay", "weight_decay", float, "AdamW weight decay"),
    ("--warmup", "warmup", float, "fraction of steps of linear warm-up"),
    ("--grad-clip", "grad_clip", float, "gradient-norm clip, 0 = off"),
    ("--dim", "dim", int, "model width"),
    ("--depth", "depth", int, "layers"),
    ("--heads", "heads", int, "attention heads"),
    ("--ffn-dim", "ffn_dim", int, "feed-forward width, 0 = 4*dim"),
    ("--dropout", "dropout", float, "dropout"),
    ("--checkpoint-every", "checkpoint_every", int, "checkpoint every N steps"),
    ("--precision", "precision", str, PRECISION_HELP),
)

#: What may follow ``NAME+`` in a pe list: randomized (Ruoss 2023) or coupled (Cho 2024)
#: positions.
POSITION_SUFFIXES = ("random", "coupled", "random+coupled")


def add_field_flags(
    parser: argparse.ArgumentParser,
    flags: tuple[tuple[str, str, type, str], ...],
    defaults: dict[str, Any],
) -> None:
    """Add one option per ``(flag, field, type, help)`` row; ``defaults`` (field -> value)
    gives the default each help states."""
    for flag, name, kind, text in flags:
        parser.add_argument(flag, type=kind, help=f"{text} (default {defaults[name]})")


def read_field_flags(
    args: argparse.Namespace, flags: tuple[tuple[str, str, type, str], ...]
) -> dict[str, Any]:
    """The config fields the command line set, by field name."""
    values = {name: getattr(args, flag.lstrip("-").replace("-", "_")) for flag, name, *_ in flags}
    return {name: value for name, value in values.items() if value is not None}


def add_device_flag(parser: argparse.ArgumentParser) -> None:
    """``--device`` (read with :func:`~posenc.runs.device.resolve_device`; unset: ``auto``)."""
    parser.add_argument("--device", help=DEVICE_HELP)


def parse_pe_list(text: str | list[str]) -> list[tuple[str, str]]:
    """``"none,rope+random,rope/none:temp"`` -> ``[("none", ""), ("rope", "random"),
    ("rope/none:temp", "")]``: each encoding a registry name or a per-layer schedule
    (:mod:`posenc.runs.schedules`, checked entry by entry against the registry), then the
    whole model's position suffix, checked against :data:`POSITION_SUFFIXES`."""
    items = text if isinstance(text, list) else str(text).split(",")
    out = []
    for raw in items:
        if not isinstance(raw, str):
            raise PosencTypeError(f"pe entries must be strings, got {raw!r}")
        item = raw.strip()
        if not item:
            raise PosencValueError(f"pe list {text!r} has an empty entry")
        name, plus, suffix = item.partition("+")
        if plus and suffix not in POSITION_SUFFIXES:
            raise PosencValueError(
                f"pe {item!r}: the only suffixes are '+random', '+coupled' and "
                f"'+random+coupled', got '+{suffix}'"
            )
        parse_schedule(name)  # unknown names list the known ones, naming the entry
        out.append((name, suffix))
    if len(set(out)) != len(out):
        raise PosencValueError(f"pe list {text!r} names an encoding twice")
    return out


def pe_names(pes: list[tuple[str, str]]) -> set[str]:
    """The registry names a parsed pe list uses (a schedule's entries among them): the names
    ``--pe-option`` may address."""
    return {name for spec, _ in pes for name in schedule_names(spec)}


def options_for(spec: str, options: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A run's ``pe_options`` from the sweep's table by name: a single name's own keyword
    arguments; for a schedule, the table of each of its names that has options (every
    entry of that name gets them)."""
    if not is_schedule(spec):
        return dict(options.get(spec, {}))
    return {name: dict(options[name]) for name in schedule_names(spec) if name in options}


def parse_seeds(value: str | int | list[int]) -> list[int]:
    """``3`` -> ``[0, 1, 2]``; ``"0,5,7"`` or ``[0, 5, 7]`` -> that list."""
    if isinstance(value, list):
        seeds = value
    elif isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= MAX_SEEDS:
            raise PosencValueError(
                f"seeds must be a count >= 1 (at most {MAX_SEEDS}) or a list, got {value}"
            )
        seeds = list(range(value))
    elif isinstance(value, str):
        text = value.strip()
        if "," in text:
            try:
                seeds = [int(s) for s in text.split(",") if s.strip()]
            except ValueError:
                raise PosencValueError(
                    f"seeds must be a count or a comma list of ints, got {value!r}"
                ) from None
        else:
            try:
                return parse_seeds(int(text))
            except ValueError as exc:
                if "seeds must" in str(exc):
                    raise
                raise PosencValueError(
                    f"seeds must be a count or a comma list of ints, got {value!r}"
                ) from None
    else:
        raise PosencTypeError(f"seeds must be a count or a list of ints, got {value!r}")
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise PosencValueError(f"seeds must be non-negative ints, got {value!r}")
    if len(seeds) > MAX_SEEDS or max(seeds) >= 2**32:
        raise PosencValueError(f"seeds must be at most {MAX_SEEDS} ints below 2**32, got {value!r}")
    if len(set(seeds)) != len(seeds):
        raise PosencValueError(f"seeds {value!r} repeat a seed")
    return seeds


def parse_jobs(value: str | int) -> int:
    """``"auto"`` -> the number of cores; otherwise an int >= 1."""
    if value == "auto":
        return max(1, os.cpu_count() or 1)
    try:
        jobs = int(value)
    except (TypeError, ValueError):
        raise PosencValueError(f"jobs must be an int >= 1 or 'auto', got {value!r}") from None
    if isinstance(value, bool) or jobs < 1:
        raise PosencValueError(f"jobs must be an int >= 1 or 'auto', got {value!r}")
    return jobs


def _scalar(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_pe_option(text: str) -> tuple[str, str, Any]:
    """``"rope.rotary_dim=4"`` -> ``("rope", "rotary_dim", 4)``."""
    target, eq, value = text.partition("=")
    name, dot, key = target.partition(".")
    if not (eq and dot and name and key.isidentifier()):
        raise PosencValueError(f"--pe-option must look like NAME.KEY=VALUE, got {text!r}")
    return name, key, _scalar(value)


def sweep_options(
    args: argparse.Namespace, jobs: int, console: Any, device: Any = None
) -> dict[str, Any]:
    """The keywords of ``run_sweep`` that both harnesses take from their command line (and
    ``device``, once resolved, when given)."""
    options = {
        "jobs": jobs,
        "resume": args.resume,
        "progress": not args.no_progress and jobs == 1,
        "threads": args.threads,
        "console": console,
    }
    if device is not None:
        options["device"] = device
    return options


def bounded_int(limit: int | None = None) -> Callable[[str], int]:
    """An argparse type: a positive integer, at most ``limit`` when given (a size past it
    would only exhaust memory)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
        if limit is not None and value > limit:
            raise argparse.ArgumentTypeError(f"expected at most {limit}, got {value}")
        return value

    parse.__name__ = "positive integer"
    return parse


def seed_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer seed in ``[low, high)``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer seed, got {text!r}") from None
        if not low <= value < high:
            raise argparse.ArgumentTypeError(f"expected a seed in [{low}, {high}), got {value}")
        return value

    parse.__name__ = "seed"
    return parse
