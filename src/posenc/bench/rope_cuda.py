"""``posenc bench rope --device cuda``: RoPE on queries and keys on a GPU, posenc against the
copy floor and transformers (``rope.py`` is the CPU suite).

For each shape (default (4, 32, 4096, 128) and (1, 32, 16384, 128)) and dtype (bfloat16,
float32), round-robin in one process, each call timed on the GPU between CUDA events with the
device synchronised around it (:func:`~posenc.bench.harness.round_robin` with ``cuda``):

* the floor ``q.clone(); k.clone()``;
* posenc ``RotaryEmbedding.forward`` (cos/sin from its table included), out of place and
  with ``inplace=True``, half and interleaved layouts; the same forward with
  ``POSENC_ROTARY_KERNEL=torch`` (the pure-torch path every CUDA call took before the Triton
  kernel); and inside a module the user compiles (``torch.compile(fullgraph=True)``);
* transformers' ``apply_rotary_pos_emb`` (its tables precomputed, in q's dtype), eager and
  under ``torch.compile`` (inductor's fusion of the formula).

Then a decode step in bfloat16: one new token at position 4095 of q ``(8, 32, 1, 128)`` and k
``(8, 8, 1, 128)``, posenc against transformers' rotary module + ``apply_rotary_pos_emb``;
and a training step (forward, backward, AdamW) of an 8-layer width-512 causal
:class:`~posenc.Encoder` on 32 x 256 tokens under bfloat16 autocast, with RoPE against the
same step with no positions. Compilation happens in the set-up, never in the medians.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..encodings.rotary.rope import RotaryEmbedding
from .harness import Case, Section, Table, ms, ratio, round_robin
from .rope_calls import FORWARD, IN_PLACE, decode_cases, decode_table, forced_kernel
from .timing import Timing, copy_floor

if TYPE_CHECKING:
    from .suites.settings import Settings

FLOOR = "q.clone(); k.clone()"
TORCH_KERNEL = "posenc RotaryEmbedding, POSENC_ROTARY_KERNEL=torch"
COMPILED, COMPILED_IN_PLACE = "posenc compiled", "posenc compiled, in place"
PEER, PEER_COMPILED = "transformers apply_rotary_pos_emb", "transformers, compiled"
#: The goals of issue 36 as "x floor" bounds per row (half layout).
GOALS = {FORWARD: 1.2, IN_PLACE: 1.0}
TRAIN_ROPE, TRAIN_NONE = "training step, RoPE", "training step, no positions"


class _Rotate(nn.Module):
    """What a user compiles: a module that rotates q and k (in place or not)."""

    def __init__(self, rope: RotaryEmbedding, inplace: bool) -> None:
        super().__init__()
        self.rope, self.inplace = rope, inplace

    def forward(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return self.rope(q, k, inplace=self.inplace)


def _compiled(fn: Callable[..., object], *args: Tensor) -> tuple[Callable[[], object], float]:
    """``fn`` compiled for ``args`` and called once (the compilation), and its seconds."""
    compiled = torch.compile(fn, fullgraph=True, dynamic=False)
    start = time.perf_counter()
    with torch.inference_mode():
        compiled(*args)
    torch.cuda.synchronize()
    return (lambda: compiled(*args)), time.perf_counter() - start


def cuda_cases(
    q: Tensor, k: Tensor, notes: list[str], *, compile: bool
) -> list[tuple[str, str, Callable[[], object]]]:
    """The floor, posenc's rows per layout and transformers', as ``(name, layout, fn)``."""
    cases: list[tuple[str, str, Callable[[], object]]] = [(FLOOR, "-", copy_floor(q, k))]
    dtype = str(q.dtype).removeprefix("torch.")
    for interleaved in (False, True):
        layout = "interleaved" if interleaved else "half"
        rope = RotaryEmbedding(q.shape[-1], interleaved=interleaved).to(q.device)
        with torch.inference_mode():
            rope(q, k)  # builds the table
        cases.append((FORWARD, layout, lambda rope=rope: rope(q, k)))
        cases.append((IN_PLACE, layout, lambda rope=rope: rope(q, k, inplace=True)))
        if interleaved:
            continue

        def torch_kernel(rope: RotaryEmbedding = rope) -> object:
            with forced_kernel("torch"):
                return rope(q, k)

        cases.append((TORCH_KERNEL, layout, torch_kernel))
        if compile:
            for name, inplace in ((COMPILED, False), (COMPILED_IN_PLACE, True)):
                fn, seconds = _compiled(_Rotate(rope, inplace), q, k)
                notes.append(f"{dtype} {name}: {seconds:.1f} s")
                cases.append((name, layout, fn))
    try:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import (
            LlamaRotaryEmbedding,
            apply_rotary_pos_emb,
        )
    except ImportError:
        return cases
    n, d = q.shape[-2], q.shape[-1]
    config = LlamaConfig(hidden_size=d, num_attention_heads=1, max_position_embeddings=n)
    positions = torch.arange(n, device=q.device)[None]
    cos, sin = LlamaRotaryEmbedding(config).to(q.device)(q, positions)  # in q's dtype
    cases.append((PEER, "half", lambda: apply_rotary_pos_emb(q, k, cos, sin)))
    if compile:
        fn, seconds = _compiled(apply_rotary_pos_emb, q, k, cos, sin)
        notes.append(f"{dtype} {PEER_COMPILED}: {seconds:.1f} s")
        cases.append((PEER_COMPILED, "half", fn))
    return cases


def train_cases(device: str, shape: tuple[int, int, int, int, int]) -> list[Case]:
    """One training step (forward, backward, AdamW) of a causal :class:`~posenc.Encoder` of
    ``shape`` (width, depth, heads, batch, tokens) with RoPE and with no positions, under
    bfloat16 autocast on ``device``."""
    import posenc

    width, depth, heads, batch, n = shape
    cases = []
    x = torch.randn(batch, n, width, device=device)
    for name, pe in ((TRAIN_ROPE, "rope"), (TRAIN_NONE, None)):
        torch.manual_seed(0)
        model = posenc.Encoder(width, depth, heads, pe=pe, causal=True).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(model: nn.Module = model, optimizer: torch.optim.Optimizer = optimizer) -> object:
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = model(x).float().square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.detach()

        cases.append(Case(name, step))
    return cases


def cuda_suite(s: Settings) -> Section:
    """The rope section of ``posenc bench --device cuda``: one table per shape, a decode
    step, a training step, and the goals of issue 36 against this run's numbers."""
    section = Section("rope", "RoPE applied to queries and keys, on a GPU")
    device = torch.device("cuda")
    section.intro = [
        f"GPU: {torch.cuda.get_device_name(device)}; torch {torch.__version__}, CUDA "
        f"{torch.version.cuda}.",
        "",
        "q and k of each shape (batch, heads, n, head dim), rotated together; each call timed "
        "on the GPU between CUDA events, the device synchronised before and after it. posenc "
        "rows include forming cos/sin from the module's cached table; transformers gets its "
        "tables precomputed, in q's dtype. `x floor` is the time over `q.clone(); k.clone()`. "
        f"Medians over {s.repeats} timed calls per case, round-robin after {s.warmup} "
        "warm-up call(s).",
    ]
    notes: list[str] = []
    spans: dict[str, list[float]] = {}
    for shape in s.rope_cuda:
        table = Table(
            ["dtype", "implementation", "layout", "median ms", "range ms", "x floor"],
            caption=f"q and k of shape {tuple(shape)}:",
            text_columns=3,
        )
        for dtype in (torch.bfloat16, torch.float32):
            torch._dynamo.reset()  # the modules compiled for earlier shapes are not called again
            torch.manual_seed(0)
            q = torch.randn(shape, device=device, dtype=dtype)
            k = torch.randn(shape, device=device, dtype=dtype)
            triples = cuda_cases(q, k, notes, compile=s.rope_compile)
            cases = [Case(f"{name}|{layout}", fn) for name, layout, fn in triples]
            timings = round_robin(cases, warmup=s.warmup, repeats=s.repeats, cuda=True)
            _add_rows(table, str(dtype).removeprefix("torch."), triples, timings, spans)
            del q, k, triples, cases
        section.tables.append(table)
    decode = decode_cases("cuda", torch.bfloat16)
    repeats = max(20 * s.repeats, 50)
    decode_timings = round_robin(decode, warmup=max(s.warmup, 20), repeats=repeats, cuda=True)
    section.tables.append(decode_table(decode, decode_timings, "bfloat16, on the GPU"))
    train = train_cases("cuda", s.rope_train)
    warmup = max(s.warmup, 3)
    train_timings = round_robin(train, warmup=warmup, repeats=s.repeats, grad=True, cuda=True)
    section.tables.append(_train_table(train_timings, s.rope_train))
    section.notes += _summary(spans, decode, decode_timings)
    rope, none = (t.median for t in train_timings)
    section.notes.append(
        f"training step: RoPE takes {rope / none:.3f}x the step with no positions "
        "(goal: at most 1.05x)"
    )
    if notes:
        section.notes.append("compilation (not in the medians): " + ", ".join(notes))
    return section


