"""Host time of one eager rotary call (``posenc bench host``): the Python that surrounds a
kernel, timed on the CPU with the Triton launch faked.

A decode step moves a few hundred kilobytes: on a GPU the kernel takes microseconds and
the host's Python around it decides the step's time. This suite times that Python without
a GPU. :func:`faked_launches` installs a stand-in for Triton's CUDA driver: it reports an
sm_90 target, so Triton compiles the kernel for real (its own ``ptxas``, shipped in the
wheel) and binds and specialises the arguments as on a GPU; only the launcher, the call
into ``cuLaunchKernel`` (C code that packs the arguments), is a no-op Python function. CPU
tensors stand in for CUDA ones (their addresses are all the launch reads).

Each call is timed as a whole, and in its two parts:

* posenc's: the same call with the launch itself
  (:func:`~posenc.encodings.rotary.kernels.triton_launch._run`) a no-op: selection, checks, the
  plan lookup, outputs, table views;
* Triton's: that launch alone, with the arguments a call hands it (the stream lookup and
  the launcher call; on the first launch of a plan, ``JITFunction.run``).

beside the C kernel's whole call on the same CPU tensors (its arithmetic included) and
transformers' rotary step (``LlamaRotaryEmbedding`` + ``apply_rotary_pos_emb``), at a
decode shape and a prefill shape. Times are medians over rounds of many calls, the cases
interleaved round by round (:func:`time_calls`), since other processes share the CPUs.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..errors import PosencValueError
from .harness import Section, Table
from .rope_calls import DECODE_K, DECODE_POSITION, DECODE_Q

#: The prefill shape: q and k of one prompt (batch, heads, n, head dim), bfloat16.
PREFILL_Q, PREFILL_K = (1, 32, 512, 128), (1, 8, 512, 128)


class _Utils:
    """The driver's ``utils``: a "loaded" kernel without a GPU."""

    def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple:
        return object(), 0, 32, 0, 1024  # module, function, registers, spills, max threads

    def get_device_properties(self, device: int) -> dict[str, int]:
        return {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536}


class FakeDriver:
    """Triton's active driver for a CUDA sm_90 device 0 that launches nothing: every launch
    is counted in :attr:`launches` (with its arguments in :attr:`last`)."""

    def __init__(self) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", 90, 32)
        self.utils = _Utils()
        self.launches = 0
        self.last: tuple = ()
        driver = self

        class Launcher:  # (one per compiled kernel; called as the C launcher would be)
            def __init__(self, src: Any, metadata: Any) -> None:
                pass

            def __call__(self, *args: Any) -> None:
                driver.launches += 1
                driver.last = args

        self.launcher_cls = Launcher

    def is_active(self) -> bool:
        return True

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        pass

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


@contextmanager
def faked_launches() -> Iterator[FakeDriver]:
    """Within: Triton's driver is a :class:`FakeDriver`, the Triton kernel takes CPU tensors,
    and ``POSENC_ROTARY_KERNEL=triton`` sends posenc's rotations to it. On the way in and
    out the compiled kernels and posenc's launch plans are dropped (a real one must not
    launch on CPU addresses, nor a fake one launch nothing later), and the rest is
    restored."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise PosencValueError("faked launches need Triton's compiler: unset TRITON_INTERPRET")
    from triton.runtime import driver

    from ..encodings.rotary.kernels import triton_entry, triton_kernel, triton_launch

    fake = FakeDriver()
    previous_driver = driver._active
    tensor_ok = triton_entry._tensor_ok
    previous_kernel = os.environ.get("POSENC_ROTARY_KERNEL")
    triton_kernel.rotary_kernel.device_caches.clear()  # (no kernel made for a real device
    triton_launch._PLANS.clear()  # may launch on CPU addresses in here, nor fake ones later)
    driver.set_active(fake)
    triton_entry._tensor_ok = lambda x: (  # (CPU tensors stand in for CUDA ones)
        x.dtype in triton_entry.DTYPES and 1 <= x.dim() <= triton_entry.MAX_DIMS
    )
    os.environ["POSENC_ROTARY_KERNEL"] = "triton"
    try:
        yield fake
    finally:
        driver._active = previous_driver
        triton_entry._tensor_ok = tensor_ok
        if previous_kernel is None:
            del os.environ["POSENC_ROTARY_KERNEL"]
        else:
            os.environ["POSENC_ROTARY_KERNEL"] = previous_kernel
        triton_kernel.rotary_kernel.device_caches.clear()
        triton_launch._PLANS.clear()


@contextmanager
def launches_skipped() -> Iterator[None]:
    """Within: posenc's Triton path does everything but the launch (posenc's part)."""
    from ..encodings.rotary.kernels import triton_launch

    run = triton_launch._run
    triton_launch._run = lambda plan, *tensors: None
    try:
        yield
    finally:
        triton_launch._run = run


def time_calls(
    cases: dict[str, Callable[[], object]], *, calls: int, rounds: int
) -> dict[str, float]:
    """Seconds per call of each case: the median over ``rounds`` rounds of the mean of
    ``calls`` back-to-back calls, every case once per round in a shuffled order (load from
    other processes falls on all alike)."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    order = list(cases)
    shuffler = random.Random(0)
    for fn in cases.values():
        fn()
    for _ in range(rounds):
        shuffler.shuffle(order)
        for name in order:
            fn = cases[name]
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(s) for name, s in samples.items()}


