"""Packed documents and the context of a cached or packed forward (``posenc.sequence.context``).

Packed documents must each come out as they would alone: every registered sequence scheme,
every backend, causal and bidirectional. Positions restart in each document unless given; a
cached call continues the last document; a row of 16,384 packed tokens never materialises an
``n × n`` mask (measured in a fresh process).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.sequence.context import SequenceContext
from tests.schemes import NAMES, SEQUENCE

BACKENDS = ["auto", "sdpa", "math", "flex"]
DIM, HEADS = 24, 2
ATOL, RTOL = 2e-5, 1e-4
#: Two packed rows: documents of lengths 3, 4, 2 and 5, 4 (ids need not be sorted).
IDS = torch.tensor([[4, 4, 4, 1, 1, 1, 1, 9, 9], [0, 0, 0, 0, 0, 7, 7, 7, 7]])
DOCUMENTS = [[(0, 3), (3, 7), (7, 9)], [(0, 5), (5, 9)]]


def _encoder(name: str, backend: str, causal: bool) -> posenc.Encoder:
    torch.manual_seed(0)
    encoder = posenc.Encoder(DIM, 2, HEADS, pe=name, causal=causal, backend=backend).eval()
    for layer in encoder.layers:
        layer.attn.compile_flex = False
    return encoder


def _check_documents(encoder: posenc.Encoder, name: str) -> None:
    x = torch.randn(2, IDS.shape[1], DIM, generator=torch.Generator().manual_seed(0))
    packed = encoder(x, document_ids=IDS)
    for r, documents in enumerate(DOCUMENTS):
        for start, end in documents:
            alone = encoder(x[r : r + 1, start:end])
            assert_close(
                packed[r, start:end],
                alone[0],
                atol=ATOL,
                rtol=RTOL,
                msg=lambda m, r=r, s=start: f"{name}, row {r}, document at {s}: {m}",
            )


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", SEQUENCE)
def test_packed_documents_equal_each_document_alone(name: str, backend: str, causal: bool):
    with torch.no_grad():
        _check_documents(_encoder(name, backend, causal), name)


@pytest.mark.parametrize("name", SEQUENCE)
def test_packed_documents_under_autograd_equal_each_document_alone(name: str) -> None:
    _check_documents(_encoder(name, "auto", True), name)


@pytest.mark.parametrize("name", ["rope", "alibi", "sinusoidal"])
def test_packed_then_cached_decoding_equals_each_document_alone(name: str) -> None:
    """A packed prompt fills the cache; the next tokens continue each row's last document
    (positions count on from it, attention reads only it)."""
    torch.manual_seed(0)
    model = posenc.TransformerModel(30, DIM, 2, HEADS, pe=name, causal=True).eval()
    tokens = torch.randint(0, 30, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = posenc.KVCache()
        first = model(tokens[:, :9], cache=cache, document_ids=IDS)
        rest = [model(tokens[:, t : t + 1], cache=cache) for t in range(9, 12)]
        decoded = torch.cat([first, *rest], dim=1)
        for r, documents in enumerate(DOCUMENTS):
            last = documents[-1][0]
            alone = model(tokens[r : r + 1, last:])
            assert_close(decoded[r, last:], alone[0], atol=ATOL, rtol=RTOL)
    assert cache.positions.tolist() == [
        [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4],
        [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6],
    ]
    assert cache.document_ids[:, 9:].tolist() == [[9, 9, 9], [7, 7, 7]]


def test_a_cached_call_may_open_a_new_document() -> None:
    """New ids in a cached call start a document: positions from 0, no reading back."""
    torch.manual_seed(0)
    model = posenc.TransformerModel(30, DIM, 1, HEADS, pe="t5", causal=True).eval()
    tokens = torch.randint(0, 30, (1, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        cache = posenc.KVCache()
        model(tokens[:, :4], cache=cache)
        new = model(tokens[:, 4:], cache=cache, document_ids=torch.tensor([[5, 5, 5]]))
        alone = model(tokens[:, 4:])
    assert_close(new, alone, atol=ATOL, rtol=RTOL)
    assert cache.positions.tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    assert cache.document_runs.tolist() == [[0, 0, 0, 0, 1, 1, 1]]


def test_explicit_positions_win_over_document_restarts() -> None:
    x = torch.randn(1, 4, DIM)
    context = SequenceContext.build(
        batch=1,
        seq=4,
        device=x.device,
        positions=torch.tensor([7, 8, 9, 10]),
        key_padding_mask=None,
        document_ids=torch.tensor([[0, 0, 1, 1]]),
        cache=None,
    )
    assert context is not None
    assert context.positions.tolist() == [[7, 8, 9, 10]]
    assert context.q_runs.tolist() == [[0, 0, 1, 1]]


def test_no_context_without_cache_or_documents() -> None:
    context = SequenceContext.build(
        batch=1,
        seq=3,
        device=torch.device("cpu"),
        positions=None,
        key_padding_mask=None,
        document_ids=None,
        cache=None,
    )
    assert context is None


def test_one_document_per_row_needs_no_document_mask() -> None:
    context = SequenceContext.build(
        batch=2,
        seq=3,
        device=torch.device("cpu"),
        positions=None,
        key_padding_mask=None,
        document_ids=torch.tensor([[3, 3, 3], [1, 1, 1]]),
        cache=None,
    )
    assert context is not None and context.q_runs is None
    assert context.mask(True, 3, 3, torch.device("cpu")) is not None  # causal still


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"document_ids": torch.zeros(1, 4, dtype=torch.long)}, ValueError, r"\(1, 3\)"),
        ({"document_ids": torch.zeros(1, 3)}, TypeError, "integer tensor"),
        ({"document_ids": [[0, 0, 0]]}, TypeError, "document_ids must be a torch.Tensor"),
        ({"cache": {}}, TypeError, "cache must be a posenc.KVCache"),
    ],
)
def test_bad_documents_and_caches_are_clear_errors(kwargs: dict, error: type, match: str):
    model = posenc.TransformerModel(30, DIM, 1, HEADS, pe="rope", causal=True)
    with pytest.raises(error, match=match):
        model(torch.zeros(1, 3, dtype=torch.long), **kwargs)


@pytest.mark.parametrize("name", [n for n in NAMES if posenc.entry(n).cls.axes > 1])
def test_grid_schemes_refuse_caches_and_documents(name: str) -> None:
    encoder = posenc.Encoder(DIM, 1, HEADS, pe=name)
    with pytest.raises(ValueError, match="1-D positions"):
        encoder(torch.zeros(1, 3, DIM), cache=posenc.KVCache())
    with pytest.raises(ValueError, match="1-D positions"):
        encoder(torch.zeros(1, 3, DIM), document_ids=torch.zeros(1, 3, dtype=torch.long))


@pytest.mark.parametrize("name", [n for n in NAMES if posenc.entry(n).cls.axes > 1])
def test_grid_schemes_refuse_windows_when_built(name: str) -> None:
    # every forward would refuse the pair: the encoder and the attention refuse it when built
    with pytest.raises(posenc.PosencValueError, match=rf"^window=2 needs .*; {name} takes"):
        posenc.Encoder(DIM, 1, HEADS, pe=name, window=2)
    with pytest.raises(posenc.PosencValueError, match=r"^chunk=4 needs .*1-D positions"):
        posenc.Encoder(DIM, 2, HEADS, pe=name, chunk=[None, 4])  # one layer chunked
    if posenc.entry(name).cls.family in ("rotary", "bias"):
        with pytest.raises(posenc.PosencValueError, match=r"^window=2 needs"):
            posenc.MultiHeadAttention(DIM, HEADS, pe=name, window=2)


@pytest.mark.slow
def test_a_packed_row_of_16k_tokens_never_materialises_a_mask() -> None:
    """8 documents of 2,048 tokens in one row, ALiBi, causal, the default backend: auto picks
    flex, whose block mask skips other documents. A materialised mask and bias would take
    16,384² × (1 + 4 heads) × 4 bytes = 5 GiB; the peak grows by less than 1 GiB (a fresh
    process, its peak reset after a warm-up call that compiles the kernel)."""
    script = textwrap.dedent(
        """
        import gc, torch, posenc

        def kib(field):
            with open("/proc/self/status") as status:
                return next(int(l.split()[1]) for l in status if l.startswith(field))

        torch.manual_seed(0)
        model = posenc.TransformerModel(64, 64, 1, 4, pe="alibi", causal=True).eval()
        n = 16384
        tokens = torch.randint(0, 64, (1, n))
        ids = torch.arange(8).repeat_interleave(n // 8)[None]
        with torch.no_grad():
            model(tokens, document_ids=ids)  # warm-up: compiles flex for this shape
            gc.collect()
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")  # reset the peak resident set size
            before = kib("VmRSS:")
            model(tokens, document_ids=ids)
        print(model.encoder.layers[0].attn.last_backend, (kib("VmHWM:") - before) * 1024)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    backend, growth = result.stdout.split()[-2:]
    assert backend == "flex"
    assert int(growth) < 2**30, f"peak grew by {int(growth) / 2**30:.2f} GiB"
