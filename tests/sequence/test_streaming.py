"""StreamingLLM's cache (:class:`posenc.StreamingCache`, issue #41 item 4) is exact.

Its definition: a query of a decode step reads the first ``S`` tokens of its row and the last
``W`` (itself included), at positions inside the cache (the sinks at ``0 .. S - 1``, the window
right after them). So, with the same backend on both sides and the suite's cached = full
tolerance:

* a one-layer model's step equals one forward over those ``S + W`` tokens at positions
  ``0 .. S + W - 1`` (every 1-D rotary and bias scheme of the registry, every rope type;
  additive schemes at the tokens' own positions, NoPE);
* in a deeper model, each layer's attention at a step equals attention over that layer's
  held keys rotated at their in-cache positions, written out here in float64;
* the held storage stays at ``S + W`` tokens however many steps run;
* ``generate`` from a left-padded batch gives each row what it gives alone.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.errors import PosencTypeError, PosencValueError
from tests.schemes import FACTS, SEQUENCE

VOCAB, DIM, HEADS, S, W, N, PROMPT = 40, 16, 2, 2, 3, 10, 4
ATOL, RTOL = 2e-5, 1e-4  # the suite's cached = full tolerance (tests/sequence/test_decoding.py)
HALF = DIM // HEADS // 2  # rotary pairs per head
#: The 1-D schemes a StreamingCache takes (the others are refused by name, below).
STREAMS = [name for name in SEQUENCE if FACTS[name].streams]

#: Every rope type with arguments (``original`` 4 < S + W, so length-dependent types move).
SCALINGS: dict[str, dict] = {
    "linear": {"scaling": {"rope_type": "linear", "factor": 2.0}},
    "ntk": {"scaling": {"rope_type": "ntk", "factor": 2.0}},
    "dynamic": {"scaling": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 4},
    "yarn": {"scaling": {"rope_type": "yarn", "factor": 4.0}, "max_position_embeddings": 16},
    "longrope": {
        "scaling": {
            "rope_type": "longrope",
            "short_factor": [1.0] * HALF,
            "long_factor": [2.0] * HALF,
            "original_max_position_embeddings": 4,
        },
        "max_position_embeddings": 16,
    },
    "llama3": {
        "scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 4,
        }
    },
    "proportional": {"scaling": {"rope_type": "proportional", "factor": 2.0}},
    "ntk_alpha": {"scaling": {"rope_type": "ntk_alpha", "alpha": 2.0}},
}
#: (scheme, pe_kwargs): every 1-D scheme of the registry, Shaw's value-side term, every rope
#: type, partial and interleaved variants.
CASES = (
    [(name, {}) for name in STREAMS]
    + [("shaw", {"values": True})]
    + [("rope", kwargs) for kwargs in SCALINGS.values()]
    + [("rope", {"rotary_dim": 4}), ("rope-interleaved", SCALINGS["yarn"])]
)
IDS = (
    list(STREAMS)
    + ["shaw-values"]
    + [f"rope-{kind}" for kind in SCALINGS]
    + ["rope-partial", "rope-interleaved-yarn"]
)


def test_every_rope_type_is_covered() -> None:
    assert set(SCALINGS) == set(posenc.ROPE_TYPES) - {"default"}, "add the new type to SCALINGS"


def _model(name: str, pe_kwargs: dict, depth: int = 1, **kwargs) -> posenc.TransformerModel:
    torch.manual_seed(0)
    model = posenc.TransformerModel(
        VOCAB, DIM, depth, HEADS, pe=name, causal=True, pe_kwargs=pe_kwargs, **kwargs
    ).eval()
    for layer in model.encoder.layers:
        layer.attn.compile_flex = False
    return model


def _kept(t: int, sinks: int = S, window: int = W) -> list[int]:
    """The tokens query ``t`` reads: the first ``sinks`` and the last ``window`` up to it."""
    return sorted(set(range(min(sinks, t + 1))) | set(range(max(0, t + 1 - window), t + 1)))


def _tokens(seed: int = 1, batch: int = 2, n: int = N) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


def _reference(model, tokens: torch.Tensor, t: int, **kwargs) -> torch.Tensor:
    """The last logits of one forward over the tokens query ``t`` reads: at positions
    ``0 ..`` (rotary, bias, none), or at their own positions (additive)."""
    kept = _kept(t, **kwargs)
    additive = isinstance(model.encoder.pe, posenc.AdditiveEncoding)
    positions = torch.tensor(kept) if additive else None
    return model(tokens[:, kept], positions=positions)[:, -1]


@pytest.mark.parametrize(("name", "pe_kwargs"), CASES, ids=IDS)
def test_a_decode_step_equals_a_forward_over_the_sinks_and_the_window(
    name: str, pe_kwargs: dict
) -> None:
    model = _model(name, pe_kwargs)
    tokens = _tokens()
    cache = posenc.StreamingCache(sink_tokens=S, window=W)
    with torch.no_grad():
        prompt = model(tokens[:, :PROMPT], cache=cache)  # fits: nothing evicted yet
        assert_close(prompt, model(tokens[:, :PROMPT]), atol=ATOL, rtol=RTOL)
        for t in range(PROMPT, N):
            step = model(tokens[:, t : t + 1], cache=cache)[:, -1]
            assert_close(step, _reference(model, tokens, t), atol=ATOL, rtol=RTOL)
            assert len(cache) == len(_kept(t)) <= S + W


@pytest.mark.parametrize("name", ["rope", "xpos", "alibi"])
def test_a_step_under_autograd_has_the_reference_gradient(name: str) -> None:
    """The training path: keys rotated out of place, held keys concatenated."""
    model = _model(name, {})
    tokens = _tokens(seed=12)
    cache = posenc.StreamingCache(sink_tokens=S, window=W)
    model(tokens[:, :PROMPT], cache=cache)
    for t in range(PROMPT, N):
        step = model(tokens[:, t : t + 1], cache=cache)[:, -1]
    reference = _reference(model, tokens, N - 1)
    assert_close(step, reference, atol=ATOL, rtol=RTOL)
    weights = [model.embed.weight, model.encoder.layers[0].attn.qkv.weight]
    got = torch.autograd.grad(step.square().sum(), weights)
    want = torch.autograd.grad(reference.square().sum(), weights)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("backend", ["math", "sdpa", "flex"])
@pytest.mark.parametrize("name", ["rope", "alibi", "cope"])
def test_every_backend_streams_exactly(name: str, backend: str) -> None:
    model = _model(name, {}, backend=backend)
    tokens = _tokens(seed=2)
    cache = posenc.StreamingCache(sink_tokens=S, window=W)
    with torch.no_grad():
        model(tokens[:, : S + W], cache=cache)
        for t in range(S + W, N):
            step = model(tokens[:, t : t + 1], cache=cache)[:, -1]
            assert_close(step, _reference(model, tokens, t), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_streaming_differs_from_full_attention_once_tokens_leave(name: str) -> None:
    """The comparison above can fail: past ``S + W`` tokens the full cache reads more."""
    model = _model(name, {})
    tokens = _tokens(seed=3)
    cache = posenc.StreamingCache(sink_tokens=S, window=W)
    with torch.no_grad():
        model(tokens[:, :PROMPT], cache=cache)
        for t in range(PROMPT, N):
            step = model(tokens[:, t : t + 1], cache=cache)[:, -1]
        full = model(tokens)[:, -1]
    assert (step - full).abs().max() > 1e-3


def test_a_cache_wide_enough_equals_the_kv_cache() -> None:
    """Nothing leaves a cache of ``S + W >= N`` tokens: it is then a plain KVCache."""
    model = _model("rope", {}, depth=2)
    tokens = _tokens(seed=4)
    streaming, full = posenc.StreamingCache(sink_tokens=1, window=N), posenc.KVCache()
    with torch.no_grad():
        for start, end in [(0, PROMPT), *((t, t + 1) for t in range(PROMPT, N))]:
            a = model(tokens[:, start:end], cache=streaming)
            b = model(tokens[:, start:end], cache=full)
            assert_close(a, b, atol=ATOL, rtol=RTOL)


def test_a_windowed_layer_streams_over_in_cache_positions() -> None:
    model = _model("rope", {}, window=3)
    sinks, window = 2, 4
    tokens = _tokens(seed=5)
    cache = posenc.StreamingCache(sink_tokens=sinks, window=window)
    with torch.no_grad():
        model(tokens[:, :PROMPT], cache=cache)
        for t in range(PROMPT, N):
            step = model(tokens[:, t : t + 1], cache=cache)[:, -1]
            reference = _reference(model, tokens, t, sinks=sinks, window=window)
            assert_close(step, reference, atol=ATOL, rtol=RTOL)


def test_multi_head_attention_streams_alone() -> None:
    torch.manual_seed(0)
    attn = posenc.MultiHeadAttention(DIM, HEADS, pe="rope", causal=True, num_kv_heads=1).eval()
    x = torch.randn(2, N, DIM)
    cache = posenc.StreamingCache(sink_tokens=S, window=W)
    with torch.no_grad():
        attn(x[:, :PROMPT], cache=cache)
        for t in range(PROMPT, N):
            step = attn(x[:, t : t + 1], cache=cache)[:, -1]
            assert_close(step, attn(x[:, _kept(t)])[:, -1], atol=ATOL, rtol=RTOL)


# ------------------------------------------------------- each layer of a deeper model


def _rotate64(x: torch.Tensor, positions: torch.Tensor, inv_freq, interleaved: bool):
    """RoPE written out in float64: ``x`` ``(b, h, n, d)``, positions ``(b, n)``."""
    angles = positions.double()[:, None, :, None] * inv_freq  # (b, 1, n, d/2)
    cos, sin = angles.cos(), angles.sin()
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x.chunk(2, dim=-1)
    ra, rb = a * cos - b * sin, b * cos + a * sin
    if interleaved:
        return torch.stack([ra, rb], dim=-1).flatten(-2)
    return torch.cat([ra, rb], dim=-1)


DEEP = {
    "rope": ("rope", {}, 1.0),
    "rope-interleaved": ("rope-interleaved", {}, 1.0),
    "rope-linear": ("rope", {"scaling": {"rope_type": "linear", "factor": 2.0}}, 2.0),
    "alibi": ("alibi", {}, None),
}


@pytest.mark.parametrize("case", list(DEEP))
def test_each_layer_attends_over_its_held_keys_at_in_cache_positions(case: str) -> None:
    name, pe_kwargs, factor = DEEP[case]
    model = _model(name, pe_kwargs, depth=3)
    d = DIM // HEADS
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    if factor is not None:
        inv_freq = inv_freq / factor
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for index, layer in enumerate(model.encoder.layers):
        attend = layer.attn.attend

        def spy(x, state, *, _attend=attend, _index=index, **kwargs):
            heads, weights = _attend(x, state, **kwargs)
            seen[_index] = (x, heads)
            return heads, weights

        layer.attn.attend = spy
    tokens = _tokens(seed=6)
    cache = posenc.StreamingCache(sink_tokens=S, window=W)
    with torch.no_grad():
        model(tokens[:, :PROMPT], cache=cache)
        for t in range(PROMPT, N):
            model(tokens[:, t : t + 1], cache=cache)
            positions = cache.positions  # (b, L): the held keys', the new one last
            assert positions.tolist() == [list(range(len(_kept(t))))] * 2
            for index, layer in enumerate(model.encoder.layers):
                attn = layer.attn
                x, heads = seen[index]
                q = attn._project(x)[0].double()  # (b, h, 1, d)
                keys, values = (part.double() for part in cache.keys_values(attn))
                logits_bias = 0.0
                if factor is not None:
                    interleaved = name == "rope-interleaved"
                    q = _rotate64(q, positions[:, -1:], inv_freq, interleaved)
                    keys = _rotate64(keys, positions, inv_freq, interleaved)
                else:  # ALiBi: -slope * |i - j| at in-cache positions
                    slopes = torch.tensor(
                        [2.0 ** (-8.0 * (h + 1) / HEADS) for h in range(HEADS)],
                        dtype=torch.float64,
                    )
                    distance = (positions[:, -1:] - positions).abs().double()  # (b, L)
                    logits_bias = -slopes[None, :, None, None] * distance[:, None, None, :]
                scores = q @ keys.transpose(-1, -2) / math.sqrt(d) + logits_bias
                out = scores.softmax(dim=-1) @ values  # (b, h, 1, d)
                expected = out.transpose(1, 2).reshape(2, 1, HEADS * d)
                assert_close(heads.double(), expected, atol=ATOL, rtol=RTOL)


# ------------------------------------------------------------------ memory and batches


@pytest.mark.parametrize("padded", [False, True], ids=["plain", "left-padded"])
def test_the_held_storage_stays_flat_over_many_steps(padded: bool) -> None:
    model = _model("rope", {}, depth=2)
    sinks, window, steps = 2, 4, 24
    cache = posenc.StreamingCache(sink_tokens=sinks, window=window)
    prompt = _tokens(seed=7, n=5)
    mask = torch.tensor([[True, True, False, False, False], [False] * 5]) if padded else None
    sizes = []
    with torch.no_grad():
        token = model(prompt, cache=cache, key_padding_mask=mask)[:, -1:].argmax(-1)
        for _ in range(steps):
            token = model(token, cache=cache)[:, -1:].argmax(-1)
            assert len(cache) <= sinks + window
            for attn in cache.layers():
                assert all(t.shape[2] == len(cache) for t in cache.keys_values(attn))
            sizes.append(cache.storage_bytes())
    assert len(cache) == sinks + window
    assert cache.tokens_seen.tolist() == [(3 if padded else 5) + steps, 5 + steps]
    assert len(set(sizes[10:])) == 1  # flat once full
    held = 2 * 2 * 2 * (sinks + window) * DIM * 4  # layers x (k, v) x rows x tokens x width
    assert held <= sizes[-1] < held + 1024  # the keys and values, and small token records


@pytest.mark.parametrize("name", ["rope", "alibi", "cope", "xpos", "sinusoidal"])
def test_a_left_padded_batch_streams_each_row_as_alone(name: str) -> None:
    """Direct calls: a padded prompt (at most S + W real tokens a row), then steps."""
    model = _model(name, {}, depth=2)
    lengths, width = [5, 2, 4], 5
    tokens = _tokens(seed=8, batch=3, n=width + 6)
    mask = torch.zeros(3, width, dtype=torch.bool)
    for row, length in enumerate(lengths):
        mask[row, : width - length] = True
    with torch.no_grad():
        cache = posenc.StreamingCache(sink_tokens=S, window=W)
        batch = [model(tokens[:, :width], cache=cache, key_padding_mask=mask)[:, -1]]
        batch += [model(tokens[:, t : t + 1], cache=cache)[:, -1] for t in range(width, N + 1)]
        for row, length in enumerate(lengths):
            alone = posenc.StreamingCache(sink_tokens=S, window=W)
            mine = tokens[row : row + 1]
            outs = [model(mine[:, width - length : width], cache=alone)[:, -1]]
            outs += [model(mine[:, t : t + 1], cache=alone)[:, -1] for t in range(width, N + 1)]
            for got, want in zip(batch, outs, strict=True):
                assert_close(got[row : row + 1], want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", ["rope", "alibi", "xpos", "sinusoidal"])
def test_generate_from_a_left_padded_batch_gives_each_row_as_alone(name: str) -> None:
    """Prompts longer than S + W (fed S + W at once, then one by one) and shorter ones."""
    model = _model(name, {}, depth=2)
    lengths, width, new = [9, 3, 6], 9, 8
    prompt = _tokens(seed=9, batch=3, n=width)
    mask = torch.zeros(3, width, dtype=torch.bool)
    for row, length in enumerate(lengths):
        mask[row, : width - length] = True
    cache = posenc.StreamingCache(sink_tokens=S, window=W)
    out = model.generate(prompt, new, key_padding_mask=mask, cache=cache)
    assert len(cache) <= S + W
    for row, length in enumerate(lengths):
        alone = model.generate(
            prompt[row : row + 1, width - length :], new, cache=posenc.StreamingCache(S, W)
        )
        assert torch.equal(out[row, width - length :], alone[0])


def test_generate_after_a_long_prompt_reads_the_sinks_and_the_window() -> None:
    model = _model("rope", {})
    prompt = _tokens(seed=10, batch=2, n=N)
    out = model.generate(prompt, 1, cache=posenc.StreamingCache(sink_tokens=S, window=W))
    with torch.no_grad():
        expected = _reference(model, prompt, N - 1).argmax(-1)
    assert torch.equal(out[:, -1], expected)


def test_generate_takes_a_kv_cache_or_none_alike() -> None:
    model = _model("rope", {}, depth=2)
    prompt = _tokens(seed=11, n=4)
    cache = posenc.KVCache()
    assert torch.equal(model.generate(prompt, 5), model.generate(prompt, 5, cache=cache))
    assert len(cache) == 4 + 5 - 1


# ------------------------------------------------------------------------- refusals


class _OwnRotation(posenc.RotaryEncoding):
    """A rotary scheme with only the protocol's forward (no read_state)."""

    def forward(self, q, k, positions=None):
        return q, k


