"""The layers of one Encoder forward on the flex backend share one block mask: the first
layer builds it, the others find it in the forward's memo (the context of a cached, packed or
windowed forward, or the plain forward's own), keyed by shape and mask; a layer of another
kind (another window) builds its own. The outputs equal SDPA's."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.attention import flex

DIM, HEADS, N = 16, 2, 12


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every block mask built, as ``(nq, nk)``."""
    made: list[tuple[int, int]] = []
    build = flex.block_mask

    def counted(spec, device, **kwargs):
        made.append((spec.nq, spec.nk))
        return build(spec, device, **kwargs)

    monkeypatch.setattr(flex, "block_mask", counted)
    return made


def _pair(**kwargs) -> tuple[posenc.Encoder, posenc.Encoder]:
    """The same 3-layer encoder on flex and on SDPA."""
    encoders = []
    for backend in ("flex", "sdpa"):
        torch.manual_seed(0)
        encoders.append(posenc.Encoder(DIM, 3, HEADS, backend=backend, **kwargs).eval())
    return encoders[0], encoders[1]


@pytest.mark.parametrize("pe", ["rope", "alibi"])
def test_a_plain_forward_builds_one_block_mask(builds: list, pe: str) -> None:
    on_flex, on_sdpa = _pair(pe=pe, causal=True)
    x = torch.randn(2, N, DIM, generator=torch.Generator().manual_seed(1))
    padding = torch.zeros(2, N, dtype=torch.bool)
    padding[1, :3] = True
    with torch.no_grad():
        got = on_flex(x, key_padding_mask=padding)
        assert [layer.attn.last_backend for layer in on_flex.layers] == ["flex"] * 3
        assert builds == [(N, N)]
        on_flex(x)  # a new forward builds its own
        assert builds == [(N, N), (N, N)]
        want = on_sdpa(x, key_padding_mask=padding)
        # (a padding query reads no key: flex gives it zeros, SDPA uniform weights)
        assert_close(got[~padding], want[~padding], atol=1e-5, rtol=1e-5)


def test_a_cached_and_packed_forward_builds_one_per_kind_of_layer(builds: list) -> None:
    on_flex, on_sdpa = _pair(pe="rope", causal=True, window=[None, 4, 4])
    x = torch.randn(1, N, DIM, generator=torch.Generator().manual_seed(2))
    documents = torch.tensor([[0] * 5 + [1] * 7])
    with torch.no_grad():
        got = on_flex(x, document_ids=documents)
        assert sorted(builds) == [(N, N), (N, N)]  # full attention, and the windowed layers
        want = on_sdpa(x, document_ids=documents)
        assert_close(got, want, atol=1e-5, rtol=1e-5)
        builds.clear()
        on_flex(x[:, :8], cache=posenc.KVCache())  # a cached forward: the same
        assert builds == [(8, 8), (8, 8)]


def test_a_plain_forward_on_sdpa_makes_one_additive_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """RoPE (no bias state) with padding: SDPA's additive mask, made by the first layer."""
    from posenc.sequence.memo import ForwardMemo

    made: list[str] = []
    keep = ForwardMemo.keep

    def counted(self, key, make):
        return keep(self, key, lambda: (made.append(key[0]), make())[1])

    monkeypatch.setattr(ForwardMemo, "keep", counted)
    _, on_sdpa = _pair(pe="rope", causal=True)
    x = torch.randn(2, N, DIM, generator=torch.Generator().manual_seed(3))
    padding = torch.zeros(2, N, dtype=torch.bool)
    padding[0, :2] = True
    with torch.no_grad():
        got = on_sdpa(x, key_padding_mask=padding)
    assert made == ["sdpa mask"]
    for row in range(2):  # each row alone, its padding cut off: the same real tokens
        start = int(padding[row].sum())
        with torch.no_grad():
            alone = on_sdpa(x[row : row + 1, start:], positions=torch.arange(N)[start:])
        assert_close(got[row, start:], alone[0], atol=1e-5, rtol=1e-5)
