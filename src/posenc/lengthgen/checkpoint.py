"""Checkpoints that survive SIGKILL, and the random state that makes a resumed run exact.

- :func:`save_checkpoint` writes atomically (temp file, fsync, ``os.replace``): a reader sees
  the old checkpoint or the new one, never half of one.
- :func:`rng_state` / :func:`set_rng_state` capture and restore every random generator a run
  reads (Python, NumPy's global and, if the run has one, its data generator, torch), so a run
  restarted from a checkpoint draws exactly what it would have drawn.
- :func:`prepare_run_dir` refuses to overwrite a started run unless asked to resume, and
  clears the temp files a kill mid-write leaves.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import PosencValueError
from .distributed import world

CHECKPOINT = "checkpoint.pt"
RESULT = "result.json"
CHECKPOINT_VERSION = 1


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically: a temp file in the same folder, flushed and
    fsynced, then ``os.replace`` (a reader sees the old file or the new one, never half)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        torch.save(payload, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    with contextlib.suppress(OSError):  # make the rename itself durable where possible
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (safe unpickler)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def write_json(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` as JSON to ``path`` through a temp file and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, sort_keys=True, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def rng_state(data_rng: np.random.Generator | None = None) -> dict[str, Any]:
    """Every random state a run reads, in a form ``torch.load(weights_only=True)`` accepts."""
    legacy = np.random.get_state(legacy=False)
    state = {
        "python": random.getstate(),
        "numpy_global": {
            **legacy,
            "state": {**legacy["state"], "key": legacy["state"]["key"].tolist()},
        },
        "torch": torch.get_rng_state(),
    }
    if data_rng is not None:
        state["numpy_data"] = data_rng.bit_generator.state
    return state


def set_rng_state(state: dict[str, Any], data_rng: np.random.Generator | None = None) -> None:
    """Restore what :func:`rng_state` captured."""
    random.setstate(state["python"])
    legacy = state["numpy_global"]
    key = np.asarray(legacy["state"]["key"], dtype=np.uint32)
    np.random.set_state({**legacy, "state": {**legacy["state"], "key": key}})
    if data_rng is not None:
        data_rng.bit_generator.state = state["numpy_data"]
    torch.set_rng_state(state["torch"])


def check_resumable(
    saved: dict[str, Any], config: dict[str, Any], path: Path, free: Iterable[str] = ()
) -> None:
    """Raise if ``config`` differs from the ``saved`` one in a field outside ``free`` (the
    fields that do not change the numbers), naming each change."""
    free = frozenset(free)
    differ = [k for k in config if k not in free and saved.get(k) != config[k]]
    if differ:
        detail = ", ".join(f"{k}: {saved.get(k)!r} -> {config[k]!r}" for k in differ)
        raise PosencValueError(f"cannot resume {path}: the configuration changed ({detail})")


def prepare_run_dir(run_dir: Path | str | None, *, resume: bool, rank: int) -> Path | None:
    """The checkpoint path of a run in ``run_dir`` (``None``: nothing is saved). Raises if a
    checkpoint exists and ``resume`` is false; removes temp files a kill mid-write left."""
    path = None if run_dir is None else Path(run_dir) / CHECKPOINT
    if path is not None and path.exists() and not resume:
        raise PosencValueError(f"{path} exists: pass resume=True (--resume) to continue that run")
    if path is not None and rank == 0 and path.parent.is_dir():
        for stale in path.parent.glob(f".{CHECKPOINT}.*.tmp"):  # left by a kill mid-write
            stale.unlink(missing_ok=True)
    return path


def check_sweep_start(dirs: list[Path], out: object, *, resume: bool, jobs: int) -> None:
    """Before a sweep of runs into ``dirs`` (under ``out``): without ``resume`` no run may
    have started already, and parallel ``jobs`` cannot be combined with torchrun (each run
    already uses every rank)."""
    if not resume:
        existing = [str(d / CHECKPOINT) for d in dirs if (d / CHECKPOINT).exists()]
        if existing:
            raise PosencValueError(
                f"{existing[0]} exists ({len(existing)} run(s) already started in {out}): "
                "pass --resume to continue them, or choose another --out"
            )
    _, world_size = world()
    if jobs > 1 and world_size > 1:
        raise PosencValueError("--jobs must be 1 under torchrun (each run already uses every rank)")