def _transformers_step(q: torch.Tensor, k: torch.Tensor, ids: torch.Tensor) -> Callable | None:
    try:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import (
            LlamaRotaryEmbedding,
            apply_rotary_pos_emb,
        )
    except ImportError:
        return None
    config = LlamaConfig(
        hidden_size=q.shape[1] * q.shape[-1],
        num_attention_heads=q.shape[1],
        num_key_value_heads=k.shape[1],
        max_position_embeddings=8192,
    )
    llama = LlamaRotaryEmbedding(config)

    def step() -> object:
        cos, sin = llama(q, ids)
        return apply_rotary_pos_emb(q, k, cos, sin)

    return step


def host_times(
    shape_q: tuple[int, ...],
    shape_k: tuple[int, ...],
    positions: torch.Tensor | None,
    *,
    calls: int,
    rounds: int,
) -> dict[str, float]:
    """Seconds per eager call ``rope(q, k, positions)`` (bfloat16 CPU tensors): ``triton``
    (launch faked), ``posenc`` (its part), ``launch`` (Triton's part), ``native`` (the C
    kernel, its arithmetic included) and ``transformers`` (where installed)."""
    from ..encodings.rotary.kernels import triton_launch
    from ..encodings.rotary.rope import RotaryEmbedding

    torch.manual_seed(0)
    q = torch.randn(shape_q, dtype=torch.bfloat16)
    k = torch.randn(shape_k, dtype=torch.bfloat16)
    rope = RotaryEmbedding(shape_q[-1], max_position_embeddings=8192)
    seen: list[tuple] = []
    run = triton_launch._run

    def spy(plan: Any, *tensors: torch.Tensor) -> None:
        seen.append((plan, tensors))
        run(plan, *tensors)

    times: dict[str, float] = {}
    with torch.inference_mode():
        rope(q, k, positions)  # (the tables)
        with faked_launches() as fake:
            triton_launch._run = spy
            try:
                rope(q, k, positions)  # (the plan, the compilation)
            finally:
                triton_launch._run = run
            if fake.launches != 1 or len(seen) != 1:
                raise RuntimeError("the call did not reach the faked Triton launch once")
            plan, tensors = seen[0]
            times |= time_calls(
                {
                    "triton": lambda: rope(q, k, positions),
                    "launch": lambda: triton_launch._run(plan, *tensors),
                },
                calls=calls,
                rounds=rounds,
            )
            with launches_skipped():
                times |= time_calls(
                    {"posenc": lambda: rope(q, k, positions)}, calls=calls, rounds=rounds
                )
        cases: dict[str, Callable[[], object]] = {"native": lambda: rope(q, k, positions)}
        ids = torch.arange(q.shape[2])[None] if positions is None else positions[None]
        step = _transformers_step(q, k, ids)
        if step is not None:
            cases["transformers"] = step
        times |= time_calls(cases, calls=max(1, calls // 10), rounds=rounds)
    return times


def suite(*, calls: int = 2000, rounds: int = 9) -> Section:
    """``posenc bench host``: the table of :func:`host_times` at the decode and prefill
    shapes."""
    shapes = [
        ("decode", DECODE_Q, DECODE_K, torch.tensor([DECODE_POSITION])),
        ("prefill", PREFILL_Q, PREFILL_K, None),
    ]
    table = Table(
        [
            "call",
            "Triton, launch faked, µs",
            "posenc's part, µs",
            "Triton's part, µs",
            "C kernel (CPU, with its work), µs",
            "transformers, µs",
        ],
        caption="Host µs per eager `RotaryEmbedding(128)(q, k, positions)`, bfloat16 (medians "
        f"of {rounds} rounds of {calls} calls, cases interleaved):",
    )
    data = {}
    for name, sq, sk, positions in shapes:
        t = host_times(sq, sk, positions, calls=calls, rounds=rounds)
        data[name] = t
        at = "position 4095" if positions is not None else "positions arange(n)"
        cells = [t["triton"], t["posenc"], t["launch"], t["native"], t.get("transformers")]
        table.rows.append(
            [f"{name} q {sq}, k {sk}, {at}"]
            + ["-" if v is None else f"{v * 1e6:.1f}" for v in cells]
        )
    intro = [
        "The Python around one eager rotary call, on the CPU: Triton's CUDA driver is "
        "replaced by one that compiles for sm_90 and launches nothing (the launcher, the C "
        "call into `cuLaunchKernel`, is a no-op), so the Triton column is posenc's Python "
        "plus Triton's, without the real launcher's C argument packing (not timed here: "
        "it needs a GPU). posenc's part is the call "
        "with the launch skipped; Triton's part is the launch alone with the same "
        "arguments. The C kernel and transformers columns include their CPU arithmetic "
        "(negligible at the decode shape, not at the prefill one).",
    ]
    return Section("host", "Host time per eager rotary call", intro, [table], data=data)
