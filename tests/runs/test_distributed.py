"""Processes and threads (``posenc.runs.distributed``): one process outside ``torchrun``;
a rank's ``global_mean`` of its slice makes DDP's gradient average the gradient of the whole
batch's mean (checked by splitting a batch over pretend ranks); a batch must split evenly;
``torch_threads`` restores the thread count, also after an error; the process group is NCCL
with the rank's GPU made current on GPUs, gloo on CPUs. (Two real ``torchrun`` processes
are started by the lengthgen and extrapolate tests.)"""

from __future__ import annotations

import pytest
import torch

from posenc.errors import PosencValueError
from posenc.runs import distributed as dist_module
from posenc.runs.distributed import (
    all_reduce_sum,
    backend_for,
    barrier,
    check_divisible,
    close_distributed,
    global_mean,
    init_distributed,
    torch_threads,
    world,
)


def test_one_process_outside_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert world() == (0, 1)
    assert init_distributed() is False
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert init_distributed() is False
    close_distributed(False)  # nothing joined: nothing to leave
    barrier(1)
    value = torch.tensor([3.0])
    assert all_reduce_sum(value, 1) is value and value.item() == 3.0


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_averaging_the_ranks_gradients_gives_the_whole_batch_gradient(world_size: int) -> None:
    torch.manual_seed(0)
    weight = torch.randn(3, requires_grad=True)
    x, y = torch.randn(8, 3), torch.randn(8)

    def losses(rows: slice) -> torch.Tensor:
        return (x[rows] @ weight - y[rows]) ** 2

    (whole,) = torch.autograd.grad(losses(slice(None)).mean(), weight)
    part = 8 // world_size
    grads = [
        torch.autograd.grad(
            global_mean(losses(slice(r * part, (r + 1) * part)).sum(), 8, world_size), weight
        )[0]
        for r in range(world_size)
    ]
    torch.testing.assert_close(torch.stack(grads).mean(0), whole)  # what DDP's all-reduce does


def test_the_batch_must_split_evenly() -> None:
    check_divisible(12, 4)
    with pytest.raises(PosencValueError, match=r"batch_size \(10\) must be divisible .* \(4\)"):
        check_divisible(10, 4)


def test_torch_threads_restores_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(dist_module.torch, "get_num_threads", lambda: 6)
    monkeypatch.setattr(dist_module.torch, "set_num_threads", calls.append)
    with torch_threads(2):
        assert calls == [2]
    with pytest.raises(RuntimeError), torch_threads(3):
        raise RuntimeError
    with torch_threads(0):  # 0: left as it is
        pass
    assert calls == [2, 6, 3, 6, 6]


def test_the_process_group_is_nccl_on_gpus_and_gloo_on_cpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.distributed as dist

    joined: list[tuple[str, object]] = []
    current: list[object] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(
        dist, "init_process_group", lambda backend, **kw: joined.append((backend, kw))
    )
    monkeypatch.setattr(dist_module.torch.cuda, "set_device", current.append)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert backend_for(None) == backend_for(torch.device("cpu")) == "gloo"
    assert backend_for(torch.device("cuda", 1)) == "nccl"
    assert init_distributed(torch.device("cpu")) is True
    assert init_distributed() is True
    assert joined == [("gloo", {}), ("gloo", {})] and current == []
    gpu = torch.device("cuda", 1)
    assert init_distributed(gpu) is True
    assert joined[-1] == ("nccl", {"device_id": gpu}) and current == [gpu]  # its own GPU
