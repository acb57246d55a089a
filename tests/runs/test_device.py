"""``posenc.runs.device``: ``--device`` names a device this machine has or is refused by name
(no GPU here, a GPU index past the count, MPS without MPS, a malformed string, ``cuda:N``
and MPS under torchrun), ``auto`` takes a GPU when there is one, torchrun ranks take
``cuda:LOCAL_RANK``; ``--precision`` is fp32 or bf16 (bf16 refused on a GPU without
bfloat16), and bf16 means autocast around the block; a model's device is its weights'.

GPUs are faked by patching ``torch.cuda``'s queries: this machine may have none."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from posenc.errors import PosencTypeError, PosencValueError
from posenc.runs import device as device_module
from posenc.runs.device import (
    autocast,
    check_precision,
    model_device,
    placement,
    resolve_device,
)
from tests.misuse import Misuse, cases, check


@pytest.fixture(autouse=True)
def one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def gpus(monkeypatch: pytest.MonkeyPatch, count: int, *, bf16: bool = True) -> None:
    """Pretend this machine has ``count`` CUDA devices (0: none)."""
    cuda = device_module.torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(cuda, "device_count", lambda: count)
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda, "is_bf16_supported", lambda: bf16)
    monkeypatch.setattr(cuda, "get_device_name", lambda device=None: "Old GPU")


def no_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_module.torch.backends.mps, "is_available", lambda: False)


def torchrun(monkeypatch: pytest.MonkeyPatch, local_rank: int, local_world: int) -> None:
    monkeypatch.setenv("WORLD_SIZE", str(local_world))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))


def test_the_cpu_and_auto_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 0)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" cpu ") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device() == torch.device("cpu")


def test_auto_and_cuda_take_a_gpu_when_there_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 2)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")  # asked for: kept


def test_under_torchrun_each_rank_takes_its_local_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 2)
    torchrun(monkeypatch, local_rank=1, local_world=2)
    assert resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device(torch.device("cuda", 1)) == torch.device("cuda", 1)  # already placed
    assert resolve_device("cpu") == torch.device("cpu")
    gpus(monkeypatch, 1)  # fewer GPUs than local processes: auto stays on the CPUs, all ranks
    assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize(
    "case",
    cases(
        [
            Misuse("malformed", lambda: resolve_device("gpu"), PosencValueError, "device", "gpu"),
            Misuse("bad index", lambda: resolve_device("cuda:x"), PosencValueError, "device",
                   "cuda:x"),
            Misuse("cpu index", lambda: resolve_device("cpu:0"), PosencValueError, "device",
                   "cpu:0"),
            Misuse("negative", lambda: resolve_device("cuda:-1"), PosencValueError, "device",
                   "cuda:-1"),
            Misuse("capitals", lambda: resolve_device("CUDA"), PosencValueError, "device",
                   "CUDA"),
            Misuse("empty", lambda: resolve_device(""), PosencValueError, "device", ""),
            Misuse("type", lambda: resolve_device(0), PosencTypeError, "device", "int"),  # type: ignore[arg-type]
            Misuse("precision", lambda: check_precision("fp16", torch.device("cpu")),
                   PosencValueError, "precision", "fp16"),
            Misuse("autocast", lambda: autocast(torch.device("cpu"), "half"), PosencValueError,
                   "precision", "half"),
        ]
    ),
)  # fmt: skip
def test_malformed_devices_and_precisions_are_refused(case: Misuse) -> None:
    check(case)


def test_a_device_this_machine_lacks_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 0)
    no_mps(monkeypatch)
    with pytest.raises(PosencValueError, match=r"device 'cuda': CUDA is not available"):
        resolve_device("cuda")
    with pytest.raises(PosencValueError, match=r"device 'cuda:0': CUDA is not available"):
        resolve_device("cuda:0")
    with pytest.raises(PosencValueError, match=r"device 'mps': MPS .* is not available"):
        resolve_device("mps")
    gpus(monkeypatch, 2)
    with pytest.raises(
        PosencValueError,
        match=r"device 'cuda:7': only 2 CUDA device\(s\) are visible \(cuda:0, "
        r"cuda:1\)",
    ):
        resolve_device("cuda:7")


def test_torchrun_refuses_one_gpu_for_every_rank_and_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 1)
    torchrun(monkeypatch, local_rank=1, local_world=2)
    with pytest.raises(PosencValueError, match=r"'cuda:0' under torchrun: each process takes"):
        resolve_device("cuda:0")
    with pytest.raises(PosencValueError, match=r"'cuda': only 1 CUDA device"):
        resolve_device("cuda")  # rank 1 needs cuda:1
    with pytest.raises(PosencValueError, match=r"'mps' cannot be used under torchrun"):
        resolve_device("mps")


def test_bf16_is_refused_on_a_gpu_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 1, bf16=False)
    check_precision("fp32", torch.device("cuda", 0))
    check_precision("bf16", torch.device("cpu"))
    with pytest.raises(PosencValueError, match=r"'bf16' needs bfloat16 .* cuda:0 \(Old GPU\)"):
        check_precision("bf16", torch.device("cuda", 0))
    with pytest.raises(PosencValueError, match="bfloat16"):
        placement("cuda", ["fp32", "bf16"])
    assert placement("cuda", ["fp32"]) == torch.device("cuda", 0)


def test_bf16_autocasts_the_block_and_fp32_leaves_it_alone() -> None:
    cpu = torch.device("cpu")
    a, b = torch.randn(3, 4, dtype=torch.float64).float(), torch.randn(4, 2)
    with autocast(cpu, "fp32"):
        plain = a @ b
        assert not torch.is_autocast_enabled("cpu")
    with autocast(cpu, "bf16"):
        assert torch.is_autocast_enabled("cpu")
        low = a @ b
    assert plain.dtype == torch.float32 and low.dtype == torch.bfloat16
    # the product of the bfloat16-rounded inputs, accumulated wider: what autocast computes
    want = (a.bfloat16().double() @ b.bfloat16().double()).bfloat16()
    torch.testing.assert_close(low, want, rtol=2**-8, atol=0)  # within bf16's rounding
    assert not torch.equal(low.float(), plain)  # bf16 differs from fp32, slightly
    torch.testing.assert_close(low.float(), plain, rtol=2e-2, atol=2e-2)


def test_a_model_is_where_its_weights_are() -> None:
    assert model_device(nn.Linear(2, 2)) == torch.device("cpu")
    assert model_device(nn.Linear(2, 2, device="meta")) == torch.device("meta")
    assert model_device(nn.Identity()) == torch.device("cpu")  # nothing to go by
    with_buffer = nn.Module()
    with_buffer.register_buffer("table", torch.zeros(2, device="meta"))
    assert model_device(with_buffer) == torch.device("meta")
