"""Sinusoidal tables against a float64 transcription of the paper's formula and against the
positional-encodings package; module paths (positions, offsets, dtypes, growth) agree."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc import (
    ScaledSinusoidalPositionalEncoding,
    Sinusoidal2DPositionalEncoding,
    Sinusoidal3DPositionalEncoding,
    SinusoidalPositionalEncoding,
    sinusoidal_nd_table,
    sinusoidal_table,
    sinusoidal_table_np,
)
from posenc.errors import MemoryBudgetError
from tests.misuse import MISSING, Misuse, cases, check
from tests.schemes import of_family


def formula(positions: list[int], dim: int, base: float = 10000.0) -> np.ndarray:
    """PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(same), written out in float64."""
    out = np.zeros((len(positions), dim), dtype=np.float64)
    for row, p in enumerate(positions):
        for col in range(dim):
            i2 = col - col % 2
            angle = p / base ** (i2 / dim)
            out[row, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    return out


@pytest.mark.parametrize("dim", [1, 2, 3, 7, 8, 64, 65])
@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_table_matches_formula(dim: int, base: float) -> None:
    positions = list(range(50))
    expected = torch.from_numpy(formula(positions, dim, base))
    assert_close(
        sinusoidal_table(50, dim, base=base, dtype=torch.float64), expected, rtol=0, atol=1e-12
    )
    assert_close(sinusoidal_table(50, dim, base=base).double(), expected, rtol=0, atol=1e-7)
    np.testing.assert_allclose(
        sinusoidal_table_np(50, dim, base=base, dtype=np.float64),
        expected.numpy(),
        atol=1e-12,
        rtol=0,
    )


def test_odd_dim_ends_on_sine() -> None:
    table = sinusoidal_table(10, 5, dtype=torch.float64)
    p = torch.arange(10, dtype=torch.float64)
    assert_close(table[:, 4], torch.sin(p / 10000 ** (4 / 5)), rtol=0, atol=1e-15)


def test_float32_exact_far_out() -> None:
    """Float32 tables stay within 1e-6 of the exact value at positions up to 1e6."""
    positions = [0, 1, 8191, 8192, 65535, 123457, 500000, 999_999, 1_000_000]
    dim = 64
    table = sinusoidal_table(1_000_001, dim)
    expected = torch.from_numpy(formula(positions, dim))
    assert_close(table[positions].double(), expected, rtol=0, atol=1e-6)
    # and the whole far tail, against float64 evaluated by torch
    tail = table[-5000:].double()
    exact = sinusoidal_table(1_000_001, dim, dtype=torch.float64)[-5000:]
    assert (tail - exact).abs().max() < 1e-6


def test_numpy_twin_equals_torch() -> None:
    for dim in (1, 6, 33):
        np.testing.assert_array_equal(
            sinusoidal_table_np(300, dim), sinusoidal_table(300, dim).numpy()
        )


def test_matches_positional_encodings_package() -> None:
    from positional_encodings.torch_encodings import PositionalEncoding1D

    for dim in (8, 64, 256):
        theirs = PositionalEncoding1D(dim)(torch.zeros(1, 200, dim))[0]
        # they evaluate angles in float32: agreement is at float32 angle-rounding level
        assert_close(sinusoidal_table(200, dim), theirs, rtol=0, atol=2e-4)
    # For odd d they compute frequencies for d + 1 and drop the last column: a different
    # table from the paper's (whose exponent is 2i/d). Ours follows the paper.
    theirs = PositionalEncoding1D(63)(torch.zeros(1, 200, 63))[0]
    assert_close(sinusoidal_table(200, 64)[:, :63], theirs, rtol=0, atol=2e-4)
    assert (sinusoidal_table(200, 63) - theirs).abs().max() > 0.1


@pytest.mark.parametrize("dim", [1, 3, 7, 63])
def test_odd_dim_convention_against_positional_encodings_package(dim: int) -> None:
    """What docs/peers.md states: for odd d both tables end on a sine, but posenc keeps the
    paper's exponent 2i/d while PositionalEncoding1D(d) is the d + 1 table with its last
    (cosine) column dropped, exponent 2i/(d + 1): the first two columns (frequency 1) agree,
    every later column's frequency differs."""
    from positional_encodings.torch_encodings import PositionalEncoding1D

    n, base = 2000, 10000.0
    theirs = PositionalEncoding1D(dim)(torch.zeros(1, n, dim))[0].double()
    ours = sinusoidal_table(n, dim, dtype=torch.float64)
    p = torch.arange(n, dtype=torch.float64)
    assert_close(ours[:, -1], torch.sin(p / base ** ((dim - 1) / dim)), rtol=0, atol=1e-12)
    # theirs evaluates angles in float32: agreement at float32 angle-rounding level
    assert_close(theirs[:, -1], torch.sin(p / base ** ((dim - 1) / (dim + 1))), rtol=0, atol=2e-4)
    assert_close(
        theirs, sinusoidal_table(n, dim + 1, dtype=torch.float64)[:, :dim], rtol=0, atol=2e-4
    )
    assert_close(theirs[:, :2], ours[:, :2], rtol=0, atol=2e-4)
    for col in range(2, dim):  # over 2000 positions even the slowest columns part by > 1e-2
        assert (theirs[:, col] - ours[:, col]).abs().max() > 1e-2


