"""The native RoPE kernel: ``rope_kernel.c``, built with the system C compiler on first use.

:func:`rotate` rotates float32, bfloat16 and float16 inputs with float32 tables, without
autograd; :func:`posenc.apply_rotary` uses it for half-precision inputs in the interleaved
layout, where torch needs several passes over memory. It reads each input once and writes
the output once, rotating in float32 with one rounding per value, bit-identical to the
float32 formula cast once (``tests/test_native.py``). Where it cannot be built (no C
compiler, a read-only cache) ``apply_rotary`` warns once and uses torch kernels, with the same
results; ``posenc.set_rotary_compile(False)`` (or ``POSENC_COMPILE=0``) switches it off along
with ``torch.compile``.

The shared library is cached under ``$POSENC_CACHE_DIR`` (default
``$XDG_CACHE_HOME/posenc``, else ``~/.cache/posenc``), named by a hash of the source, the
compiler command and the CPU's instruction-set flags, so an upgrade or another machine
sharing the home directory builds its own. It is written to a temporary name and renamed, so
processes building it at the same time never load a half-written file.

Positions (or, for a few positions, batches x heads) are split among
``torch.get_num_threads()`` threads; ctypes releases the GIL for the
call, so they run in parallel.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("rope_kernel.c")
#: Flags of the build; ``-ffp-contract=off`` keeps ``a*c - b*s`` two roundings, as torch does.
CFLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-shared")
#: Below this many elements one thread does the whole tensor: waking a second thread while
#: torch's OpenMP workers still spin after the previous operation costs more than it saves
#: (measured: (1, 16, 2048, 64) bf16 1.4 ms on one thread, 1.7 ms on two).
PARALLEL_MIN_NUMEL = 1 << 22

_FUNCTIONS = {
    torch.float32: "posenc_rope_f32",
    torch.bfloat16: "posenc_rope_bf16",
    torch.float16: "posenc_rope_f16",
}
_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_failed = False
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _reset_after_fork() -> None:
    """A forked child inherits the pool object but not its threads: start a new one."""
    global _pool, _pool_size
    _pool, _pool_size = None, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def cache_dir() -> Path:
    """Where the built library goes (see the module docstring)."""
    explicit = os.environ.get("POSENC_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "posenc"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _build() -> ctypes.CDLL:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC)")
    source = SOURCE.read_bytes()
    key = hashlib.sha256(
        b"\0".join([source, compiler.encode(), " ".join(CFLAGS).encode(), _cpu_flags().encode()])
        + platform.machine().encode()
    ).hexdigest()[:16]
    target = cache_dir() / f"rope_kernel-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            done = subprocess.run(
                [compiler, *CFLAGS, "-o", tmp, str(SOURCE)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if done.returncode != 0:
                raise RuntimeError(f"{compiler} failed: {done.stderr.strip()[-500:]}")
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    library = ctypes.CDLL(str(target))
    i64 = ctypes.c_int64
    for name in _FUNCTIONS.values():
        function = getattr(library, name)
        function.argtypes = [ctypes.c_void_p] * 4 + [i64] * 14 + [ctypes.c_int]
        function.restype = None
    return library


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, building it on first call; None where it cannot be built
    (the reason is warned once)."""
    global _library, _failed
    if _library is not None or _failed:
        return _library
    with _lock:
        if _library is None and not _failed:
            try:
                _library = _build()
            except Exception as error:  # no compiler, read-only cache, exotic platform
                _failed = True
                warnings.warn(
                    f"posenc's native RoPE kernel is unavailable ({error}); "
                    "using torch kernels (same results, slower)",
                    stacklevel=3,
                )
    return _library


def _threads(rows: int, numel: int) -> int:
    if numel < PARALLEL_MIN_NUMEL:
        return 1
    return max(1, min(torch.get_num_threads(), rows))


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool, _pool_size = ThreadPoolExecutor(workers, "posenc-rope"), workers
        return _pool


def opaque_call_ok(*tensors: Tensor) -> bool:
    """Whether a call torch cannot see is safe: plain tensors, and no tracer (``jit.trace``),
    functorch transform (``vmap``) or torch function/dispatch mode (``FlopCounterMode``,
    fake tensors) that expects to observe every operation."""
    return (
        all(
            type(t) is Tensor and not torch._C._functorch.is_functorch_wrapped_tensor(t)
            for t in tensors
        )
        and torch._C._get_tracing_state() is None
        and torch._C._len_torch_function_stack() == 0
        and torch._C._len_torch_dispatch_stack() == 0
    )


def rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor | None:
    """The rotation of :func:`posenc.apply_rotary` (no autograd), or None where the native
    kernel does not apply: not on CPU, other dtypes, more than 4 dims, non-unit channel
    stride, tables not float32, tensor subclasses or transforms (:func:`opaque_call_ok`), or no
    kernel on this machine."""
    if (
        not opaque_call_ok(x, cos, sin)
        or x.device.type != "cpu"
        or x.dtype not in _FUNCTIONS
        or cos.dtype != torch.float32
        or sin.dtype != torch.float32
        or cos.device != x.device
        or sin.device != x.device
        or not 1 <= x.dim() <= 4
        or cos.dim() > x.dim()
        or x.stride(-1) != 1
        or x.numel() == 0
    ):
        return None
    lib = library()
    if lib is None:
        return None
    half, d = cos.shape[-1], x.shape[-1]
    view = x.reshape((1,) * (4 - x.dim()) + tuple(x.shape)) if x.dim() < 4 else x
    s0, s1, s2 = view.shape[:3]
    if cos.stride() != sin.stride() or cos.stride(-1) != 1:  # same shape (apply_rotary checks)
        cos, sin = cos.contiguous(), sin.contiguous()  # the small tables, before broadcasting
    try:
        tables = [t.expand(s0, s1, s2, half) for t in (cos, sin)]  # views: stride 0 on repeats
    except RuntimeError:
        return None
    out = torch.empty(view.shape, dtype=x.dtype, device=x.device)
    function = getattr(lib, _FUNCTIONS[x.dtype])
    head = (view.data_ptr(), out.data_ptr(), tables[0].data_ptr(), tables[1].data_ptr())
    tail = (s1, s2, *view.stride()[:3], *tables[0].stride()[:3], d, half, int(interleaved))
    groups = s0 * s1
    workers = _threads(max(groups, s2), x.numel())
    if workers == 1:
        function(*head, 0, groups, 0, s2, *tail)
        return out.view(x.shape)
    # split the longer of the two ranges (positions for prefill, groups for one-token decode)
    if s2 >= groups:
        bounds = [s2 * i // workers for i in range(workers + 1)]
        shares = [(0, groups, bounds[i], bounds[i + 1]) for i in range(workers)]
    else:
        bounds = [groups * i // workers for i in range(workers + 1)]
        shares = [(bounds[i], bounds[i + 1], 0, s2) for i in range(workers)]
    pool = _executor(workers - 1)
    futures = [pool.submit(function, *head, *share, *tail) for share in shares[1:]]
    function(*head, *shares[0], *tail)  # this thread takes the first share
    for future in futures:
        future.result()
    return out.view(x.shape)
