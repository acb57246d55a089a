"""RoPE's decode path (``src/posenc/encodings/rotary/tables.py``): one read of a few positions,
table rows as views, and the decode lane (q and k turned by rows of the table where they lie)
equal to the full path bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode

from posenc import PosencValueError, RotaryEmbedding
from posenc.encodings.rotary.tables import read_positions
from tests.encodings.rotary.test_rope_inplace import fused_qk

# --------------------------------------------------------------------------- decode


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_a_decode_step_indexes_the_table_and_rotates(interleaved: bool, inplace: bool) -> None:
    """One new token at position 4095 (grouped-query heads): no reduction over the positions
    (they are read once), no gather (the table row is a view), only the rotation's own
    operations; the result equals float positions (angles computed in float64)."""
    rope = RotaryEmbedding(128, interleaved=interleaved)
    q, k = torch.randn(8, 32, 1, 128), torch.randn(8, 8, 1, 128)
    position = torch.tensor([4095])
    with torch.no_grad():
        want_q, want_k = rope(q, k, position.double())
        rope(q, k, position)  # builds the table
        with _CountOps() as counted:
            got_q, got_k = rope(q.clone(), k.clone(), position, inplace=inplace)
    assert_close(got_q, want_q, rtol=0, atol=1e-6)
    assert_close(got_k, want_k, rtol=0, atol=1e-6)
    ops = [op for op in counted.ops if op not in ("clone", "promote_types")]
    assert not {"min", "max", "aminmax", "index", "index_select", "_local_scalar_dense"} & set(
        ops
    ), ops
    views = {"empty", "empty_like", "slice", "narrow", "split", "view", "alias"}
    compute = [op for op in ops if op not in views | {"view_as_complex", "unflatten"}]
    # per tensor: a complex table and one complex multiply; or eq. 34's four operations (in
    # place also a copy of x1)
    assert len(compute) <= (4 if interleaved else 10), compute


@pytest.mark.parametrize(
    "positions",
    [[5], [5, 6, 7], [7, 5, 6], [5, 5, 6], list(range(100, 120)), [[3, 4], [9, 10]]],
    ids=str,
)
def test_table_rows_equal_the_formula_for_runs_and_gathers(positions: list) -> None:
    rope = RotaryEmbedding(16)
    pos = torch.tensor(positions)
    n = pos.shape[-1]
    q, k = torch.randn(2, 3, n, 16), torch.randn(2, 3, n, 16)
    exact = RotaryEmbedding(16)(q.double(), k.double(), pos)  # float64: no table
    got = rope(q, k, pos)
    assert_close(got[0].double(), exact[0], rtol=0, atol=2e-6)
    assert_close(got[1].double(), exact[1], rtol=0, atol=2e-6)


@pytest.mark.parametrize(
    ("positions", "error", "match"),
    [
        (torch.tensor([3, -1]), ValueError, "positions must be >= 0, got a minimum of -1"),
        (torch.tensor([[3, 4]] * 3), ValueError, "positions has batch size 3"),
        (torch.tensor([3, 4, 5]), ValueError, r"positions must have shape \(seq,\)"),
        (torch.tensor([True, False]), TypeError, "positions must be an integer or float"),
    ],
)
def test_the_fast_position_check_defers_errors_to_the_full_one(
    positions: torch.Tensor, error: type, match: str
) -> None:
    q = torch.randn(2, 1, 2, 8)
    with pytest.raises(error, match=match):
        RotaryEmbedding(8)(q, q.clone(), positions)


#: Rows of a new RotaryEmbedding's tables.
ROWS = RotaryEmbedding.initial_table_size


def _lane_row(rope: RotaryEmbedding, positions: torch.Tensor | None, n: int) -> int | None:
    """The first table row the forward's decode lane reads for ``positions``, or ``None``
    where the full path runs (positions the full check refuses included)."""
    try:
        extent = read_positions(positions, n, 1, "cpu", True)[1]
    except PosencValueError:
        return None
    if positions is None:
        extent = (0, n - 1, True)
    return (
        rope._tables.first_row(extent, n, torch.device("cpu")) if rope._tables.decode_lane else None
    )


@pytest.mark.parametrize(
    ("positions", "n", "first"),
    [
        (None, 3, 0),
        (torch.tensor([4095]), 1, 4095),
        (torch.tensor([5, 6, 7], dtype=torch.int32), 3, 5),
        (torch.tensor([7, 5, 6]), 3, None),  # not one run: gathered
        (torch.tensor([5, 5]), 2, None),
        (torch.tensor([-1, 0]), 2, None),  # the full check names it
        (torch.tensor([[5, 6]]), 2, None),  # per-batch positions
        (torch.tensor([5.0]), 1, None),  # angles computed in float64
        (torch.arange(17), 17, None),  # more than _FEW_POSITIONS: not read whole
        (torch.tensor([ROWS - 1]), 1, ROWS - 1),
        (torch.tensor([ROWS]), 1, None),  # past the table: the full path grows it
    ],
    ids=str,
)
def test_the_decode_lane_takes_runs_of_rows_already_in_the_table(
    positions: torch.Tensor | None, n: int, first: int | None
) -> None:
    rope = RotaryEmbedding(8)
    assert rope.cos_cached.shape[0] == ROWS
    assert _lane_row(rope, positions, n) == first


@pytest.mark.parametrize(
    "options",
    [
        {"scaling": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 16},
        {"scaling": {"rope_type": "longrope", "short_factor": [1.0] * 4,
                     "long_factor": [2.0] * 4, "original_max_position_embeddings": 16},
         "max_position_embeddings": 64},
        {"learned_freq": True},
        {"device": "meta"},
    ],
    ids=["dynamic", "longrope", "learned", "meta"],
)  # fmt: skip
def test_the_decode_lane_leaves_moving_or_absent_tables_to_the_full_path(options: dict) -> None:
    rope = RotaryEmbedding(8, **options)
    assert _lane_row(rope, torch.tensor([3]), 1) is None
    assert _lane_row(rope, None, 1) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("positions", [None, [9], [9, 10, 11]], ids=str)
def test_the_decode_lane_equals_the_full_path_bit_for_bit(
    dtype: torch.dtype, interleaved: bool, inplace: bool, positions: list | None
) -> None:
    """The lane (1-D positions: rows of the table read where they lie) against the full path
    (the same positions per batch, ``(b, n)``: validated, gathered), on q and k sliced from a
    fused projection."""
    rope = RotaryEmbedding(16, interleaved=interleaved)
    q, k = fused_qk(2, 3 if positions is None else len(positions), 4, 2, 16, dtype)
    pos = None if positions is None else torch.tensor(positions)
    per_batch = torch.arange(q.shape[2]).expand(2, -1) if pos is None else pos.expand(2, -1)
    n = q.shape[2]
    extent = (0, n - 1, True) if pos is None else read_positions(pos, n, 1, "cpu", True)[1]
    assert (
        rope._tables.first_row(extent, n, torch.device("cpu")) is not None
    )  # the decode lane takes it
    want_q, want_k = rope(q, k, per_batch)
    got_q, got_k = rope(q, k, pos, inplace=inplace)
    assert (got_q is q) == inplace and (got_k is k) == inplace
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
