"""The ``decode`` suite of ``posenc bench``: incremental decoding with a :class:`~posenc.KVCache`.

Three measurements of one causal RoPE :class:`~posenc.TransformerModel`, in one run:

* cached greedy generation (``model.generate``) against recomputing the whole prefix at every
  step (both must give the same tokens: checked before timing);
* the same generation against transformers' ``LlamaForCausalLM`` of the same shape with its
  ``DynamicCache``, through each library's ``generate`` and through a plain loop (prefill, then
  one token per call), which separates ``generate``'s overhead from the model's;
* the time of one new token as the cache grows, against a plain copy of the bytes a step must
  read (every weight and the cached keys and values): the memory-bandwidth floor;
* a long generation with a :class:`~posenc.StreamingCache` against a :class:`~posenc.KVCache`
  (a smaller model): tokens/s over the whole run and over its last quarter, and the bytes
  each cache holds at the end.
"""

from __future__ import annotations

import random as pyrandom
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ...sequence.cache import KVCache
from ...sequence.streaming import StreamingCache
from ..harness import Case, Section, Table, ms, peer_version, ratio, round_robin
from ..timing import Timing
from .settings import Settings, missing_peer, timing_line

# ----------------------------------------------------------------------- the decoding loops


def posenc_model(s: Settings) -> nn.Module:
    """The causal RoPE model every row times (seeded, eval mode)."""
    from ...model.transformer import TransformerModel

    vocab, dim, depth, heads = s.decode
    torch.manual_seed(0)
    return TransformerModel(vocab, dim, depth, heads, pe="rope", causal=True).eval()


def recompute(model: nn.Module, prompt: Tensor, new: int) -> Tensor:
    """Greedy decoding without a cache: every step runs the model over the whole sequence so
    far and takes the argmax of the last logits. ``(b, n)`` -> ``(b, n + new)``."""
    seq = prompt
    for _ in range(new):
        token = model(seq)[:, -1].argmax(dim=-1)
        seq = torch.cat([seq, token[:, None]], dim=1)
    return seq


def posenc_loop(model: nn.Module, prompt: Tensor, new: int) -> Tensor:
    """Greedy decoding by hand with a :class:`~posenc.KVCache`: the prompt in one call, then
    one call per new token (what ``generate`` does, without its checks and options)."""
    cache = KVCache()
    logits = model(prompt, cache=cache)
    tokens = []
    for step in range(new):
        token = logits[:, -1].argmax(dim=-1, keepdim=True)
        tokens.append(token)
        if step + 1 < new:
            logits = model(token, cache=cache)
    return torch.cat([prompt, *tokens], dim=1)


