"""``posenc probe RUN...``: where position lives by depth in trained models. For each
``posenc extrapolate`` or ``posenc lengthgen`` run, a linear probe (:mod:`posenc.probe`) of
every token's absolute position and of its distance to the previous occurrence of the same
token, fitted on half of the windows and scored on the other half, at every depth; a table
per model and one figure.

    posenc probe extrapolate-results-press
    posenc probe runs/small/rope/seed0 runs/small/none/seed0 --windows 128 -o probe.png

A RUN is a ``checkpoint.pt``, a run folder holding one, or a sweep's folder (every run below
it; fine-tunes are left out).
"""

from __future__ import annotations

import argparse
import json
import pickle
from pathlib import Path
from typing import Any

from ..errors import PosencValueError

__all__ = ["add_subcommand", "find_checkpoints", "load_run"]

#: The longest windows probed (the hidden states of every depth are kept).
MAX_LENGTH = 4096
CHECKPOINT = "checkpoint.pt"


def add_subcommand(subparsers: argparse._SubParsersAction) -> None:
    """Add ``probe`` to the ``posenc`` command."""
    p = subparsers.add_parser(
        "probe",
        help="linear probes of position and recurrence distance in trained models, by depth",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="checkpoint.pt, run folder or sweep")
    p.add_argument(
        "--windows", type=int, default=256, help="windows run through each model (default 256)"
    )
    p.add_argument(
        "--length", type=int, default=0, help="tokens per window (default: the trained length)"
    )
    p.add_argument("--fit", type=float, default=0.5, help="share of windows the probes fit on")
    p.add_argument("--seed", type=int, default=0, help="seed of lengthgen's examples")
    p.add_argument("-o", "--output", default="probe.png", help="figure (.png, .svg or .pdf)")
    p.add_argument(
        "--untrained",
        action="store_true",
        help="also probe each model as its training started (same config and seed, no "
        "training): the control",
    )
    p.add_argument("--json", help="also write every row as JSON to this file")
    p.set_defaults(func=run)


def find_checkpoints(paths: list[str]) -> list[Path]:
    """The checkpoints the RUN arguments name, in order, each once: a file itself, a folder's
    own ``checkpoint.pt``, or every one below a folder (those of fine-tunes left out)."""
    found: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_file():
            found.append(path)
        elif (path / CHECKPOINT).is_file():
            found.append(path / CHECKPOINT)
        elif path.is_dir():
            below = [
                p
                for p in sorted(path.rglob(CHECKPOINT))
                if not any(part.startswith("finetune-") for part in p.relative_to(path).parts)
            ]
            if not below:
                raise PosencValueError(f"RUN {text!r}: no {CHECKPOINT} in it or below it")
            found += below
        else:
            raise PosencValueError(f"RUN {text!r}: no such file or folder")
    return list(dict.fromkeys(p.resolve() for p in found))


def load_run(
    path: Path, windows: int, length: int, seed: int, *, trained: bool = True
) -> tuple[Any, Any, str, str]:
    """The model of the checkpoint at ``path`` (``trained=False``: the one its training
    started from), the ``(windows, n)`` token ids to probe it on, its label and what it was
    trained on."""
    from ..extrapolate import probe as extrapolate_probe
    from ..lengthgen import probe as lengthgen_probe
    from ..runs.checkpoint import load_checkpoint

    try:
        saved = load_checkpoint(path)
    except (RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        raise PosencValueError(f"RUN {str(path)!r}: not a posenc checkpoint ({exc})") from None
    if not isinstance(saved, dict) or saved.get("record") is None or "model" not in saved:
        raise PosencValueError(
            f"RUN {str(path)!r}: not the checkpoint of a finished posenc extrapolate or "
            "lengthgen run"
        )
    if extrapolate_probe.is_extrapolate_run(saved):
        model, config = extrapolate_probe.model_from_checkpoint(saved, trained=trained)
        n = length or config.train_len
        tokens = extrapolate_probe.probe_windows(saved, windows, n)
        return model, tokens, f"{config.pe} seed {config.seed}", f"trained at {config.train_len}"
    if lengthgen_probe.is_lengthgen_run(saved):
        model, config = lengthgen_probe.model_from_checkpoint(saved, trained=trained)
        if length:
            raise PosencValueError(
                "--length applies to extrapolate runs; a lengthgen run is probed on its task's "
                "examples at the longest trained length"
            )
        tokens = lengthgen_probe.probe_windows(config, windows, seed)
        label = f"{config.task} {config.label} seed {config.seed}"
        return model, tokens, label, f"trained on inputs up to {config.train_max_length}"
    raise PosencValueError(
        f"RUN {str(path)!r}: a fine-tune's or another tool's checkpoint; probe the trained run"
    )


def run(args: argparse.Namespace) -> int:
    """Carry out ``posenc probe``; returns the exit status."""
    if args.windows < 3:
        raise PosencValueError(f"--windows must be >= 3, got {args.windows}")
    if not 0 <= args.length <= MAX_LENGTH or args.length == 1:
        raise PosencValueError(
            f"--length must be in [2, {MAX_LENGTH}] (0: the trained length), got {args.length}"
        )
    if not 0.0 < args.fit < 1.0:
        raise PosencValueError(f"--fit must be a share in (0, 1), got {args.fit}")
    output = Path(args.output)
    if output.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise PosencValueError(f"-o/--output must end in .png, .svg or .pdf, got {args.output!r}")
    paths = find_checkpoints(args.runs)

    import matplotlib.pyplot as plt

    from ..plots import save_figure
    from ..plots.probe import plot_probe
    from ..probe import format_probe, probe_depths

    results = {}
    for path in paths:
        for trained in (True, False) if args.untrained else (True,):
            model, tokens, label, note = load_run(
                path, args.windows, args.length, args.seed, trained=trained
            )
            label = label if trained else f"{label} untrained"
            label = label if label not in results else f"{label} ({path.parent})"
            result = probe_depths(model, tokens, fit=args.fit)
            note = note if trained else f"as initialised; the run was {note}"
            result.extra.update(run=str(path.parent), trained=trained, note=note)
            results[label] = result
            print(format_probe(result, f"{label} ({note})") + "\n", flush=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig = plot_probe(results)
    save_figure(fig, output, dpi=120)
    plt.close(fig)
    written = [str(output)]
    if args.json:
        record = {label: result.to_dict() for label, result in results.items()}
        Path(args.json).write_text(json.dumps(record, indent=1), encoding="utf-8")
        written.append(args.json)
    print("wrote " + ", ".join(written))
    return 0
