"""The public rotary modules with ``POSENC_ROTARY_KERNEL=triton``, against the float64 formula:
every call below must reach the Triton kernel (a spy counts its launches) and give the
formula's numbers.

Like ``interpreted_triton.py``, not collected by the suite's own run: ``test_triton_kernel.py``
runs it in a subprocess with ``TRITON_INTERPRET=1`` (CPU tensors); on a GPU machine run it
as is and the kernel runs compiled on CUDA tensors. The factors are covered pairwise
(``interpreted_triton.covering_design``).

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim, ``r`` rotary dim.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import pytest
import torch
from torch import Tensor

import posenc
from posenc.encodings import checks
from posenc.encodings.rotary.kernels import triton_launch
from posenc.encodings.rotary.kernels.rotate import rotate_reference

from . import interpreted_triton as kernel_cases
from .interpreted_triton import DEVICE, assert_close_to

B, HQ, HK, N, D = 2, 4, 2, 6, 16

#: Each factor a public call varies and its levels.
FACTORS: dict[str, tuple] = {
    # RoPE; with YaRN's attention factor; partial; clockwise; xPos (q and k by their own tables)
    "module": ("rope", "yarn", "partial", "clockwise", "xpos"),
    "interleaved": (False, True),
    "dtype": (torch.float32, torch.bfloat16, torch.float16),
    "inplace": (False, True),
    # default arange; an offset chunk (n,); per-row (b, n) (packing, left padding); a decode
    # step (one token at a far position)
    "positions": ("default", "offset", "per_row", "decode"),
    "view": ("contiguous", "fused_qkv"),
    "grad": (False, True),
}


def _design() -> list[tuple]:
    saved = kernel_cases.FACTORS
    kernel_cases.FACTORS = FACTORS
    try:
        return kernel_cases.covering_design()
    finally:
        kernel_cases.FACTORS = saved


DESIGN = _design()


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """``POSENC_ROTARY_KERNEL=triton``, and the number of Triton launches so far."""
    seen: list[int] = []
    launch = triton_launch.launch

    def counted(*args: object, **kwargs: object) -> None:
        seen.append(1)
        launch(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(triton_launch, "launch", counted)
    monkeypatch.setenv("POSENC_ROTARY_KERNEL", "triton")
    yield seen


def test_the_design_covers_every_pair() -> None:
    pairs = kernel_cases._pairs
    every = set().union(*map(pairs, itertools.product(*FACTORS.values())))
    assert set().union(*map(pairs, DESIGN)) == every


def _module(name: str, interleaved: bool) -> torch.nn.Module:
    if name == "xpos":
        return posenc.XPos(D, interleaved=interleaved)
    options: dict = {"interleaved": interleaved}
    if name == "yarn":
        options["scaling"] = {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 16,
        }
        options["max_position_embeddings"] = 64
    elif name == "partial":
        options["rotary_dim"] = D // 2
    elif name == "clockwise":
        options["clockwise"] = True
    return posenc.RotaryEmbedding(D, **options).to(DEVICE)


def _positions(kind: str, n: int) -> Tensor | None:
    if kind == "default":
        return None
    if kind == "offset":
        return torch.arange(9, 9 + n, device=DEVICE)
    if kind == "per_row":  # left padding in row 0, a packed second document in row 1
        return torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 0, 1, 2]], device=DEVICE)[:, :n]
    return torch.tensor([41], device=DEVICE)  # decode


def _reference(module: torch.nn.Module, x: Tensor, positions: Tensor | None, key: bool) -> Tensor:
    """Eq. 34 in float64 with the module's own float64 tables (no kernel: the formula)."""
    n = x.shape[2]
    if isinstance(module, posenc.XPos):
        pos = torch.arange(n, device=DEVICE) if positions is None else positions
        cos, sin = module.scaled_cos_sin(pos, torch.float64, key=key)
    else:
        cos, sin = module.cos_sin(positions, n, dtype=torch.float64)
    return rotate_reference(x.double(), cos, sin, interleaved=module.interleaved)


