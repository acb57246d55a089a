"""The Triton rotary kernel (:mod:`posenc.encodings.rotary.kernels.triton_kernel`) in the suite's
run: its cases against the float64 formula under Triton's interpreter, directly
(``interpreted_triton.py``) and through the public modules with
``POSENC_ROTARY_KERNEL=triton`` (``interpreted_modules.py``), in a subprocess (the
interpreter is chosen when the kernel is decorated, so ``TRITON_INTERPRET=1`` must be set
before the module is imported, and only there); every variant compiled ahead of time for a
GPU; and that posenc's import and command never import triton."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.commands import SUBPROCESS_ENV

pytest.importorskip("triton", reason="triton ships Linux x86-64 wheels only")

HERE = Path(__file__).parent
#: pytest on the interpreted cases without the suite's addopts (one process, no workers)
INTERPRETED = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]


@pytest.mark.slow  # (a subprocess: about 15 s)
def test_the_kernel_is_the_formula_under_the_interpreter() -> None:
    """Every case of both covering designs, plus the errors, against float64 (CPU tensors)."""
    files = [str(HERE / "interpreted_triton.py"), str(HERE / "interpreted_modules.py")]
    done = subprocess.run(
        [sys.executable, *INTERPRETED, *files],
        capture_output=True,
        text=True,
        timeout=300,
        env={**SUBPROCESS_ENV, "TRITON_INTERPRET": "1"},
        cwd=HERE.parents[2],
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary


@pytest.mark.slow  # (a subprocess)
def test_posenc_and_its_command_import_no_triton() -> None:
    code = (
        "import sys, posenc, posenc.app.cli; "
        "assert 'triton' not in sys.modules, 'triton imported'; "
        "assert 'posenc.encodings.rotary.kernels.triton_kernel' not in sys.modules"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=SUBPROCESS_ENV
    )
    assert done.returncode == 0, done.stderr


# --------------------------------------------------------------------------- compiled for a GPU

#: The integer arguments a launch with head dim 128 passes as multiples of 16 (which Triton
#: tells the compiler): the row, head and batch strides.
_MULTIPLES_OF_16 = (
    "c_sn",
    "s_sn",
    *(f"{t}_{s}" for t in ("q", "oq", "k", "ok") for s in ("sb", "sh", "sn")),
)


def _compile_for_sm90(dtype: str, unit: tuple[str, ...], **flags: object) -> tuple[str, str]:
    """The kernel compiled ahead of time for an H100 (sm_90) as the launch specialises it:
    pointers 16-byte aligned, the strides named in ``unit`` equal to 1 (Triton makes them
    constants), the others multiples of 16. Returns its PTX and ``cuobjdump``'s resource
    usage. Triton ships the compiler (ptxas): no GPU is needed."""
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from posenc.encodings.rotary.kernels import triton_kernel as tk

    kernel = tk.rotary_kernel
    names = kernel.arg_names
    signature, constants, attrs = {}, {}, {}
    for i, name in enumerate(names):
        if name in ("Q", "OQ", "K", "OK", "COS", "SIN", "POS"):
            signature[name] = (
                "*fp32" if name in ("COS", "SIN") else "*i64" if name == "POS" else dtype
            )
        elif name in unit or name in flags:
            signature[name] = "constexpr"
            constants[(i,)] = 1 if name in unit else flags[name]
            continue
        else:
            signature[name] = "i32"
        if signature[name].startswith("*") or name in _MULTIPLES_OF_16:
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(kernel, signature, constexprs=constants, attrs=attrs)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "enable_fp_fusion": True}
    )
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run(
            [str(tool), "--dump-resource-usage", cubin.name], capture_output=True, text=True
        ).stdout
    return compiled.asm["ptx"], usage


@pytest.mark.slow  # (17 compilations, about 9 s)
def test_every_variant_compiles_for_a_gpu_with_wide_accesses_and_no_spills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the interpreter cannot show: the kernel compiles for CUDA in every combination of
    its switches (a q with unit channel stride beside a k without one too), without spilling
    registers, and a contiguous half- or interleaved-layout bfloat16 row moves in 16-byte
    loads and stores."""
    import itertools

    from posenc.encodings.rotary.kernels.triton_kernel import TILE_ELEMENTS

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # (compiled here, kept nowhere)
    switches = ("INTERLEAVED", "HAS_POS", "TABLE_PER_HEAD", "COPY_REST")
    unit = ("q_sd", "oq_sd", "k_sd", "ok_sd")
    dtypes = ("*bf16", "*fp32", "*fp16")
    for i, values in enumerate(itertools.product((False, True), repeat=4)):
        flags = dict(zip(switches, values, strict=True))
        flags |= {"SIGN": -1.0 if i % 2 else 1.0, "HEADS": 1 if flags["TABLE_PER_HEAD"] else 4}
        flags |= {"BLOCK_N": TILE_ELEMENTS // 64, "BLOCK_HALF": 64, "BLOCK_REST": 32}
        flags |= {"HALF": 64, "REST": 32 if flags["COPY_REST"] else 0}
        ptx, usage = _compile_for_sm90(dtypes[i % 3], unit, **flags)
        assert "LOCAL:0" in usage and "STACK:0" in usage, (flags, usage)
        if dtypes[i % 3] == "*bf16" and not flags["HAS_POS"] and not flags["COPY_REST"]:
            assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx, flags
    flags = dict.fromkeys(switches, False) | {"SIGN": 1.0, "HEADS": 4, "BLOCK_N": 16}
    flags |= {"BLOCK_HALF": 64, "BLOCK_REST": 1, "HALF": 64, "REST": 0}
    _compile_for_sm90("*bf16", ("q_sd", "oq_sd"), **flags)  # k's channels strided


@pytest.mark.slow  # (4 compilations, about 3 s)
@pytest.mark.parametrize("half", [40, 56])
def test_head_sizes_80_and_112_keep_wide_accesses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, half: int
) -> None:
    """The rotated width is a constant of the compiled kernel: at 40 or 56 pairs (head sizes
    80 and 112, padded to 64 lanes) the compiler knows the masks run in whole 16-byte groups
    and the second half starts 16-byte aligned, so bfloat16 rows still move in 16-byte loads
    and stores, in both layouts."""
    from posenc.encodings.rotary.kernels.triton_kernel import TILE_ELEMENTS

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    unit = ("q_sd", "oq_sd", "k_sd", "ok_sd")
    for interleaved in (False, True):
        flags = dict.fromkeys(("HAS_POS", "TABLE_PER_HEAD", "COPY_REST"), False)
        flags |= {"INTERLEAVED": interleaved, "SIGN": 1.0, "HEADS": 4, "HALF": half, "REST": 0}
        flags |= {"BLOCK_N": TILE_ELEMENTS // 64, "BLOCK_HALF": 64, "BLOCK_REST": 1}
        ptx, usage = _compile_for_sm90("*bf16", unit, **flags)
        assert "LOCAL:0" in usage, usage
        assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx, (half, interleaved)
