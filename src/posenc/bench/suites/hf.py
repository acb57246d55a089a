"""The ``hf`` suite of ``posenc bench``: a transformers Llama with and without
:func:`posenc.hf.patch`.

Two ``LlamaForCausalLM`` with the same random weights (:attr:`Settings.hf`: width, depth,
heads, key/value heads, prompt, new tokens; float32, SDPA attention), one patched. They must
give the same greedy tokens (checked before timing). Timed: the prefill (one forward over the
prompt) and greedy ``generate`` (prefill, then one token per step with transformers'
``DynamicCache``), medians over round-robin repeats. Then, in one untimed generation of each,
the time spent in the rotary code (the rotary module's forward and every call that rotates q
or k, each timed around the call; each kind of call at its median, times its calls), per call,
and its share of the median generation, and the peak of the bytes
allocated during a prefill (CUDA: ``torch.cuda.max_memory_allocated``; the CPU keeps no
peak, so there the bytes allocated in all, from the profiler).
"""

from __future__ import annotations

import contextlib
import importlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ..harness import Case, Section, Table, ms, peer_version, ratio, round_robin
from .settings import Settings, missing_peer, timing_line


def llama(s: Settings) -> nn.Module:
    """The benchmarked model: ``LlamaForCausalLM`` of :attr:`Settings.hf`'s shape (seeded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    width, depth, heads, kv_heads, prompt, new = s.hf
    config = LlamaConfig(
        vocab_size=s.hf_vocab,
        hidden_size=width,
        intermediate_size=(8 * width // 3 + 63) // 64 * 64,
        num_hidden_layers=depth,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=prompt + new,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval().to(s.device)


def _generate(model: nn.Module, prompt: torch.Tensor, new: int) -> torch.Tensor:
    return model.generate(
        prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
    )


class _Clock:
    """Time spent inside the calls it wraps (the device synchronised around each), kept per
    kind of call (the function and the shape of its first tensor: a decode step's calls are
    one kind, the prefill's another). :attr:`seconds` is each kind's median call times its
    number of calls, summed: on a shared machine a call that the scheduler preempts counts
    as a typical one, not as the milliseconds another job took."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.calls: dict[tuple, list[float]] = {}

    @property
    def seconds(self) -> float:
        return sum(statistics.median(t) * len(t) for t in self.calls.values())

    @property
    def count(self) -> int:
        return sum(len(t) for t in self.calls.values())

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            if self.cuda:
                torch.cuda.synchronize()
            took = time.perf_counter() - start
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            kind = (id(fn), None if first is None else tuple(first.shape))
            self.calls.setdefault(kind, []).append(took)
            return out

        return timed


@contextlib.contextmanager
def _rotary_clock(model: nn.Module, patched: bool, cuda: bool) -> Iterator[_Clock]:
    """Time the rotary module's forward and the q/k rotations of ``model`` while inside."""
    from ...hf.patch import APPLY, _innermost

    clock = _Clock(cuda)
    rotary = model.model.rotary_emb
    rotary_forward = rotary.forward
    rotary.forward = clock.wrap(rotary_forward)
    if patched:  # posenc's rotation: the function each patched attention reads from its globals
        owners = [
            _innermost(layer.self_attn.forward.__func__).__globals__ for layer in model.model.layers
        ]
    else:
        owners = [vars(importlib.import_module("transformers.models.llama.modeling_llama"))]
    originals = [(owner, owner[APPLY]) for owner in {id(o): o for o in owners}.values()]
    for owner, original in originals:
        owner[APPLY] = clock.wrap(original)
    try:
        yield clock
    finally:
        for owner, original in originals:
            owner[APPLY] = original
        rotary.forward = rotary_forward


def _allocated_bytes(run: Callable[[], object], cuda: bool) -> int:
    """On CUDA the most bytes allocated at once while ``run()`` runs, above what was allocated
    before; on the CPU (which keeps no peak) the bytes allocated in all, summed over the
    profiler's per-operator allocations."""
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    return sum(max(e.self_cpu_memory_usage, 0) for e in prof.events())


def suite_hf(s: Settings) -> Section:
    section = Section("hf", "A transformers Llama patched by posenc.hf.patch")
    if peer_version("transformers") is None:
        section.notes.append(missing_peer("transformers", "the hf suite"))
        return section
    import transformers

    from ...hf.patch import patch

    transformers.logging.set_verbosity_error()
    cuda = s.device == "cuda"
    width, depth, heads, kv_heads, n_prompt, new = s.hf
    plain, patched = llama(s), llama(s)
    patch(patched)
    prompt = torch.randint(3, s.hf_vocab, (1, n_prompt), generator=torch.Generator().manual_seed(0))
    prompt = prompt.to(s.device)
    with torch.inference_mode():
        same = torch.equal(_generate(plain, prompt, new), _generate(patched, prompt, new))
    if not same:
        raise AssertionError("the patched Llama's greedy tokens differ from the unpatched one's")
    models = {"transformers": plain, "patched": patched}
    cases = []
    for label, model in models.items():
        cases.append(Case(f"prefill, {label}", lambda m=model: m(prompt), "prefill"))
        cases.append(Case(f"generate, {label}", lambda m=model: _generate(m, prompt, new), "gen"))
    timings = {
        t.label: t for t in round_robin(cases, warmup=s.warmup, repeats=s.hf_repeats, cuda=cuda)
    }
    shares, peaks = {}, {}
    with torch.inference_mode():
        for label, model in models.items():
            with _rotary_clock(model, label == "patched", cuda) as clock:
                _generate(model, prompt, new)
            shares[label] = (clock.seconds, timings[f"generate, {label}"].median, clock.count)
            peaks[label] = _allocated_bytes(lambda m=model: m(prompt), cuda)
    table = Table(
        [
            "",
            "prefill",
            "generate",
            "rotary in one generate",
            "a rotary call",
            "rotary share",
            "prefill peak (CUDA) / allocated (CPU)",
        ],
        caption=(
            f"`LlamaForCausalLM`: width {width}, {depth} layers, {heads} heads, {kv_heads} "
            f"key/value heads, vocabulary {s.hf_vocab}, float32, SDPA, on {s.device}; prefill "
            f"{n_prompt} tokens, generate {new} new tokens greedily (same tokens patched and not)"
        ),
    )
    for label in models:
        rotary, total, calls = shares[label]
        table.rows.append(
            [
                label,
                ms(timings[f"prefill, {label}"].median),
                ms(timings[f"generate, {label}"].median),
                ms(rotary),
                f"{1e6 * rotary / max(calls, 1):.1f} µs",
                f"{100 * rotary / total:.1f}%",
                f"{peaks[label] / 2**20:.1f} MiB",
            ]
        )
    plain_share = shares["transformers"][0] / shares["transformers"][1]
    patched_share = shares["patched"][0] / shares["patched"][1]
    table.rows.append(
        [
            "transformers / patched",
            ratio(timings["prefill, transformers"].median, timings["prefill, patched"].median),
            ratio(timings["generate, transformers"].median, timings["generate, patched"].median),
            ratio(shares["transformers"][0], shares["patched"][0]),
            ratio(
                shares["transformers"][0] / max(shares["transformers"][2], 1),
                shares["patched"][0] / max(shares["patched"][2], 1),
            ),
            ratio(plain_share, patched_share),
            ratio(peaks["transformers"], max(peaks["patched"], 1)),
        ]
    )
    section.tables.append(table)
    section.intro.append(
        timing_line(s).replace(f"{s.repeats} timed", f"{s.hf_repeats} timed")
        + " The rotary columns come from one more, untimed generation of each model, with a "
        "clock around the rotary module's forward and each rotation call: each kind of call "
        "(the function, the shape it gets) counted at its median, times its number of calls "
        "(a call the scheduler preempts counts as a typical one); the share is of the median "
        "generate."
    )
    section.data["hf"] = {"timings": timings, "shares": shares, "peaks": peaks}
    return section
