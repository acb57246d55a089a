"""The measuring subprocess of ``posenc bench`` (``posenc.bench.worker``): the bias torch's
attention is given is ALiBi's."""

from __future__ import annotations

import torch

import posenc
from posenc.bench.worker import alibi_bias_reference


def test_alibi_reference_bias_matches_posenc() -> None:
    pe = posenc.ALiBi(5)
    pos = torch.arange(12)
    torch.testing.assert_close(
        alibi_bias_reference(pe.slopes, 12), pe.bias(pos, pos).float(), rtol=0, atol=1e-6
    )
