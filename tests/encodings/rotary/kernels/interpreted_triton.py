"""The Triton rotary kernel against the float64 formula, on every factor it takes.

Not collected by the suite's own run (its name is not ``test_*``): Triton's interpreter is
chosen when a kernel is decorated, so ``TRITON_INTERPRET=1`` must be set before
:mod:`posenc.encodings.rotary.kernels.triton_kernel` is imported, and only for these tests.
``test_triton_kernel.py`` runs this file in a subprocess with it set (CPU tensors); on a GPU
machine run it as is, without the variable, and the kernel runs compiled on CUDA tensors:

    PYTHONPATH=src python -m pytest -n 0 -q tests/encodings/rotary/kernels/interpreted_triton.py

The interpreter runs programs one at a time (a few ms each), so the factors are covered by a
pairwise covering design (every pair of levels of any two factors in some case, checked by
:func:`test_the_design_covers_every_pair`) on small shapes, not by their full product.
Tolerances: float32 within 4e-6 of the scale; bfloat16 and float16 within one unit in the
last place (the interpreter rounds those casts toward zero, a GPU to nearest).

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim, ``r`` rotary dim.
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch
from torch import Tensor

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRET and not torch.cuda.is_available():
    pytest.skip("needs TRITON_INTERPRET=1 (CPU) or a CUDA device", allow_module_level=True)

from posenc.encodings.rotary.kernels.rotate import rotate_reference  # noqa: E402
from posenc.encodings.rotary.kernels.triton_launch import (  # noqa: E402 (after the env check)
    launch_one,
    launch_pair,
)
from posenc.errors import PosencTypeError, PosencValueError  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"
B, HQ, HK, N, D = 2, 3, 1, 5, 8
ROWS = 24  # rows of a whole table indexed by positions

#: Each factor the kernel takes and its levels.
FACTORS: dict[str, tuple] = {
    "interleaved": (False, True),
    "dtype": (torch.float32, torch.bfloat16, torch.float16),
    "inplace": (False, True),
    # how the tables reach the rows: broadcast (n, r/2); gathered per batch (b, 1, n, r/2);
    # heads-last x (b, n, h, d) with (n, 1, r/2); whole tables indexed by positions (n,)
    # (an offset), (b, n) (per-row: packing, left padding), (b, n, 1) heads-last
    "tables": ("rows", "batch", "heads_last", "offset", "per_row", "per_row_heads_last"),
    "partial": (False, True),
    "clockwise": (False, True),
    "view": ("contiguous", "fused_qkv", "channel_stride"),
    "pair": (False, True),
}


def _pairs(case: tuple) -> set:
    return {(i, case[i], j, case[j]) for i, j in itertools.combinations(range(len(case)), 2)}


def covering_design() -> list[tuple]:
    """Cases (one level per factor) covering every pair of levels of any two factors: greedy,
    each step the case of the full product that covers most pairs not yet covered, the first
    such in product order (deterministic)."""
    candidates = list(itertools.product(*FACTORS.values()))
    uncovered = set().union(*map(_pairs, candidates))
    chosen = []
    while uncovered:
        best = max(candidates, key=lambda c: len(_pairs(c) & uncovered))
        chosen.append(best)
        uncovered -= _pairs(best)
    return chosen


DESIGN = covering_design()


def test_the_design_covers_every_pair() -> None:
    every = set().union(*map(_pairs, itertools.product(*FACTORS.values())))
    assert set().union(*map(_pairs, DESIGN)) == every
    assert len(DESIGN) <= 40  # about 30 s under the interpreter


def _ulp(ref: Tensor, dtype: torch.dtype) -> Tensor:
    """One unit in the last place of ``dtype`` at the float64 values ``ref``."""
    fraction_bits = {torch.bfloat16: 7, torch.float16: 10}[dtype]
    _, exponent = torch.frexp(ref)
    return torch.ldexp(torch.ones_like(ref), exponent - 1 - fraction_bits)


def assert_close_to(got: Tensor, ref: Tensor) -> None:
    """``got`` (any dtype) within float32's 4e-6 of the scale, or one ulp, of ``ref``."""
    assert got.shape == ref.shape
    got64, ref = got.double().cpu(), ref.cpu()
    assert torch.isfinite(got64).all()
    if got.dtype is torch.float32:
        assert (got64 - ref).abs().max() <= 4e-6 * max(1.0, ref.abs().max().item())
    else:
        assert ((got64 - ref).abs() <= _ulp(ref, got.dtype)).all()


