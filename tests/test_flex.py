"""``posenc.flex``: the block mask built for causal and padding masks, and the fallback to
SDPA when compiling flex_attention fails (remembered, warned once). Flex attention against
the other backends is in ``tests/test_attention.py`` and ``tests/test_padding.py``."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.testing import assert_close

import posenc.flex as flex
from posenc import MultiHeadAttention
from posenc.encodings import ALiBi


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
    x = torch.randn(1, 6, 8)
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
