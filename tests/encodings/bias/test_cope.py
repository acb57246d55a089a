"""CoPE, contextual position encoding (Golovneva et al. 2024), against its paper's equations
transcribed in float64."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from posenc.encodings.bias.cope import CoPE
from tests.misuse import Misuse, cases, check
from tests.schemes import qk


@pytest.mark.parametrize("max_positions", [3, 16])
def test_cope_formula(max_positions: int) -> None:
    h, d, n = 2, 4, 6
    pe = CoPE(h, d, max_positions=max_positions).double()
    with torch.no_grad():
        pe.embeddings.normal_()
    q, k = qk(1, h, n, d)
    pos = torch.arange(n)
    got = pe.bias(pos, pos, q=q, k=k)
    e = pe.embeddings  # (d, P)
    want = torch.empty(1, h, n, n, dtype=torch.float64)
    for hh in range(h):
        for i in range(n):
            gates = [torch.sigmoid(q[0, hh, i] @ k[0, hh, t]).item() for t in range(n)]
            for j in range(n):
                lo, hi = min(i, j), max(i, j)  # the paper's t = j..i; mirrored for j > i
                p = min(sum(gates[lo : hi + 1]), max_positions - 1)
                f = p - math.floor(p)
                emb = f * e[:, math.ceil(p)] + (1 - f) * e[:, math.floor(p)]
                want[0, hh, i, j] = q[0, hh, i] @ emb / math.sqrt(d)
    assert_close(got, want, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- bad input


def _bias(q: object, k: object) -> object:
    return CoPE(2, 4).bias(torch.arange(3), torch.arange(3), q=q, k=k)


MISUSE = [
    Misuse("heads-zero", lambda: CoPE(0, 4), ValueError, "num_heads", 0),
    Misuse("max-positions-zero", lambda: CoPE(2, 4, max_positions=0), ValueError,
           "max_positions", 0),
    Misuse("q-list", lambda: _bias([1.0], [1.0]), TypeError, "q", "list"),
    Misuse("q-int", lambda: _bias(*(torch.ones(1, 2, 3, 4, dtype=torch.long),) * 2), TypeError,
           "q", torch.int64),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse_names_the_argument_and_the_value(case: Misuse) -> None:
    check(case)
