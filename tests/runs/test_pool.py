"""Runs in parallel (``posenc.runs.pool``): folder-safe names, threads shared out among
the jobs, and ``run_all`` runs in this process one after another or hands every run to the
worker processes with its thread count, results and ``on_done`` calls in the order given.
(Real worker processes are started by the ``--jobs`` tests of ``test_train.py``.)"""

from __future__ import annotations

from typing import Any

import pytest

from posenc.runs import pool


def test_slug_keeps_only_folder_safe_characters() -> None:
    assert pool.slug("rope+random") == "rope+random"
    assert pool.slug("path/to/task.py:Class") == "path_to_task.py_Class"
    assert pool.slug("a b\\c") == "a_b_c"
    assert pool.slug("") == "_"


def test_threads_are_shared_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool.os, "cpu_count", lambda: 16)
    assert [pool.threads_per_job(jobs, 0) for jobs in (1, 3, 16, 40)] == [16, 5, 1, 1]
    assert pool.threads_per_job(3, 2) == 2  # given: kept
    monkeypatch.setattr(pool.os, "cpu_count", lambda: None)
    assert pool.threads_per_job(2, 0) == 1


def test_one_job_runs_here_in_order() -> None:
    done: list[tuple[int, Any]] = []

    def refuse(*args: object) -> None:
        raise AssertionError("no worker process for one job")

    results = pool.run_all(
        4,
        lambda i: i * i,
        refuse,
        refuse,
        jobs=1,
        threads=0,
        on_done=lambda i, r: done.append((i, r)),
    )
    assert results == [0, 1, 4, 9] and done == [(0, 0), (1, 1), (2, 4), (3, 9)]
    alone = pool.run_all(
        1, lambda i: "here", refuse, refuse, jobs=8, threads=0, on_done=lambda i, r: None
    )
    assert alone == ["here"]


def test_many_jobs_go_to_the_workers_with_their_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_processes(job, calls, *, jobs, on_done):  # type: ignore[no-untyped-def]
        seen.update(job=job, calls=calls, jobs=jobs)
        results = [job(*args) for args in calls]
        for i, result in enumerate(results):
            on_done(i, result)
        return results

    monkeypatch.setattr(pool, "run_in_processes", fake_processes)
    monkeypatch.setattr(pool.os, "cpu_count", lambda: 8)
    done: list[int] = []
    results = pool.run_all(
        3,
        lambda i: pytest.fail("ran here"),
        lambda i, threads: (i, threads),
        lambda i, each: (i, each),
        jobs=2,
        threads=0,
        on_done=lambda i, r: done.append(i),
    )
    assert seen["calls"] == [(0, 4), (1, 4), (2, 4)] and seen["jobs"] == 2  # 8 cores / 2 jobs
    assert results == [(0, 4), (1, 4), (2, 4)] and done == [0, 1, 2]