@pytest.mark.parametrize("levels", DESIGN, ids=lambda c: "-".join(map(str, c)))
def test_the_module_on_the_kernel_is_the_formula(
    levels: tuple, launches: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    case = dict(zip(FACTORS, levels, strict=True))
    dtype, n = case["dtype"], 1 if case["positions"] == "decode" else N
    module = _module(case["module"], case["interleaved"])
    positions = _positions(case["positions"], n)
    if case["view"] == "fused_qkv":  # (b, n, heads of q, k and v, d) from one projection
        fused = torch.randn(B, n, HQ + 2 * HK, D, device=DEVICE).to(dtype)
        q, k = fused[:, :, :HQ].transpose(1, 2), fused[:, :, HQ : HQ + HK].transpose(1, 2)
    else:
        q = torch.randn(B, HQ, n, D, device=DEVICE).to(dtype)
        k = torch.randn(B, HK, n, D, device=DEVICE).to(dtype)
    with monkeypatch.context() as m:  # the references take the formula
        m.delenv("POSENC_ROTARY_KERNEL")
        want_q = _reference(module, q, positions, key=False)
        want_k = _reference(module, k, positions, key=True)
    if case["grad"]:  # a leaf that requires grad, turned through one autograd node
        q_leaf, k_leaf = q.detach().requires_grad_(), k.detach().requires_grad_()
        q, k = q_leaf * 1, k_leaf * 1
    got_q, got_k = module(q, k, positions, inplace=case["inplace"])
    assert launches, "the Triton kernel did not run"
    assert_close_to(got_q.detach(), want_q)
    assert_close_to(got_k.detach(), want_k)
    if case["inplace"]:
        assert got_q is q and got_k is k
    if case["grad"]:  # the backward turns the gradient back: grad of <rot(q), g> is rot^T g
        g_q, g_k = torch.randn_like(want_q), torch.randn_like(want_k)
        count = len(launches)
        ((got_q * g_q.to(dtype)).sum() + (got_k * g_k.to(dtype)).sum()).backward()
        assert len(launches) > count, "the backward did not run the Triton kernel"
        for leaf, g, key in ((q_leaf, g_q, False), (k_leaf, g_k, True)):
            x64 = leaf.detach().double().requires_grad_()
            with monkeypatch.context() as m:
                m.delenv("POSENC_ROTARY_KERNEL")
                (_reference(module, x64, positions, key) * g.to(dtype).double()).sum().backward()
            assert leaf.grad is not None and x64.grad is not None
            assert_close_to(leaf.grad, x64.grad)


@pytest.mark.parametrize("positions", [None, "decode"])
def test_in_place_refuses_q_and_k_that_share_memory(
    launches: list[int], positions: str | None
) -> None:
    """On the kernel as on the others: partly overlapping views refused by name before any
    launch, nothing written."""
    rope = posenc.RotaryEmbedding(8).to(DEVICE)
    at = None if positions is None else torch.tensor([41], device=DEVICE)
    buf = torch.randn(1, 2, 1 if at is not None else 5, 16, device=DEVICE)
    before = buf.clone()
    with pytest.raises(posenc.PosencValueError, match="q and k share memory"):
        rope(buf[..., :8], buf[..., 4:12], at, inplace=True)
    assert not launches and torch.equal(buf, before)
    want = rope(buf[..., :8], buf[..., 8:], at)
    got = rope(buf[..., :8], buf[..., 8:], at, inplace=True)
    assert launches and got[0].data_ptr() == buf.data_ptr()
    assert_close_to(torch.cat(got, -1), torch.cat(want, -1).double())


@pytest.mark.parametrize("inplace", [False, True])
def test_the_functional_forms_on_the_kernel(launches: list[int], inplace: bool) -> None:
    x = torch.randn(B, N, HQ, D, device=DEVICE, dtype=torch.bfloat16)  # heads-last
    angles = torch.rand(N, 1, D // 2, device=DEVICE, dtype=torch.float64) * 9
    cos, sin = angles.cos(), angles.sin()
    want = rotate_reference(x.double(), cos, sin)
    apply = posenc.apply_rotary_ if inplace else posenc.apply_rotary
    got = apply(x, cos.float(), sin.float())
    assert launches and (got is x) == inplace
    assert_close_to(got, want)


def test_axial_rotation_on_the_kernel(launches: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    rope = posenc.Rotary2DEmbedding(D).to(DEVICE)
    q = torch.randn(1, 2, 6, D, device=DEVICE)
    k = torch.randn(1, 2, 6, D, device=DEVICE)
    coords = torch.tensor([[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]], device=DEVICE)
    got_q, got_k = rope(q, k, coords)
    assert launches
    with monkeypatch.context() as m:
        m.delenv("POSENC_ROTARY_KERNEL")
        cos, sin = rope.cos_sin(coords, torch.float64)
    assert_close_to(got_q, rotate_reference(q.double(), cos, sin, interleaved=rope.interleaved))
    assert_close_to(got_k, rotate_reference(k.double(), cos, sin, interleaved=rope.interleaved))


@pytest.mark.parametrize("inplace", [False, True])
def test_compiled_calls_keep_the_kernel(
    launches: list[int], monkeypatch: pytest.MonkeyPatch, inplace: bool
) -> None:
    """Under ``torch.compile`` the rotation is one custom operator running the Triton kernel
    (chosen when the graph is traced): out of place with its autograd formula (compiled
    training keeps the kernel, forward and backward), in place without grad."""
    torch._dynamo.reset()
    rope = posenc.RotaryEmbedding(D).to(DEVICE)
    q = torch.randn(B, HQ, N, D, device=DEVICE)
    k = torch.randn(B, HK, N, D, device=DEVICE)
    positions = torch.arange(3, 3 + N, device=DEVICE)
    with monkeypatch.context() as m:
        m.delenv("POSENC_ROTARY_KERNEL")
        want = [_reference(rope, x, positions, key=False) for x in (q, k)]
    compiled = torch.compile(
        lambda q, k: rope(q, k, positions, inplace=inplace), backend="aot_eager", fullgraph=True
    )
    if inplace:
        with torch.no_grad():
            got = compiled(q, k)
        assert launches and got[0].data_ptr() == q.data_ptr()
        for g, w in zip(got, want, strict=True):
            assert_close_to(g, w)
        return
    q_leaf, k_leaf = q.clone().requires_grad_(), k.clone().requires_grad_()
    got = compiled(q_leaf, k_leaf)
    forward = len(launches)
    assert forward
    for g, w in zip(got, want, strict=True):
        assert_close_to(g.detach(), w)
    g_q, g_k = torch.randn_like(q), torch.randn_like(k)
    ((got[0] * g_q).sum() + (got[1] * g_k).sum()).backward()
    assert len(launches) > forward  # the backward is the kernel turning the other way
    with monkeypatch.context() as m:
        m.delenv("POSENC_ROTARY_KERNEL")
        cos, sin = rope.cos_sin(positions, N, dtype=torch.float64)
    for leaf, g in ((q_leaf, g_q), (k_leaf, g_k)):
        back = rotate_reference(g.double(), cos, -sin)  # rot^T g
        assert leaf.grad is not None
        assert_close_to(leaf.grad, back)


@pytest.mark.parametrize("positions", ["default", "per_row"])
def test_training_is_one_launch_each_way(
    launches: list[int], monkeypatch: pytest.MonkeyPatch, positions: str
) -> None:
    """Under autograd q and k are one node: one launch forward (rows of the whole table,
    by a run or by positions read on the device) and one backward (the kernel clockwise),
    with the formula's gradients."""
    rope = posenc.RotaryEmbedding(D).to(DEVICE)
    q = torch.randn(B, HQ, N, D, device=DEVICE, requires_grad=True)
    k = torch.randn(B, HK, N, D, device=DEVICE, requires_grad=True)
    pos = _positions(positions, N)
    got_q, got_k = rope(q, k, pos)
    assert len(launches) == 1 and got_q.grad_fn is got_k.grad_fn
    g_q, g_k = torch.randn_like(got_q), torch.randn_like(got_k)
    ((got_q * g_q).sum() + (got_k * g_k).sum()).backward()
    assert len(launches) == 2
    with monkeypatch.context() as m:
        m.delenv("POSENC_ROTARY_KERNEL")
        cos, sin = rope.cos_sin(pos, N, dtype=torch.float64)
    for leaf, g in ((q, g_q), (k, g_k)):
        assert leaf.grad is not None
        assert_close_to(leaf.grad, rotate_reference(g.double(), cos, -sin))


def test_per_row_positions_index_the_whole_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positions that are not one run (packing, left padding) reach the kernel as positions
    over the module's whole cached table, in one launch for q and k: no gathered table."""
    seen: list[tuple] = []
    launch = triton_launch.launch

    def spy(q, out_q, k, out_k, cos, sin, positions, *rest):  # type: ignore[no-untyped-def]
        seen.append((k is not None, tuple(cos.shape), positions))
        launch(q, out_q, k, out_k, cos, sin, positions, *rest)

    monkeypatch.setattr(triton_launch, "launch", spy)
    monkeypatch.setenv("POSENC_ROTARY_KERNEL", "triton")
    rope = posenc.RotaryEmbedding(D).to(DEVICE)
    q = torch.randn(B, HQ, N, D, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(B, HK, N, D, device=DEVICE, dtype=torch.bfloat16)
    positions = _positions("per_row", N)
    got = rope(q, k, positions)
    assert len(seen) == 1
    pair, table_shape, given = seen[0]
    assert pair and table_shape == tuple(rope.cos_cached.shape) and given is positions
    with monkeypatch.context() as m:
        m.delenv("POSENC_ROTARY_KERNEL")
        for g, x, key in ((got[0], q, False), (got[1], k, True)):
            assert_close_to(g, _reference(rope, x, positions, key))


@pytest.mark.parametrize("grad", [False, True])
def test_unread_positions_are_indexed_by_the_kernel(
    launches: list[int], monkeypatch: pytest.MonkeyPatch, grad: bool
) -> None:
    """Positions a GPU keeps (not read on the host: ``CPU_IS_HOST`` cleared, as on CUDA)
    are indexed by the kernel in the whole table, one launch for q and k; a row outside the
    table turns by NaN, the others by the formula."""
    from posenc.encodings.rotary import tables

    monkeypatch.setattr(checks, "CPU_IS_HOST", False)
    monkeypatch.delenv(tables.CHECK_VARIABLE, raising=False)
    torch.manual_seed(7)
    rope = posenc.RotaryEmbedding(D).to(DEVICE)
    size = rope.initial_table_size
    positions = torch.tensor([[0, 5, size, 3, 2, 1], [7, 8, 9, -1, 11, 12]], device=DEVICE)
    q = torch.randn(B, HQ, N, D, device=DEVICE, requires_grad=grad)
    k = torch.randn(B, HK, N, D, device=DEVICE, requires_grad=grad)
    got_q, got_k = rope(q, k, positions)
    assert len(launches) == 1
    outside = (positions < 0) | (positions >= size)  # (b, n)
    inv = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angle = positions.double().cpu()[:, None, :, None] * inv  # (b, 1, n, d/2)
    for got, x in ((got_q, q), (got_k, k)):
        want = rotate_reference(x.detach().double().cpu(), angle.cos(), angle.sin())
        assert got[outside[:, None].expand(got.shape[:-1])].isnan().all()
        inside = ~outside[:, None, :, None].expand(got.shape).cpu()
        torch.testing.assert_close(
            got.detach().double().cpu()[inside], want[inside], atol=1e-5, rtol=0
        )
    if grad:  # the backward: the same kernel clockwise, one launch
        (got_q[~outside[:, None].expand(got_q.shape[:-1])].sum()).backward()
        assert len(launches) == 2 and q.grad is not None


def _per_head_formula(x: Tensor, rows: Sequence[float | None], positions: Tensor) -> Tensor:
    """Eq. 34 in float64 on the CPU, head ``j`` of ``x`` by base ``rows[j]`` (``None``:
    untouched); differentiable in ``x``."""
    outs = []
    for j, base in enumerate(rows):
        head = x[:, j].double().cpu()
        if base is not None:
            inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
            angle = positions.double().cpu()[:, :, None] * inv  # (b, n, d/2)
            head = rotate_reference(head, angle.cos(), angle.sin())
        outs.append(head)
    return torch.stack(outs, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inplace", [False, True])
def test_per_head_tables_and_some_heads_on_the_kernel(
    launches: list[int], dtype: torch.dtype, inplace: bool
) -> None:
    """Frequencies per key head (``base=[...]``; query head i reads row i // 2), and the
    first two of four query heads alone (``rotary_heads=2``: key head 0 of 2): the kernel
    reads the tables' head axis by stride and turns head slices where they lie; the
    backward (out of place) too."""
    torch.manual_seed(8)
    short, long = 10.0, 1e4
    some = posenc.RotaryEmbedding(D, base=short, rotary_heads=2).to(DEVICE)
    per_head = posenc.RotaryEmbedding(D, base=[short, long]).to(DEVICE)
    positions = torch.tensor([[3, 4, 5, 6, 7, 8], [0, 1, 2, 0, 1, 2]], device=DEVICE)
    q0 = torch.randn(B, HQ, N, D, device=DEVICE).to(dtype)
    k0 = torch.randn(B, HK, N, D, device=DEVICE).to(dtype)
    cases = (
        (some, [short, short, None, None], [short, None]),
        (per_head, [short, short, long, long], [short, long]),
    )
    for module, q_rows, k_rows in cases:
        got_q, got_k = module(q0.clone(), k0.clone(), positions, inplace=inplace)
        assert launches
        assert_close_to(got_q, _per_head_formula(q0, q_rows, positions))
        assert_close_to(got_k, _per_head_formula(k0, k_rows, positions))
        if inplace:
            continue
        q_leaf, k_leaf = q0.clone().requires_grad_(), k0.clone().requires_grad_()
        got_q, got_k = module(q_leaf * 1, k_leaf * 1, positions)
        g_q, g_k = torch.randn_like(got_q), torch.randn_like(got_k)
        count = len(launches)
        ((got_q * g_q).sum() + (got_k * g_k).sum()).backward()
        assert len(launches) > count, "the backward did not run the Triton kernel"
        for leaf, g, rows in ((q_leaf, g_q, q_rows), (k_leaf, g_k, k_rows)):
            x64 = leaf.detach().double().requires_grad_()
            (_per_head_formula(x64, rows, positions) * g.double().cpu()).sum().backward()
            assert leaf.grad is not None and x64.grad is not None
            assert_close_to(leaf.grad, x64.grad)
