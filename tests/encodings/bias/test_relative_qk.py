"""The schemes of ``posenc.encodings.bias.relative_qk``, which read the queries, against their
papers' formulas in float64: Shaw et al. 2018 (key and value terms) and Transformer-XL (Dai
et al. 2019). Their bad-input cases are in ``test_relative.py``'s misuse table."""

from __future__ import annotations

import math

import torch
from torch.testing import assert_close

from posenc.encodings.bias.relative_qk import ShawRelativeBias, TransformerXLRelativeBias
from tests.schemes import qk

# --------------------------------------------------------------------------- Shaw


def test_shaw_key_term_formula() -> None:
    h, d, K = 2, 4, 3
    pe = ShawRelativeBias(h, d, max_distance=K).double()
    q, _ = qk(2, h, 7, d)
    qp, kp = torch.arange(7) + 2, torch.arange(7)
    got = pe.bias(qp, kp, q=q)
    w = pe.key_embeddings.weight
    want = torch.empty(2, h, 7, 7, dtype=torch.float64)
    for b in range(2):
        for hh in range(h):
            for i in range(7):
                for j in range(7):
                    r = max(-K, min(K, int(kp[j]) - int(qp[i])))  # clip(j - i, k)
                    want[b, hh, i, j] = q[b, hh, i] @ w[r + K] / math.sqrt(d)
    assert_close(got, want, rtol=1e-12, atol=1e-13)


def test_shaw_value_term_formula() -> None:
    h, d, K, n = 2, 3, 2, 6
    pe = ShawRelativeBias(h, d, max_distance=K, values=True).double()
    weights = torch.rand(1, h, n, n, dtype=torch.float64).softmax(-1)
    pos = torch.arange(n)
    got = pe.value_term(weights, pos, pos)
    wv = pe.value_embeddings.weight  # type: ignore[union-attr]
    want = torch.zeros(1, h, n, d, dtype=torch.float64)
    for hh in range(h):
        for i in range(n):
            for j in range(n):
                want[0, hh, i] += weights[0, hh, i, j] * wv[max(-K, min(K, j - i)) + K]
    assert_close(got, want, rtol=1e-12, atol=1e-13)


# --------------------------------------------------------------------------- Transformer-XL


def test_xl_formula() -> None:
    h, d, n, rel = 2, 4, 5, 6
    pe = TransformerXLRelativeBias(h, d, rel_dim=rel, base=100.0).double()
    q, k = qk(1, h, n, d)
    pos = torch.arange(n)
    got = pe.bias(pos, pos, q=q, k=k) + q @ k.transpose(-2, -1) / math.sqrt(d)
    W = pe.pos_proj.weight.view(h, d, rel)  # W_R per head
    u, v = pe.u, pe.v

    def R(t: int) -> torch.Tensor:  # sinusoidal encoding of the distance t (interleaved)
        out = []
        for m in range(rel // 2):
            out += [math.sin(t / 100.0 ** (2 * m / rel)), math.cos(t / 100.0 ** (2 * m / rel))]
        return torch.tensor(out, dtype=torch.float64)

    want = torch.empty(1, h, n, n, dtype=torch.float64)
    for hh in range(h):
        for i in range(n):
            for j in range(n):
                r = W[hh] @ R(i - j)
                qi, kj = q[0, hh, i], k[0, hh, j]
                a_ij = qi @ kj + qi @ r + u[hh] @ kj + v[hh] @ r  # Dai et al. 2019, §3.3
                want[0, hh, i, j] = a_ij / math.sqrt(d)
    assert_close(got, want, rtol=1e-12, atol=1e-12)
