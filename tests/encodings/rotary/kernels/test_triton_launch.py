"""The host side of the Triton rotary kernel, without a GPU: the grid (a pure function), the
launch plans (made once per key, reused), the rotated width as a compile-time constant,
the ``torch.compile`` operator's fake and meta kernels, and (with Triton's driver replaced
by :class:`posenc.bench.host.FakeDriver`, which compiles for sm_90 and launches nothing)
that a plan's later launches call Triton's launcher exactly as ``JITFunction.run`` does.

The kernel's numbers are checked under Triton's interpreter (``interpreted_triton.py``).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton ships Linux x86-64 wheels only")

from posenc.encodings.rotary.kernels import triton_launch as tk
from posenc.encodings.rotary.kernels import triton_op  # noqa: F401  (registers the operator)
from posenc.errors import PosencValueError

CUDA_YZ_MAX = 65_535


def _program_of(pid: int, row_blocks: int, groups: int) -> tuple[int, int, int]:
    """``_rotary_kernel``'s reading of its program id (transcribed): ``(i, g, b)``."""
    return pid % row_blocks, (pid // row_blocks) % groups, pid // row_blocks // groups


def test_the_grid_numbers_every_program_once() -> None:
    row_blocks, batch, groups = 3, 2, 5
    grid = tk.launch_grid(row_blocks, batch, groups)
    assert grid[1:] == (1, 1)
    seen = {_program_of(pid, row_blocks, groups) for pid in range(grid[0])}
    want = {(i, g, b) for i in range(row_blocks) for g in range(groups) for b in range(batch)}
    assert seen == want and grid[0] == len(want)


def test_a_long_heads_last_pair_keeps_y_and_z_within_cudas_limit() -> None:
    """Heads-last ``(b, n, h, d)`` tensors are ``2 n`` groups of one head: at n = 40,000 the
    old grid put 80,000 on z (CUDA takes 65,535). Meta tensors: no memory."""
    b, n, hq, hk, d = 2, 40_000, 4, 4, 64
    q = torch.empty(b, n, hq, d, device="meta", dtype=torch.bfloat16)
    k = torch.empty(b, n, hk, d, device="meta", dtype=torch.bfloat16)
    cos = torch.empty(n, 1, d // 2, device="meta")
    plan = tk.plan_launch(q, q, k, k, cos, cos, None, False, False)
    assert plan.grid is not None
    x, y, z = plan.grid
    assert y <= CUDA_YZ_MAX and z <= CUDA_YZ_MAX and x <= tk.MAX_GRID_X
    # the kernel sees (B, H, N) = (b, n, h): one block of h rows, 2 n groups of one "head"
    # (the tables differ from one n to the next), b batches
    groups = 2 * n
    assert x == b * groups
    assert groups > CUDA_YZ_MAX  # (what the old grid's z held)


def test_a_grid_past_cudas_x_limit_is_an_error() -> None:
    with pytest.raises(PosencValueError, match="more than CUDA's"):
        tk.launch_grid(2**20, 2**10, 4)


@pytest.mark.parametrize(("d", "half"), [(80, 40), (112, 56), (128, 64)])
def test_the_rotated_width_is_a_constant_of_the_kernel(d: int, half: int) -> None:
    """``HALF`` and ``REST`` are constexprs (their masks then keep wide accesses: see
    ``test_triton_kernel.py``'s compilation for sm_90), so a plan passes them as values."""
    names = tk.rotary_kernel.arg_names
    constexprs = {names[i] for i in tk.rotary_kernel.constexprs}
    assert {"HALF", "REST"} <= constexprs
    q = torch.empty(1, 2, 3, d, device="meta", dtype=torch.bfloat16)
    cos = torch.empty(3, half, device="meta")
    plan = tk.plan_launch(q, q, None, None, cos, cos, None, False, False)
    tail = dict(zip(names[7:], plan.tail, strict=True))
    assert tail["HALF"] == half and tail["REST"] == 0 and tail["BLOCK_HALF"] == 64


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> list[tk.LaunchPlan]:
    """The plans ``_launch`` runs (the launch itself recorded, not made)."""
    seen: list[tk.LaunchPlan] = []
    monkeypatch.setattr(tk, "_run", lambda plan, *tensors: seen.append(plan))
    monkeypatch.setattr(tk, "_PLANS", {})
    return seen


def test_a_second_call_with_the_same_key_reuses_the_plan(planned: list) -> None:
    q, k = torch.randn(2, 4, 3, 16), torch.randn(2, 2, 3, 16)
    table = torch.rand(10, 8)
    for start in (0, 4):  # other rows of the same table: other addresses, the same key
        cos, sin = table[start : start + 3], table[start : start + 3]
        tk.launch(
            q, torch.empty_like(q), k, torch.empty_like(k), cos, sin, None, False, False, True
        )
    assert len(planned) == 2 and planned[0] is planned[1] and len(tk._PLANS) == 1


def test_a_changed_stride_alignment_or_switch_makes_a_new_plan(planned: list) -> None:
    fused = torch.randn(2, 3, 9, 16)  # (b, n, heads of q, k and v, d)
    q, k = fused[:, :, :4].transpose(1, 2), fused[:, :, 4:6].transpose(1, 2)
    cos = torch.rand(3, 8)
    calls = [
        (q.contiguous(), k.contiguous(), cos, False),
        (q, k, cos, False),  # strides of a fused projection
        (q, k, cos, True),  # interleaved
        (q, k, torch.rand(4, 8)[1:], False),  # a table 32 bytes further: still aligned
        (q, k, torch.rand(40)[1:25].view(3, 8), False),  # a table 4 bytes off alignment
    ]
    for x, y, c, interleaved in calls:
        out_x, out_y = torch.empty_like(x), torch.empty_like(y)
        tk.launch(x, out_x, y, out_y, c, c, None, interleaved, False, True)
    assert planned[1].tail != planned[0].tail and planned[2].tail != planned[1].tail
    assert planned[3] is planned[1]  # another aligned table of the same shape: the same plan
    assert len({id(p) for p in planned}) == len(tk._PLANS) == 4


def test_a_plan_checks_once_and_positions_every_call(planned: list) -> None:
    q = torch.randn(1, 2, 3, 8)
    cos = torch.rand(5, 4)
    with pytest.raises(PosencValueError, match="q and k must share"):
        tk.launch(q, q, q[:, :, :2], q[:, :, :2], cos[:3], cos[:3], None, False, False, True)
    tk.launch(q, q, None, None, cos, cos, torch.tensor([0, 1, 4]), False, False, False)
    with pytest.raises(PosencValueError, match=r"positions must lie in \[0, 5\)"):
        tk.launch(q, q, None, None, cos, cos, torch.tensor([0, 1, 5]), False, False, False)
    assert len(planned) == 1


# ------------------------------------------------------------------ torch.compile's operator


def test_the_compile_operators_fake_and_meta_kernels_make_the_outputs() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = torch.ops.posenc.rotary_pair_triton
    for mode in (FakeTensorMode(), None):
        device = "cpu" if mode is not None else "meta"
        with mode if mode is not None else torch.device("meta"):
            q = torch.empty(2, 6, 4, 16, dtype=torch.bfloat16, device=device).transpose(1, 2)
            k = torch.empty(2, 1, 6, 16, dtype=torch.bfloat16, device=device)
            cos = torch.empty(6, 8, device=device)
            out_q, out_k = op(q, k, cos, cos, False, False)
        assert out_q.shape == q.shape and out_k.shape == k.shape
        assert out_q.dtype is torch.bfloat16 and out_q.is_contiguous() and out_k.is_contiguous()
        assert out_q.device.type == device


# ------------------------------------------------------------------ Triton's launcher, faked


@pytest.mark.slow  # (compiles the kernel for sm_90: about 2 s)
def test_later_launches_call_the_launcher_as_jit_function_run_does() -> None:
    """The first launch of a plan goes through ``JITFunction.run``; later ones call the
    compiled kernel's launcher directly, with the same arguments (grid, stream, handle,
    metadata, hooks, every kernel argument)."""
    from posenc.bench.host import faked_launches
    from posenc.encodings.rotary.kernels import triton_entry

    q = torch.randn(2, 4, 1, 128, dtype=torch.bfloat16)
    k = torch.randn(2, 2, 1, 128, dtype=torch.bfloat16)
    cos, sin = torch.rand(64, 64), torch.rand(64, 64)
    with faked_launches() as fake:
        runs: list[int] = []
        jit_run = tk.rotary_kernel.run
        tk.rotary_kernel.run = lambda *a, **kw: runs.append(1) or jit_run(*a, **kw)
        try:
            triton_entry.turn_pair(q, k, cos, sin, False, True, 7)
            first = fake.last
            triton_entry.turn_pair(q, k, cos, sin, False, True, 7)
            second = fake.last
            triton_entry.turn_pair(q, k, cos, sin, False, True, 9)  # other rows: same plan
            q2 = torch.randn(2, 4, 2, 128, dtype=torch.bfloat16)
            triton_entry.turn_pair(q2, q2[:, :2], cos, sin, False, False, 0)  # a new plan
        finally:
            del tk.rotary_kernel.run
        assert fake.launches == 4 and len(runs) == 2
    assert len(first) == len(second) == 9 + len(tk.rotary_kernel.arg_names)
    for a, b in zip(first, second, strict=True):
        if isinstance(a, torch.Tensor):
            assert a.data_ptr() == b.data_ptr()
        elif type(a).__name__ == "LazyDict":  # the launch hooks' metadata, made per launch
            assert type(b) is type(a) and a.get() == b.get()
        else:
            assert a is b or a == b


@pytest.mark.slow  # (compiles the kernel for sm_90 and a graph: about 10 s)
def test_a_compiled_pair_is_one_kernel_launch_each_way() -> None:
    """Under ``torch.compile`` (aot_eager) a pair on the Triton kernel is one traced
    ``triton_kernel_wrapper`` launch forward and one backward (``posenc::rotary_pair_triton``
    and its autograd), not two opaque operators each way."""
    import posenc
    from posenc.bench.host import faked_launches

    rope = posenc.RotaryEmbedding(16)
    q = torch.randn(2, 4, 6, 16, requires_grad=True)
    k = torch.randn(2, 2, 6, 16, requires_grad=True)
    positions = torch.arange(3, 9)
    torch._dynamo.reset()
    try:
        with faked_launches() as fake:
            compiled = torch.compile(lambda q, k: rope(q, k, positions), backend="aot_eager")
            got_q, got_k = compiled(q, k)
            assert fake.launches == 1
            (got_q.sum() + got_k.sum()).backward()
            assert fake.launches == 2
    finally:
        torch._dynamo.reset()


def test_a_tensor_on_another_device_launches_under_its_device(
    planned: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan for a tensor on CUDA device 1 while device 0 is current launches inside
    ``torch.cuda.device(1)`` (the kernel is loaded, and runs, on the tensor's device); one
    on the current device launches without a guard. (CUDA stood in for: CPU tensors, the
    plan's device set by hand.)"""
    entered: list[int] = []

    class Guard:
        def __init__(self, index: int) -> None:
            self.index = index

        def __enter__(self) -> None:
            entered.append(self.index)

        def __exit__(self, *exc: object) -> None:
            entered.append(-1)

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", Guard)
    q, cos = torch.randn(1, 2, 3, 8), torch.rand(3, 4)
    tk.launch(q, q, None, None, cos, cos, None, False, False, True)
    assert entered == [] and len(planned) == 1  # (CPU: no device)
    for device, guarded in ((1, [1, -1]), (0, [])):
        planned[0].device = device
        entered.clear()
        tk.launch(q, q, None, None, cos, cos, None, False, False, True)
        assert entered == guarded
