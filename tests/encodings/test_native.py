"""The native RoPE kernel (``posenc.encodings.native``, C built on first use): bit-identical to
the float32 formula rounded once, for every dtype, layout and shape it takes, with the
AVX-512 path and the portable one; thread splits; where it declines; a failed build falls
back with one warning; fork safety."""

from __future__ import annotations

import multiprocessing
import warnings
from collections.abc import Iterator

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc import apply_rotary
from posenc.encodings import native, rotary


def formula32(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool):
    """RoFormer eq. 34 with every product and sum rounded to float32, cast once to x's dtype."""
    half = cos.shape[-1]
    r = 2 * half
    xf = x.float()
    if interleaved:
        x1, x2 = xf[..., 0:r:2], xf[..., 1:r:2]
    else:
        x1, x2 = xf[..., :half], xf[..., half:r]
    out1 = torch.sub(torch.mul(x1, cos), torch.mul(x2, sin))
    out2 = torch.add(torch.mul(x2, cos), torch.mul(x1, sin))
    out = xf.clone()
    if interleaved:
        out[..., 0:r:2], out[..., 1:r:2] = out1, out2
    else:
        out[..., :half], out[..., half:r] = out1, out2
    return out.to(x.dtype)


def tables(shape: tuple[int, ...], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    angles = angles * 1000
    return angles.cos().float(), angles.sin().float()


CASES = [
    # x shape (b, h, n, d), rotary dim, per-batch tables, non-contiguous x
    ((2, 3, 37, 16), 16, False, True),
    ((2, 3, 37, 15), 6, False, False),  # odd head dim, partial rotary
    ((2, 3, 37, 16), 8, True, True),  # per-batch positions
    ((3, 4, 130, 128), 128, False, True),  # AVX-512 body only
    ((3, 4, 130, 128), 96, True, False),  # AVX-512 body and scalar tail, passthrough
    ((1, 2, 65, 70), 70, False, False),  # r/2 = 35: vector + remainder in both layouts
]


def case_inputs(shape, rotary_dim, per_batch, strided, dtype):
    b, h, n, d = shape
    gen = torch.Generator().manual_seed(sum(shape) + rotary_dim)
    if strided:  # (b, n, h, d) transposed, as attention's projections give
        x = torch.randn(b, n, h, d, generator=gen).to(dtype).transpose(1, 2)
    else:
        x = torch.randn(b, h, n, d, generator=gen).to(dtype)
    cos, sin = tables((b, 1, n, rotary_dim // 2) if per_batch else (n, rotary_dim // 2))
    return x, cos, sin


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("shape", "rotary_dim", "per_batch", "strided"), CASES)
def test_native_is_the_float32_formula_rounded_once(
    shape, rotary_dim, per_batch, strided, dtype, interleaved
) -> None:
    x, cos, sin = case_inputs(shape, rotary_dim, per_batch, strided, dtype)
    got = native.rotate(x, cos, sin, interleaved)
    assert got is not None, "the native kernel did not build or declined"
    assert got.dtype == dtype and got.shape == x.shape and got.is_contiguous()
    assert torch.equal(got, formula32(x, cos, sin, interleaved))
    # and near the float64 value: float32 arithmetic (a few eps32 of the terms), then one
    # rounding to the dtype
    exact = rotary._rotate_eager(x.double(), cos.double(), sin.double(), interleaved)
    bound = torch.finfo(dtype).eps * exact.abs() + 4 * torch.finfo(torch.float32).eps * (
        x.double().abs().max()
    )
    assert ((got.double() - exact).abs() <= bound).all()


def test_strided_tables_are_read_as_given() -> None:
    x, cos, sin = case_inputs((2, 3, 20, 16), 16, False, False, torch.bfloat16)
    cos_strided = torch.empty(20, 16)[:, ::2].copy_(cos)  # channel stride 2
    sin_transposed = sin.t().contiguous().t()  # column-major
    got = native.rotate(x, cos_strided, sin_transposed, True)
    assert got is not None and torch.equal(got, formula32(x, cos, sin, True))


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_native_takes_fewer_dims(ndim: int) -> None:
    shape = (5, 7, 12)[-ndim:] if ndim > 1 else (12,)
    x = torch.randn(shape).bfloat16()
    cos, sin = tables((shape[-2] if ndim > 1 else 1, 6))
    if ndim == 1:
        cos, sin = cos[0], sin[0]
    got = native.rotate(x, cos, sin, True)
    assert got is not None and got.shape == x.shape
    assert torch.equal(got, formula32(x, cos, sin, True))


@pytest.mark.parametrize(
    "shape",
    [(2, 3, 301, 64), (5, 7, 2, 64)],  # split by positions (prefill), by batch x heads (decode)
)
def test_thread_split_equals_one_thread(shape, monkeypatch: pytest.MonkeyPatch) -> None:
    x, cos, sin = case_inputs(shape, 64, True, True, torch.bfloat16)
    monkeypatch.setattr(native, "PARALLEL_MIN_NUMEL", 1 << 40)
    one = native.rotate(x, cos, sin, True)
    monkeypatch.setattr(native, "PARALLEL_MIN_NUMEL", 1)
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # 3 uneven shares
    try:
        split = native.rotate(x, cos, sin, True)
    finally:
        torch.set_num_threads(before)
    assert one is not None and split is not None and torch.equal(one, split)


def test_nan_and_inf_stay_nan_and_inf() -> None:
    x = torch.ones(1, 1, 2, 32, dtype=torch.bfloat16)
    x[0, 0, 0, 0] = float("nan")
    x[0, 0, 1, 5] = float("inf")
    cos, sin = torch.ones(2, 16), torch.zeros(2, 16)
    got = native.rotate(x, cos, sin, False)
    assert got is not None
    assert got[0, 0, 0, 0].isnan() and got[0, 0, 1, 5] == float("inf")
    # inf * sin(0) is nan in the partner channel (5 + 16), as in IEEE float32
    assert_close(got, formula32(x, cos, sin, False), rtol=0, atol=0, equal_nan=True)
    assert got.isnan().sum() == 3


@pytest.mark.parametrize(
    "why",
    ["float64", "meta", "five dims", "fp64 tables", "channel stride", "bigger tables", "vmap"],
)
def test_native_declines_what_it_does_not_take(why: str) -> None:
    x, cos, sin = torch.randn(2, 3, 4, 8), *tables((4, 4))
    if why == "float64":
        x, cos, sin = x.double(), cos.double(), sin.double()
    elif why == "meta":
        x = x.to("meta")
    elif why == "five dims":
        x = x[None]
    elif why == "fp64 tables":
        cos = cos.double()
    elif why == "channel stride":
        x = torch.randn(2, 3, 4, 16)[..., ::2]
    elif why == "bigger tables":
        cos, sin = tables((5, 2, 3, 4, 4))
    if why == "vmap":
        seen = []
        torch.vmap(lambda t: seen.append(native.rotate(t, cos, sin, False)) or t)(x)
        assert seen == [None]
        return
    assert native.rotate(x, cos, sin, False) is None


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
def test_vmap_and_jit_trace_of_apply_rotary_use_torch_kernels() -> None:
    x, cos, sin = case_inputs((2, 3, 9, 16), 16, False, False, torch.float32)
    with torch.no_grad():
        want = formula32(x, cos, sin, True)
        mapped = torch.vmap(lambda t: apply_rotary(t, cos, sin, interleaved=True))(x)
        traced = torch.jit.trace(lambda t: apply_rotary(t, cos, sin, interleaved=True), (x,))
    assert_close(mapped, want, rtol=1e-6, atol=1e-6)
    y = torch.randn_like(x)  # a traced graph, not a recorded constant
    assert_close(traced(y), formula32(y, cos, sin, True), rtol=1e-6, atol=1e-6)


def test_apply_rotary_goes_native_for_half_precision_interleaved_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[torch.dtype] = []
    real = native.rotate

    def spy(x, cos, sin, interleaved):
        calls.append(x.dtype)
        return real(x, cos, sin, interleaved)

    monkeypatch.setattr(native, "rotate", spy)
    x, cos, sin = case_inputs((2, 3, 37, 16), 16, False, True, torch.bfloat16)
    with torch.no_grad():
        fast = apply_rotary(x, cos, sin, interleaved=True)
        posenc.set_rotary_compile(False)
        try:
            eager = apply_rotary(x, cos, sin, interleaved=True)
        finally:
            posenc.set_rotary_compile(True)
    assert calls == [torch.bfloat16]  # the switched-off call never asked the native kernel
    assert torch.equal(fast, eager)
    with torch.no_grad():  # float32, and the half layout, stay with torch's kernels
        apply_rotary(x.float(), cos, sin, interleaved=True)
        apply_rotary(x, cos, sin, interleaved=False)
    assert calls == [torch.bfloat16]
    x.requires_grad_(True)
    apply_rotary(x, cos, sin, interleaved=True).float().sum().backward()  # autograd: torch
    assert calls == [torch.bfloat16] and x.grad is not None


@pytest.fixture
def fresh_build(tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An empty cache and no library loaded yet; restored afterwards."""
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_failed", False)
    yield


@pytest.mark.slow
def test_portable_build_without_avx512_is_exact(
    fresh_build: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native, "CFLAGS", ("-O2", "-ffp-contract=off", "-fPIC", "-shared"))
    for interleaved in (False, True):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x, cos, sin = case_inputs((2, 3, 33, 70), 64, True, True, dtype)
            got = native.rotate(x, cos, sin, interleaved)
            assert got is not None and torch.equal(got, formula32(x, cos, sin, interleaved))
    built = list(native.cache_dir().glob("rope_kernel-*.so"))
    assert len(built) == 1 and not list(native.cache_dir().glob("*.so.tmp*"))


@pytest.mark.slow
def test_failed_build_warns_once_and_falls_back(
    fresh_build: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "/bin/false")
    x, cos, sin = case_inputs((2, 3, 37, 16), 16, False, True, torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        first = apply_rotary(x, cos, sin, interleaved=True)
        second = apply_rotary(x, cos, sin, interleaved=False)
    messages = [str(w.message) for w in caught if "native RoPE kernel" in str(w.message)]
    assert len(messages) == 1 and "/bin/false failed" in messages[0]
    assert torch.equal(first, formula32(x, cos, sin, True))
    assert torch.equal(second, formula32(x, cos, sin, False))
    assert list(native.cache_dir().iterdir()) == []  # no half-written library left behind


def _rotate_in_child(queue) -> None:
    torch.set_num_threads(1)  # torch's own OpenMP pool does not survive fork either
    native._threads = lambda rows, numel: 2  # but ours must: two shares, one on the pool
    x, cos, sin = case_inputs((2, 4, 30, 64), 64, False, True, torch.bfloat16)
    got = native.rotate(x, cos, sin, True)
    queue.put(bool(got is not None and torch.equal(got, formula32(x, cos, sin, True))))


@pytest.mark.slow
def test_thread_pool_survives_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    monkeypatch.setattr(native, "_threads", lambda rows, numel: 2)
    x, cos, sin = case_inputs((2, 4, 30, 64), 64, False, True, torch.bfloat16)
    assert native.rotate(x, cos, sin, True) is not None  # the parent's pool now exists
    assert native._pool is not None
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_rotate_in_child, args=(queue,))
    child.start()
    child.join(timeout=60)
    if child.exitcode is None:
        child.kill()
    assert child.exitcode == 0 and queue.get(timeout=5) is True
