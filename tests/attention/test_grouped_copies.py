"""Grouped heads without copies (issue #43 item 4): with ``num_kv_heads = g < h`` the keys and
values reach every backend with their ``g`` heads, and no backend repeats them for the query
groups (no ``repeat_interleave``, no expand-and-copy): math folds the query groups into the
query axis, SDPA takes ``enable_gqa`` (or folds, where CUDA would need it), flex takes
``enable_gqa`` compiled and folds for its eager reference. Checked on a prompt and one cached
decoding step, and each backend's output against the attention formula written out here in
float64 with the keys and values repeated.

What is counted: every aten op run inside ``forward`` (``repeat_interleave`` anywhere), and,
inside the backend, every op that reads the keys' or values' storage and makes a new tensor
larger than the one it read (a copy across the groups). The math backend's ``torch.matmul``
may still lay the keys out afresh for its batched product (``g`` heads, as for full
multi-head attention); that is not a copy across the groups. Flex's eager reference cannot
run under a dispatch mode: there the test checks what reaches ``flex_attention`` instead.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import posenc
from posenc.attention import flex, sdpa
from posenc.attention import module as attention_module
from posenc.attention.backends import Backend

DIM, HEADS, KV_HEADS, HEAD_DIM, PROMPT = 16, 4, 2, 8, 5
GROUPS = HEADS // KV_HEADS


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class _Ops(TorchDispatchMode):
    """The aten ops run, and those that read a watched storage into a new tensor with more
    elements than that storage holds."""

    def __init__(self, watched: list[torch.Tensor] = ()) -> None:
        super().__init__()
        self.storages = {t.untyped_storage().data_ptr() for t in watched}
        self.ops: list[str] = []
        self.grown: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        self.ops.append(str(func))
        read = [t for t in _tensors((args, kwargs)) if self._watched(t)]
        made = [t for t in _tensors(out) if not self._watched(t)]
        # more elements than the storage read holds (an expanded view holds more than that)
        held = max((t.untyped_storage().nbytes() // t.element_size() for t in read), default=0)
        product = str(func).startswith(("aten.bmm", "aten.mm", "aten._scaled_dot_product"))
        if read and not product and any(o.numel() > held for o in made):
            self.grown.append(str(func))
        return out

    def _watched(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() in self.storages


@contextmanager
def _backend_calls(monkeypatch: pytest.MonkeyPatch, watch: bool) -> Iterator[list[dict[str, Any]]]:
    """Each backend call: its inputs, output, and (``watch``) the ops that grew a key or
    value tensor (run on copies of k and v with storages of their own, so that the queries,
    which share the projection's storage, are not mistaken for them)."""
    calls: list[dict[str, Any]] = []
    table = dict(attention_module.BACKEND_FUNCTIONS)

    def spying(fn: Any) -> Any:
        def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: Any) -> Any:
            record: dict[str, Any] = {"q": q, "k": k, "v": v, "call": call, "grown": []}
            if watch:
                k, v = k.clone(), v.clone()
                with _Ops([k, v]) as ops:
                    result = fn(q, k, v, call)
                record["grown"] = ops.grown
            else:
                result = fn(q, k, v, call)
            record["out"] = result[0]
            calls.append(record)
            return result

        return run

    with monkeypatch.context() as patch:
        for backend, fn in table.items():
            patch.setitem(attention_module.BACKEND_FUNCTIONS, backend, spying(fn))
        yield calls


