"""Tables by distance sized from a host bound (issue #43 item 2): default positions count
tokens, so a plain forward's distances lie within ``n - 1`` and a cached or packed one's
within the tokens seen minus one; the fused forms of KERPLE, DPB, FIRE, Sandwich and
DeBERTa then read nothing from the positions. Here through flex attention (its eager
reference), over a cache (each step's queries offset by the cached tokens) and over packed
documents, with every host read counted, against the float64 math backend; and a bound
that the distances exceed gives NaN, never another distance's value."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.attention.backends import Backend
from posenc.encodings import checks
from tests.encodings.bias.scores import on_grid
from tests.host_reads import host_reads

DIM, HEADS = 16, 2
TABLES = ["kerple", "dpb", "fire", "sandwich", "deberta", "inkling"]


def _pair(name: str) -> tuple[posenc.MultiHeadAttention, posenc.MultiHeadAttention]:
    """Attention on flex (eager) and a float64 copy on the math backend."""
    torch.manual_seed(0)
    attn = posenc.MultiHeadAttention(DIM, HEADS, pe=name, causal=True, backend="flex").eval()
    attn.compile_flex = False
    ref = copy.deepcopy(attn).double()
    ref.backend = Backend.MATH
    return attn, ref


@pytest.mark.parametrize("name", TABLES)
def test_cached_steps_read_nothing_and_equal_float64(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt of 5, three single steps and a chunk of 2 through one cache: each call's
    table covers the tokens seen (its queries sit at offsets 5, 6, ... from the cache), no
    value is read, and the outputs equal the float64 math backend's."""
    attn, ref = _pair(name)
    x = torch.randn(2, 10, DIM, generator=torch.Generator().manual_seed(1))
    caches = posenc.KVCache(), posenc.KVCache()
    with torch.no_grad():
        for start, end in [(0, 5), (5, 6), (6, 7), (7, 8), (8, 10)]:
            with host_reads(monkeypatch, own=True, named=True) as calls:
                got = attn(x[:, start:end], cache=caches[0])
            want = ref(x[:, start:end].double(), cache=caches[1])
            assert attn.last_backend == "flex"
            assert calls == [], (start, calls)
            assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("on_device", [False, True], ids=["cpu", "device"])
