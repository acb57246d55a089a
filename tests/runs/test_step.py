"""``posenc.runs.step.scored_step``: the reported loss is the mean cross-entropy of the
scored tokens before the step and the accuracy their argmax hit rate (computed here
independently); the update is the AdamW step on that loss, with clipping, that a
hand-written loop takes; in bf16 the forward runs under autocast (bfloat16 logits) while the
loss is taken in float32 and the parameters, gradients and optimiser state stay float32."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from posenc.runs.step import scored_step, to_device
from posenc.runs.trainer import make_optimizer

V = 7


def toy() -> tuple[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Embedding(V, 8), nn.Linear(8, 16), nn.GELU(), nn.Linear(16, V))
    tokens = torch.randint(0, V, (4, 6))
    targets = torch.randint(0, V, (4, 6))
    scored = torch.rand(4, 6) < 0.6
    return model, tokens, targets, scored


def optimizer_of(model: nn.Module):  # type: ignore[no-untyped-def]
    return make_optimizer(model, lr=0.05, weight_decay=0.01, steps=10, warmup=0.0, decay="linear")


def test_the_loss_the_accuracy_and_the_update_match_a_plain_loop() -> None:
    model, tokens, targets, scored = toy()
    reference = copy.deepcopy(model)
    optimizer, scheduler = optimizer_of(model)
    seen: list[torch.dtype] = []

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        logits = model(tokens)  # (b, n, V)
        seen.append(logits.dtype)
        return logits[scored], targets[scored]

    loss, accuracy = scored_step(
        model, optimizer, scheduler, forward, total=int(scored.sum()), grad_clip=0.5
    )
    assert seen == [torch.float32]

    # the same step written out by hand
    ref_optimizer, ref_scheduler = optimizer_of(reference)
    with torch.no_grad():
        logits = reference(tokens)[scored].double()  # (t, V)
    want_loss = F.cross_entropy(logits, targets[scored])
    hits = (logits.argmax(-1) == targets[scored]).double().mean()
    assert (loss.dtype, accuracy.dtype) == (torch.float64, torch.float32)  # read later
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-6)
    assert float(accuracy) == pytest.approx(float(hits), rel=1e-6)  # a float32 mean
    ref_optimizer.zero_grad()
    F.cross_entropy(reference(tokens)[scored], targets[scored]).backward()
    nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
    ref_optimizer.step()
    ref_scheduler.step()
    for (name, got), want in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7, msg=name)
    assert scheduler.get_last_lr() == ref_scheduler.get_last_lr()


def test_the_mean_is_over_the_global_batch() -> None:
    """``total`` is the global count of scored tokens: a rank holding half of them reports
    its sum over the whole count (the other rank's half adds in through the all-reduce)."""
    model, tokens, targets, scored = toy()
    optimizer, scheduler = optimizer_of(model)
    with torch.no_grad():
        summed = F.cross_entropy(model(tokens)[scored], targets[scored], reduction="sum")
    count = int(scored.sum())

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        return model(tokens)[scored], targets[scored]

    loss, _ = scored_step(
        model, optimizer, scheduler, forward, total=2 * count, grad_clip=0.0, world_size=1
    )
    assert float(loss) == pytest.approx(float(summed) / (2 * count), rel=1e-6)


def test_bf16_autocasts_the_forward_and_keeps_everything_else_fp32() -> None:
    model, tokens, targets, scored = toy()
    twin = copy.deepcopy(model)
    results = {}
    for precision, net in (("fp32", model), ("bf16", twin)):
        optimizer, scheduler = optimizer_of(net)
        seen: list[torch.dtype] = []

        def forward(net: nn.Module = net, seen: list = seen) -> tuple[torch.Tensor, torch.Tensor]:
            logits = net(tokens)
            seen.append(logits.dtype)
            return logits[scored], targets[scored]

        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            low = net(tokens)[scored]  # what bf16 computes, the loss then taken in fp32
        want = F.cross_entropy(low.float(), targets[scored])
        loss, _ = scored_step(
            net,
            optimizer,
            scheduler,
            forward,
            total=int(scored.sum()),
            grad_clip=1.0,
            precision=precision,
        )
        results[precision] = float(loss)
        assert seen == [torch.bfloat16 if precision == "bf16" else torch.float32]
        if precision == "bf16":
            assert float(loss) == pytest.approx(float(want), rel=1e-6)
        assert all(p.dtype == torch.float32 for p in net.parameters())
        assert all(p.grad is None or p.grad.dtype == torch.float32 for p in net.parameters())
        moments = [v for s in optimizer.state.values() for v in s.values() if v.dim()]
        assert moments and all(m.dtype == torch.float32 for m in moments)
        assert not torch.is_autocast_enabled("cpu")  # nothing left switched on
    assert results["bf16"] != results["fp32"]
    assert results["bf16"] == pytest.approx(results["fp32"], rel=2e-2)


def test_to_device_copies_the_batch() -> None:
    """On the CPU a plain copy (on a GPU: pinned and queued, see ``to_device``)."""
    batch = torch.arange(12).view(3, 4)
    moved = to_device(batch, torch.device("cpu"))
    assert torch.equal(moved, batch) and moved.device.type == "cpu"
