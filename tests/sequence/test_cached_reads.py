"""A cached or packed forward reads no position on the host (issue #36 item 3).

On CUDA a read of a device value (``.tolist()``, ``.item()``, ``bool(t)``, ...) synchronises
the host with the GPU. The rotary tables of a cached forward are sized from a bound the host
knows (:class:`~posenc.encodings.checks.PositionBound`: the cache's, kept without reads, or
the value read once from positions a user gave), so a decode step reads nothing. Here every
host read is counted on the CPU (the same code runs on CUDA), and the rotated result is
compared bit for bit with the path that reads the positions (``bounded_positions`` replaced
by ``None``, as before), for every rotary scheme, through :class:`~posenc.Encoder` with a
:class:`~posenc.KVCache`: plain, left-padded and packed prompts, then single steps and a
chunk of two. ``benchmarks/sync_check.py --decode`` makes the same check on a GPU.

Also counted: the constants posenc's code makes with ``torch.tensor`` (on CUDA a copy from
the host, which waits for the stream) in flex attention with a mask, Shaw's bias and the
sampling of a token: none, they are filled on the device.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.encodings import checks
from posenc.encodings.rotary import rope as rope_module
from posenc.model import sampling
from tests.host_reads import host_reads

DIM, HEADS, DEPTH, PROMPT, N = 32, 2, 3, 6, 11
#: ``Tensor`` methods through which a device value reaches the host.

SCHEMES = {
    "rope": ("rope", {}),
    "rope-interleaved": ("rope-interleaved", {}),
    "partial": ("rope", {"rotary_dim": 10}),
    "xpos": ("xpos", {}),
    "linear": ("rope", {"scaling": {"rope_type": "linear", "factor": 2.0}}),
    "yarn": ("rope", {"scaling": {"rope_type": "yarn", "factor": 4.0},
                      "max_position_embeddings": 32}),
    "llama3": ("rope", {"scaling": {"rope_type": "llama3", "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8}}),
    # frequencies that move with the length: the decode steps below cross the original 8
    "dynamic": ("rope", {"scaling": {"rope_type": "dynamic", "factor": 2.0},
                         "max_position_embeddings": 8}),
    "longrope": ("rope", {"scaling": {"rope_type": "longrope", "short_factor": [1.0] * 8,
                                      "long_factor": [2.0] * 8,
                                      "original_max_position_embeddings": 8},
                          "max_position_embeddings": 32}),
}  # fmt: skip
MOVING = {"dynamic", "longrope"}
PADDING = torch.tensor([[False] * PROMPT, [True, True] + [False] * (PROMPT - 2)])
PROMPTS = {
    "plain": {},
    "padded": {"key_padding_mask": PADDING},
    "padded-positions": {
        "key_padding_mask": PADDING,
        "positions": posenc.positions_from_padding(PADDING),
    },
    "packed": {"document_ids": torch.tensor([[0, 0, 0, 1, 1, 1], [5, 5, 5, 5, 7, 7]])},
}


def _encoder(name: str, kwargs: dict) -> posenc.Encoder:
    torch.manual_seed(0)
    return posenc.Encoder(DIM, DEPTH, HEADS, pe=name, causal=True, pe_kwargs=kwargs).eval()


def _decode(
    encoder: posenc.Encoder, x: torch.Tensor, first: dict, monkeypatch: pytest.MonkeyPatch
) -> tuple[torch.Tensor, list[int]]:
    """Outputs of ``x`` through one cache (the prompt, single steps, a chunk of two) and the
    host reads of each call."""
    cache = posenc.KVCache()
    outs, reads, start = [], [], 0
    for i, end in enumerate([PROMPT, *range(PROMPT + 1, N - 1), N]):
        with host_reads(monkeypatch) as calls:
            outs.append(encoder(x[:, start:end], cache=cache, **(first if i == 0 else {})))
        reads.append(len(calls))
        start = end
    return torch.cat(outs, dim=1), reads


@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_decoding_reads_no_position_and_rotates_as_the_reading_path(
    scheme: str, prompt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, kwargs = SCHEMES[scheme]
    x = torch.randn(2, N, DIM, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        bounded, reads = _decode(_encoder(name, kwargs), x, PROMPTS[prompt], monkeypatch)
        with monkeypatch.context() as patch:  # the positions read, as before issue #36
            patch.setattr(rope_module, "bounded_positions", lambda *args: None)
            read, before = _decode(_encoder(name, kwargs), x, PROMPTS[prompt], monkeypatch)
    assert torch.equal(bounded, read)
    # a length-moving rope type needs the largest position itself: the bound is exact after
    # a plain prompt, not after padding or new documents (rows then differ), where it reads
    expected = 1 if scheme in MOVING and prompt != "plain" else 0
    assert reads[1:] == [expected] * (len(reads) - 1), reads
    if prompt == "plain":
        assert reads[0] == 0
    if name != "xpos":  # (xPos reads nothing either way: its formula needs no table size)
        assert all(count >= 1 for count in before[1:]), before  # (the test can fail)


@pytest.mark.parametrize("scheme", sorted(set(SCHEMES) - MOVING))
def test_cached_decoding_without_reads_equals_one_full_forward(scheme: str) -> None:
    """(dynamic NTK and LongRoPE cache each key at its step's frequencies: not equal.)"""
    name, kwargs = SCHEMES[scheme]
    encoder = _encoder(name, kwargs)
    x = torch.randn(2, N, DIM, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = encoder(x)
        cache, outs = posenc.KVCache(), []
        for start, end in [(0, PROMPT), *((i, i + 1) for i in range(PROMPT, N))]:
            outs.append(encoder(x[:, start:end], cache=cache))
    assert_close(torch.cat(outs, dim=1), full, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("cached", [True, False], ids=["cache", "no-cache"])
def test_explicit_positions_cost_one_read_per_forward_not_per_layer(
    cached: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = torch.randn(2, 3, DIM)
    positions = torch.tensor([[3, 4, 9], [5, 6, 7]])
    outs = []
    for bounded in (True, False):
        encoder = _encoder("rope", {})
        cache = posenc.KVCache() if cached else None
        with torch.no_grad(), monkeypatch.context() as patch:
            if not bounded:  # the positions read, as before issue #36
                patch.setattr(rope_module, "bounded_positions", lambda *args: None)
            if cache is not None:
                encoder(x, cache=cache)
            with host_reads(monkeypatch) as calls:
                outs.append(encoder(x, positions=positions, cache=cache))
            if bounded:
                assert len(calls) == 1, calls  # DEPTH = 3 layers
            if cache is not None:  # the cache's bound follows: a step reads nothing
                assert cache.position_bound() == (10, True)
                with host_reads(monkeypatch) as calls:
                    outs.append(encoder(x[:, :1], cache=cache))
                assert calls == [] or not bounded
    for bounded, read in zip(outs[: len(outs) // 2], outs[len(outs) // 2 :], strict=True):
        assert torch.equal(bounded, read)


@pytest.mark.parametrize("pe", ["rope", "alibi", "kerple"])
def test_explicit_positions_on_a_device_read_nothing_in_a_cached_decode(
    pe: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt and decode steps with positions given every call (as transformers passes
    ``position_ids``), then a step with default positions, through a cache, with CPU tensors
    walking a GPU's path: no host read in any call (the cache's bound stays unknown and the
    rotary tables are sized ahead), and every output equal to the path that reads."""
    x = torch.randn(2, N, DIM)
    steps = [(0, PROMPT), *((i, i + 1) for i in range(PROMPT, N - 1))]
    outs = {}
    for on_device in (False, True):
        encoder, cache = _encoder(pe, {}), posenc.KVCache()
        got, reads = [], []
        with torch.no_grad(), monkeypatch.context() as patch:
            patch.setattr(checks, "CPU_IS_HOST", not on_device)
            for start, end in steps:
                positions = torch.arange(start, end).expand(2, -1) + torch.tensor([[0], [3]])
                with host_reads(monkeypatch) as calls:
                    got.append(encoder(x[:, start:end], cache=cache, positions=positions))
                reads.append(len(calls))
            with host_reads(monkeypatch) as calls:  # default positions: the next ones
                got.append(encoder(x[:, N - 1 :], cache=cache))
            reads.append(len(calls))
        outs[on_device] = torch.cat(got, dim=1)
        if on_device:
            assert reads == [0] * len(reads), reads
        else:
            assert sum(reads) > 0  # (the reading path reads: the count can fail)
    assert_close(outs[True], outs[False], atol=1e-6, rtol=1e-6)


def test_the_bound_sizes_the_tables_and_far_positions_take_the_formula() -> None:
    """No row outside the tables: they grow to the bound; a position past what a table may
    grow to (10^9, given explicitly) takes the float64 formula, equal to a fresh module's."""
    encoder = _encoder("rope", {"max_position_embeddings": 8192})  # (tables may grow to it)
    rope = encoder.distinct_pes()[0]
    cache = posenc.KVCache()
    x = torch.randn(1, 2, DIM)
    with torch.no_grad():
        encoder(x, cache=cache, positions=torch.tensor([[5000, 5001]]))
        assert rope.cos_cached.shape[0] > 5001  # grown past 4096 to the bound
        assert cache.position_bound() == (5002, True)
        encoder(x[:, :1], cache=cache)  # at 5002: the bound, no read, and a row in the table
        assert rope.cos_cached.shape[0] > 5002
        encoder(x, cache=cache, positions=torch.tensor([[10**9, 10**9 + 1]]))
        assert rope.cos_cached.shape[0] < 10**6  # the formula, not a table up to 10^9
        state = rope.context_state(
            torch.tensor([[10**9]]), torch.tensor([[10**9]]), x[:, :1], {},
            bound=posenc.encodings.checks.PositionBound(10**9, True),
        )  # fmt: skip
        q = torch.randn(1, HEADS, 1, DIM // HEADS)
        expected = posenc.build("rope", head_dim=DIM // HEADS)(q, q, torch.tensor([10**9]))
        assert torch.equal(state(q, q)[0], expected[0])


def test_negative_explicit_positions_in_a_cache_are_an_error() -> None:
    encoder = _encoder("rope", {})
    cache = posenc.KVCache()
    with torch.no_grad():
        encoder(torch.randn(1, 2, DIM), cache=cache)
        with pytest.raises(posenc.PosencValueError, match=r"positions must be >= 0.*-3"):
            encoder(torch.randn(1, 1, DIM), cache=cache, positions=torch.tensor([[-3]]))


def test_float_positions_leave_the_bound_unknown_and_it_is_read_once() -> None:
    encoder = _encoder("rope", {})
    cache = posenc.KVCache()
    x = torch.randn(2, 3, DIM)
    with torch.no_grad():
        encoder(x, cache=cache)
        assert cache.position_bound() == (3, True)
        encoder(x[:, :2], cache=cache, positions=torch.tensor([[3.5, 7.0], [3.0, 4.0]]))
        assert cache._bound is None  # nothing read for float positions
        assert cache.position_bound() == (8, True)  # read once, then kept
        encoder(x[:, :1], cache=cache)
        assert cache.position_bound() == (9, True)


def test_positions_past_2_to_the_53_are_refused_without_a_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """float64 holds every whole number up to 2**53 and not past it: explicit positions past
    it are refused in the one read they cost, and default positions that continue a cache
    past it are refused from the host's bound, with no read."""
    encoder = _encoder("rope", {})
    cache = posenc.KVCache()
    x = torch.randn(1, 1, DIM)
    with torch.no_grad():
        with (
            host_reads(monkeypatch) as calls,
            pytest.raises(
                posenc.PosencValueError,
                match=r"positions must be at most 2\*\*53.*9007199254740993",
            ),
        ):
            encoder(x, cache=cache, positions=torch.tensor([[2**53 + 1]]))
        assert len(calls) == 1
        encoder(x, cache=cache, positions=torch.tensor([[2**53 - 1]]))
        encoder(x, cache=cache)  # at 2**53: still exact
        assert cache.position_bound() == (2**53 + 1, True)
        with (
            host_reads(monkeypatch) as calls,
            pytest.raises(posenc.PosencValueError, match=r"at most 2\*\*53.*9007199254740993"),
        ):
            encoder(x, cache=cache)
        assert calls == []


# --------------------------------------------------------------------------- host copies


@contextmanager
def host_copies(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """The values posenc's code made into tensors with ``torch.tensor``: on CUDA each is a
    copy from the host, which waits for the stream (a synchronisation as a read is);
    ``torch.full`` fills on the device instead. (torch's own calls are not counted: its
    eager flex attention on the CPU makes one.)"""
    made: list[object] = []
    real = torch.tensor

    def counted(data, *args, **kwargs):  # type: ignore[no-untyped-def]
        if sys._getframe(1).f_globals.get("__name__", "").startswith("posenc"):
            made.append(data)
        return real(data, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(torch, "tensor", counted)
        yield made


@pytest.mark.parametrize("pe", ["alibi", "shaw"])
def test_flex_with_a_mask_copies_nothing_from_the_host(
    pe: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flex attention with a causal mask (its offset) and Shaw's bias (its clip distance):
    the constants are filled on the device; the output equals the math backend's."""
    torch.manual_seed(0)
    attn = posenc.MultiHeadAttention(16, 2, pe=pe, causal=True, backend="flex").eval()
    ref = posenc.MultiHeadAttention(16, 2, pe=pe, causal=True, backend="math").eval()
    ref.load_state_dict(attn.state_dict())
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        with host_copies(monkeypatch) as made:
            got = attn(x)
        assert attn.last_backend == "flex"
        assert made == []
        assert_close(got, ref(x), atol=1e-5, rtol=1e-5)


def test_sampling_a_token_copies_nothing_from_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """top-k and nucleus cuts fill -inf from a Python number, and cut what they did before:
    the tokens outside the top 3, then those past the 0.6 nucleus."""
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0], [0.0, 0.0, 5.0, 5.0, -1.0]])
    with host_copies(monkeypatch) as made:
        drawn = [
            sampling.sample_next(
                logits,
                temperature=1.0,
                top_k=3,
                top_p=0.6,
                generator=torch.Generator().manual_seed(s),
            )
            for s in range(40)
        ]
    assert made == []
    drawn = torch.stack(drawn)  # (draws, b)
    # row 0: softmax of (4, 3, 2) gives 0.665 to token 0, past 0.6 alone; row 1: tokens 2
    # and 3 hold 0.5 each, past 0.6 together
    assert set(drawn[:, 0].tolist()) == {0}
    assert set(drawn[:, 1].tolist()) == {2, 3}


# --------------------------------------------------------------------------- flex and training


@pytest.mark.parametrize(
    "pe",
    [
        None,
        "alibi",
        "t5",
        "fire",
        "kerple",
        "dpb",
        "sandwich",
        "inkling",
        "deberta",
    ],
)
def test_a_flex_call_with_a_mask_reads_nothing_on_the_host(
    pe: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flex attention with a causal mask (its block mask, its mask_mod's offset) and the
    scheme's score_mod: posenc reads no value on the host; the output equals the math
    backend's. (``benchmarks/gpu_first.py`` runs the same call in CUDA's sync debug mode.)
    CPU positions walk a GPU's path (``CPU_IS_HOST`` cleared: on the CPU, ``gather_fn``
    reads whether they are one run, for index arithmetic in place of a load)."""
    monkeypatch.setattr(checks, "CPU_IS_HOST", False)
    torch.manual_seed(0)
    attn = posenc.MultiHeadAttention(16, 2, pe=pe, causal=True, backend="flex").eval()
    attn.compile_flex = False
    ref = posenc.MultiHeadAttention(16, 2, pe=pe, causal=True, backend="math").eval()
    ref.load_state_dict(attn.state_dict())
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        with host_reads(monkeypatch, own=True) as calls:
            got = attn(x)
        assert attn.last_backend == "flex"
        assert_close(got, ref(x), atol=1e-5, rtol=1e-5)
    assert calls == [], calls


@pytest.mark.parametrize("pe", ["none", "rope", "alibi", "t5", "kerple"])
def test_a_training_step_reads_nothing_on_the_host(
    pe: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forward, backward and an optimiser step of a causal Encoder: no value read on the host
    (the first step too), and the parameters move."""
    torch.manual_seed(0)
    encoder = _encoder(pe, {}).train()
    optimizer = torch.optim.SGD(encoder.parameters(), lr=0.1)
    x = torch.randn(2, N, DIM)
    before = [p.detach().clone() for p in encoder.parameters()]
    for _ in range(2):
        with host_reads(monkeypatch) as calls:
            optimizer.zero_grad(set_to_none=True)
            encoder(x).square().mean().backward()
            optimizer.step()
        assert calls == [], calls
    moved = [not torch.equal(a, p) for a, p in zip(before, encoder.parameters(), strict=True)]
    assert all(moved)
