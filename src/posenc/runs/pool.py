"""Runs in parallel worker processes (``--jobs N``): spawned interpreters that end with their
parent, results returned in the order the runs were given."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any


def slug(text: str) -> str:
    """A folder-safe version of a task or encoding name."""
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text) or "_"


def exit_with_parent() -> None:
    """In a worker: end this process as soon as the parent is gone (killed, say), so no
    orphan keeps writing checkpoints that a later ``--resume`` would race with."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def threads_per_job(jobs: int, threads: int) -> int:
    """Torch threads for each of ``jobs`` workers: ``threads`` if given, else the cores
    divided by ``jobs`` (at least 1)."""
    return threads or max(1, (os.cpu_count() or 1) // jobs)


def run_in_processes(
    job: Callable[..., Any],
    calls: Sequence[tuple[Any, ...]],
    *,
    jobs: int,
    on_done: Callable[[int, Any], None] | None = None,
) -> list[Any]:
    """``[job(*args) for args in calls]``, ``jobs`` at a time in spawned processes (``job``
    and its arguments must pickle: a module-level function and plain data). ``on_done(i,
    result)`` is called in the parent as results arrive, in order."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=jobs, mp_context=context, initializer=exit_with_parent
    ) as pool:
        futures = [pool.submit(job, *args) for args in calls]
        results = []
        for i, future in enumerate(futures):
            results.append(future.result())
            if on_done is not None:
                on_done(i, results[-1])
    return results


def run_all(
    count: int,
    here: Callable[[int], Any],
    job: Callable[..., Any],
    job_args: Callable[[int, int], tuple[Any, ...]],
    *,
    jobs: int,
    threads: int,
    on_done: Callable[[int, Any], None],
) -> list[Any]:
    """The results of ``count`` runs, in order: one after another in this process
    (``here(i)``) when ``jobs <= 1`` or there is one run, else ``job(*job_args(i, each))``
    ``jobs`` at a time in worker processes, ``each`` being :func:`threads_per_job`.
    ``on_done(i, result)`` is called in this process as each result arrives."""
    if jobs <= 1 or count == 1:
        results = []
        for i in range(count):
            results.append(here(i))
            on_done(i, results[-1])
        return results
    each = threads_per_job(jobs, threads)
    calls = [job_args(i, each) for i in range(count)]
    return run_in_processes(job, calls, jobs=jobs, on_done=on_done)
