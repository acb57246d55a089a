"""Per-layer schedules: one encoding per layer, sliding-window and chunked attention.

A per-layer ``pe`` must equal running each layer with its own encoding by hand; a windowed or
chunked layer must equal attention over exactly the keys it may read (the query run on that
slice of the sequence, at its positions); cached decoding through windowed layers must equal
one full forward.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from tests.schemes import SEQUENCE

DIM, HEADS, N = 24, 2, 9
ATOL, RTOL = 2e-5, 1e-4
INSIDE = [n for n in SEQUENCE if posenc.entry(n).family in ("rotary", "bias")]


def test_equal_names_share_one_module_and_equal_the_single_pe() -> None:
    torch.manual_seed(0)
    listed = posenc.Encoder(DIM, 3, HEADS, pe=["t5"] * 3, causal=True)
    torch.manual_seed(0)
    single = posenc.Encoder(DIM, 3, HEADS, pe="t5", causal=True)
    assert listed.pe is not None and listed.pes == [listed.pe] * 3
    assert listed.state_dict().keys() == single.state_dict().keys()
    x = torch.randn(2, N, DIM)
    assert_close(listed(x), single(x))


def test_a_mixed_schedule_equals_each_layer_run_with_its_own_encoding() -> None:
    torch.manual_seed(0)
    own = posenc.build_for_model("rope", DIM, HEADS)
    encoder = posenc.Encoder(
        DIM, 5, HEADS, pe=["rope", "none", "alibi", own, "rope"], causal=True
    ).eval()
    pes = encoder.pes
    assert encoder.pe is None and len(encoder.encodings) == 4
    assert pes[0] is pes[4] and pes[3] is own and pes[0] is not own
    assert isinstance(pes[1], posenc.NoPE)
    x = torch.randn(2, N, DIM, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(3, 3 + N)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            out = encoder(x, positions=positions)
            h = x
            for layer, pe in zip(encoder.layers, pes, strict=True):
                attention_pe = None if isinstance(pe, posenc.NoPE) else pe
                h = layer(h, positions=positions, pe=attention_pe)
            assert_close(out, encoder.norm(h), atol=ATOL, rtol=RTOL)


def test_positions_are_formed_once_per_distinct_encoding(monkeypatch) -> None:
    encoder = posenc.Encoder(DIM, 4, HEADS, pe=["rope", "alibi", "rope", "alibi"])
    calls: list[str] = []
    for pe in encoder.distinct_pes():
        original = pe.position_state

        name = type(pe).__name__

        def counting(positions, x, original=original, name=name):
            calls.append(name)
            return original(positions, x)

        monkeypatch.setattr(pe, "position_state", counting)
    encoder(torch.randn(1, 5, DIM))
    assert sorted(calls) == ["ALiBi", "RotaryEmbedding"]


@pytest.mark.parametrize(
    ("pe", "error", "match"),
    [
        (["rope", "sinusoidal"], ValueError, r"pe\[1\]=sinusoidal is additive"),
        (["rope"], ValueError, "pe has 1 entries but the model has depth=2"),
        (["rope", 3], TypeError, r"pe\[1\] must be a registry name"),
    ],
)
def test_bad_schedules_are_clear_errors(pe, error, match) -> None:
    with pytest.raises(error, match=match):
        posenc.Encoder(DIM, 2, HEADS, pe=pe)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"window": 0}, ValueError, "window must be >= 1"),
        ({"window": [2]}, ValueError, "window has 1 entries but the model has depth=2"),
        ({"chunk": [2, "4"]}, TypeError, r"chunk\[1\] must be a positive int or None"),
        ({"window": 2.0}, TypeError, "window must be a positive int or None"),
    ],
)
def test_bad_windows_are_clear_errors(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        posenc.Encoder(DIM, 2, HEADS, pe="rope", **kwargs)


def test_with_rope_scaling_rescales_the_layers_of_the_types_given() -> None:
    encoder = posenc.Encoder(DIM, 4, HEADS, pe=["rope", "rope", "none", "rope"], causal=True)
    encoder.layer_types = ["sliding", "full", "full", "sliding"]
    scaled = encoder.with_rope_scaling({"rope_type": "linear", "factor": 8.0}, layer_types={"full"})
    factors = [getattr(pe, "scaling", {}).get("factor") for pe in scaled.pes]
    assert factors == [None, 8.0, None, None]
    assert scaled.pes[0] is encoder.pes[0] and scaled.layers is encoder.layers
    everywhere = encoder.with_rope_scaling({"rope_type": "linear", "factor": 2.0})
    assert [getattr(pe, "scaling", {}).get("factor") for pe in everywhere.pes] == [
        2.0,
        2.0,
        None,
        2.0,
    ]
    assert everywhere.pe is None and everywhere.pes[0] is everywhere.pes[3]
    with pytest.raises(ValueError, match=r"layer_types \['global'\] are not among"):
        encoder.with_rope_scaling(None, layer_types=["global"])
    with pytest.raises(TypeError, match="collection of layer type names"):
        encoder.with_rope_scaling(None, layer_types="full")
    plain = posenc.Encoder(DIM, 2, HEADS, pe="rope")
    with pytest.raises(ValueError, match="layer_types are known"):
        plain.with_rope_scaling(None, layer_types=["full"])


# --------------------------------------------------------------------------- windows


def _reference(attn, x: torch.Tensor, keys: list[range]) -> torch.Tensor:
    """Each query i run alone over the keys ``keys[i]`` at their positions: attention that
    reads exactly those keys."""
    rows = []
    for i, span in enumerate(keys):
        out = attn(x[:, span.start : span.stop], positions=torch.arange(span.start, span.stop))
        rows.append(out[:, i - span.start])
    return torch.stack(rows, dim=1)


def _spans(causal: bool, window: int | None, chunk: int | None) -> list[range]:
    spans = []
    for i in range(N):
        lo, hi = 0, (i + 1 if causal else N)
        if window is not None:
            lo, hi = max(lo, i - window + 1), min(hi, i + window)
        if chunk is not None:
            lo, hi = max(lo, i // chunk * chunk), min(hi, (i // chunk + 1) * chunk)
        spans.append(range(lo, hi))
    return spans


@pytest.mark.parametrize(("window", "chunk"), [(3, None), (None, 4), (3, 4)])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("backend", ["auto", "math", "flex"])
@pytest.mark.parametrize("name", INSIDE)
def test_windowed_and_chunked_attention_read_exactly_their_keys(
    name, backend, causal, window, chunk
) -> None:
    torch.manual_seed(0)
    pe = posenc.build_for_model(name, DIM, HEADS)
    windowed = posenc.MultiHeadAttention(
        DIM, HEADS, pe=pe, causal=causal, window=window, chunk=chunk, backend=backend
    )
    windowed.compile_flex = False
    plain = posenc.MultiHeadAttention(DIM, HEADS, pe=pe, causal=causal)
    plain.load_state_dict(windowed.state_dict())
    x = torch.randn(2, N, DIM, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = _reference(plain, x, _spans(causal, window, chunk))
        assert_close(windowed(x), expected, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", SEQUENCE)
def test_cached_decoding_through_windowed_layers_equals_one_forward(name: str) -> None:
    torch.manual_seed(0)
    model = posenc.TransformerModel(
        30, DIM, 3, HEADS, pe=name, causal=True, window=[3, None, 2], chunk=[None, 4, None]
    ).eval()
    tokens = torch.randint(0, 30, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(tokens)
        cache = posenc.KVCache()
        parts = [model(tokens[:, :5], cache=cache)]
        parts += [model(tokens[:, t : t + 1], cache=cache) for t in range(5, 12)]
    assert_close(torch.cat(parts, dim=1), full, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", ["rope", "alibi", "learned"])
def test_windowed_layers_keep_padded_and_packed_rows_as_alone(name: str) -> None:
    """Windows and chunks count positions, so left padding (positions from the padding) and
    packed documents (positions restarting) see what each row or document sees alone."""
    torch.manual_seed(0)
    encoder = posenc.Encoder(DIM, 2, HEADS, pe=name, causal=True, window=[3, None], chunk=[None, 2])
    encoder.eval()
    x = torch.randn(2, 7, DIM, generator=torch.Generator().manual_seed(4))
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, :3] = True
    with torch.no_grad():
        out = encoder(x, key_padding_mask=padding, positions=posenc.positions_from_padding(padding))
        assert_close(out[1, 3:], encoder(x[1:, 3:])[0], atol=ATOL, rtol=RTOL)
        ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1]] * 2)
        packed = encoder(x, document_ids=ids)
        assert_close(packed[:, 3:], encoder(x[:, 3:]), atol=ATOL, rtol=RTOL)


def test_a_schemes_own_causal_argument_passes_through_pe_kwargs() -> None:
    """``pe_kwargs={"causal": ...}`` is ALiBi's own argument, not the model's."""
    encoder = posenc.Encoder(DIM, 1, HEADS, pe="alibi", pe_kwargs={"causal": True})
    assert encoder.pe.causal is True and encoder.causal is False


def test_a_windowed_layer_keeps_only_the_keys_it_can_still_read() -> None:
    torch.manual_seed(0)
    model = posenc.TransformerModel(
        30, DIM, 3, HEADS, pe="alibi", causal=True, window=[4, None, None], chunk=[None, 8, None]
    ).eval()
    tokens = torch.randint(0, 30, (2, 60), generator=torch.Generator().manual_seed(5))
    padding = torch.zeros(2, 10, dtype=torch.bool)
    padding[1, :6] = True  # row 1 holds 4 real prompt tokens
    positions = posenc.positions_from_padding(padding)
    window, chunked, full = (layer.attn for layer in model.encoder.layers)
    with torch.no_grad():
        cache = posenc.KVCache()
        parts = [model(tokens[:, :10], cache=cache, key_padding_mask=padding, positions=positions)]
        for t in range(10, 60):
            parts.append(model(tokens[:, t : t + 1], cache=cache))
            assert cache.keys_values(window)[0].shape[2] <= 4  # i - 3 ... i
            assert cache.keys_values(chunked)[0].shape[2] <= 8  # the current chunk
        assert cache.keys_values(full)[0].shape[2] == 60
        # the windowed layer's storage stayed small: it reuses its room
        assert cache._layers[id(window)].keys.data.shape[2] <= 16
        for r in range(2):
            real = tokens[r : r + 1, 6 * r :]
            alone = model(real)
            assert_close(torch.cat(parts, dim=1)[r, 6 * r :], alone[0], atol=ATOL, rtol=RTOL)
        with pytest.raises(ValueError, match="positions go back in row 0"):
            model(tokens[:, :1], cache=cache, positions=torch.tensor([3]))


def test_one_layer_takes_no_list_and_per_layer_errors_name_the_layer() -> None:
    with pytest.raises(TypeError, match="window of one attention layer must be a positive int"):
        posenc.MultiHeadAttention(DIM, HEADS, window=[3])
    scale = posenc.QueryScale.llama4(0.1, 8)
    with pytest.raises(TypeError, match=r"query_scale\[1\] must be a posenc"):
        posenc.Encoder(DIM, 2, HEADS, query_scale=[scale, 3])
    encoder = posenc.Encoder(DIM, 3, HEADS, pe="rope")
    encoder.layer_types = ["full_attention"] * 2
    with pytest.raises(ValueError, match="layer_types has 2 entries but the encoder has depth=3"):
        encoder.with_rope_scaling(None, layer_types=["full_attention"])
