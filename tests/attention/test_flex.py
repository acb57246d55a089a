"""``posenc.attention.flex``: the block mask built for causal and padding masks, and the fallback to
SDPA when compiling flex_attention fails (remembered, warned once). Flex attention against
the other backends is in ``tests/attention/test_module.py`` and
``tests/sequence/test_padding.py``."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.testing import assert_close

import posenc.attention.flex as flex
from posenc import MultiHeadAttention
from posenc.encodings.bias.alibi import ALiBi


def test_flex_compile_failure_falls_back_to_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(key: object):
        def run(*args: object) -> torch.Tensor:
            raise RuntimeError("no C++ compiler")

        return run

    monkeypatch.setattr(flex, "_compiled_flex", broken)
    flex.flex_cache_clear()
    pe = ALiBi(2)
    attn = MultiHeadAttention(8, 2, pe=pe, backend="flex")
    ref = MultiHeadAttention(8, 2, pe=pe, backend="math")
    ref.load_state_dict(attn.state_dict())
    x = torch.randn(1, 130, 8)  # past one block: shorter ones never compile on a CPU
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="compiling flex_attention failed"):
        got = attn(x)
    assert attn.last_backend == "sdpa"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # remembered: no second warning, no second attempt
        again = attn(x)
        want = ref(x)
    assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert_close(again, want, rtol=1e-5, atol=1e-6)
    flex.flex_cache_clear()


def test_block_mask_structure() -> None:
    padding = torch.zeros(2, 300, dtype=torch.bool)
    padding[1, 130:] = True
    mask = flex.flex_block_mask(
        2, 300, 300, causal=True, key_padding_mask=padding, device=torch.device("cpu")
    )
    dense = mask.to_dense()  # (b, 1, 3, 3) blocks that are visited at all
    expected = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=dense.dtype)
    assert_close(dense[0, 0], expected)
    assert_close(dense[1, 0], torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 0]], dtype=dense.dtype))
    unmasked = flex.flex_block_mask(
        1, 300, 300, causal=False, key_padding_mask=None, device=torch.device("cpu")
    )
    assert bool(unmasked.to_dense().all())  # every block visited, all of them full
    assert int(unmasked.kv_num_blocks.sum()) == 0 and int(unmasked.full_kv_num_blocks.sum()) == 9


@pytest.mark.parametrize(("nq", "nk"), [(300, 300), (40, 300)])
@pytest.mark.parametrize("causal", [False, True])
def test_document_block_mask_equals_the_dense_mask(nq: int, nk: int, causal: bool) -> None:
    """Flex with a document block mask (runs spanning blocks, queries the last nq keys) gives
    what the dense boolean mask gives, and skips the blocks pairing two documents."""
    from posenc.attention.sdpa import scaled_dot_product_attention
    from posenc.sequence.masks import attention_mask

    runs = torch.cat([torch.zeros(100), torch.ones(150), torch.full((50,), 2)]).long()
    k_runs = torch.stack([runs, runs.roll(60).cummax(0).values])  # (2, 300), never decreasing
    q_runs = k_runs[:, nk - nq :]
    padding = torch.zeros(2, nk, dtype=torch.bool)
    padding[1, 5:9] = True
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 8, generator=gen) for n in (nq, nk, nk))
    block_mask = flex.flex_block_mask(
        2,
        nq,
        nk,
        causal=causal,
        key_padding_mask=padding,
        device=torch.device("cpu"),
        q_documents=q_runs,
        k_documents=k_runs,
    )
    out = flex.flex_attention_forward(q, k, v, score_mod=None, block_mask=block_mask, compile=False)
    dense = attention_mask(
        2,
        nq,
        nk,
        causal=causal,
        key_padding_mask=padding,
        device=None,
        q_documents=q_runs,
        k_documents=k_runs,
    )
    expected, _ = scaled_dot_product_attention(q, k, v, dense)
    assert_close(out, expected, atol=1e-5, rtol=1e-4)
    if nq == nk:  # row 0: blocks [0,128) x [256,300) hold documents 0|1 and 2 only: skipped
        visited = block_mask.to_dense()[0, 0]
        assert not bool(visited[0, 2]) and not bool(visited[2, 0])


@pytest.mark.parametrize(("window", "chunk"), [(50, None), (None, 96), (40, 96)])
@pytest.mark.parametrize("causal", [False, True])
def test_window_and_chunk_block_masks_equal_the_dense_mask(window, chunk, causal) -> None:
    """Blocks of 128 tokens are skipped only where no pair can be near enough or share a
    chunk (positions given per row, one row shifted by left padding)."""
    from posenc.attention.sdpa import scaled_dot_product_attention
    from posenc.sequence.masks import attention_mask

    n = 400
    positions = torch.stack([torch.arange(n), (torch.arange(n) - 30).clamp(min=0)])
    padding = torch.zeros(2, n, dtype=torch.bool)
    padding[1, :30] = True
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 8, generator=gen) for _ in range(3))
    reach = {"window": window, "chunk": chunk}
    block_mask = flex.flex_block_mask(
        2,
        n,
        n,
        causal=causal,
        key_padding_mask=padding,
        device=torch.device("cpu"),
        q_positions=positions,
        k_positions=positions,
        **reach,
    )
    out = flex.flex_attention_forward(q, k, v, score_mod=None, block_mask=block_mask, compile=False)
    dense = attention_mask(
        2,
        n,
        n,
        causal=causal,
        key_padding_mask=padding,
        device=None,
        q_positions=positions,
        k_positions=positions,
        **reach,
    )
    expected, _ = scaled_dot_product_attention(q, k, v, dense)
    # a query with no key left (row 1's causal padding) is zero on flex, uniform on math
    some = dense.expand(2, 1, n, n).any(-1, keepdim=True)  # (b, 1, n, 1)
    assert_close(out * some, expected * some, atol=1e-5, rtol=1e-4)
    visited = block_mask.to_dense()[0, 0]  # row 0: blocks 3 apart hold no near pair
    if window is not None:
        assert not bool(visited[0, 3]) and not bool(visited[3, 0])
    assert bool(visited[1, 1])


def test_short_sequences_on_cpu_skip_the_compiled_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below one block (128) of queries or keys, torch 2.13's compiled CPU flex kernel is
    intermittently wrong: posenc runs the eager reference there."""

    def refuse(key):
        raise AssertionError("the compiled kernel ran for a short sequence")

    monkeypatch.setattr(flex, "_compiled_flex", refuse)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=gen) for _ in range(3))
    mask = flex.flex_block_mask(1, 8, 8, causal=True, key_padding_mask=None, device=q.device)
    out = flex.flex_attention_forward(q, k, v, score_mod=None, block_mask=mask, compile=True)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_int32_positions_window_the_blocks_as_int64_ones_do() -> None:
    """Integer positions of either width (int32 ones made the block ranges' padding overflow)
    give the same block mask, and the same attention through the public module."""
    n = 300
    positions = torch.stack([torch.arange(n), (torch.arange(n) - 30).clamp(min=0)])
    dense = [
        flex.flex_block_mask(
            2,
            n,
            n,
            causal=True,
            key_padding_mask=None,
            device=torch.device("cpu"),
            q_positions=p,
            k_positions=p,
            window=50,
            chunk=96,
        ).to_dense()
        for p in (positions, positions.int())
    ]
    assert torch.equal(dense[0], dense[1])
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2, pe=ALiBi(2), causal=True, window=3, backend="flex")
    x = torch.randn(1, 10, 16)
    with torch.no_grad():
        outs = [
            attn(x, positions=torch.arange(10, dtype=t)[None]) for t in (torch.int64, torch.int32)
        ]
    assert attn.last_backend == "flex"
    assert torch.equal(outs[0], outs[1])