@pytest.mark.parametrize(
    ("make", "call", "error", "match"),
    [
        (lambda: _model("rope2d", {}), {}, PosencValueError, "rope2d takes 2-D"),
        (lambda: _model("rope", {}), {"positions": torch.arange(3)}, PosencValueError,
         "positions= cannot be given with a StreamingCache"),
        (lambda: _model("rope", {}), {"document_ids": torch.zeros(2, 3, dtype=torch.long)},
         PosencValueError, "document_ids= cannot be given with a StreamingCache"),
        (lambda: _model("rope", {}),
         {"key_padding_mask": torch.tensor([[False, False, True]] * 2)},
         PosencValueError, "padding after a real token"),
    ],
    ids=["axial", "positions", "document_ids", "right-padding"],
)  # fmt: skip
def test_what_cannot_stream_is_refused_by_name(make, call, error, match) -> None:
    model = make()
    with pytest.raises(error, match=match):
        model(_tokens(n=3), cache=posenc.StreamingCache(S, W), **call)


@pytest.mark.parametrize("name", [name for name in SEQUENCE if not FACTS[name].streams])
def test_schemes_that_cannot_stream_are_refused_by_name(name: str) -> None:
    with pytest.raises(PosencValueError, match=f"{name} cannot join a StreamingCache"):
        _model(name, {})(_tokens(n=3), cache=posenc.StreamingCache(S, W))