def _train_table(timings: list[Timing], shape: tuple[int, int, int, int, int]) -> Table:
    width, depth, heads, batch, n = shape
    table = Table(
        ["step", "median ms", "range ms", "x no positions"],
        caption=f"Training step (forward, backward, AdamW) of a causal Encoder, width {width}, "
        f"{depth} layers, {heads} heads, {batch} x {n} tokens, bfloat16 autocast:",
    )
    for t in timings:
        table.rows.append(
            [t.label, ms(t.median), f"{ms(t.low)}–{ms(t.high)}", ratio(t.median, timings[1].median)]
        )
    return table


def _add_rows(
    table: Table,
    dtype: str,
    triples: list[tuple[str, str, Callable[[], object]]],
    timings: list[Timing],
    spans: dict[str, list[float]],
) -> None:
    floor = timings[0]
    for (name, layout, _), t in zip(triples, timings, strict=True):
        if name in GOALS and layout == "half":
            spans.setdefault(name, []).append(t.median / floor.median)
        table.rows.append(
            [dtype, name, layout, ms(t.median), f"{ms(t.low)}–{ms(t.high)}",
             ratio(t.median, floor.median)]
        )  # fmt: skip


def _summary(
    spans: dict[str, list[float]], decode: list[Case], decode_timings: list[Timing]
) -> list[str]:
    """One line per goal of issue 36: this run's range against the bound."""
    lines = [
        f"`{name}` (half layout): {min(spans[name]):.2f}–{max(spans[name]):.2f}x the clone "
        f"floor over every shape and dtype (goal: at most {bound}x)"
        for name, bound in GOALS.items()
        if spans.get(name)
    ]
    times = {case.name: t.median for case, t in zip(decode, decode_timings, strict=True)}
    peer = next((name for name in times if name.startswith("transformers")), None)
    if peer is not None:
        lines.append(
            f"decode step: transformers takes {times[peer] / times[FORWARD]:.2f}x the time of "
            f"posenc (in place: {times[peer] / times[IN_PLACE]:.2f}x; goal: at least 3x)"
        )
    return lines