@pytest.mark.parametrize("shape", [(5, 7), (4, 3, 6)])
@pytest.mark.parametrize("dim", [12, 16, 30, 13])
def test_nd_matches_positional_encodings_package(shape: tuple[int, ...], dim: int) -> None:
    from positional_encodings.torch_encodings import PositionalEncoding2D, PositionalEncoding3D

    peer = PositionalEncoding2D(dim) if len(shape) == 2 else PositionalEncoding3D(dim)
    theirs = peer(torch.zeros(1, *shape, dim))[0]
    assert_close(sinusoidal_nd_table(shape, dim), theirs, rtol=0, atol=1e-5)


def test_nd_table_formula() -> None:
    dim, shape = 8, (3, 4)
    table = sinusoidal_nd_table(shape, dim, dtype=torch.float64)
    c = 4  # 2 * ceil(8 / 4)
    for y in range(3):
        for x in range(4):
            expected = np.concatenate([formula([y], c)[0], formula([x], c)[0]])
            np.testing.assert_allclose(table[y, x].numpy(), expected, atol=1e-15, rtol=0)


def test_nd_modules_grid_and_flat_agree() -> None:
    pe2 = Sinusoidal2DPositionalEncoding(16)
    grid = torch.randn(2, 3, 5, 16)
    out_grid = pe2(grid)
    coords = torch.cartesian_prod(torch.arange(3), torch.arange(5))  # (15, 2)
    out_flat = pe2(grid.reshape(2, 15, 16), coords)
    assert_close(out_flat, out_grid.reshape(2, 15, 16))
    pe3 = Sinusoidal3DPositionalEncoding(12)
    vol = torch.zeros(1, 2, 3, 4, 12)
    assert_close(pe3(vol)[0], sinusoidal_nd_table((2, 3, 4), 12))
    check(
        Misuse(
            "flat-without-positions",
            lambda: pe2(torch.zeros(1, 15, 16)),
            ValueError,
            "positions",
            MISSING,
        )
    )
    check(
        Misuse(
            "wrong-coordinates",
            lambda: pe2(torch.zeros(1, 15, 16), torch.zeros(15, 3)),
            ValueError,
            "positions",
            (15, 3),
        )
    )


def test_module_adds_table() -> None:
    pe = SinusoidalPositionalEncoding(16, max_len=64)
    x = torch.randn(3, 10, 16)
    assert_close(pe(x), x + sinusoidal_table(10, 16), rtol=0, atol=0)


def test_explicit_positions_paths_agree() -> None:
    pe = SinusoidalPositionalEncoding(16, max_len=64)
    x = torch.randn(2, 10, 16)
    default = pe(x)
    assert torch.equal(pe(x, torch.arange(10)), default)
    assert torch.equal(pe(x, torch.arange(10).expand(2, 10)), default)
    # float positions evaluate the formula: equal to the table at whole numbers
    assert_close(pe(x, torch.arange(10, dtype=torch.float32)), default, rtol=0, atol=1e-6)
    # an offset equals the same rows of a longer run
    long = torch.randn(2, 30, 16)
    assert torch.equal(pe(long[:, 20:], torch.arange(20, 30)), pe(long)[:, 20:])
    # per-batch positions
    pos = torch.stack([torch.arange(10), torch.arange(5, 15)])
    out = pe(x, pos)
    assert torch.equal(out[1], x[1] + sinusoidal_table(15, 16)[5:])


def test_grows_on_demand_once() -> None:
    pe = SinusoidalPositionalEncoding(8, max_len=4)
    out = pe(torch.zeros(1, 10, 8))
    assert_close(out[0], sinusoidal_table(10, 8), rtol=0, atol=0)
    grown = pe.table
    assert grown.shape[0] >= 10
    pe(torch.zeros(1, 9, 8))
    assert pe.table is grown  # no recomputation on a shorter call
    pe(torch.zeros(1, 3, 8), torch.tensor([0, 11, 7]))
    assert pe.table.shape[0] >= 12  # near the table: it grows


