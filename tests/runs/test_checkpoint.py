"""posenc.runs.checkpoint: the run folder (a started run is refused, stale temporary files
are cleared), RNG state round trips (the GPU's generator on a GPU only), resuming refuses a
changed configuration by name (the precision too; a checkpoint from before it counts as
fp32), a checkpoint written on a GPU loads on the CPU, and a file written through
``replacing`` is the old one or the new one, never half of one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from posenc.runs.checkpoint import (
    ADDED_FIELDS,
    CHECKPOINT,
    check_resumable,
    load_checkpoint,
    prepare_run_dir,
    replacing,
    rng_state,
    save_checkpoint,
    set_rng_state,
    write_text,
)
from tests.runs.gpu_files import as_if_written_on_a_gpu


def test_prepare_run_dir_refuses_a_started_run_and_clears_stale_temp_files(tmp_path: Path) -> None:
    assert prepare_run_dir(None, resume=False, rank=0) is None
    (tmp_path / CHECKPOINT).write_bytes(b"x")
    stale = tmp_path / f".{CHECKPOINT}.123.tmp"
    stale.write_bytes(b"half")
    with pytest.raises(ValueError, match="pass resume=True"):
        prepare_run_dir(tmp_path, resume=False, rank=0)
    assert prepare_run_dir(tmp_path, resume=True, rank=0) == tmp_path / CHECKPOINT
    assert not stale.exists()


def test_a_file_is_replaced_whole_or_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "results.md"
    write_text(path, "old\n")
    with pytest.raises(KeyboardInterrupt), replacing(path) as tmp:
        tmp.write_text("half of the ne")
        raise KeyboardInterrupt  # a kill mid-write
    assert path.read_text() == "old\n"
    write_text(path, "new\n")
    assert path.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["results.md"]


def test_rng_state_round_trip_with_and_without_a_data_generator() -> None:
    rng = np.random.default_rng(1)
    state = rng_state(rng)
    want = (np.random.rand(), torch.rand(1), rng.random())
    set_rng_state(state, rng)
    assert (np.random.rand(), torch.rand(1), rng.random()) == want
    plain = rng_state()
    assert "numpy_data" not in plain
    want_plain = torch.rand(2)
    set_rng_state(plain)
    assert torch.equal(torch.rand(2), want_plain)


def test_check_resumable_names_every_change() -> None:
    check_resumable({"a": 1, "b": 2}, {"a": 1, "b": 3}, Path("x"), free={"b"})
    with pytest.raises(ValueError, match=r"a: 1 -> 2, b: 2 -> 3"):
        check_resumable({"a": 1, "b": 2}, {"a": 2, "b": 3}, Path("x"))


def test_a_checkpoint_written_on_a_gpu_loads_on_the_cpu(tmp_path: Path) -> None:
    path = tmp_path / CHECKPOINT
    weights = torch.randn(3, 4)
    save_checkpoint(path, {"model": {"w": weights}, "rng": rng_state()})
    as_if_written_on_a_gpu(path)
    if not torch.cuda.is_available():  # the file really names a GPU
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(path, weights_only=True)
    loaded = load_checkpoint(path)  # map_location: the CPU by default
    assert loaded["model"]["w"].device == torch.device("cpu")
    assert torch.equal(loaded["model"]["w"], weights)
    again = load_checkpoint(path, map_location=torch.device("cpu"))
    assert torch.equal(again["model"]["w"], weights)
    set_rng_state(loaded["rng"])  # a GPU run's random state restores on the CPU


def test_the_gpu_generator_is_saved_and_restored_on_a_gpu_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a CUDA device the GPU's generator (dropout draws from it) joins the state and is
    restored onto that device; resumed on the CPU it is left alone."""
    calls: list[tuple[str, object]] = []
    gpu_state = torch.arange(8, dtype=torch.uint8)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: gpu_state)
    monkeypatch.setattr(
        torch.cuda, "set_rng_state", lambda state, device: calls.append((str(device), state))
    )
    state = rng_state(device=torch.device("cuda", 1))
    assert torch.equal(state["cuda"], gpu_state)
    assert "cuda" not in rng_state(device=torch.device("cpu"))
    set_rng_state(state, device=torch.device("cpu"))
    assert calls == []
    set_rng_state(state, device=torch.device("cuda", 1))
    assert [device for device, _ in calls] == ["cuda:1"]
    assert torch.equal(calls[0][1], gpu_state)  # type: ignore[arg-type]


def test_a_changed_precision_is_refused_and_an_old_checkpoint_counts_as_fp32() -> None:
    saved = {"lr": 0.1, "precision": "fp32"}
    check_resumable(saved, {"lr": 0.1, "precision": "fp32"}, Path("x"))
    with pytest.raises(ValueError, match=r"precision: 'fp32' -> 'bf16'"):
        check_resumable(saved, {"lr": 0.1, "precision": "bf16"}, Path("x"))
    assert ADDED_FIELDS == {"precision": "fp32"}
    old = {"lr": 0.1}  # written before there was a precision
    check_resumable(old, {"lr": 0.1, "precision": "fp32"}, Path("x"))
    with pytest.raises(ValueError, match=r"precision: None -> 'bf16'"):
        check_resumable(old, {"lr": 0.1, "precision": "bf16"}, Path("x"))
    # inside a nested table too (a fine-tune records its base run's config)
    check_resumable({"base": old}, {"base": {"lr": 0.1, "precision": "fp32"}}, Path("x"))
    with pytest.raises(ValueError, match="base"):
        check_resumable({"base": old}, {"base": {"lr": 0.1, "precision": "bf16"}}, Path("x"))
    with pytest.raises(ValueError, match="lr"):  # any other missing field still differs
        check_resumable({}, {"lr": 0.1}, Path("x"))
