"""Tests of ``src/posenc/encodings/rotary/kernels/native.py``: the native kernel's interface
(``_rotary_native.c``): it is told the storage, offset, sizes and strides of every buffer,
computes every address itself, and refuses, before writing anything, a call whose numbers
would take it outside a buffer (a table row past the table, a size or a stride reaching past
a storage, a storage too small) or that it cannot check. Valid calls, negative and zero
strides and a table row offset included, agree with the formula bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from posenc import RotaryEmbedding, apply_rotary, apply_rotary_
from posenc.encodings.rotary.kernels import native, pytorch, rotate

pytestmark = pytest.mark.skipif(
    native._native is None,
    reason="the native rotary kernel is not built here (no C compiler)",
)

FIELDS = ("address", "nbytes", "offset", "sizes", "strides")
B, H, N, D = 2, 3, 5, 16  # x: (B, H, N, D); the tables: (rows, D / 2)


def describe(t: torch.Tensor, **changes: object) -> tuple:
    """``t`` as rotate.py describes it to the kernel, with ``changes`` to some fields."""
    fields = dict(zip(FIELDS, native._native_buffer(t, t.element_size()), strict=True))
    assert set(changes) <= set(fields)
    fields.update(changes)
    return tuple(fields[name] for name in FIELDS)


def tables(rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.rand(rows, D // 2, generator=torch.Generator().manual_seed(seed)) * 100
    return angles.cos(), angles.sin()


def kernel(
    x: tuple,
    out: tuple,
    cos: tuple,
    sin: tuple,
    first_row: int | None = None,
    *,
    bf16: bool = False,
    interleaved: bool = False,
) -> None:
    """The kernel's Python-visible entry point, with x, out, cos and sin as descriptions."""
    native._native(x, out, cos, sin, first_row, bf16, interleaved)  # type: ignore[misc]


