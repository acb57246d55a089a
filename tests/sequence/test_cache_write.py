"""The cache's write side: a forward writes through a transaction its context holds
(``CacheWrite`` for a ``KVCache``, ``StreamWrite`` for a ``StreamingCache``); nothing a
reader sees changes before the commit, and a forward that raises, in any layer, on the
first call or a later one, leaves the cache exactly as it was (its records, every layer's keys
and values, its flags, the encodings' memos), after which the next call gives what it would
have given."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.sequence.cache import CacheWrite

VOCAB, DIM, HEADS = 30, 16, 2


def _model(pe: str = "rope", **kwargs: Any) -> posenc.TransformerModel:
    torch.manual_seed(0)
    return posenc.TransformerModel(VOCAB, DIM, 3, HEADS, pe=pe, causal=True, **kwargs).eval()


def _snapshot(cache: posenc.KVCache | posenc.StreamingCache) -> dict[str, Any]:
    """Everything a reader can see, copied."""

    def copied(t: Any) -> Any:
        return None if t is None else t.clone()

    seen: dict[str, Any] = {
        "len": len(cache),
        "batch": cache.batch_size,
        "positions": copied(cache.positions),
        "padding": copied(cache.key_padding_mask),
        "has_padding": cache.has_padding,
        "layers": list(cache.layers()),
        "kv": [tuple(t.clone() for t in cache.keys_values(m)) for m in cache.layers()],
        "memos": {key: dict(memo) for key, (_, memo) in cache._memos.items()},
    }
    if isinstance(cache, posenc.KVCache):
        seen.update(
            documents=copied(cache.document_ids),
            runs=copied(cache.document_runs),
            has_documents=cache.has_documents,
            bound=cache.position_bound(),
            next=copied(cache.next_position),
        )
    return seen


def _assert_same(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert before.keys() == after.keys()
    for name in before:
        a, b = before[name], after[name]
        if name == "kv":
            assert len(a) == len(b)
            for pair_a, pair_b in zip(a, b, strict=True):
                for x, y in zip(pair_a, pair_b, strict=True):
                    assert x.dtype == y.dtype and torch.equal(x, y), name
        elif name == "memos":
            assert a.keys() == b.keys(), name
            for key in a:
                assert a[key].keys() == b[key].keys(), name
        elif isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            assert a is not None and b is not None, name
            assert a.dtype == b.dtype and torch.equal(a, b), name
        else:
            assert a == b, name


def _failing(layer: torch.nn.Module) -> None:
    """Make ``layer``'s attention raise once its keys are staged (after the earlier layers
    staged theirs)."""
    attn = layer.attn
    project = attn._project

    def boom(x: torch.Tensor) -> Any:
        raise RuntimeError("boom")

    attn._project = boom
    layer._restore = lambda: setattr(attn, "_project", project)


@pytest.mark.parametrize("failing", [0, 2])
@pytest.mark.parametrize(
    "second",
    [
        {},  # a decoding step
        {"key_padding_mask": torch.tensor([[False, False], [True, False]])},
        {"document_ids": torch.tensor([[5, 6], [5, 5]])},
        {"positions": torch.tensor([[4.5, 5.5], [4.0, 5.0]])},  # float: the bound unknown
    ],
)
def test_a_failed_forward_leaves_a_kv_cache_as_it_was(failing: int, second: dict) -> None:
    model = _model("xpos", window=[None, 3, None])  # xPos keeps a memo; a windowed layer
    tokens = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    padding = torch.tensor([[False] * 4, [True, False, False, False]])
    cache = posenc.KVCache()
    with torch.no_grad():
        model(tokens[:, :4], cache=cache, key_padding_mask=padding)
        before = _snapshot(cache)
        layer = model.encoder.layers[failing]
        _failing(layer)
        with pytest.raises(RuntimeError, match="boom"):
            model(tokens[:, 4:], cache=cache, **second)
        layer._restore()
        _assert_same(before, _snapshot(cache))
        got = model(tokens[:, 4:], cache=cache, **second)
        fresh = posenc.KVCache()  # the same two calls, with no failure between them
        model(tokens[:, :4], cache=fresh, key_padding_mask=padding)
        want = model(tokens[:, 4:], cache=fresh, **second)
    assert_close(got, want, atol=0, rtol=0)
    _assert_same(_snapshot(fresh), _snapshot(cache))


def test_a_failed_first_forward_leaves_the_cache_empty() -> None:
    model = _model("xpos")
    cache = posenc.KVCache()
    empty = _snapshot(cache)
    with torch.no_grad():
        _failing(model.encoder.layers[1])
        with pytest.raises(RuntimeError, match="boom"):
            model(
                torch.ones(1, 3, dtype=torch.long),
                cache=cache,
                document_ids=torch.tensor([[0, 0, 1]]),
            )
    _assert_same(empty, _snapshot(cache))
    assert cache.positions is None and cache.layers() == [] and cache._memos == {}
    assert not cache.has_documents


def test_a_failed_attention_forward_leaves_the_cache_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MultiHeadAttention's own forward: its write is never committed."""
    from posenc.attention import module

    torch.manual_seed(0)
    attn = posenc.MultiHeadAttention(DIM, HEADS, pe="rope", causal=True).eval()
    x = torch.randn(1, 5, DIM)
    cache = posenc.KVCache()
    with torch.no_grad():
        attn(x[:, :3], cache=cache)
        before = _snapshot(cache)
        with monkeypatch.context() as patch:  # fails once the keys are staged
            patch.setattr(module, "choose_backend", lambda request: 1 / 0)
            with pytest.raises(ZeroDivisionError):
                attn(x[:, 3:], cache=cache)
        _assert_same(before, _snapshot(cache))
        assert_close(attn(x[:, 3:], cache=cache), attn(x)[:, 3:], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("padded", [False, True])
def test_a_failed_forward_leaves_a_streaming_cache_as_it_was(padded: bool) -> None:
    model = _model()
    tokens = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    cache = posenc.StreamingCache(sink_tokens=2, window=4)
    padding = torch.tensor([[False, False], [True, False]]) if padded else None
    with torch.no_grad():
        model(tokens[:, :3], cache=cache)
        before = _snapshot(cache)
        layer = model.encoder.layers[2]
        _failing(layer)
        with pytest.raises(RuntimeError, match="boom"):
            model(tokens[:, 3:5], cache=cache, key_padding_mask=padding)
        layer._restore()
        _assert_same(before, _snapshot(cache))
        assert cache.key_padding_mask is None  # a padded call that failed set nothing
        got = model(tokens[:, 3:4], cache=cache)
        fresh = posenc.StreamingCache(sink_tokens=2, window=4)
        model(tokens[:, :3], cache=fresh)
        assert_close(got, model(tokens[:, 3:4], cache=fresh), atol=0, rtol=0)


def test_the_write_commits_and_rolls_back() -> None:
    cache = posenc.KVCache()
    attn = torch.nn.Linear(1, 1)  # any module names a layer's entry
    k = torch.randn(1, 2, 3, 4)
    records = (torch.zeros(1, 3, dtype=torch.bool), torch.zeros(1, 3, dtype=torch.long))
    records += (records[1],)  # padding, document ids, runs
    write = cache.write(1)
    assert isinstance(write, CacheWrite)
    write.stage(torch.arange(3).view(1, 3), *records)
    keys, _ = write.append_kv(attn, k, k)
    assert keys.shape == (1, 2, 3, 4)
    assert len(cache) == 0 and cache.positions is None and cache.layers() == []  # nothing yet
    write.rollback()
    write.commit()  # closed: nothing
    assert len(cache) == 0 and cache.positions is None and cache.layers() == []
    write = cache.write(1)
    write.stage(torch.arange(3).view(1, 3), *records)
    write.append_kv(attn, k, k)
    with pytest.raises(ValueError, match="ran twice in one cached call"):
        write.append_kv(attn, k, k)
    write.commit()
    assert len(cache) == 3 and cache.layers() == [attn]
    assert torch.equal(cache.keys_values(attn)[0], k)
    with pytest.raises(ValueError, match="holds 1 row"):
        cache.write(2)