def _make(case: dict, heads: int, fused: Tensor | None, at: int) -> Tensor:
    """A rotated tensor ``(b, h, n, d)`` (heads-last ``(b, n, h, d)``) as the case views it."""
    dtype, heads_last = case["dtype"], case["tables"].endswith("heads_last")
    if case["view"] == "fused_qkv":
        assert fused is not None  # (b, n, heads of q, k and v, d)
        x = fused[:, :, at : at + heads]
        return x if heads_last else x.transpose(1, 2)
    shape = (B, N, heads, D) if heads_last else (B, heads, N, D)
    if case["view"] == "channel_stride":
        return torch.randn(*shape, 2 * D, device=DEVICE).to(dtype)[..., 0, ::2]
    return torch.randn(shape, device=DEVICE).to(dtype)


def _tables(case: dict, r: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor]:
    """The kernel's ``cos, sin, positions`` and the float64 cos and sin each row turns by
    (broadcasting against ``x.shape[:-1]``)."""
    half, mode = r // 2, case["tables"]
    if mode in ("offset", "per_row", "per_row_heads_last"):
        angles = torch.rand(ROWS, half, dtype=torch.float64, device=DEVICE) * 40
        cos, sin = angles.cos().float(), angles.sin().float()
        if mode == "offset":  # a chunk after a cache: positions 17, 18, ...
            positions = torch.arange(17, 17 + N, device=DEVICE)
            index = positions
        else:  # per row: e.g. packed documents or left padding
            positions = torch.randint(0, ROWS, (B, N), device=DEVICE, dtype=torch.int32)
            index = positions[:, None] if mode == "per_row" else positions[..., None]
            if mode == "per_row_heads_last":
                positions = positions[..., None]  # (b, n, 1)
        return cos, sin, positions, cos.double()[index.long()], sin.double()[index.long()]
    lead = {"rows": (N,), "batch": (B, 1, N), "heads_last": (N, 1)}[mode]
    angles = torch.rand(*lead, half, dtype=torch.float64, device=DEVICE) * 40
    cos, sin = angles.cos().float(), angles.sin().float()
    return cos, sin, None, cos.double(), sin.double()


@pytest.mark.parametrize("levels", DESIGN, ids=lambda c: "-".join(map(str, c)))
def test_the_kernel_is_the_formula(levels: tuple) -> None:
    case = dict(zip(FACTORS, levels, strict=True))
    r = D // 2 if case["partial"] else D
    heads_k = (HQ if case["tables"].endswith("heads_last") else HK) if case["pair"] else 0
    fused = None
    if case["view"] == "fused_qkv":  # one projection holding q, k and v
        fused = torch.randn(B, N, HQ + 2 * heads_k, D, device=DEVICE).to(case["dtype"])
        before = fused.clone()
    q = _make(case, HQ, fused, 0)
    k = _make(case, heads_k, fused, HQ) if case["pair"] else None
    cos, sin, positions, cos64, sin64 = _tables(case, r)
    sign = -1.0 if case["clockwise"] else 1.0
    refs = [
        rotate_reference(t.double(), cos64, sign * sin64, interleaved=case["interleaved"])
        for t in ([q] if k is None else [q, k])
    ]
    originals = [t.clone() for t in ([q] if k is None else [q, k])]
    options = {
        "positions": positions,
        "interleaved": case["interleaved"],
        "clockwise": case["clockwise"],
    }
    if k is None:
        got = [launch_one(q, cos, sin, out=q if case["inplace"] else None, **options)]
    else:
        outs = {"out_q": q, "out_k": k} if case["inplace"] else {}
        got = list(launch_pair(q, k, cos, sin, **outs, **options))
    for out, ref, x, original in zip(got, refs, [q, k], originals, strict=False):
        assert_close_to(out, ref)
        assert torch.equal(out[..., r:], original[..., r:])  # channels past r pass through
        if case["inplace"]:
            assert out is x
        else:
            assert out.is_contiguous() and torch.equal(x, original)  # x untouched
    if fused is not None:  # in place, nothing else of the projection changed (v above all)
        kept = before[:, :, HQ + heads_k :]
        assert torch.equal(fused[:, :, HQ + heads_k :], kept)
        if not case["inplace"]:
            assert torch.equal(fused, before)


