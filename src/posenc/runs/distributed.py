"""Processes and threads: ``torchrun`` (NCCL on GPUs, gloo on CPUs) and torch's thread count.

Every rank draws the same global batch and trains on its slice; :func:`global_mean` scales a
slice's loss so that DDP's gradient average equals the single-process gradient of the whole
batch, and :func:`all_reduce_sum` gives every rank the batch's total.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from torch import Tensor

from ..errors import PosencValueError


def world() -> tuple[int, int]:
    """``(rank, world size)``: ``(0, 1)`` outside ``torchrun``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def check_divisible(batch_size: int, world_size: int) -> None:
    """A global batch must split evenly over the processes."""
    if batch_size % world_size:
        raise PosencValueError(
            f"batch_size ({batch_size}) must be divisible by the number of processes ({world_size})"
        )


def barrier(world_size: int) -> None:
    """Wait for every rank (nothing to do in one process)."""
    if world_size > 1:
        import torch.distributed as dist

        dist.barrier()


def backend_for(device: torch.device | None) -> str:
    """The process-group backend for ranks computing on ``device``: NCCL for CUDA, gloo
    otherwise (the CPU)."""
    return "nccl" if device is not None and device.type == "cuda" else "gloo"


def init_distributed(device: torch.device | None = None) -> bool:
    """Join the torchrun process group when launched by torchrun: NCCL with this process's
    GPU made current when ``device`` is a CUDA device (``cuda:LOCAL_RANK``, see
    :func:`~posenc.runs.device.resolve_device`), gloo otherwise. True if joined here."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    backend = backend_for(device)
    if backend == "nccl":
        torch.cuda.set_device(device)
        dist.init_process_group(backend, device_id=device)
    else:
        dist.init_process_group(backend)
    return True


def close_distributed(joined: bool) -> None:
    """Leave the process group if :func:`init_distributed` joined it, once every rank has
    reached this point, and free it while Python still runs. gloo's worker threads drop
    their finished collectives (which hold tensors with Python objects) on their own time;
    one that does so while the interpreter shuts down cannot take the GIL and aborts the
    rank ("terminate called without an active exception": a core dump showed
    ``~AsyncBarrierWork`` -> ``~AsyncAllreduceWork`` -> ``decref_pyobject`` ->
    ``pthread_exit`` in ``ProcessGroupGloo::runLoop``). Collecting the group's last
    references (the DDP wrappers) here joins those threads before the interpreter ends."""
    if joined:
        import gc

        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
        gc.collect()


def global_mean(loss_sum: Tensor, global_count: int, world_size: int) -> Tensor:
    """This rank's part of the global-batch mean: DDP averages gradients over ranks, so
    ``loss_sum * world / count`` makes that average the gradient of the global mean."""
    return loss_sum * (world_size / global_count)


def all_reduce_sum(value: Tensor, world_size: int) -> Tensor:
    """``value`` summed over ranks (in place; the value itself in one process)."""
    if world_size > 1:
        import torch.distributed as dist

        dist.all_reduce(value)
    return value


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` torch threads (0: leave as is), then restore."""
    previous = torch.get_num_threads()
    if count > 0:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