def test_far_position_costs_its_own_rows_only() -> None:
    """One token at position 10^9 (a long KV cache) gets its row from the formula, exactly
    as the table would hold it, without a table of 10^9 rows."""
    pe = SinusoidalPositionalEncoding(8, max_len=16)
    positions = torch.tensor([0, 10**9, 7])
    out = pe(torch.zeros(1, 3, 8), positions)
    assert pe.table.shape[0] == 16
    exact = torch.tensor([0, 10**9, 7], dtype=torch.float64)[:, None] * (
        10000.0 ** -(torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    )
    expected = torch.stack((exact.sin(), exact.cos()), dim=-1).flatten(-2).float()
    assert_close(out[0], expected, rtol=0, atol=0)
    assert_close(out[0, 2], sinusoidal_table(8, 8)[7], rtol=0, atol=0)


def test_buffer_not_persistent_and_survives_half_cast() -> None:
    pe = SinusoidalPositionalEncoding(8, max_len=32)
    assert "table" not in pe.state_dict()
    pe = pe.to(torch.bfloat16)
    assert pe.table.dtype == torch.float32
    x = torch.randn(1, 20, 8).to(torch.bfloat16)
    out = pe(x)
    assert out.dtype == torch.bfloat16
    expected = (x.float() + sinusoidal_table(20, 8)).to(torch.bfloat16)
    assert torch.equal(out, expected)  # computed in fp32, cast once


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_output_dtype_follows_input(dtype: torch.dtype) -> None:
    pe = SinusoidalPositionalEncoding(6)
    x = torch.randn(2, 5, 6).to(dtype)
    out = pe(x)
    assert out.dtype == dtype
    exact = x.double() + torch.from_numpy(formula(list(range(5)), 6))
    tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-6, torch.float64: 1e-12}[
        dtype
    ]
    assert_close(out.double(), exact, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", of_family("additive"))
def test_half_precision_add_rounds_once(name: str, dtype: torch.dtype) -> None:
    """The one-pass add (no autograd) and the autograd path both equal x + pe computed in
    float32 and rounded once, bit for bit (1-D encodings at an offset; N-D ones on a grid)."""
    pe = posenc.build(name, dim=12)
    shape = {1: (3, 7, 12), 2: (3, 4, 5, 12), 3: (3, 2, 3, 4, 12)}[pe.axes]
    x = torch.randn(shape).to(dtype)
    positions = torch.arange(5, 12) if pe.axes == 1 else None
    table = pe(torch.zeros(shape[1:]).unsqueeze(0), positions)  # the encoding alone, float32
    with torch.no_grad():
        fast = pe(x, positions)
    slow = pe(x, positions)
    assert fast.dtype == dtype and slow.dtype == dtype
    assert torch.equal(fast, (x.float() + table).to(dtype))
    assert torch.equal(slow, fast)


def test_meta_device_then_materialise() -> None:
    meta = SinusoidalPositionalEncoding(8, max_len=16, device="meta")
    assert meta.table.device.type == "meta"
    out = meta(torch.zeros(1, 4, 8, device="meta"))
    assert out.shape == (1, 4, 8) and out.device.type == "meta"
    real = meta.to_empty(device="cpu")
    assert torch.equal(real.table, sinusoidal_table(16, 8))


def test_dropout_applies_in_training_only() -> None:
    pe = SinusoidalPositionalEncoding(8, dropout=0.5)
    x = torch.ones(4, 16, 8)
    assert (pe(x) == 0).any()
    pe.eval()
    assert torch.equal(pe(x), x + sinusoidal_table(16, 8))


def test_scaled_sinusoidal_matches_x_transformers() -> None:
    from x_transformers.x_transformers import ScaledSinusoidalEmbedding

    dim, n = 16, 12
    ours = ScaledSinusoidalPositionalEncoding(dim)
    theirs = ScaledSinusoidalEmbedding(dim)
    assert_close(ours.scale.detach().reshape(1), theirs.scale.detach())
    table = ours(torch.zeros(1, n, dim))[0]
    # x-transformers lays out [sin..., cos...]; ours interleaves sin, cos
    half = torch.cat([table[:, 0::2], table[:, 1::2]], dim=-1)
    assert_close(half, theirs(torch.zeros(1, n, dim)), rtol=0, atol=1e-6)
    # the gain is learned
    ours(torch.randn(1, n, dim)).sum().backward()
    assert ours.scale.grad is not None and ours.scale.grad != 0


NAN, INF = float("nan"), float("inf")
X = torch.randn(2, 5, 8)

MISUSE = [
    # tables
    Misuse("table-num-positions-float", lambda: sinusoidal_table(4.0, 8), TypeError,
           "num_positions", 4.0),
    Misuse("table-num-positions-negative", lambda: sinusoidal_table(-1, 4), ValueError,
           "num_positions", -1),
    Misuse("table-dim-zero", lambda: sinusoidal_table(10, 0), ValueError, "dim", 0),
    Misuse("table-dim-float", lambda: sinusoidal_table(10, 2.5), TypeError, "dim", 2.5),
    Misuse("table-dim-nan", lambda: sinusoidal_table(4, NAN), TypeError, "dim", NAN),
    Misuse("table-base-negative", lambda: sinusoidal_table(4, 4, base=-2.0), ValueError, "base",
           -2.0),
    Misuse("table-base-nan", lambda: sinusoidal_table(4, 8, base=NAN), ValueError, "base", NAN),
    Misuse("table-base-inf", lambda: sinusoidal_table(4, 8, base=INF), ValueError, "base", INF),
    Misuse("table-base-one", lambda: sinusoidal_table(4, 8, base=1.0), ValueError, "base", 1.0),
    Misuse("table-dtype-str", lambda: sinusoidal_table(4, 8, dtype="float32"), TypeError,
           "dtype", "float32"),
    Misuse("table-dtype-int", lambda: sinusoidal_table(4, 8, dtype=torch.int64), TypeError,
           "dtype", torch.int64),
    Misuse("table-size", lambda: sinusoidal_table(10**9, 64), MemoryBudgetError,
           "num_positions x dim", "1000000000 x 64"),
    Misuse("encode-positions-list", lambda: posenc.sinusoidal_encode([1, 2], 4), TypeError,
           "positions", "list"),
    Misuse("encode-dim-zero", lambda: posenc.sinusoidal_encode(torch.arange(3), 0), ValueError,
           "dim", 0),
    Misuse("encode-base-zero", lambda: posenc.sinusoidal_encode(torch.arange(3), 4, base=0.0),
           ValueError, "base", 0.0),
    Misuse("numpy-table-dim-zero", lambda: sinusoidal_table_np(3, 0), ValueError, "dim", 0),
    Misuse("nd-table-empty-shape", lambda: sinusoidal_nd_table((), 4), ValueError, "shape", ()),
    Misuse("nd-table-axis-zero", lambda: sinusoidal_nd_table((2, 0), 4), ValueError, "shape[1]",
           0),
    Misuse("nd-table-dim-zero", lambda: sinusoidal_nd_table((2, 2), 0), ValueError, "dim", 0),
    Misuse("nd-table-base-nan", lambda: sinusoidal_nd_table((2, 2), 4, base=NAN), ValueError,
           "base", NAN),
    Misuse("nd-table-size", lambda: sinusoidal_nd_table((10**5, 10**5), 8), MemoryBudgetError,
           "shape x dim", (100000, 100000)),
    # modules
    Misuse("dim-negative", lambda: SinusoidalPositionalEncoding(-3), ValueError, "dim", -3),
    Misuse("dim-str", lambda: SinusoidalPositionalEncoding("8"), TypeError, "dim", "8"),
    Misuse("dim-bool", lambda: SinusoidalPositionalEncoding(True), TypeError, "dim", True),
    Misuse("max-len-zero", lambda: SinusoidalPositionalEncoding(8, max_len=0), ValueError,
           "max_len", 0),
    Misuse("dropout-nan", lambda: SinusoidalPositionalEncoding(8, dropout=NAN), ValueError,
           "dropout", NAN),
    Misuse("dropout-one", lambda: SinusoidalPositionalEncoding(8, dropout=1.0), ValueError,
           "dropout", 1.0),
    Misuse("dropout-above-one", lambda: SinusoidalPositionalEncoding(8, dropout=1.5), ValueError,
           "dropout", 1.5),
    Misuse("size-dim", lambda: SinusoidalPositionalEncoding(10**9), MemoryBudgetError,
           "max_len x dim", "2048 x 1000000000"),
    Misuse("size-max-len", lambda: SinusoidalPositionalEncoding(64, max_len=10**9),
           MemoryBudgetError, "max_len x dim", "1000000000 x 64"),
    Misuse("scaled-dim-zero", lambda: ScaledSinusoidalPositionalEncoding(0), ValueError, "dim",
           0),
    Misuse("2d-flat-without-positions", lambda: Sinusoidal2DPositionalEncoding(8)(X),
           ValueError, "positions", MISSING),
    Misuse("2d-positions-shape", lambda: Sinusoidal2DPositionalEncoding(8)(X, torch.zeros(5, 3)),
           ValueError, "positions", (5, 3)),
    Misuse("2d-positions-nan",
           lambda: Sinusoidal2DPositionalEncoding(8)(X, torch.full((5, 2), NAN)), ValueError,
           "positions", NAN),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse_names_the_argument_and_the_value(case: Misuse) -> None:
    check(case)


def test_registry_builds_sinusoidal() -> None:
    pe = posenc.build("sinusoidal", dim=8, max_len=16)
    assert isinstance(pe, SinusoidalPositionalEncoding) and pe.family == "additive"