def llama_model(s: Settings) -> nn.Module:
    """transformers' ``LlamaForCausalLM`` shaped like :func:`posenc_model`: the same width,
    depth, heads (no grouped queries), vocabulary and intermediate size (posenc's
    feed-forward is ``4 * dim``); fp32, SDPA attention, seeded, eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab, dim, depth, heads = s.decode
    prompt, new = s.decode_tokens
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=dim,
        intermediate_size=4 * dim,
        num_hidden_layers=depth,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max(prompt + new, *s.decode_lengths) + 1,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def llama_generate(model: nn.Module, prompt: Tensor, new: int) -> Tensor:
    """``model.generate``, greedy, exactly ``new`` tokens, with its (default) DynamicCache."""
    return model.generate(  # type: ignore[operator]
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        use_cache=True,
        pad_token_id=0,
        eos_token_id=None,
    )


def llama_loop(model: nn.Module, prompt: Tensor, new: int) -> Tensor:
    """Greedy decoding by hand with a ``DynamicCache``: the prompt in one call, then one call
    per new token (positions follow from the cache's length)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    logits = model(prompt, cache=cache, use_cache=True).logits
    tokens = []
    for step in range(new):
        token = logits[:, -1].argmax(dim=-1, keepdim=True)
        tokens.append(token)
        if step + 1 < new:
            logits = model(token, cache=cache, use_cache=True).logits
    return torch.cat([prompt, *tokens], dim=1)


def step_bytes(model: nn.Module, length: int) -> int:
    """The bytes one decoding step of a batch of one reads at least: every weight, and the
    keys and values of ``length`` cached tokens in every layer."""
    encoder = model.encoder
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    itemsize = next(model.parameters()).element_size()
    return weights + 2 * encoder.depth * length * encoder.dim * itemsize


# ----------------------------------------------------------------------- the measurements


def _agree(name: str, got: Tensor, want: Tensor, what: str) -> None:
    """Raise when two decodings of the same prompt differ (the timings would compare unequal
    work)."""
    if got.shape != want.shape or not torch.equal(got, want):
        differ = (got != want).nonzero() if got.shape == want.shape else None
        where = "shapes differ" if differ is None else f"first at column {int(differ[0, 1])}"
        raise AssertionError(f"decode bench: {name} and {what} give different tokens ({where})")


def _generation(s: Settings, model: nn.Module, section: Section) -> tuple[Table, Table]:
    """Cached vs recomputed generation, and posenc vs transformers: one round-robin over
    every whole-generation case."""
    vocab = s.decode[0]
    n, new = s.decode_tokens
    prompt = torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(1))
    runs: dict[str, Callable[[], Tensor]] = {
        "posenc generate": lambda: model.generate(prompt, new),  # type: ignore[operator]
        "recompute": lambda: recompute(model, prompt, new),
        "posenc loop": lambda: posenc_loop(model, prompt, new),
    }
    have_peer = peer_version("transformers") is not None
    if have_peer:
        llama = llama_model(s)
        runs["llama generate"] = lambda: llama_generate(llama, prompt, new)
        runs["llama loop"] = lambda: llama_loop(llama, prompt, new)
    else:
        section.notes.append(missing_peer("transformers", "LlamaForCausalLM rows"))
    tokens = {name: run() for name, run in runs.items()}  # also a first warm-up call each
    _agree("model.generate", tokens["posenc generate"], tokens["recompute"], "recomputation")
    _agree("posenc's loop", tokens["posenc loop"], tokens["posenc generate"], "model.generate")
    if have_peer:
        _agree("transformers' loop", tokens["llama loop"], tokens["llama generate"], "generate")
    section.data["tokens_agree"] = True
    cases = [Case(name, run) for name, run in runs.items()]
    timed = dict(
        zip(
            runs,
            round_robin(cases, warmup=max(s.warmup - 1, 0), repeats=s.decode_repeats, grad=True),
            strict=True,
        )
    )

    def row(name: str, label: str) -> dict[str, Any]:
        t = timed[name]
        return {"case": name, "implementation": label, "median_s": t.median, "low_s": t.low,
                "high_s": t.high, "tokens_per_s": new / t.median}  # fmt: skip

    def cells(r: dict[str, Any], speedup: str) -> list[str]:
        spread = f"{ms(r['low_s'])}–{ms(r['high_s'])}"
        return [ms(r["median_s"]), spread, f"{r['tokens_per_s']:,.0f}", speedup]

    cached = [row("posenc generate", "posenc `model.generate` (KV cache)"),
              row("recompute", "recompute the whole prefix each step")]  # fmt: skip
    section.data["cached"] = cached
    first = Table(
        ["implementation", "median ms", "range ms", "new tokens/s", "cache speed-up"],
        caption=f"Cached generation vs recomputing the prefix ({n}-token prompt, {new} new "
        "tokens, greedy, batch 1):",
    )
    speedup = ratio(cached[1]["median_s"], cached[0]["median_s"])
    first.rows = [[cached[0]["implementation"], *cells(cached[0], speedup)],
                  [cached[1]["implementation"], *cells(cached[1], "1.00")]]  # fmt: skip
    second = Table(
        ["loop", "implementation", "median ms", "range ms", "new tokens/s", "posenc speed-up"],
        caption="posenc vs transformers' LlamaForCausalLM with its DynamicCache (same prompt "
        "and length; the speed-up is transformers' median over posenc's):",
        text_columns=2,
    )
    peer_rows: list[dict[str, Any]] = []
    loops = (("generate()", "posenc generate", "llama generate"),
             ("manual loop", "posenc loop", "llama loop"))  # fmt: skip
    for loop, mine, theirs in loops:
        if not have_peer:
            continue
        ours = {**row(mine, "posenc TransformerModel"), "loop": loop}
        peer = {**row(theirs, "transformers LlamaForCausalLM"), "loop": loop}
        ours["speedup"] = peer["median_s"] / ours["median_s"]
        peer_rows += [ours, peer]
        second.rows += [[loop, ours["implementation"], *cells(ours, f"{ours['speedup']:.2f}")],
                        [loop, peer["implementation"], *cells(peer, "-")]]  # fmt: skip
    section.data["peer"] = peer_rows
    return first, second