@pytest.mark.parametrize("name", TABLES)
def test_packed_documents_read_nothing_and_equal_float64(
    name: str, on_device: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Positions restart at each document (ids ``[0, 0, 0, 1, 1, 1, 1]``, ``[4, 4, 9, 9, 9,
    9, 9]``): the bound is the tokens minus one, no position is read. On the CPU the runs
    are read once, to know whether some row holds two documents and needs their mask; with
    CPU tensors taken as a device's (``CPU_IS_HOST`` cleared) nothing is read and the mask
    is built."""
    monkeypatch.setattr(checks, "CPU_IS_HOST", not on_device)
    attn, ref = _pair(name)
    x = torch.randn(2, 7, DIM, generator=torch.Generator().manual_seed(2))
    ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [4, 4, 9, 9, 9, 9, 9]])
    with torch.no_grad():
        with host_reads(monkeypatch, own=True, named=True) as calls:
            got = attn(x, document_ids=ids)
        want = ref(x.double(), document_ids=ids)
    assert attn.last_backend == "flex"
    assert calls == ([] if on_device else ["posenc.sequence.documents: __bool__"]), calls
    assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["alibi", "t5", "fire"])
def test_one_document_per_row_on_a_device_is_masked_as_none(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of one document each: the device path builds the document mask without reading
    the ids, and its output equals the host path's, which builds none (and a call without
    ids)."""
    attn, _ = _pair(name)
    x = torch.randn(2, 7, DIM, generator=torch.Generator().manual_seed(3))
    ids = torch.tensor([[0] * 7, [5] * 7])
    with torch.no_grad():
        host = attn(x, document_ids=ids)
        plain = attn(x)
        monkeypatch.setattr(checks, "CPU_IS_HOST", False)
        with host_reads(monkeypatch, own=True) as calls:
            device = attn(x, document_ids=ids)
    assert calls == [], calls
    assert_close(device, host, atol=1e-6, rtol=1e-6)
    assert_close(host, plain, atol=0, rtol=0)


def test_the_bound_is_the_tokens_seen_and_given_positions_drop_it() -> None:
    """The context's bound: tokens - 1 while every position is counted by default; once a
    call gives positions (here far past the tokens), none, and the table is sized from the
    distances read (the output still equals float64)."""
    attn, ref = _pair("dpb")
    seen: list[int | None] = []
    real = type(attn.pe).score_mod

    def spy(self, *args, distance_bound=None, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(distance_bound)
        return real(self, *args, distance_bound=distance_bound, **kwargs)

    x = torch.randn(1, 9, DIM)
    cache, cache64 = posenc.KVCache(), posenc.KVCache()
    far = torch.tensor([[100, 140]])
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(attn.pe), "score_mod", spy)
        attn(x[:, :4], cache=cache)
        attn(x[:, 4:5], cache=cache)
        got = attn(x[:, 5:7], cache=cache, positions=far)
        step = attn(x[:, 7:8], cache=cache)
    assert seen == [3, 4, None, None]
    ref(x[:, :4].double(), cache=cache64)
    ref(x[:, 4:5].double(), cache=cache64)
    assert_close(got.double(), ref(x[:, 5:7].double(), cache=cache64, positions=far))
    assert_close(step.double(), ref(x[:, 7:8].double(), cache=cache64))


@pytest.mark.parametrize("name", ["kerple", "fire"])
def test_distances_past_a_broken_bound_are_nan(name: str) -> None:
    """The fused form trusts its bound for its table's size; a distance past it reads NaN
    and every distance within it the bias itself (float64, exactly)."""
    pe = posenc.build_for_model(name, DIM, HEADS).double()
    n, bound = 6, 3
    positions = torch.arange(n)
    mod = pe.score_mod(positions, positions, distance_bound=bound)
    assert mod is not None
    got = on_grid(mod, 1, HEADS, n)[0]
    far = (positions.view(-1, 1) - positions.view(1, -1)).abs() > bound  # (n, n)
    assert got[:, far].isnan().all()
    want = pe.bias(positions, positions)
    assert_close(got[:, ~far], want[:, ~far], rtol=1e-12, atol=1e-12)


def test_transformer_xl_over_a_bound_reads_nothing_and_equals_float64(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Transformer-XL's materialised bias takes the bound too: a plain forward, a prompt and
    steps through a cache on a GPU's path (``CPU_IS_HOST`` cleared) read nothing and equal
    the float64 math backend's on the reading path."""
    torch.manual_seed(0)
    attn = posenc.MultiHeadAttention(DIM, HEADS, pe="xl", causal=True).eval()
    ref = copy.deepcopy(attn).double()
    ref.backend = Backend.MATH
    x = torch.randn(2, 8, DIM, generator=torch.Generator().manual_seed(4))
    caches = posenc.KVCache(), posenc.KVCache()
    with torch.no_grad():
        for start, end, cache in [(0, 8, None), (0, 5, 0), (5, 6, 0), (6, 8, 0)]:
            pair = (None, None) if cache is None else caches
            want = ref(x[:, start:end].double(), cache=pair[1])
            with monkeypatch.context() as patch:
                patch.setattr(checks, "CPU_IS_HOST", False)
                with host_reads(monkeypatch, own=True, named=True) as calls:
                    got = attn(x[:, start:end], cache=pair[0])
            assert calls == [], (start, calls)
            assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_transformer_xl_distances_past_a_broken_bound_are_nan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pe = posenc.build_for_model("xl", DIM, HEADS).double()
    n, bound = 6, 3
    positions = torch.arange(n)
    q, k = torch.randn(2, 1, HEADS, n, DIM // HEADS, dtype=torch.float64).unbind(0)
    want = pe.bias(positions, positions, q=q, k=k)  # (1, h, n, n), the range read
    monkeypatch.setattr(checks, "CPU_IS_HOST", False)
    with host_reads(monkeypatch, own=True) as calls:
        got = pe.bias(positions, positions, q=q, k=k, distance_bound=bound)
    assert calls == [], calls
    far = (positions.view(-1, 1) - positions.view(1, -1)).abs() > bound  # (n, n)
    assert got[:, :, far].isnan().all()
    assert_close(got[:, :, ~far], want[:, :, ~far], atol=1e-12, rtol=1e-12)
