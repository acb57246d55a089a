"""``MaskSpec``, the one statement of the masking rules: for a grid of (causal, window, chunk,
padding, packed documents, cache offset), flex's ``mask_mod`` evaluated on every pair (by
flex's own ``create_mask``) equals the SDPA boolean mask element by element, and both equal
the rules written out independently (``tril`` for causal order, broadcast comparisons for the
rest); the block mask's full blocks hold only allowed pairs and its skipped blocks none."""

from __future__ import annotations

import itertools

import pytest
import torch

from posenc.attention import flex
from posenc.sequence.masks import MaskSpec, attention_mask

B, NK = 2, 260  # three key blocks of 128, the last ragged


def _reference(
    nq: int,
    causal: bool,
    padding: torch.Tensor | None,
    q_docs: torch.Tensor | None,
    k_docs: torch.Tensor | None,
    qp: torch.Tensor,
    kp: torch.Tensor,
    window: int | None,
    chunk: int | None,
) -> torch.Tensor:
    """The rules written out with whole-tensor operations: ``(B, nq, NK)`` bool."""
    allowed = torch.ones(B, nq, NK, dtype=torch.bool)
    if causal:  # the last query is the last key
        allowed &= torch.ones(nq, NK, dtype=torch.bool).tril(NK - nq)
    if padding is not None:
        allowed &= ~padding[:, None, :]
    if q_docs is not None and k_docs is not None:
        allowed &= q_docs[:, :, None] == k_docs[:, None, :]
    distance = qp[:, :, None] - kp[:, None, :]
    if window is not None:
        allowed &= distance.abs() < window
    if chunk is not None:
        allowed &= (
            torch.div(qp, chunk, rounding_mode="floor")[:, :, None]
            == torch.div(kp, chunk, rounding_mode="floor")[:, None, :]
        )
    return allowed


def _rows() -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows' document runs (never decreasing) and left padding of row 1."""
    runs = torch.stack(
        [
            torch.cat([torch.zeros(100), torch.ones(90), torch.full((70,), 2)]),
            torch.cat([torch.zeros(30), torch.ones(230)]),
        ]
    ).long()
    padding = torch.zeros(B, NK, dtype=torch.bool)
    padding[1, :20] = True
    return runs, padding


GRID = list(
    itertools.product(
        [False, True],  # causal
        [None, 40],  # window
        [None, 96],  # chunk
        [False, True],  # padding
        [False, True],  # packed documents
        [0, 37],  # cache offset: nq = NK - offset queries, the newest keys
    )
)


@pytest.mark.parametrize(("causal", "window", "chunk", "padded", "packed", "offset"), GRID)
def test_flex_mask_mod_equals_the_sdpa_mask_and_the_rules(
    causal: bool, window: int | None, chunk: int | None, padded: bool, packed: bool, offset: int
) -> None:
    from torch.nn.attention.flex_attention import create_mask

    nq = NK - offset
    runs, pad = _rows()
    k_docs = runs if packed else None
    q_docs = runs[:, offset:] if packed else None
    padding = pad if padded else None
    index = torch.arange(NK).expand(B, NK)
    if packed:  # positions restart at each document
        opens = torch.cat([torch.ones(B, 1, dtype=torch.bool), runs[:, 1:] != runs[:, :-1]], 1)
        start = torch.where(opens, index, torch.zeros_like(index)).cummax(1).values
        kp = index - start
    else:
        kp = (index - pad.sum(1, keepdim=True) * padded).clamp(min=0)
    qp = kp[:, offset:]
    where = {
        "key_padding_mask": padding,
        "q_documents": q_docs,
        "k_documents": k_docs,
        "q_positions": qp,
        "k_positions": kp,
        "window": window,
        "chunk": chunk,
    }
    spec = MaskSpec.build(B, nq, NK, causal=causal, **where)
    want = _reference(nq, causal, padding, q_docs, k_docs, qp, kp, window, chunk)
    dense = attention_mask(B, nq, NK, causal=causal, device=torch.device("cpu"), **where)
    if not spec.restricts:
        assert bool(want.all()) and dense is None
        assert flex.mask_mod(spec, torch.device("cpu")) is None
        return
    assert dense is not None
    assert torch.equal(dense.expand(B, 1, nq, NK)[:, 0], want)
    rule = flex.mask_mod(spec, torch.device("cpu"))
    assert rule is not None
    evaluated = create_mask(rule, B, 1, nq, NK, device="cpu")  # (B, 1, nq, NK), flex's vmap
    assert torch.equal(evaluated[:, 0], want)

    # the blocks: a full block allows every pair, a block neither full nor partial none
    size = flex.FLEX_BLOCK_SIZE
    block_mask = flex.block_mask(spec, torch.device("cpu"))
    visited = block_mask.to_dense()  # (B|1, 1, mq, mk): partial or full
    full = torch.zeros_like(visited)
    counts, indices = block_mask.full_kv_num_blocks, block_mask.full_kv_indices
    for b, i in itertools.product(range(full.shape[0]), range(full.shape[2])):
        full[b, 0, i, indices[b, 0, i, : counts[b, 0, i]].long()] = 1
    for b, i, j in itertools.product(range(B), range(visited.shape[2]), range(visited.shape[3])):
        row = min(b, visited.shape[0] - 1)
        pairs = want[b, i * size : (i + 1) * size, j * size : (j + 1) * size]
        if bool(full[row, 0, i, j]):
            assert bool(pairs.all()), (b, i, j)
        if not bool(visited[row, 0, i, j]):
            assert not bool(pairs.any()), (b, i, j)