def _slope(xs: list[int], ys: list[float]) -> float:
    """The least-squares slope of ``ys`` against ``xs`` (0 with fewer than two lengths)."""
    if len(set(xs)) < 2:
        return 0.0
    return statistics.linear_regression(xs, ys).slope


def warm_rounds(steps: list[Case], *, warmup: int, repeats: int) -> list[Timing]:
    """:func:`~posenc.bench.harness.round_robin` for decoding steps: every timed call follows
    an untimed call of the same case, as a step follows a step when decoding (the weights
    and that cache are then as warm as they get), instead of whatever case came before it.
    Each round takes the cases in a new (seeded) order; each case runs ``warmup + 2 *
    repeats`` times."""
    samples: list[list[float]] = [[] for _ in steps]
    order = list(range(len(steps)))
    shuffler = pyrandom.Random(0)
    for case in steps:
        for _ in range(warmup):
            case.fn()
    for _ in range(repeats):
        shuffler.shuffle(order)
        for i in order:
            steps[i].fn()
            start = time.perf_counter()
            steps[i].fn()
            samples[i].append(time.perf_counter() - start)
    return [
        Timing(case.name, statistics.median(x), min(x), max(x), repeats)
        for case, x in zip(steps, samples, strict=True)
    ]


def _growth(s: Settings, model: nn.Module, section: Section) -> Table:
    """One new token's time against the cache's length, and two copy floors at each length:
    into a new buffer (``torch.empty_like(x).copy_(x)``) and into an existing one."""
    vocab = s.decode[0]
    lengths = s.decode_lengths
    random = torch.Generator().manual_seed(2)
    token = torch.randint(0, vocab, (1, 1), generator=random)
    steps: list[Case] = []
    floors: list[Case] = []
    for length in lengths:
        cache = KVCache()
        model(torch.randint(0, vocab, (1, length), generator=random), cache=cache)
        buffer = torch.empty(step_bytes(model, length) // 4, dtype=torch.float32).normal_()
        target = torch.empty_like(buffer)

        def step(cache: KVCache = cache) -> object:
            return model(token, cache=cache)

        def floor(buffer: Tensor = buffer) -> object:
            return torch.empty_like(buffer).copy_(buffer)

        def into(buffer: Tensor = buffer, target: Tensor = target) -> object:
            return target.copy_(buffer)

        steps.append(Case(f"step {length}", step))
        floors += [Case(f"floor {length}", floor), Case(f"into {length}", into)]
    timings = warm_rounds(steps, warmup=s.warmup, repeats=s.repeats)
    copies = round_robin(floors, warmup=s.warmup, repeats=s.repeats, grad=True)
    rows = []
    for i, (length, t) in enumerate(zip(lengths, timings, strict=True)):
        f, c = copies[2 * i : 2 * i + 2]
        rows.append({"length": length, "median_s": t.median, "low_s": t.low, "high_s": t.high,
                     "bytes": step_bytes(model, length), "floor_s": f.median,
                     "into_s": c.median})  # fmt: skip
    base = rows[0]["median_s"]
    table = Table(
        ["cache length", "µs/token", "range µs", f"x {lengths[0]} row", "bytes read MiB",
         "copy floor µs", "x floor", "copy into buffer µs", "x copy into"],
        caption="One new token as the cache grows (batch 1; `bytes read`: every weight and "
        "the cached keys and values of every layer; `copy floor`: "
        "`torch.empty_like(x).copy_(x)` of a buffer that size; `copy into buffer`: "
        "`y.copy_(x)` into a buffer made beforehand):",
    )  # fmt: skip
    us = 1e6
    for r in rows:
        r["x_first"] = r["median_s"] / base
        r["x_floor"] = r["median_s"] / r["floor_s"]
        r["x_into"] = r["median_s"] / r["into_s"]
        table.rows.append(
            [str(r["length"]), f"{r['median_s'] * us:,.0f}",
             f"{r['low_s'] * us:,.0f}–{r['high_s'] * us:,.0f}", f"{r['x_first']:.2f}",
             f"{r['bytes'] / 2**20:.1f}", f"{r['floor_s'] * us:,.0f}", f"{r['x_floor']:.2f}",
             f"{r['into_s'] * us:,.0f}", f"{r['x_into']:.2f}"]
        )  # fmt: skip
    section.data["growth"] = rows
    xs = [r["length"] for r in rows]
    step_slope = _slope(xs, [r["median_s"] for r in rows]) * 1e3 * us  # µs per 1000 tokens
    copy_slope = _slope(xs, [r["into_s"] for r in rows]) * 1e3 * us
    last_slope = _slope(xs[-2:], [r["median_s"] for r in rows[-2:]]) * 1e3 * us
    kv_mib = (step_bytes(model, 1000) - step_bytes(model, 0)) / 2**20
    versus = f"{step_slope / copy_slope:.2f}x" if copy_slope > 0 else "-"
    section.notes.append(
        f"growth: each 1000 more cached tokens add {step_slope:.0f} µs to a step "
        f"({last_slope:.0f} µs between the last two rows: a straight line, as the attention's "
        f"work); copying those tokens' keys and values ({kv_mib:.1f} MiB) into a buffer adds "
        f"{copy_slope:.0f} µs ({versus}; least-squares lines over every row)"
    )
    if rows[-1]["bytes"] > 32 * 2**20:
        section.notes.append(
            "the two floors part where a buffer exceeds 32 MiB, glibc's largest `mmap` "
            "threshold: from there every `empty_like` maps fresh pages and faults each one in, "
            "so the new-buffer floor jumps while the copy into an existing buffer (the "
            "bandwidth) does not"
        )
    section.notes.append(
        f"each step appends its token, so over the {s.warmup + 2 * s.repeats} calls of a row "
        f"the cache grows from L to L + {s.warmup + 2 * s.repeats}; a row's first call also "
        "doubles the cache's storage (a warm-up call)"
    )
    return table


def timed_loop(
    model: nn.Module, prompt: Tensor, new: int, cache: KVCache | StreamingCache
) -> tuple[float, float]:
    """Greedy decoding by hand (the prompt in one call, then one call per new token, as
    :func:`posenc_loop`) into ``cache``: the seconds of the whole run and of its last
    quarter of new tokens."""
    quarter = new - new // 4
    start = time.perf_counter()
    tail = start
    logits = model(prompt, cache=cache)
    for step in range(new):
        if step == quarter:
            tail = time.perf_counter()
        token = logits[:, -1].argmax(dim=-1, keepdim=True)
        if step + 1 < new:
            logits = model(token, cache=cache)
    end = time.perf_counter()
    return end - start, end - tail


def cache_bytes(cache: KVCache | StreamingCache) -> tuple[int, int]:
    """The bytes of keys and values ``cache`` holds for its tokens, and the bytes allocated
    for them (a KVCache grows by doubling: its buffers hold room for more)."""
    live = allocated = 0
    for module in cache.layers():
        held = cache.keys_values(module)
        assert held is not None
        for t in held:
            live += t.numel() * t.element_size()
            allocated += t.untyped_storage().nbytes()
    return live, allocated


def _streaming(s: Settings, section: Section) -> Table:
    """A long greedy generation with a StreamingCache and with a KVCache, alternating."""
    from ...model.transformer import TransformerModel

    vocab, dim, depth, heads = s.decode_stream
    n, new, sinks, window = s.decode_stream_tokens
    torch.manual_seed(0)
    model = TransformerModel(vocab, dim, depth, heads, pe="rope", causal=True).eval()
    prompt = torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(3))
    makers: dict[str, Callable[[], KVCache | StreamingCache]] = {
        "KVCache": KVCache,
        f"StreamingCache({sinks}, {window})": lambda: StreamingCache(sinks, window),
    }
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in makers}
    held: dict[str, tuple[int, int, int]] = {}
    for round_ in range(s.decode_stream_repeats):
        for name in makers if round_ % 2 == 0 else reversed(makers):
            cache = makers[name]()
            runs[name].append(timed_loop(model, prompt, new, cache))
            held[name] = (len(cache), *cache_bytes(cache))
    table = Table(
        ["cache", "tokens/s", "last quarter tokens/s", "tokens held", "K/V MiB held",
         "K/V MiB allocated"],
        caption=f"{new} new greedy tokens after a {n}-token prompt (batch 1; the median "
        f"over {s.decode_stream_repeats} run(s) of each cache, alternating):",
    )  # fmt: skip
    rows = []
    for name, timings in runs.items():
        total = statistics.median(t for t, _ in timings)
        tail = statistics.median(t for _, t in timings)
        tokens, live, allocated = held[name]
        row = {"cache": name, "seconds": total, "tokens_per_s": new / total,
               "tail_tokens_per_s": (new // 4) / tail, "tokens_held": tokens,
               "bytes_held": live, "bytes_allocated": allocated}  # fmt: skip
        rows.append(row)
        table.rows.append(
            [name, f"{row['tokens_per_s']:,.0f}", f"{row['tail_tokens_per_s']:,.0f}",
             str(tokens), f"{live / 2**20:.2f}", f"{allocated / 2**20:.2f}"]
        )  # fmt: skip
    section.data["streaming"] = rows
    section.notes.append(
        f'streaming: `TransformerModel({vocab}, {dim}, {depth}, {heads}, pe="rope", '
        f"causal=True)`; a StreamingCache holds {sinks} sink and {window} window tokens "
        "whatever the length (keys rotated when read), a KVCache every token; the two give "
        "different tokens once tokens leave the window (StreamingLLM reads fewer)"
    )
    return table


def suite_decode(s: Settings) -> Section:
    vocab, dim, depth, heads = s.decode
    n, new = s.decode_tokens
    section = Section("decode", "Incremental decoding with a KV cache")
    llama = peer_version("transformers")
    model = posenc_model(s)
    weights_mib = step_bytes(model, 0) / 2**20
    floors_line = timing_line(s)
    section.intro = [
        f'`posenc.TransformerModel({vocab}, {dim}, {depth}, {heads}, pe="rope", '
        f"causal=True).eval()` ({weights_mib:.1f} MiB of weights), fp32, batch 1, everything "
        f"under `torch.no_grad()`. Generation: a {n}-token prompt and {new} new greedy tokens; "
        f"`model.generate(prompt, {new})` fills a `posenc.KVCache` with the prompt, then runs "
        "one call per new token; `recompute` runs the model over the whole sequence so far at "
        "every step and takes the argmax of the last logits. Both give the same tokens "
        f"(checked before timing). New tokens/s = {new} / median (the prompt's call included).",
        "",
        f"transformers ({llama or 'not installed'}): `LlamaForCausalLM` with hidden_size "
        f"{dim}, {depth} layers, {heads} heads ({heads} key/value heads), intermediate_size "
        f"{4 * dim}, vocabulary {vocab}, fp32, SDPA attention, through "
        f"`generate(input_ids, max_new_tokens={new}, min_new_tokens={new}, do_sample=False, "
        "use_cache=True)` (its DynamicCache); Llama's gated feed-forward has three matrices to "
        "posenc's two, so it holds a third more weights per layer. `manual loop`: each "
        "library's model called by hand, the prompt once and then one token per call with a "
        "cache, argmax in between (no `generate`). "
        f"Generation medians over {s.decode_repeats} timed calls per case, round-robin, after "
        f"{max(s.warmup, 1)} untimed call(s) of each (the first one also checks the tokens).",
        "",
        f"Per-token rows: medians over {s.repeats} timed steps per cache length after "
        f"{s.warmup} warm-up step(s); each round takes the lengths in a new order and times "
        "the second of two back-to-back steps, so that a timed step follows a step, as in "
        "decoding (where the weights may stay in the CPU's caches from one step to the next), "
        f"and not a copy. Copy floors: {floors_line[0].lower()}{floors_line[1:]}",
    ]
    with torch.no_grad():
        first, second = _generation(s, model, section)
        third = _growth(s, model, section)
        fourth = _streaming(s, section)
    section.tables += [table for table in (first, second, third, fourth) if table.rows]
    if section.data["peer"]:
        through_generate, by_hand = section.data["peer"][0], section.data["peer"][2]
        section.notes.insert(
            0,
            f"posenc generates {through_generate['speedup']:.2f}x as fast as transformers "
            f"through `generate` and {by_hand['speedup']:.2f}x through the manual loop (above "
            "1: posenc is faster)",
        )
    return section
