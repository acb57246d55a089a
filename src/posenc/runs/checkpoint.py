"""Checkpoints that survive SIGKILL, and the random state that makes a resumed run exact.

- :func:`save_checkpoint` writes atomically (temp file, fsync, ``os.replace``): a reader sees
  the old checkpoint or the new one, never half of one; :func:`replacing` does the same for
  any file another writer makes (results, tables, figures), :func:`write_text` for text.
- :func:`load_checkpoint` reads one onto any device (``map_location``, the CPU by default),
  so a run trained on a GPU resumes or is evaluated on a CPU, and the reverse.
- :func:`rng_state` / :func:`set_rng_state` capture and restore every random generator a run
  reads (Python, NumPy's global and, if the run has one, its data generator, torch's CPU
  generator and the GPU's when it trains on one), so a run restarted from a checkpoint draws
  exactly what it would have drawn.
- :func:`check_resumable` refuses a resume whose configuration changed (the precision
  included: it changes the numbers), naming each change.
- :func:`prepare_run_dir` refuses to overwrite a started run unless asked to resume, and
  clears the temp files a kill mid-write leaves.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import PosencValueError

CHECKPOINT = "checkpoint.pt"
RESULT = "result.json"
CHECKPOINT_VERSION = 1

#: Configuration fields added after checkpoints were already being written, with the value
#: every run saved before them used: a saved configuration without the field resumes as if
#: it held that value.
ADDED_FIELDS: dict[str, Any] = {"precision": "fp32"}


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


def load_checkpoint(path: Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (safe unpickler), its tensors
    placed on ``map_location`` whatever device wrote them (a checkpoint written on
    ``cuda:0`` loads on a machine without a GPU)."""
    return torch.load(path, map_location=map_location, weights_only=True)


@contextlib.contextmanager
def replacing(path: Path | str) -> Iterator[Path]:
    """The temp file to write ``path``'s new content to (``.NAME.tmp`` beside it), moved onto
    ``path`` with ``os.replace`` when the block ends without an error: a reader, or a sweep
    killed at any moment, sees the old file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    yield tmp
    os.replace(tmp, path)


def write_text(path: Path | str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`replacing`)."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` as JSON to ``path`` atomically, keys sorted."""
    write_text(path, json.dumps(record, sort_keys=True, indent=1))


def rng_state(
    data_rng: np.random.Generator | None = None, device: torch.device | None = None
) -> dict[str, Any]:
    """Every random state a run reads, in a form ``torch.load(weights_only=True)`` accepts;
    with a CUDA ``device``, its generator too (dropout on a GPU draws from it)."""
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
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(
    state: dict[str, Any],
    data_rng: np.random.Generator | None = None,
    device: torch.device | None = None,
) -> None:
    """Restore what :func:`rng_state` captured (wherever ``map_location`` put the tensors).
    A GPU generator is restored only onto a GPU; a run resumed on another kind of device
    keeps every other state, so its data are drawn as they would have been."""
    random.setstate(state["python"])
    legacy = state["numpy_global"]
    key = np.asarray(legacy["state"]["key"], dtype=np.uint32)
    np.random.set_state({**legacy, "state": {**legacy["state"], "key": key}})
    if data_rng is not None:
        data_rng.bit_generator.state = state["numpy_data"]
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def _same(saved: Any, new: Any) -> bool:
    """Whether a saved configuration value equals the new one, a field of
    :data:`ADDED_FIELDS` missing from a saved table counting as its old value."""
    if isinstance(saved, Mapping) and isinstance(new, Mapping):
        keys = set(saved) | set(new)
        return all(_same(_field(saved, k), _field(new, k)) for k in keys)
    return bool(saved == new)


_MISSING = object()


def _field(table: Mapping[str, Any], key: str) -> Any:
    return table.get(key, ADDED_FIELDS.get(key, _MISSING))


def check_resumable(
    saved: dict[str, Any], config: dict[str, Any], path: Path, free: Iterable[str] = ()
) -> None:
    """Raise if ``config`` differs from the ``saved`` one in a field outside ``free`` (the
    fields that do not change the numbers), naming each change. A field of
    :data:`ADDED_FIELDS` that a checkpoint written before it lacks counts as its old value
    (``precision``: ``fp32``)."""
    free = frozenset(free)
    differ = [k for k in config if k not in free and not _same(_field(saved, k), config[k])]
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