def test_rotary_schemes_without_read_state_and_mrope_are_refused_by_name() -> None:
    attn = posenc.MultiHeadAttention(DIM, HEADS, pe=_OwnRotation(), causal=True)
    with pytest.raises(PosencValueError, match="_OwnRotation cannot rotate cached keys"):
        attn(torch.randn(1, 3, DIM), cache=posenc.StreamingCache(S, W))
    mrope = posenc.MultimodalRotaryEmbedding(DIM // HEADS, mrope_section=[2, 1, 1])
    attn = posenc.MultiHeadAttention(DIM, HEADS, pe=mrope, causal=True)
    with pytest.raises(PosencValueError, match="MultimodalRotaryEmbedding"):
        attn(torch.randn(1, 3, DIM), cache=posenc.StreamingCache(S, W))


def test_a_call_that_would_evict_part_way_is_refused() -> None:
    model = _model("rope", {})
    cache = posenc.StreamingCache(S, W)
    with pytest.raises(PosencValueError, match="feed at most 5 tokens"):
        model(_tokens(n=S + W + 1), cache=cache)
    model(_tokens(n=3), cache=cache)
    with pytest.raises(PosencValueError, match="feed at most 2 tokens"):
        model(_tokens(n=3), cache=cache)
    model(_tokens(n=2), cache=cache)  # fits exactly
    model(_tokens(n=1), cache=cache)  # one token always fits
    padded = posenc.StreamingCache(S, W)
    mask = torch.tensor([[True] + [False] * 5, [False] * 6])
    with pytest.raises(PosencValueError, match="6 real tokens after 0 in row 1"):
        model(_tokens(n=6), cache=padded, key_padding_mask=mask)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((-1, 3), PosencValueError, "sink_tokens must be >= 0"),
        ((2, 0), PosencValueError, "window must be >= 1"),
        ((2.0, 3), PosencTypeError, "sink_tokens must be an int"),
        ((2, True), PosencTypeError, "window must be an int"),
    ],
)
def test_bad_sizes_are_refused(args, error, match) -> None:
    with pytest.raises(error, match=match):
        posenc.StreamingCache(*args)


def test_generate_needs_an_empty_cache_of_a_known_kind() -> None:
    model = _model("rope", {})
    cache = posenc.StreamingCache(S, W)
    model(_tokens(n=2), cache=cache)
    with pytest.raises(PosencValueError, match="needs an empty cache"):
        model.generate(_tokens(n=2), 2, cache=cache)
    with pytest.raises(PosencTypeError, match=r"cache must be a posenc\.KVCache"):
        model.generate(_tokens(n=2), 2, cache={})
    with pytest.raises(PosencValueError, match="holds 2 row"):
        model(_tokens(batch=3, n=1), cache=cache)
