"""Running a sweep: many runs, each in its own folder, one after another or ``jobs`` at a
time in worker processes, results in the order given.

Both experiments hand :func:`run_each` their run folders and three callables (run ``i``
here; the module-level worker function; its arguments); the runner checks, before any work,
that no two runs share a folder and that no run has started unless resuming
(:func:`check_sweep_start`), then runs them (:func:`~posenc.runs.pool.run_all`) with the
torch thread count asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import PosencValueError
from .checkpoint import CHECKPOINT
from .distributed import torch_threads, world
from .pool import run_all


def check_distinct(dirs: Sequence[Path]) -> None:
    """No two runs may share a folder (they would overwrite each other's checkpoints)."""
    seen: dict[Path, int] = {}
    for i, folder in enumerate(dirs):
        if folder in seen:
            raise PosencValueError(
                f"runs {seen[folder]} and {i} would share the folder {folder}: "
                "a run is listed twice"
            )
        seen[folder] = i


def check_sweep_start(dirs: Sequence[Path], out: object, *, resume: bool, jobs: int) -> None:
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


def run_each(
    dirs: Sequence[Path],
    out: object,
    here: Callable[[int], Any],
    job: Callable[..., Any],
    job_args: Callable[[int, int], tuple[Any, ...]],
    *,
    jobs: int,
    resume: bool,
    threads: int,
    on_done: Callable[[int, Any], None],
) -> list[Any]:
    """The results of the runs in ``dirs`` (under ``out``), in order, after
    :func:`check_distinct` and :func:`check_sweep_start`: ``here(i)`` in this process with
    ``threads`` torch threads when ``jobs <= 1`` or there is one run, else
    ``job(*job_args(i, each))`` in worker processes (``each``: the threads per worker).
    ``on_done(i, result)`` is called in this process as each result arrives."""
    check_distinct(dirs)
    check_sweep_start(dirs, out, resume=resume, jobs=jobs)

    def local(i: int) -> Any:
        with torch_threads(threads):
            return here(i)

    return run_all(len(dirs), local, job, job_args, jobs=jobs, threads=threads, on_done=on_done)
