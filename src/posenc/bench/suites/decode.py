"""The ``decode`` suite of ``posenc bench``: incremental decoding with a :class:`~posenc.KVCache`.

Three measurements of one causal RoPE :class:`~posenc.TransformerModel`, in one run:

* cached greedy generation (``model.generate``) against recomputing the whole prefix at every
  step (both must give the same tokens: checked before timing);
* the same generation against transformers' ``LlamaForCausalLM`` of the same shape with its
  ``DynamicCache``, through each library's ``generate`` and through a plain loop (prefill, then
  one token per call), which separates ``generate``'s overhead from the model's;
* the time of one new token as the cache grows, against a plain copy of the bytes a step must
  read (every weight and the cached keys and values): the memory-bandwidth floor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ...cache import KVCache
from ..harness import Case, Section, Table, fit_exponent, ms, peer_version, ratio, round_robin
from .settings import Settings, missing_peer, timing_line

# ----------------------------------------------------------------------- the decoding loops


def posenc_model(s: Settings) -> nn.Module:
    """The causal RoPE model every row times (seeded, eval mode)."""
    from ...model import TransformerModel

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
    logits = model(prompt, past_key_values=cache, use_cache=True).logits
    tokens = []
    for step in range(new):
        token = logits[:, -1].argmax(dim=-1, keepdim=True)
        tokens.append(token)
        if step + 1 < new:
            logits = model(token, past_key_values=cache, use_cache=True).logits
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


def _growth(s: Settings, model: nn.Module, section: Section) -> Table:
    """One new token's time against the cache's length, and the copy floor at each length."""
    vocab = s.decode[0]
    lengths = s.decode_lengths
    random = torch.Generator().manual_seed(2)
    token = torch.randint(0, vocab, (1, 1), generator=random)
    cases: list[Case] = []
    for length in lengths:
        cache = KVCache()
        model(torch.randint(0, vocab, (1, length), generator=random), cache=cache)
        buffer = torch.empty(step_bytes(model, length) // 4, dtype=torch.float32).normal_()

        def step(cache: KVCache = cache) -> object:
            return model(token, cache=cache)

        def floor(buffer: Tensor = buffer) -> object:
            return torch.empty_like(buffer).copy_(buffer)

        cases += [Case(f"step {length}", step), Case(f"floor {length}", floor)]
    timings = round_robin(cases, warmup=s.warmup, repeats=s.repeats, grad=True)
    rows = []
    for i, length in enumerate(lengths):
        t, f = timings[2 * i], timings[2 * i + 1]
        rows.append({"length": length, "median_s": t.median, "low_s": t.low, "high_s": t.high,
                     "bytes": step_bytes(model, length), "floor_s": f.median})  # fmt: skip
    base = rows[0]["median_s"]
    table = Table(
        ["cache length", "µs/token", "range µs", f"x {lengths[0]} row", "bytes read MiB",
         "copy floor µs", "x floor"],
        caption="One new token as the cache grows (batch 1; `bytes read`: every weight and "
        "the cached keys and values of every layer; the floor is "
        "`torch.empty_like(x).copy_(x)` of a buffer that size):",
    )  # fmt: skip
    for r in rows:
        r["x_first"] = r["median_s"] / base
        r["x_floor"] = r["median_s"] / r["floor_s"]
        table.rows.append(
            [str(r["length"]), f"{r['median_s'] * 1e6:,.0f}",
             f"{r['low_s'] * 1e6:,.0f}–{r['high_s'] * 1e6:,.0f}", f"{r['x_first']:.2f}",
             f"{r['bytes'] / 2**20:.1f}", f"{r['floor_s'] * 1e6:,.0f}", f"{r['x_floor']:.2f}"]
        )  # fmt: skip
    section.data["growth"] = rows
    grown = [(r["length"] - lengths[0], r["median_s"] - base) for r in rows[1:]]
    slope = fit_exponent([g[0] for g in grown], [g[1] for g in grown])
    per_k = [1e9 * c / x for x, c in grown if c > 0]  # µs per 1000 cached tokens
    if slope is not None and per_k:
        section.notes.append(
            f"the time beyond the {lengths[0]} row grows as (L − {lengths[0]})^{slope:.2f} "
            f"(least-squares fit of log time on log length; 1 is the attention's work, linear "
            f"in L): {min(per_k):.0f}–{max(per_k):.0f} µs more per 1000 cached tokens"
        )
    section.notes.append(
        f"each timed step appends its token, so over the {s.warmup + s.repeats} calls of a row "
        f"the cache grows from L to L + {s.warmup + s.repeats}; a row's first call also "
        "doubles the cache's storage (a warm-up call)"
    )
    return table


def suite_decode(s: Settings) -> Section:
    vocab, dim, depth, heads = s.decode
    n, new = s.decode_tokens
    section = Section("decode", "Incremental decoding with a KV cache")
    llama = peer_version("transformers")
    section.intro = [
        f"`posenc.TransformerModel({vocab}, {dim}, {depth}, {heads}, pe=\"rope\", "
        f"causal=True).eval()`, fp32, batch 1, everything under `torch.no_grad()`. Generation: "
        f"a {n}-token prompt and {new} new greedy tokens; `model.generate(prompt, {new})` fills "
        "a `posenc.KVCache` with the prompt, then runs one call per new token; `recompute` "
        "runs the model over the whole sequence so far at every step and takes the argmax of "
        "the last logits. Both give the same tokens (checked before timing). New tokens/s = "
        f"{new} / median (the prompt's call included). "
        f"transformers ({llama or 'not installed'}): `LlamaForCausalLM` with hidden_size "
        f"{dim}, {depth} layers, {heads} heads ({heads} key/value heads), intermediate_size "
        f"{4 * dim}, vocabulary {vocab}, fp32, SDPA attention, through "
        f"`generate(input_ids, max_new_tokens={new}, min_new_tokens={new}, do_sample=False, "
        "use_cache=True)` (its DynamicCache); Llama's gated feed-forward has three matrices to "
        "posenc's two, so it holds a third more weights per layer. `manual loop`: each "
        "library's model called by hand, the prompt once and then one token per call with a "
        "cache, argmax in between (no `generate`). "
        f"Generation medians over {s.decode_repeats} timed calls per case, round-robin, after "
        f"{max(s.warmup, 1)} untimed call(s) of each (the first one also checks the tokens). "
        f"Per-token rows: {timing_line(s)}",
    ]
    with torch.no_grad():
        model = posenc_model(s)
        first, second = _generation(s, model, section)
        third = _growth(s, model, section)
    section.tables += [first, second, third]
    if section.data["peer"]:
        mine, peer = section.data["peer"][0], section.data["peer"][2]
        section.notes.insert(
            0,
            f"posenc generates {mine['speedup']:.2f}x as fast as transformers through "
            f"`generate` and {peer['speedup']:.2f}x through the manual loop (above 1: posenc "
            "is faster)",
        )
    return section