def test_clockwise_undoes_the_turn() -> None:
    """The backward is the same kernel turning the other way: it undoes the forward (the
    design above checks each direction against the formula in every dtype)."""
    x = torch.randn(1, 2, 6, 8, device=DEVICE)
    angles = torch.rand(6, 4, device=DEVICE) * 6
    cos, sin = angles.cos(), angles.sin()
    for interleaved in (False, True):
        there = launch_one(x, cos, sin, interleaved=interleaved)
        back = launch_one(there, cos, sin, interleaved=interleaved, clockwise=True)
        assert_close_to(back, x.double())


def test_positions_outside_the_table_are_an_error_never_a_wrong_row() -> None:
    x = torch.randn(1, 1, 3, 4, device=DEVICE)
    cos = torch.ones(8, 2, device=DEVICE)
    for bad in (torch.tensor([0, 8, 1]), torch.tensor([0, -1, 1])):
        with pytest.raises(PosencValueError, match=r"positions must lie in \[0, 8\)"):
            launch_one(x, cos, cos, positions=bad.to(DEVICE))
    # the caller vouched for the bounds and was wrong: that row is NaN, the others right
    got = launch_one(x, cos, cos, positions=torch.tensor([0, 8, 1], device=DEVICE), checked=True)
    assert got[0, 0, 1].isnan().all() and not got[0, 0, [0, 2]].isnan().any()


def test_bad_arguments_are_named() -> None:
    q = torch.randn(1, 2, 3, 4, device=DEVICE)
    cos = torch.ones(3, 2, device=DEVICE)
    with pytest.raises(PosencValueError, match="q and k must share"):
        launch_pair(q, q[:, :, :2].to(torch.bfloat16), cos, cos)
    with pytest.raises(PosencValueError, match="does not broadcast"):
        launch_one(q, torch.ones(4, 2, device=DEVICE), torch.ones(4, 2, device=DEVICE))
    with pytest.raises(PosencValueError, match="pairs and one shape"):
        launch_one(q, cos, torch.ones(3, 1, device=DEVICE))
    with pytest.raises(PosencTypeError, match="int64 or int32"):
        launch_one(q, cos, cos, positions=torch.zeros(3, device=DEVICE))
    with pytest.raises(PosencValueError, match="1 to 4 dims"):
        launch_one(q[None], cos, cos)
    with pytest.raises(PosencValueError, match="out must match"):
        launch_one(q, cos, cos, out=q[0])


