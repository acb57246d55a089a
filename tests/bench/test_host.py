"""``posenc bench host`` (``posenc.bench.host``): the table is made (never the timings
checked), the faked driver launches once per call and leaves nothing behind."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton", reason="triton ships Linux x86-64 wheels only")

from posenc.bench import host
from posenc.errors import PosencValueError


def test_faked_launches_need_the_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(PosencValueError, match="unset TRITON_INTERPRET"), host.faked_launches():
        pass


@pytest.mark.slow  # (compiles the kernel for sm_90 twice: about 3 s)
def test_the_suite_times_every_column_and_restores_everything() -> None:
    from triton.runtime import driver

    from posenc.encodings.rotary.kernels import triton_entry, triton_kernel, triton_launch

    before = (driver._active, triton_entry._tensor_ok, os.environ.get("POSENC_ROTARY_KERNEL"))
    section = host.suite(calls=2, rounds=1)
    (table,) = section.tables
    assert len(table.rows) == 2 and table.rows[0][0].startswith("decode")
    for row in table.rows:
        assert all(float(cell) > 0 for cell in row[1:5])  # (transformers may be absent)
    times = section.data["decode"]
    assert set(times) >= {"triton", "posenc", "launch", "native"}
    after = (driver._active, triton_entry._tensor_ok, os.environ.get("POSENC_ROTARY_KERNEL"))
    assert after == before and not triton_launch._PLANS
    assert not triton_kernel.rotary_kernel.device_caches  # (kernels that launch nothing)
    assert not triton_entry.takes(torch.zeros(1, 2), None, None)  # CPU tensors: no longer