# --------------------------------------------------------------------------- valid calls


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_table_row_offset_reads_the_rows_from_there(
    dtype: torch.dtype, interleaved: bool
) -> None:
    """``first_row = p``: the kernel reads table rows ``p`` to ``p + n - 1`` where they lie,
    as the formula with ``cos[p : p + n]`` does; from the last row that fits, too."""
    x = torch.randn(B, H, N, D).to(dtype)
    cos, sin = tables(40)
    bf16 = dtype is torch.bfloat16
    for first in (0, 7, 40 - N):
        want = rotate.rotate_reference(
            x, cos[first : first + N], sin[first : first + N], interleaved=interleaved
        )
        out = torch.empty_like(x)
        kernel(describe(x), describe(out), describe(cos), describe(sin), first, bf16=bf16,
               interleaved=interleaved)  # fmt: skip
        assert torch.equal(out, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_negative_and_zero_strides_inside_the_buffer_are_taken(dtype: torch.dtype) -> None:
    """Strides torch does not make (negative) or makes for reading only (zero, ``expand``):
    the kernel bounds them like any other and rotates what they describe."""
    x = torch.randn(B, H, N, D).to(dtype)
    cos, sin = tables(N)
    bf16 = dtype is torch.bfloat16
    # the rows of each head backwards: start at the last, step back one row
    backwards = describe(x, offset=(N - 1) * D, strides=(H * N * D, N * D, -D, 1))
    out = torch.empty_like(x)
    kernel(backwards, describe(out), describe(cos), describe(sin), bf16=bf16)
    assert torch.equal(out, rotate.rotate_reference(x.flip(-2), cos, sin))
    # one head read for every batch and head (out of place)
    one = torch.randn(1, 1, N, D).to(dtype)
    out = torch.empty_like(x)
    kernel(describe(one.expand(B, H, N, D)), describe(out), describe(cos), describe(sin),
           bf16=bf16)  # fmt: skip
    assert torch.equal(out, rotate.rotate_reference(one.expand(B, H, N, D), cos, sin))


def misaligned(values: torch.Tensor) -> torch.Tensor:
    """A float32 copy of ``values`` in a storage at an odd address (``torch.frombuffer``)."""
    raw = bytearray(4 * values.numel() + 1)
    t = torch.frombuffer(raw, dtype=torch.float32, offset=1, count=values.numel())
    return t.view(values.shape).copy_(values)


def test_tensors_the_kernel_refuses_take_the_torch_path() -> None:
    """A storage whose address is not a multiple of the element size: rotate.py does not send
    it to the kernel but to the pure-torch path, out of place, in place and in the module's
    decode step (whose result is then the formula's within float32 rounding: the torch
    path's order of operations differs)."""
    values = torch.randn(B, H, N, D)
    x = misaligned(values)
    assert native._native_buffer(x, 4) is None
    cos, sin = tables(N)
    assert not native._turn_c(x, torch.empty_like(x), cos, sin, False)
    want, want_inplace = torch.empty_like(values), values.clone()
    pytorch.turn_tiled(values, want, cos, sin, False)
    pytorch.turn_tiled(want_inplace, want_inplace, cos, sin, False)
    assert torch.equal(apply_rotary(x, cos, sin), want)
    assert torch.equal(apply_rotary_(x, cos, sin), want_inplace)
    rope = RotaryEmbedding(D)
    q, k = misaligned(values[:, :, :1]), torch.randn(B, H, 1, D)
    want_q, want_k = rope(q.clone(), k.clone(), torch.tensor([3]))
    with torch.no_grad():
        got_q, got_k = rope(q, k, torch.tensor([3]), inplace=True)
    assert got_q is q and got_k is k
    assert_close(q, want_q, rtol=1e-6, atol=1e-6)
    assert torch.equal(k, want_k)


# --------------------------------------------------------------------------- refused calls


def case_first_row_past_the_table(a: dict) -> None:
    a["first_row"] = 40 - N + 1  # rows 36 to 40 of a table of 40


def case_first_row_negative(a: dict) -> None:
    a["first_row"] = -1


def case_first_row_on_one_row(a: dict) -> None:
    a["cos"], a["sin"] = (describe(t[:1]) for t in (a["cos_t"], a["sin_t"]))
    a["first_row"] = 0  # five rows wanted, one there


def case_first_row_without_rows(a: dict) -> None:
    a["cos"], a["sin"] = (describe(t[0]) for t in (a["cos_t"], a["sin_t"]))
    a["first_row"] = 0


def case_x_size_past_its_storage(a: dict) -> None:
    a["x"] = describe(a["x_t"], sizes=(B, H, N + 1, D))
    a["out"] = describe(a["big_t"])  # (B, H, N + 1, D): room for all of them
    a["first_row"] = 0


def case_x_stride_past_its_storage(a: dict) -> None:
    a["x"] = describe(a["x_t"], strides=(H * N * D, N * D, D + 1, 1))


def case_out_stride_past_its_storage(a: dict) -> None:
    a["out"] = describe(a["out_t"], strides=(H * N * D + 1, N * D, D, 1))


def case_table_stride_past_its_storage(a: dict) -> None:
    a["sin"] = describe(a["sin_t"], strides=(D // 2 + 1, 1))


def case_negative_stride_before_the_start(a: dict) -> None:
    a["x"] = describe(a["x_t"], offset=(N - 2) * D, strides=(H * N * D, N * D, -D, 1))


def case_offset_past_the_end(a: dict) -> None:
    a["x"] = describe(a["x_t"], offset=1)


def case_negative_offset(a: dict) -> None:
    a["x"] = describe(a["x_t"], offset=-1)


def storage_too_small(name: str) -> Callable[[dict], None]:
    def case(a: dict) -> None:
        address, nbytes, *rest = a[name]
        a[name] = (address, nbytes - 1, *rest)

    case.__name__ = f"case_{name}_storage_too_small"
    return case


def case_overflowing_stride(a: dict) -> None:
    a["x"] = describe(a["x_t"], strides=(2**62, 2**62, D, 1))


def case_address_wraps(a: dict) -> None:
    a["out"] = describe(a["out_t"], address=2**64 - 64)


def case_misaligned_address(a: dict) -> None:
    a["x"] = describe(a["x_t"], address=a["x"][0] + 1)


def case_channels_not_contiguous(a: dict) -> None:
    a["x"] = describe(a["x_t"], strides=(H * N * D, N * D, D, 2))


def case_too_few_channels(a: dict) -> None:
    a["x"] = describe(a["x_t"], sizes=(B, H, N, D - 2))
    a["out"] = describe(a["out_t"], sizes=(B, H, N, D - 2))


def case_out_sizes_differ(a: dict) -> None:
    a["out"] = describe(a["out_t"], sizes=(B, H, N - 1, D))


def case_sin_sizes_differ(a: dict) -> None:
    a["sin"] = describe(a["sin_t"], sizes=(39, D // 2))


def case_tables_do_not_broadcast(a: dict) -> None:
    a["cos"], a["sin"] = (describe(t[:3]) for t in (a["cos_t"], a["sin_t"]))
    a["first_row"] = None  # three rows against five


def case_out_zero_stride(a: dict) -> None:
    a["out"] = describe(a["out_t"], strides=(H * N * D, 0, D, 1))


def case_too_many_dims(a: dict) -> None:
    a["x"] = describe(a["x_t"], sizes=(1, 1, B, H, N, D), strides=(0, 0, H * N * D, N * D, D, 1))


def case_negative_size(a: dict) -> None:
    a["x"] = describe(a["x_t"], sizes=(B, -H, N, D))


def case_sizes_and_strides_differ_in_length(a: dict) -> None:
    a["x"] = describe(a["x_t"], strides=(N * D, D, 1))


REFUSED = [
    (case_first_row_past_the_table, IndexError, r"first_row 36: x needs 5 rows .* have 40"),
    (case_first_row_negative, IndexError, "first_row -1"),
    (case_first_row_on_one_row, IndexError, "first_row 0: x needs 5 rows .* have 1 "),
    (case_first_row_without_rows, ValueError, "first_row needs tables with rows"),
    (case_x_size_past_its_storage, IndexError, r"^x .* elements 0 to 495 of a storage of 480 "),
    (case_x_stride_past_its_storage, IndexError, r"^x .* elements 0 to 483 of a storage of 480 "),
    (case_out_stride_past_its_storage, IndexError, r"^out .* 0 to 480 of a storage of 480 "),
    (case_table_stride_past_its_storage, IndexError, r"^sin .* 315 to 358 of a storage of 320 "),
    (case_negative_stride_before_the_start, IndexError, r"^x .* elements -16 to 463 "),
    (case_offset_past_the_end, IndexError, r"^x .* elements 1 to 480 of a storage of 480 "),
    (case_negative_offset, IndexError, r"^x .* offset -1\) .* elements -1 to 478 "),
    (storage_too_small("x"), IndexError, r"^x .* elements 0 to 479 of a storage of 479 "),
    (storage_too_small("out"), IndexError, r"^out .* elements 0 to 479 of a storage of 479 "),
    (storage_too_small("cos"), IndexError, r"^cos .* 280 to 319 of a storage of 319 "),
    (storage_too_small("sin"), IndexError, r"^sin .* 280 to 319 of a storage of 319 "),
    (case_overflowing_stride, ValueError, "^x .* its addresses overflow"),
    (case_address_wraps, ValueError, "^out: a storage of .* wraps around"),
    (case_misaligned_address, ValueError, "^x: the storage's address .* not a multiple"),
    (case_channels_not_contiguous, ValueError, "^x: its channels must be contiguous"),
    (case_too_few_channels, ValueError, "tables of 8 pairs need 2 [*] 8 channels, x has 14"),
    (case_out_sizes_differ, ValueError, "^out has sizes"),
    (case_sin_sizes_differ, ValueError, "^sin has sizes"),
    (case_tables_do_not_broadcast, ValueError, "do not broadcast"),
    (case_out_zero_stride, ValueError, "^out: stride 0 along a dimension of 3 elements"),
    (case_too_many_dims, ValueError, "^x: 6 sizes, expected 1 to 5"),
    (case_negative_size, ValueError, "^x: a negative size"),
    (case_sizes_and_strides_differ_in_length, ValueError, "^x: sizes .* differ in length"),
]  # fmt: skip


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "case, error, message", REFUSED, ids=[c.__name__.removeprefix("case_") for c, *_ in REFUSED]
)
def test_a_call_reaching_outside_a_buffer_raises_and_writes_nothing(
    case: Callable[[dict], None],
    error: type[Exception],
    message: str,
    dtype: torch.dtype,
    inplace: bool,
) -> None:
    """Each wrong number, in the description of one buffer or in ``first_row``, raises before
    the kernel reads or writes: the output (``x`` itself, in place) keeps every bit, and so
    does every other buffer. The descriptions are those of real tensors, so that a kernel that
    failed to refuse would write into memory this test owns and compares."""
    x = torch.randn(B, H, N, D).to(dtype)
    out = x if inplace else torch.full_like(x, 7.0)
    big = torch.full((B, H, N + 1, D), 7.0, dtype=dtype)  # (see case_x_size_past_its_storage)
    cos, sin = tables(40)
    a = {"x_t": x, "out_t": out, "big_t": big, "cos_t": cos, "sin_t": sin}
    a.update(x=describe(x), out=describe(out), cos=describe(cos), sin=describe(sin))
    a["first_row"] = 40 - N  # the tables' last rows: a table one element short is refused
    case(a)
    before = {name: t.clone() for name, t in (("x", x), ("out", out), ("big", big),
                                               ("cos", cos), ("sin", sin))}  # fmt: skip
    with pytest.raises(error, match=message):
        kernel(a["x"], a["out"], a["cos"], a["sin"], a["first_row"],
               bf16=dtype is torch.bfloat16)  # fmt: skip
    for name, t in (("x", x), ("out", out), ("big", big), ("cos", cos), ("sin", sin)):
        assert torch.equal(t.view(torch.uint8), before[name].view(torch.uint8)), name


def test_the_same_descriptions_with_the_right_numbers_are_taken() -> None:
    """The refusals above come from the one number each case changes: with the numbers as
    rotate.py gives them, the same call rotates (the last rows of the 40-row tables)."""
    x = torch.randn(B, H, N, D)
    out = torch.empty_like(x)
    cos, sin = tables(40)
    kernel(describe(x), describe(out), describe(cos), describe(sin), 40 - N)
    assert torch.equal(out, rotate.rotate_reference(x, cos[40 - N :], sin[40 - N :]))


# --------------------------------------------------------------------------- q and k in one call


def pair(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, **kw: bool):
    """The kernel's pair entry point, tables described as rotate.py describes them."""
    interleaved = kw.get("interleaved", False)
    return native._native_pair(  # type: ignore[misc]
        q, k, describe(cos), describe(sin), interleaved, torch.float32, torch.bfloat16
    )


def projections(dtype: torch.dtype, n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, H, n, D) and k (B, 1, n, D) as a transformers attention makes them: heads-first
    views (transposed, not contiguous) of (B, n, heads * D) projections."""
    q = torch.randn(B, n, H * D).to(dtype).view(B, n, H, D).transpose(1, 2)
    k = torch.randn(B, n, D).to(dtype).view(B, n, 1, D).transpose(1, 2)
    return q, k


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_pair_entry_turns_q_and_k_in_place_as_the_formula(
    dtype: torch.dtype, interleaved: bool
) -> None:
    """``rotate_pair`` reads q's and k's storage, offset, sizes and strides from the tensors
    themselves and turns both in place, bit for bit as the formula, with tables broadcast
    over heads ``(B, 1, N, D / 2)`` and over the batch ``(N, D / 2)``."""
    cos, sin = tables(N)
    for c, s in ((cos, sin), (cos.expand(B, 1, N, D // 2), sin.expand(B, 1, N, D // 2))):
        q, k = projections(dtype)
        want = [rotate.rotate_reference(t, c, s, interleaved=interleaved) for t in (q, k)]
        assert pair(q, k, c, s, interleaved=interleaved) is True
        assert torch.equal(q, want[0]) and torch.equal(k, want[1])


def test_the_pair_entry_declines_what_it_does_not_take() -> None:
    """Another dtype, two dtypes or a tensor that is not on the CPU (a meta tensor here):
    ``False`` with nothing read or written."""
    cos, sin = tables(N)
    for q_dtype, k_dtype in ((torch.float16, torch.float16), (torch.float32, torch.bfloat16)):
        q, k = projections(q_dtype)
        k = k.to(k_dtype)
        before = q.clone(), k.clone()
        assert pair(q, k, cos, sin) is False
        assert torch.equal(q, before[0]) and torch.equal(k, before[1])
    q, _ = projections(torch.float32)
    before = q.clone()
    assert pair(q, torch.empty(B, 1, N, D, device="meta"), cos, sin) is False
    assert torch.equal(q, before)


def test_the_pair_entry_checks_both_before_writing_either() -> None:
    """A k the kernel refuses (one head expanded: stride 0 along the heads; channels with a
    stride of 2; q and k in one storage) raises, and q keeps every bit although it alone
    would have been taken."""
    cos, sin = tables(N)
    q, k = projections(torch.float32)
    cases = {
        "stride 0": (k.expand(B, 2, N, D), cos, sin, ValueError, "stride 0"),
        "strided channels": (
            torch.randn(B, 1, N, 2 * D)[..., ::2],
            cos,
            sin,
            ValueError,
            "contiguous",
        ),
        "one storage": (q[:, :1], cos, sin, ValueError, "share one storage"),
    }
    for name, (key, c, s, error, message) in cases.items():
        before = q.clone(), key.clone()
        with pytest.raises(error, match=message):
            pair(q, key, c, s)
        assert torch.equal(q, before[0]) and torch.equal(key, before[1]), name
    assert native.turn_pair_prepared(q, k.expand(B, 2, N, D), native.prepare_tables(cos, sin),
                                     False) is False  # fmt: skip
    assert pair(q.clone(), k.clone(), cos, sin) is True  # the same q, with a k it takes


# --------------------------------------------------------------------------- the build


def _compiler() -> str | None:
    import shutil
    import sysconfig

    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) or shutil.which("cc") or shutil.which("gcc")


def test_the_native_kernel_is_built_where_a_compiler_is() -> None:
    """The install builds ``_rotary_native`` wherever a C compiler exists (setup.py makes it
    optional, for machines without one): a silent build failure would leave every caller on
    the slower torch path. The module imported is the one beside :mod:`.native`, so a stale
    build left in another folder cannot stand in for it."""
    if _compiler() is None:
        pytest.skip("no C compiler on this machine: the pure-torch path is the one in use")
    assert native._native is not None
    built = sys.modules["posenc.encodings.rotary.kernels._rotary_native"]
    assert Path(built.__file__).parent == Path(native.__file__).parent


def test_the_kernel_shares_torchs_openmp_runtime() -> None:
    """Where the kernel is built with OpenMP, the process holds one OpenMP runtime, torch's:
    the loader handed the kernel the ``libgomp.so.1`` torch had loaded, so a large rotation
    runs on torch's waiting workers, not on a second team fighting them for the cores."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("no /proc/self/maps to read the loaded libraries from")
    built = sys.modules["posenc.encodings.rotary.kernels._rotary_native"].__file__
    linked = subprocess.run(["ldd", built], capture_output=True, text=True).stdout
    if "gomp" not in linked:
        pytest.skip("the kernel was built without OpenMP (the compiler has none)")
    loaded = {line.split()[-1] for line in maps.read_text().splitlines() if "gomp" in line}
    assert len(loaded) == 1, loaded
    assert Path(next(iter(loaded))).parent.parent == Path(torch.__file__).parent, loaded


@pytest.mark.slow
def test_setup_builds_the_kernel_from_the_sources_beside_it(tmp_path: Path) -> None:
    """``setup.py build_ext`` compiles the C sources where they lie now into the dotted name
    the Python side imports (about three seconds): the build and the import agree."""
    if _compiler() is None:
        pytest.skip("no C compiler on this machine")
    root = Path(__file__).resolve().parents[4]
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "tmp")],
        cwd=root, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    kernels = tmp_path / "lib" / "posenc" / "encodings" / "rotary" / "kernels"
    built = list(kernels.glob("_rotary_native*"))
    assert len(built) == 1, sorted(p.name for p in (tmp_path / "lib").rglob("*"))


@pytest.mark.slow
def test_a_compiler_without_openmp_still_builds_the_kernel(tmp_path: Path) -> None:
    """setup.py builds with ``-fopenmp`` and, where the compiler refuses it, again without:
    here a compiler that fails on that flag alone (a wrapper around the real one). The
    kernel built so rotates on the calling thread, and still equals the formula."""
    real = _compiler()
    if real is None:
        pytest.skip("no C compiler on this machine")
    wrapper = tmp_path / "cc"
    wrapper.write_text(
        f'#!/bin/sh\nfor a in "$@"; do [ "$a" = -fopenmp ] && exit 1; done\nexec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    root = Path(__file__).resolve().parents[4]
    env = {**os.environ, "CC": str(wrapper), "LDSHARED": f"{wrapper} -shared"}
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "tmp")],
        cwd=root, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    built = list((tmp_path / "lib").rglob("_rotary_native*"))
    assert len(built) == 1
    linked = subprocess.run(["ldd", str(built[0])], capture_output=True, text=True).stdout
    assert "gomp" not in linked
    check = (
        "import importlib.util, torch; "
        f"spec = importlib.util.spec_from_file_location('_rotary_native', {str(built[0])!r}); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        "x = torch.randn(4096, 16); c, s = torch.rand(4096, 8), torch.rand(4096, 8); "
        "d = lambda t: (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes(), "
        "t.storage_offset(), t.shape, t.stride()); "
        "o = torch.empty_like(x); m.rotate(d(x), d(o), d(c), d(s), None, False, False); "
        "a, b = x[:, :8], x[:, 8:]; "
        "assert torch.equal(o, torch.cat([a * c - b * s, b * c + a * s], -1))"
    )
    ran = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-2000:]
