"""The rotary arithmetic (``posenc.encodings.rotary.kernels.rotate``): the fast path against eq. 34
written as a float64 matrix product, in place against out of place on every layout, dtype, partial
rotation, table shape and strided view, gradients through the in-place path, the cases where
rotating in place must refuse (that no compiler is ever invoked: test_rotate_no_compiler.py)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc import PosencTypeError, PosencValueError, apply_rotary, apply_rotary_
from posenc.encodings.rotary.kernels import native, pytorch, rotate

# --------------------------------------------------------------------------- reference


def rotation_matrix(
    cos: torch.Tensor, sin: torch.Tensor, d: int, *, interleaved: bool
) -> torch.Tensor:
    """RoFormer eq. 15's block-diagonal ``R`` (``d x d`` per row of the tables), float64:
    pair ``i`` is ``(2i, 2i+1)`` or ``(i, i + r/2)``; channels from ``r`` on are identity."""
    cos, sin = cos.double(), sin.double()
    half = cos.shape[-1]
    eye = torch.eye(d, dtype=torch.float64)
    R = eye.expand(*cos.shape[:-1], d, d).clone()
    for i in range(half):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
        c, s = cos[..., i], sin[..., i]
        R[..., a, a], R[..., a, b], R[..., b, a], R[..., b, b] = c, -s, s, c
    return R


def reference(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool
) -> torch.Tensor:
    """``R x`` per row in float64; ``cos``/``sin`` ``(..., n, r/2)`` broadcast against
    ``x.shape[:-1]``."""
    R = rotation_matrix(cos, sin, x.shape[-1], interleaved=interleaved)
    return (R @ x.double().unsqueeze(-1)).squeeze(-1)


def within_one_rounding(got: torch.Tensor, exact: torch.Tensor) -> bool:
    """Each value is the float32 result rounded once to ``got.dtype``: at most one unit in
    the last place of that dtype from the exact value (plus float32's own error)."""
    eps = torch.finfo(got.dtype).eps
    bound = eps * exact.abs() + 1e-6 * (1 + exact.abs())
    return bool(((got.double() - exact).abs() <= bound).all())


def check_close(got: torch.Tensor, exact: torch.Tensor) -> None:
    if got.dtype == torch.float64:
        assert_close(got, exact, rtol=1e-12, atol=1e-12)
    elif got.dtype == torch.float32:
        assert_close(got.double(), exact, rtol=1e-6, atol=1e-6)
    else:
        assert within_one_rounding(got, exact)


def make_x(layout: str, b: int, h: int, n: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    """``(b, h, n, d)`` as attention sees it: contiguous, a transposed heads-last tensor, q
    sliced from a fused qkv projection, or a slice starting at an odd offset."""
    if layout == "contiguous":
        return torch.randn(b, h, n, d).to(dtype)
    if layout == "transposed":
        return torch.randn(b, n, h, d).to(dtype).transpose(1, 2)
    if layout == "fused":
        return torch.randn(b, n, 3, h, d).to(dtype)[:, :, 1].transpose(1, 2)  # k of qkv
    assert layout == "odd-offset"
    return torch.randn(b, h, n, d + 1).to(dtype)[..., 1:]


LAYOUTS = ["contiguous", "transposed", "fused", "odd-offset"]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


@pytest.fixture(params=["native", "one-block", "many-blocks"])
def blocks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Run on each fast path: the native kernel (float32 and bfloat16 with contiguous
    channels; other tensors take the torch path), or the pure-torch path with the tensors as
    one block, or cut into blocks of 48 elements (several rows, the last block short)."""
    if request.param == "native":
        if native._native is None:
            pytest.skip("the native rotary kernel is not built here (no C compiler at install)")
        return False
    monkeypatch.setattr(native, "_native", None)
    if request.param == "many-blocks":
        monkeypatch.setattr(pytorch, "TILE_ELEMENTS", 48)
    return request.param == "many-blocks"


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_native_kernel_equals_the_formula_bit_for_bit(
    interleaved: bool, dtype: torch.dtype
) -> None:
    """Products rounded before the sum and one rounding to bfloat16, as the formula in torch
    operations: the kernel's results are identical to :func:`rotate_reference`'s, in place
    and out of place, in runs of rows that one dimension or several make; on one thread, and
    (above the kernel's 2**15 pairs) shared among torch's 2 and 3 OpenMP threads, whose
    shares start and end inside a run of rows (4,113 rows of runs of 1,371)."""
    if native._native is None:
        pytest.skip("the native rotary kernel is not built here (no C compiler at install)")
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    try:
        for shape, counts in (((2, 3, 5, 16), (1,)), ((1, 3, 1371, 16), (1, 2, 3))):
            for count in counts:
                torch.set_num_threads(count)
                x = make_x("fused", shape[0], shape[1], shape[2], shape[3], dtype)
                angles = torch.rand(shape[2], 8, dtype=torch.float64) * 1000
                cos, sin = angles.cos().float(), angles.sin().float()
                want = rotate.rotate_reference(x, cos, sin, interleaved=interleaved)
                out = torch.empty_like(x, memory_format=torch.contiguous_format)
                native._turn_c(x, out, cos, sin, interleaved)
                assert torch.equal(out, want)
                native._turn_c(x, x, cos, sin, interleaved)
                assert torch.equal(x, want)
    finally:
        torch.set_num_threads(threads)
    # the kernel's own entry point, in place, rows contiguous or strided by the fused layout
    for layout in ("contiguous", "fused"):
        x = make_x(layout, 2, 3, 37, 16, dtype)
        angles = torch.rand(37, 8, dtype=torch.float64) * 1000
        cos, sin = angles.cos().float(), angles.sin().float()
        want = rotate.rotate_reference(x, cos, sin, interleaved=interleaved)
        x_at = native._native_buffer(x, x.element_size())
        tables = native._kernel_tables(cos, sin, dtype is torch.bfloat16, interleaved)
        native._native(x_at, x_at, *tables)
        assert torch.equal(x, want)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_native_kernel_rounds_special_values_as_torch_does(
    interleaved: bool, dtype: torch.dtype
) -> None:
    """NaN, infinities, the largest finite values (whose products overflow), subnormals and
    halfway cases: the kernel writes what the formula in torch operations writes, bit for bit,
    and NaN where it has NaN."""
    if native._native is None:
        pytest.skip("the native rotary kernel is not built here (no C compiler at install)")
    info = torch.finfo(dtype)
    special = [float("nan"), float("inf"), -float("inf"), info.max, -info.max, info.tiny,
               info.tiny / 4, -0.0, 1 + info.eps / 2, 1 + 3 * info.eps / 2, 1.0, -3.5]  # fmt: skip
    torch.manual_seed(0)
    x = torch.tensor(special * 8, dtype=torch.float32).to(dtype)  # 96 values
    x = x[torch.randperm(x.numel())].view(3, 2, 16)
    angles = torch.rand(2, 8, dtype=torch.float64) * 1000
    cos, sin = angles.cos().float(), angles.sin().float()
    want = rotate.rotate_reference(x, cos, sin, interleaved=interleaved)
    for inplace in (False, True):
        out = x.clone() if inplace else torch.empty_like(x)
        native._turn_c(out if inplace else x, out, cos, sin, interleaved)
        nan = want.isnan()  # (torch itself writes bfloat16 NaN as 0x7fc0 or 0xffff)
        assert torch.equal(out.isnan(), nan)
        assert torch.equal(_bits(out[~nan]), _bits(want[~nan]))


# --------------------------------------------------------------------------- the formula


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("d, r", [(8, 8), (9, 4), (8, 2)])
def test_rotate_reference_is_the_rotation_matrix(interleaved: bool, d: int, r: int) -> None:
    x = torch.randn(2, 3, 5, d, dtype=torch.float64)
    angles = torch.rand(5, r // 2, dtype=torch.float64) * 50
    cos, sin = angles.cos(), angles.sin()
    got = rotate.rotate_reference(x, cos, sin, interleaved=interleaved)
    assert_close(got, reference(x, cos, sin, interleaved=interleaved), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("d, r", [(16, 16), (15, 6), (16, 8)])
@pytest.mark.parametrize("per_batch", [False, True])
def test_fast_path_in_and_out_of_place_match_the_formula(
    interleaved: bool,
    dtype: torch.dtype,
    layout: str,
    d: int,
    r: int,
    per_batch: bool,
    blocks: bool,
) -> None:
    """apply_rotary (a new tensor) and apply_rotary_ (in place) on every layout, dtype, odd
    and partial head dims, shared and per-batch tables, in one block or many: both within one
    rounding of eq. 34 in float64, equal to each other, channels past r untouched."""
    torch.manual_seed(0)
    b, h, n = 2, 3, 7
    x = make_x(layout, b, h, n, d, dtype)
    table_shape = (b, 1, n, r // 2) if per_batch else (n, r // 2)
    angles = torch.rand(table_shape, dtype=torch.float64) * 1000
    cos, sin = angles.cos().float(), angles.sin().float()
    exact = reference(x, cos, sin, interleaved=interleaved)
    before = x.clone()
    with torch.no_grad():
        out = apply_rotary(x, cos, sin, interleaved=interleaved)
        assert torch.equal(x, before)  # out of place leaves x alone
        same = apply_rotary_(x, cos, sin, interleaved=interleaved)
    assert same is x and out.dtype == dtype and out.is_contiguous()
    check_close(out, exact)
    check_close(x, exact)
    assert_close(x, out, rtol=2 * torch.finfo(dtype).eps, atol=1e-6)  # equal on AVX2
    assert torch.equal(x[..., r:], before[..., r:])


def test_in_place_on_a_fused_projection_leaves_its_neighbours_alone() -> None:
    """q and k rotated in place inside one qkv tensor: v and the other heads' memory keep
    their values; q and k equal rotating copies."""
    b, n, h, d = 2, 6, 4, 8
    qkv = torch.randn(b, n, 3, h, d)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (b, h, n, d) views
    want_q, want_k, v_before = q.clone(), k.clone(), v.clone()
    angles = torch.rand(n, d // 2) * 10
    cos, sin = angles.cos(), angles.sin()
    with torch.no_grad():
        want_q, want_k = apply_rotary(want_q, cos, sin), apply_rotary(want_k, cos, sin)
        apply_rotary_(q, cos, sin)
        apply_rotary_(k, cos, sin)
    assert torch.equal(q, want_q) and torch.equal(k, want_k) and torch.equal(v, v_before)


def test_heads_last_views_take_tables_of_shape_n_1_half() -> None:
    b, n, h, d = 2, 5, 3, 8
    x = torch.randn(b, n, h, d)
    angles = torch.rand(n, d // 2)
    cos, sin = angles.cos(), angles.sin()
    want = apply_rotary(x.transpose(1, 2), cos, sin).transpose(1, 2)
    with torch.no_grad():
        got = apply_rotary_(x, cos[:, None], sin[:, None])
    assert torch.equal(got, want)


def test_float64_tables_with_float32_x_work_in_float64_and_round_once() -> None:
    x = torch.randn(2, 5, 8)
    angles = torch.rand(5, 4, dtype=torch.float64) * 1e4
    want = reference(x, angles.cos(), angles.sin(), interleaved=False).float()
    with torch.no_grad():
        got = apply_rotary_(x, angles.cos(), angles.sin())
    assert_close(got, want, rtol=torch.finfo(torch.float32).eps, atol=1e-7)


def test_empty_and_one_dimensional_inputs() -> None:
    cos, sin = torch.ones(0, 2), torch.zeros(0, 2)
    assert apply_rotary(torch.randn(3, 0, 4), cos, sin).shape == (3, 0, 4)
    x = torch.tensor([1.0, 2.0])
    assert torch.equal(apply_rotary_(x, torch.tensor([0.0]), torch.tensor([1.0])), x)
    assert torch.equal(x, torch.tensor([-2.0, 1.0]))


# --------------------------------------------------------------------------- autograd


def _tables(n: int, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.rand(n, half, dtype=torch.float64) * 10
    return angles.cos() * 1.3, angles.sin() * 1.3  # scaled, as YaRN and xPos scale them


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("r", [6, 4])
def test_gradcheck_through_the_in_place_path(interleaved: bool, r: int) -> None:
    """float64 gradcheck and gradgradcheck of the in-place rotation of a tensor computed
    from the input (the backward turns the gradient back), on a transposed view."""
    x = torch.randn(2, 3, 2, 6, dtype=torch.float64, requires_grad=True)
    cos, sin = _tables(3, r // 2)

    def rotate_in_place(x: torch.Tensor) -> torch.Tensor:
        y = (x * 1.0).transpose(1, 2)  # (2, 2, 3, 6): a non-leaf strided view
        return apply_rotary_(y, cos, sin, interleaved=interleaved)

    assert torch.autograd.gradcheck(rotate_in_place, (x,))
    assert torch.autograd.gradgradcheck(rotate_in_place, (x,))


@pytest.mark.parametrize("interleaved", [False, True])
def test_gradcheck_out_of_place_with_fixed_tables(interleaved: bool) -> None:
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    cos, sin = _tables(3, 2)
    assert torch.autograd.gradcheck(
        lambda x: apply_rotary(x, cos, sin, interleaved=interleaved), (x,)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_place_backward_equals_out_of_place_backward(dtype: torch.dtype) -> None:
    """Training through a fused qkv projection with q and k rotated in place gives the
    gradients of rotating them out of place."""
    torch.manual_seed(0)
    b, n, h, d = 2, 5, 2, 8
    proj = torch.nn.Linear(h * d, 3 * h * d).to(dtype)
    inputs = torch.randn(b, n, h * d, dtype=dtype)
    angles = torch.rand(n, d // 2) * 10
    cos, sin = angles.cos(), angles.sin()

    def loss(inplace: bool) -> torch.Tensor:
        qkv = proj(inputs).view(b, n, 3, h, d)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        rotate_ = apply_rotary_ if inplace else apply_rotary
        q, k = rotate_(q, cos, sin), rotate_(k, cos, sin)
        return (q @ k.transpose(-1, -2)).float().square().sum() + v.float().sum()

    grads = []
    for inplace in (False, True):
        proj.zero_grad()
        loss(inplace).backward()
        grads.append([p.grad.clone() for p in proj.parameters()])
    for out_of_place, in_place in zip(*grads, strict=True):
        assert_close(
            in_place, out_of_place, rtol=1e-5 if dtype == torch.float32 else 2e-2, atol=1e-5
        )


def test_learned_tables_out_of_place_get_their_gradient() -> None:
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    cos, sin = (t.requires_grad_() for t in _tables(3, 3))
    assert torch.autograd.gradcheck(lambda x, c, s: apply_rotary(x, c, s), (x, cos, sin))


# --------------------------------------------------------------------------- refusals


def test_in_place_refusals_name_the_reason_and_change_nothing() -> None:
    cos, sin = _tables(3, 2)
    cos, sin = cos.float(), sin.float()
    cases = []
    leaf = torch.randn(3, 4, requires_grad=True)
    cases.append((leaf, cos, sin, "leaf tensor that requires grad"))
    learned = cos.clone().requires_grad_()
    cases.append((torch.randn(3, 4), learned, sin, "cos or sin require grad"))
    with torch.inference_mode():
        inference = torch.randn(3, 4)
    cases.append((inference, cos, sin, "inference tensor"))
    cases.append((torch.randn(1, 4).expand(3, 4), cos, sin, "share memory"))
    weight = torch.randn(4, 8, requires_grad=True)
    q_unbound = (torch.randn(3, 4) @ weight).view(3, 2, 4).unbind(1)[0]
    cases.append((q_unbound, cos, sin, "index the fused tensor instead"))
    for x, c, s, reason in cases:
        before = x.detach().clone()
        with pytest.raises(PosencValueError, match=reason):
            apply_rotary_(x, c, s)
        assert torch.equal(x.detach(), before), reason


def test_what_torch_allows_is_allowed() -> None:
    cos, sin = (t.float() for t in _tables(3, 2))
    with torch.inference_mode():
        x = torch.randn(3, 4)
        apply_rotary_(x, cos, sin)  # an inference tensor inside inference mode
    leaf = torch.randn(3, 4, requires_grad=True)
    with torch.no_grad():
        apply_rotary_(leaf, cos, sin)  # a leaf under no_grad, as torch allows
    learned = cos.clone().requires_grad_()
    with torch.no_grad():
        apply_rotary_(torch.randn(3, 4), learned, sin)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((torch.ones(3, 4, dtype=torch.long), torch.ones(3, 2), torch.ones(3, 2)), PosencTypeError,
         "x must be a floating-point tensor"),
        ((torch.ones(3, 4), torch.ones(3, 2), torch.ones(3, 1)), PosencValueError,
         "cos and sin differ in shape"),
        ((torch.ones(3, 4), torch.ones(3, 3), torch.ones(3, 3)), PosencValueError,
         r"need x with at least 2 \* 3 channels"),
        ((torch.ones(3, 4), torch.ones(2, 3, 2), torch.ones(2, 3, 2)), PosencValueError,
         "do not broadcast against x"),
        ((torch.ones(3, 4), torch.ones(5, 2), torch.ones(5, 2)), PosencValueError,
         "do not broadcast against x"),
    ],
)  # fmt: skip
def test_bad_arguments(args: tuple, error: type, match: str) -> None:
    for fn in (apply_rotary, apply_rotary_):
        with pytest.raises(error, match=match):
            fn(*args)


# ------------------------------------------------------------------ the pair's autograd node


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rows", ["none", "run", "positions", "per_row"])
def test_the_pair_node_has_the_formulas_gradient(interleaved: bool, rows: str) -> None:
    """``_PairNode`` (q and k as one autograd node, the backward the kernel turning
    clockwise) in float64 on the pure-torch kernel: gradcheck against finite differences,
    with broadcast tables and with whole tables read at a run of rows, at positions ``(n,)``
    and at per-row positions ``(b, n)``."""
    from posenc.encodings.rotary.kernels.select import TORCH

    b, hq, hk, n, d = 2, 3, 1, 4, 6
    q = torch.randn(b, hq, n, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, hk, n, d, dtype=torch.float64, requires_grad=True)
    angles = torch.rand(3 * n, d // 2, dtype=torch.float64) * 9
    cos, sin = angles.cos(), angles.sin()
    at: int | torch.Tensor | None = {
        "none": None,
        "run": 5,
        "positions": torch.tensor([7, 0, 3, 11]),
        "per_row": torch.randint(0, 3 * n, (b, n)),
    }[rows]
    if at is None:
        cos, sin = cos[:n], sin[:n]

    def pair(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rotate._PairNode.apply(q, k, cos, sin, interleaved, False, TORCH, at)

    assert torch.autograd.gradcheck(pair, (q, k))
    # and the forward is eq. 34 at the rows named
    tables = rotate._rows_tables(cos, sin, at, n)
    got = pair(q, k)
    for out, x in zip(got, (q, k), strict=True):
        assert_close(out, rotate.rotate_reference(x, *tables, interleaved=interleaved))


def test_training_turns_q_and_k_in_one_node_on_the_c_kernel() -> None:
    """Under autograd a module's q and k are one node (one ``rotate_pair`` each way) on the C
    kernel too, with the formula's gradient."""
    if native._native is None:
        pytest.skip("the C kernel is not built")
    rope = posenc.RotaryEmbedding(8)
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    k = torch.randn(1, 1, 5, 8, requires_grad=True)
    got_q, got_k = rope(q, k, torch.arange(3, 8))
    assert type(got_q.grad_fn).__name__ == "_PairNodeBackward"
    assert got_q.grad_fn is got_k.grad_fn
    g_q, g_k = torch.randn_like(got_q), torch.randn_like(got_k)
    ((got_q * g_q).sum() + (got_k * g_k).sum()).backward()
    cos, sin = rope.cos_sin(torch.arange(3, 8), 5, dtype=torch.float64)
    for leaf, g in ((q, g_q), (k, g_k)):
        assert leaf.grad is not None
        want = rotate.rotate_reference(g.double(), cos, -sin)  # R^T g
        assert_close(leaf.grad.double(), want, atol=2e-6, rtol=2e-6)