def _reference(record: dict[str, Any]) -> torch.Tensor:
    """``softmax(q kᵀ / sqrt(d) + bias, masked) v`` in float64, each key/value head repeated
    for its query heads (the copy the backends avoid)."""
    q, k, v, call = record["q"], record["k"], record["v"], record["call"]
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (b, h, nq, nk)
    if call.state is not None:
        state = call.state
        scores = scores + state.pe.bias(state.positions, state.last_keys(k.shape[-2]))
    mask = call.dense_mask(k.shape[-2], q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    return scores.softmax(-1) @ v


def _run(backend: str, pe: str | None, monkeypatch: pytest.MonkeyPatch, watch: bool) -> Any:
    torch.manual_seed(0)
    attn = posenc.MultiHeadAttention(
        DIM, HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, pe=pe, causal=True,
        backend=backend,
    ).double().eval()  # fmt: skip
    attn.compile_flex = False
    x = torch.randn(2, PROMPT + 1, DIM, dtype=torch.float64)
    padding = torch.zeros(2, PROMPT, dtype=torch.bool)
    padding[1, 3:] = True  # a padded prompt: a mask on every path
    cache = posenc.KVCache()
    forward = _Ops()
    # (flex's eager reference refuses a dispatch mode)
    counting = forward if backend != "flex" else contextlib.nullcontext()
    with torch.no_grad(), _backend_calls(monkeypatch, watch) as calls, counting:
        attn(x[:, :PROMPT], cache=cache, key_padding_mask=padding)  # the prompt
        attn(x[:, PROMPT:], cache=cache)  # one cached decoding step
    return attn, calls, forward.ops


@pytest.mark.parametrize("pe", [None, "alibi", "t5"])
@pytest.mark.parametrize("backend", ["math", "sdpa", "sdpa-folded"])
def test_math_and_sdpa_copy_no_key_or_value(
    backend: str, pe: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend == "sdpa-folded":  # the path CUDA takes with a mask, run on the CPU
        monkeypatch.setattr(sdpa, "folds_groups", lambda device: True)
        backend = "sdpa"
    attn, calls, ops = _run(backend, pe, monkeypatch, watch=True)
    assert attn.last_backend == backend and len(calls) == 2
    assert not [op for op in ops if "repeat_interleave" in op]
    for record in calls:
        assert record["k"].shape[1] == record["v"].shape[1] == KV_HEADS
        assert record["grown"] == [], record["grown"]
        assert_close(record["out"], _reference(record), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("pe", [None, "alibi", "t5"])
def test_flex_hands_its_kernel_the_grouped_keys_as_they_are(
    pe: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flex_attention gets the keys and values the backend got (the same storage, ``g``
    heads); its eager reference gets the queries folded, ``(b, g, G·nq, d)``, and no
    ``enable_gqa`` (under which it would repeat them). No ``repeat_interleave`` in posenc."""
    kernel: list[tuple[torch.Tensor, ...]] = []
    real = flex._flex

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kw: Any) -> Any:
        kernel.append((q, k, v))
        return real(q, k, v, *args, **kw)

    repeats: list[int] = []
    method = torch.Tensor.repeat_interleave
    monkeypatch.setattr(flex, "_flex", spy)
    monkeypatch.setattr(
        torch.Tensor, "repeat_interleave", lambda *a, **k: repeats.append(1) or method(*a, **k)
    )
    attn, calls, _ = _run("flex", pe, monkeypatch, watch=False)
    monkeypatch.undo()
    assert attn.last_backend == "flex" and len(calls) == len(kernel) == 2 and repeats == []
    for record, (q, k, v) in zip(calls, kernel, strict=True):
        assert k.shape[1] == v.shape[1] == q.shape[1] == KV_HEADS
        assert q.shape[2] == GROUPS * record["q"].shape[2]
        for given, got in ((record["k"], k), (record["v"], v)):
            assert got.untyped_storage().data_ptr() == given.untyped_storage().data_ptr()
        assert_close(record["out"], _reference(record), rtol=1e-10, atol=1e-12)


def test_compiled_flex_takes_enable_gqa(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where flex's kernel serves grouped heads itself (compiled, or inside a user's
    torch.compile), posenc passes ``enable_gqa`` and the keys as they are."""
    seen: list[dict[str, Any]] = []

    def fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        seen.append({"k": k, **kwargs})
        return torch.zeros_like(q)

    import torch.nn.attention.flex_attention as torch_flex

    monkeypatch.setattr(torch_flex, "flex_attention", fake)
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    flex._flex(q, k, v, None, None, None, lse=False)
    assert seen[0]["enable_gqa"] is True and seen[0]["k"] is k
    flex._flex(q, q, q, None, None, None, lse=False)
    assert seen[1]["enable_gqa"] is False


def test_the_math_kernel_folds_any_grouping_exactly() -> None:
    """``scaled_dot_product_attention`` with ``g`` key/value heads for ``h`` query heads
    (``g`` = 1, 2, 3 of 6), a bias, a mask and sinks, equals the repeated formula."""
    torch.manual_seed(0)
    q = torch.randn(2, 6, 5, 4, dtype=torch.float64)
    bias = torch.randn(6, 5, 7, dtype=torch.float64)
    mask = torch.rand(2, 1, 5, 7) > 0.3
    mask[..., 0] = True
    sinks = torch.randn(6, dtype=torch.float64)
    for g in (1, 2, 3):
        k, v = torch.randn(2, g, 7, 4, dtype=torch.float64), torch.randn(2, g, 7, 3).double()
        out, weights = sdpa.scaled_dot_product_attention(q, k, v, mask, bias=bias, sinks=sinks)
        kr, vr = (t.repeat_interleave(6 // g, dim=1) for t in (k, v))
        scores = (q @ kr.transpose(-2, -1) / 2 + bias).masked_fill(~mask, -math.inf)
        with_sink = torch.cat([scores, sinks.view(1, 6, 1, 1).expand(2, 6, 5, 1)], -1)
        want = with_sink.softmax(-1)[..., :-1]
        assert_close(weights, want, rtol=1e-12, atol=1e-14)
        assert_close(out, want @ vr, rtol=1e-12, atol=1e-14)


def test_backends_share_the_grouped_layout_in_an_encoder_under_autograd() -> None:
    """A training step through grouped layers on each backend: the same loss and gradients
    (float64), so folding and enable_gqa differentiate as the repeated keys would."""
    grads = {}
    for backend in (Backend.MATH, Backend.SDPA, Backend.FLEX):
        torch.manual_seed(0)
        attn = posenc.MultiHeadAttention(
            DIM, HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, pe="alibi", causal=True,
            backend=backend,
        ).double()  # fmt: skip
        attn.compile_flex = False
        x = torch.randn(2, 6, DIM, dtype=torch.float64)
        attn(x).square().sum().backward()
        grads[backend] = attn.qkv.weight.grad
    assert_close(grads[Backend.SDPA], grads[Backend.MATH], rtol=1e-10, atol=1e-12)
    assert_close(grads[Backend.FLEX], grads[Backend.MATH], rtol=1e-10, atol=1e-12)