def test_in_place_pair_refuses_q_and_k_that_share_memory() -> None:
    """Views sharing some elements (not their first) would turn those twice: refused, nothing
    written; the halves of one buffer share bytes but no element, and rotate as apart."""
    buf = torch.randn(1, 2, 5, 16, device=DEVICE)
    before, cos = buf.clone(), torch.full((5, 4), 0.6, device=DEVICE)
    q, k = buf[..., :8], buf[..., 4:12]
    with pytest.raises(PosencValueError, match="q and k's outputs share memory"):
        launch_pair(q, k, cos, cos + 0.2, out_q=q, out_k=k)
    assert torch.equal(buf, before)
    want = launch_pair(buf[..., :8], buf[..., 8:], cos, cos + 0.2)
    launch_pair(buf[..., :8], buf[..., 8:], cos, cos + 0.2, out_q=buf[..., :8],
                       out_k=buf[..., 8:])  # fmt: skip
    assert torch.equal(buf, torch.cat(want, -1))


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("positioned", [False, True])
def test_many_programs_and_unpadded_widths(interleaved: bool, positioned: bool) -> None:
    """What the design's small shapes never launch: several programs along the rows
    (``n > BLOCK_N``) and along the heads (more than ``HEADS_PER_PROGRAM`` query heads, and
    key groups after them), pairs and kept channels that are not powers of two (the masks
    at ``HALF < BLOCK_HALF`` and ``REST < BLOCK_REST``), out of place and in place."""
    from posenc.encodings.rotary.kernels.triton_kernel import HEADS_PER_PROGRAM, TILE_ELEMENTS

    b, hq, hk, n, d, r = 2, HEADS_PER_PROGRAM + 2, HEADS_PER_PROGRAM + 1, 40, 100, 80
    assert n > TILE_ELEMENTS // 64  # BLOCK_HALF = 64 for r/2 = 40 pairs: 3 row programs
    q = torch.randn(b, hq, n, d, device=DEVICE)
    k = torch.randn(b, hk, n, d, device=DEVICE)
    if positioned:  # whole tables, rows read per batch on the device
        angles = torch.rand(3 * n, r // 2, dtype=torch.float64, device=DEVICE) * 40
        positions = torch.randint(0, 3 * n, (b, n), device=DEVICE)
        cos64, sin64 = angles.cos()[positions[:, None]], angles.sin()[positions[:, None]]
    else:
        angles = torch.rand(n, r // 2, dtype=torch.float64, device=DEVICE) * 40
        positions, cos64, sin64 = None, angles.cos(), angles.sin()
    cos, sin = angles.cos().float(), angles.sin().float()
    refs = [rotate_reference(t.double(), cos64, sin64, interleaved=interleaved) for t in (q, k)]
    options = {"positions": positions, "interleaved": interleaved}
    got = launch_pair(q, k, cos, sin, **options)
    for out, ref, x in zip(got, refs, (q, k), strict=True):
        assert_close_to(out, ref)
        assert torch.equal(out[..., r:], x[..., r:])
    launch_pair(q, k, cos, sin, out_q=q, out_k=k, **options)
    for x, out in zip((q, k), got, strict=True):
        assert torch.equal(x, out)  # in place: the same numbers


@pytest.mark.parametrize("d", [80, 112])
@pytest.mark.parametrize("interleaved", [False, True])
def test_head_sizes_80_and_112(d: int, interleaved: bool) -> None:
    """Widths that are not powers of two, now constants of the compiled kernel (40 and 56
    pairs in 64 lanes): a pair of grouped heads against the formula, and a partial rotation
    (r = d - 16) whose last channels pass through."""
    q = torch.randn(1, 3, 2, d, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(1, 1, 2, d, device=DEVICE, dtype=torch.bfloat16)
    for r in (d, d - 16):
        angles = torch.rand(2, r // 2, dtype=torch.float64, device=DEVICE) * 40
        cos64, sin64 = angles.cos(), angles.sin()
        got = launch_pair(q, k, cos64.float(), sin64.float(), interleaved=interleaved)
        for out, x in zip(got, (q, k), strict=True):
            assert_close_to(
                out, rotate_reference(x.double(), cos64, sin64, interleaved=interleaved)
            )
            assert torch.equal(out[..., r:], x[..., r:])


def test_the_compile_operator_runs_eagerly_with_its_gradient() -> None:
    """``posenc::rotary_pair_triton`` called eagerly launches the kernel (its values the
    formula's) and its autograd is the same operator turning the gradients back."""
    from posenc.encodings.rotary.kernels.triton_op import rotary_pair_op

    q = torch.randn(2, 4, 3, 8, device=DEVICE, requires_grad=True)
    k = torch.randn(2, 2, 3, 8, device=DEVICE, requires_grad=True)
    angles = torch.rand(3, 4, dtype=torch.float64, device=DEVICE) * 40
    cos64, sin64 = angles.cos(), angles.sin()
    got_q, got_k = rotary_pair_op(q, k, cos64.float(), sin64.float(), True, False)
    for out, x in ((got_q, q), (got_k, k)):
        assert_close_to(out.detach(), rotate_reference(x.double(), cos64, sin64, interleaved=True))
    g_q, g_k = torch.randn_like(got_q), torch.randn_like(got_k)
    ((got_q * g_q).sum() + (got_k * g_k).sum()).backward()
    for leaf, g in ((q, g_q), (k, g_k)):
        assert leaf.grad is not None
        assert_close_to(leaf.grad, rotate_reference(g.double(), cos64, -sin64, interleaved=True))
