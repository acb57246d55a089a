"""Positions on a GPU are not read on the host (issue #43 item 2): the rotary tables are sized
ahead, a position outside them turns its row by NaN, and the value checks run only under
``POSENC_CHECK_POSITIONS=1``. The GPU is played by the CPU: with
:data:`~posenc.encodings.checks.CPU_IS_HOST` cleared, CPU positions take the path a
CUDA tensor takes, and every host read of a tensor value is counted (as
``tests/sequence/test_cached_reads.py`` counts them)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import posenc
from posenc.encodings import checks
from posenc.encodings.rotary import tables
from posenc.errors import PosencValueError
from tests.host_reads import host_reads

D = 8


@pytest.fixture
def device_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """CPU positions treated as a GPU's; the names of the host reads made, one per read."""
    monkeypatch.setattr(checks, "CPU_IS_HOST", False)
    monkeypatch.delenv(tables.CHECK_VARIABLE, raising=False)
    with host_reads(monkeypatch) as calls:
        yield calls


def rope64(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Eq. 34 (half layout) in float64 for ``x`` ``(b, h, n, d)`` at ``(n,)``/``(b, n)``."""
    inv = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angle = positions.double()[..., None] * inv
    angle = angle[:, None] if angle.dim() == 3 else angle
    x = x.double()
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return torch.cat((x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()), -1)


@pytest.mark.parametrize(
    "positions",
    [torch.tensor([7]), torch.tensor([3, 4, 5]), torch.tensor([[0, 9, 2], [1, 1, 4000]])],
    ids=["decode", "run", "batch"],
)
def test_device_positions_are_not_read(device_reads: list[str], positions: torch.Tensor) -> None:
    torch.manual_seed(0)
    rope = posenc.RotaryEmbedding(D, max_position_embeddings=64)
    b, n = (positions.shape[0] if positions.dim() == 2 else 2), positions.shape[-1]
    q, k = torch.randn(b, 2, n, D), torch.randn(b, 1, n, D)
    device_reads.clear()
    got_q, got_k = rope(q, k, positions)
    state_q, _ = rope.position_state(positions, torch.empty(b, n, 2 * D))(q, k)
    assert device_reads == []
    torch.testing.assert_close(got_q.double(), rope64(q, positions), atol=1e-5, rtol=0)
    torch.testing.assert_close(got_k.double(), rope64(k, positions), atol=1e-5, rtol=0)
    torch.testing.assert_close(state_q, got_q, atol=0, rtol=0)


def test_rows_outside_the_sized_tables_are_nan(
    device_reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(1)
    rope = posenc.RotaryEmbedding(D, max_position_embeddings=64)
    size = max(rope.initial_table_size, 64)
    positions = torch.tensor([[-1, 5, size]])
    q = torch.randn(1, 2, 3, D)
    device_reads.clear()
    got, _ = rope(q, q.clone(), positions)
    assert device_reads == []
    assert got[0, :, 0].isnan().all() and got[0, :, 2].isnan().all()
    torch.testing.assert_close(got[..., 1:2, :].double(), rope64(q[..., 1:2, :], positions[:, 1:2]))
    # opted in, the values are read and checked as on the CPU
    monkeypatch.setenv(tables.CHECK_VARIABLE, "1")
    with pytest.raises(PosencValueError, match="must be >= 0"):
        rope(q, q.clone(), positions)
    far = torch.tensor([[0, 5, size]])
    got, _ = rope(q, q.clone(), far)
    assert device_reads and not got.isnan().any()
    torch.testing.assert_close(got.double(), rope64(q, far), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["rope-interleaved", "xpos", "pope", "mrope"])
def test_other_schemes_read_no_device_positions(device_reads: list[str], name: str) -> None:
    """Each scheme's rotation at GPU positions reads nothing on the host and equals its
    rotation at the same positions on the CPU (read and checked there)."""
    torch.manual_seed(2)
    if name == "mrope":
        pe = posenc.MultimodalRotaryEmbedding(D, mrope_section=[2, 1, 1])
    else:
        pe = posenc.build(name, head_dim=D, **({"num_heads": 2} if name == "pope" else {}))
    q, k = torch.randn(2, 2, 3, D), torch.randn(2, 2, 3, D)
    positions = torch.tensor([[0, 3, 9], [2, 2, 5]])
    device_reads.clear()
    got = pe(q, k, positions)
    assert device_reads == []
    checks.CPU_IS_HOST = True  # (restored by the fixture's monkeypatch)
    want = pe(q, k, positions)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
