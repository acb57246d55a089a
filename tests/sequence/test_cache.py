"""The KV cache's bookkeeping: growth by doubling, what it records per token, the batch it
was filled with, and a failed call leaving it as it was."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.sequence.growing import Growing

VOCAB, DIM, HEADS = 30, 16, 2


def _model(pe: str = "rope", depth: int = 2) -> posenc.TransformerModel:
    torch.manual_seed(0)
    return posenc.TransformerModel(VOCAB, DIM, depth, HEADS, pe=pe, causal=True).eval()


def test_growing_doubles_instead_of_copying_each_step() -> None:
    grow = Growing(1)
    buffers = []
    for step in range(100):
        out = grow.append(torch.full((2, 1), step))
        grow.commit(step + 1)
        assert out.tolist() == [list(range(step + 1))] * 2
        if not buffers or grow.data is not buffers[-1]:
            buffers.append(grow.data)
    assert len(buffers) <= 8  # capacities doubling up to 128: log2 of the steps, not 100


def test_growing_under_autograd_concatenates() -> None:
    grow = Growing(0)
    a = torch.ones(2, requires_grad=True)
    first = grow.append(a * 2)
    grow.commit(2)
    second = grow.append(a * 3)
    grow.commit(4)
    second.sum().backward()  # no in-place write broke the graph of the first step
    assert a.grad.tolist() == [5.0, 5.0]
    assert first.tolist() == [2.0, 2.0]


def test_the_cache_records_every_token_and_every_layer() -> None:
    model = _model(depth=3)
    cache = posenc.KVCache()
    padding = torch.tensor([[True, False, False], [False, False, False]])
    with torch.no_grad():
        model(torch.ones(2, 3, dtype=torch.long), cache=cache, key_padding_mask=padding)
        model(torch.ones(2, 1, dtype=torch.long), cache=cache)
    assert len(cache) == 4 and cache.batch_size == 2
    assert cache.layers() == [layer.attn for layer in model.encoder.layers]
    keys, values = cache.keys_values(model.encoder.layers[1].attn)
    assert keys.shape == values.shape == (2, HEADS, 4, DIM // HEADS)
    assert cache.key_padding_mask.tolist() == [[True, False, False, False], [False] * 4]
    assert cache.positions.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert cache.document_ids.tolist() == [[0] * 4] * 2
    assert cache.keys_values(torch.nn.Linear(1, 1)) is None
    assert "length=4" in repr(cache) and "layers=3" in repr(cache)
    cache.reset()
    assert len(cache) == 0 and cache.positions is None and cache.layers() == []


def test_next_position_is_the_largest_real_cached_one_plus_one() -> None:
    """Padding never moves a row's next position, whatever positions it was given."""
    model = _model()
    cache = posenc.KVCache()
    padding = torch.tensor([[True, True, False], [False, False, False]])
    with torch.no_grad():
        model(
            torch.ones(2, 3, dtype=torch.long),
            cache=cache,
            key_padding_mask=padding,
            positions=torch.tensor([[50, 60, 0], [0, 1, 2]]),
        )
        model(torch.ones(2, 1, dtype=torch.long), cache=cache)
    assert cache.positions[:, -1].tolist() == [1, 3]


def test_a_failed_call_leaves_the_cache_as_it_was() -> None:
    model = _model()
    tokens = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = posenc.KVCache()
        model(tokens[:, :4], cache=cache)
        with pytest.raises(ValueError, match="key_padding_mask"):
            model(tokens[:, 4:], cache=cache, key_padding_mask=torch.zeros(1, 3).bool())
        # a failure in the second layer, after the first appended its keys
        second = model.encoder.layers[1]
        second.forward = lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("boom"))
        with pytest.raises(RuntimeError, match="boom"):
            model(tokens[:, 4:5], cache=cache)
        del second.forward
        assert len(cache) == 4
        rest = model(tokens[:, 4:], cache=cache)
        assert_close(rest, model(tokens)[:, 4:], atol=2e-5, rtol=1e-4)


def test_a_cache_serves_one_batch_and_one_model() -> None:
    model, other = _model(), _model()
    cache = posenc.KVCache()
    with torch.no_grad():
        model(torch.ones(2, 3, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="holds 2 row"):
            model(torch.ones(3, 1, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="serves the model that filled it"):
            other(torch.ones(2, 1, dtype=torch.long), cache=cache)


def test_one_attention_module_twice_in_a_call_is_refused() -> None:
    attn = posenc.MultiHeadAttention(DIM, HEADS, causal=True)
    encoder = posenc.Encoder(DIM, 2, HEADS, pe="rope", causal=True)
    encoder.layers[1].attn = attn
    encoder.layers[0].attn = attn
    with pytest.raises(ValueError, match="ran twice in one cached call"):
        encoder(torch.zeros(1, 3, DIM), cache=posenc.KVCache())


def test_an_empty_call_is_accepted_and_changes_nothing() -> None:
    model = _model()
    cache = posenc.KVCache()
    empty = torch.zeros(2, 0, dtype=torch.long)
    with torch.no_grad():
        assert model(empty, cache=cache).shape == (2, 0, VOCAB)
        assert model(empty, document_ids=empty).shape == (2, 0, VOCAB)
        model(torch.ones(2, 3, dtype=torch.long), cache=cache)
        assert model(empty, cache=cache).shape == (2, 0, VOCAB)
    assert len(cache) == 3


def test_keys_follow_the_models_dtype_between_calls() -> None:
    """A model moved to bfloat16 between calls reads its cached keys in bfloat16."""
    model = _model()
    tokens = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(1))
    cache = posenc.KVCache()
    with torch.no_grad():
        model(tokens[:, :4], cache=cache)
        model.to(torch.bfloat16)
        step = model(tokens[:, 4:], cache=cache)
        keys, _ = cache.keys_values(model.encoder.layers[0].attn)
        assert step.dtype == keys.dtype == torch.bfloat16
        reference = model.float()(tokens)[:, 4:]
    assert_close(step.float(), reference, atol=0.1, rtol=0.05)
