"""posenc.lengthgen.checkpoint: the run folder (a started run is refused, stale temporary files
are cleared), RNG state round trips, and resuming refuses a changed configuration by name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from posenc.lengthgen.checkpoint import (
    CHECKPOINT,
    check_resumable,
    prepare_run_dir,
    rng_state,
    set_rng_state,
)


def test_prepare_run_dir_refuses_a_started_run_and_clears_stale_temp_files(tmp_path: Path) -> None:
    assert prepare_run_dir(None, resume=False, rank=0) is None
    (tmp_path / CHECKPOINT).write_bytes(b"x")
    stale = tmp_path / f".{CHECKPOINT}.123.tmp"
    stale.write_bytes(b"half")
    with pytest.raises(ValueError, match="pass resume=True"):
        prepare_run_dir(tmp_path, resume=False, rank=0)
    assert prepare_run_dir(tmp_path, resume=True, rank=0) == tmp_path / CHECKPOINT
    assert not stale.exists()


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
