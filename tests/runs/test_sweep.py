"""``posenc.runs.sweep``: before any work, two runs may not share a folder, a started run
needs ``resume``, parallel jobs do not go with torchrun; then the runs go one after another
here (with the thread count asked for) or to worker processes, results and ``on_done`` calls
in the order given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from posenc.errors import PosencValueError
from posenc.runs import pool, sweep
from posenc.runs.checkpoint import CHECKPOINT


def refuse(*args: object) -> None:
    raise AssertionError("no worker process for jobs=1")


def test_runs_go_here_in_order_with_their_threads(tmp_path: Path) -> None:
    dirs = [tmp_path / name for name in ("b", "a", "c")]
    done: list[tuple[int, Any]] = []
    before = torch.get_num_threads()

    def here(i: int) -> tuple[str, int]:
        return dirs[i].name, torch.get_num_threads()

    asked = before + 1  # differs from the count outside, whatever it is
    results = sweep.run_each(
        dirs, tmp_path, here, refuse, refuse, jobs=1, resume=False, threads=asked,
        on_done=lambda i, r: done.append((i, r)),
    )  # fmt: skip
    assert results == [("b", asked), ("a", asked), ("c", asked)]
    assert done == list(enumerate(results)) and torch.get_num_threads() == before


def test_many_jobs_go_to_the_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    def fake_processes(job, args, *, jobs, on_done):  # type: ignore[no-untyped-def]
        calls.extend(args)
        results = [job(*a) for a in args]
        for i, result in enumerate(results):
            on_done(i, result)
        return results

    monkeypatch.setattr(pool, "run_in_processes", fake_processes)
    dirs = [tmp_path / "x", tmp_path / "y"]
    results = sweep.run_each(
        dirs, tmp_path, lambda i: pytest.fail("ran here"), lambda name, each: f"{name}/{each}",
        lambda i, each: (dirs[i].name, each), jobs=2, resume=False, threads=3,
        on_done=lambda i, r: None,
    )  # fmt: skip
    assert calls == [("x", 3), ("y", 3)] and results == ["x/3", "y/3"]


def test_the_checks_come_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def run(dirs: list[Path], **kw: Any) -> list[Any]:
        options = {"jobs": 1, "resume": False, "threads": 0, **kw}
        return sweep.run_each(
            dirs, tmp_path, lambda i: pytest.fail("ran"), refuse, refuse,
            on_done=lambda i, r: None, **options,
        )  # fmt: skip

    same = [tmp_path / "a", tmp_path / "b", tmp_path / "a"]
    with pytest.raises(PosencValueError, match=r"runs 0 and 2 would share the folder .*a"):
        run(same)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / CHECKPOINT).write_bytes(b"")
    with pytest.raises(PosencValueError, match=r"b/checkpoint.pt exists .* pass --resume"):
        run([tmp_path / "a", tmp_path / "b"])
    monkeypatch.setattr(sweep, "world", lambda: (0, 2))
    with pytest.raises(PosencValueError, match="--jobs must be 1 under torchrun"):
        run([tmp_path / "a", tmp_path / "b"], jobs=2, resume=True)
