"""``posenc.sequence.masks``: the boolean attention mask against one built pair by pair, and the
check
of a ``key_padding_mask`` (type, shape, and a row of all padding: the opposite convention)."""

from __future__ import annotations

import itertools

import pytest
import torch

from posenc.sequence.masks import attention_mask, check_key_padding_mask


@pytest.mark.parametrize(("nq", "nk"), [(5, 5), (2, 6), (1, 4)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_attention_mask_equals_the_rule_pair_by_pair(
    nq: int, nk: int, causal: bool, padded: bool
) -> None:
    """Key j is allowed for query i unless it is padding, or (causal) it lies after the
    query, the last query aligned with the last key."""
    padding = torch.zeros(2, nk, dtype=torch.bool)
    if padded:
        padding[1, :2] = True
    mask = attention_mask(
        2, nq, nk, causal=causal, key_padding_mask=padding if padded else None, device=None
    )
    rule = torch.zeros(2, 1, nq, nk, dtype=torch.bool)
    for b, i, j in itertools.product(range(2), range(nq), range(nk)):
        rule[b, 0, i, j] = not padding[b, j] and (not causal or j <= i + nk - nq)
    if bool(rule.all()):  # nothing to mask (one causal query reads every key): no mask
        assert mask is None
        return
    assert mask is not None
    assert torch.equal(mask.expand(2, 1, nq, nk), rule)


@pytest.mark.parametrize(("nq", "nk"), [(6, 6), (2, 6), (1, 6)])
@pytest.mark.parametrize("causal", [False, True])
def test_document_mask_keeps_each_query_to_its_own_document(nq: int, nk: int, causal: bool) -> None:
    """With document runs, key j is allowed for query i only within i's document (and
    causally, the queries being the last nq keys)."""
    k_docs = torch.tensor([[0, 0, 0, 1, 1, 2], [0, 1, 1, 1, 1, 1]])
    q_docs = k_docs[:, nk - nq :]
    mask = attention_mask(
        2,
        nq,
        nk,
        causal=causal,
        key_padding_mask=None,
        device=None,
        q_documents=q_docs,
        k_documents=k_docs,
    )
    assert mask is not None
    for b, i, j in itertools.product(range(2), range(nq), range(nk)):
        allowed = bool(q_docs[b, i] == k_docs[b, j]) and (not causal or j <= i + nk - nq)
        assert bool(mask.expand(2, 1, nq, nk)[b, 0, i, j]) == allowed, (b, i, j)


def test_check_key_padding_mask() -> None:
    ok = torch.tensor([[False, False, True], [True, False, False]])
    assert check_key_padding_mask(ok, 2, 3, read_values=True) is ok
    assert check_key_padding_mask(None, 2, 3) is None
    with pytest.raises(TypeError, match="attention_mask == 0"):
        check_key_padding_mask(ok.long(), 2, 3)
    with pytest.raises(ValueError, match=r"\(2, 4\)"):
        check_key_padding_mask(ok, 2, 4)
    everything = torch.tensor([[True, True, True], [False, False, False]])
    check_key_padding_mask(everything, 2, 3)  # the layers check the type and shape only
    with pytest.raises(ValueError, match=r"row\(s\) \[0\].*attention_mask == 0"):
        check_key_padding_mask(everything, 2, 3, read_values=True)
    meta = torch.ones(2, 3, dtype=torch.bool, device="meta")  # no values to read
    assert check_key_padding_mask(meta, 2, 3, read_values=True) is meta
