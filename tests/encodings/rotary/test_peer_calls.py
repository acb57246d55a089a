"""The rotary calls of posenc's peers that no other test checks, each against the posenc call
``docs/peers.md`` names for it: x-transformers' ``RotaryEmbedding`` (its own code), and, where
the peer is not installed, its documented formula written out in float64 (vLLM's rotary
``forward(positions, query, key)``, Liger's ``liger_rotary_pos_emb``, torchtune's
``RotaryPositionalEmbeddings``). Last, every test the table of ``docs/peers.md`` names exists.

Dimension legend: ``b`` batch, ``h`` heads, ``n``/``s`` positions, ``t`` packed tokens, ``d``
head size, ``r`` rotated channels.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import posenc

ROOT = Path(__file__).resolve().parents[3]


def _angles(positions: torch.Tensor, r: int, base: float = 10000.0) -> torch.Tensor:
    """``positions * base**(-2i/r)`` in float64, ``(..., r/2)``."""
    inv_freq = base ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    return positions.double()[..., None] * inv_freq


def _turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool):
    """The leading ``2 * cos.shape[-1]`` channels of ``x`` turned, in float64."""
    x = x.double()
    r = 2 * cos.shape[-1]
    head, rest = x[..., :r], x[..., r:]
    if interleaved:
        x1, x2 = head[..., 0::2], head[..., 1::2]
        turned = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(-2)
    else:
        x1, x2 = head[..., : r // 2], head[..., r // 2 :]
        turned = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)
    return torch.cat((turned, rest), -1)


@pytest.mark.parametrize("interpolation", [1.0, 2.0])
def test_x_transformers_rotary_embedding(interpolation: float) -> None:
    """x-transformers: ``freqs, scale = RotaryEmbedding(r)(t)``, ``apply_rotary_pos_emb(q,
    freqs)``: interleaved pairs on the leading ``r`` channels, ``interpolation_factor`` a
    linear scaling (its own code, float32 angles)."""
    xt = pytest.importorskip("x_transformers.x_transformers")
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 40, 16), torch.randn(2, 2, 40, 16)
    positions = torch.arange(40) + 300
    peer = xt.RotaryEmbedding(8, interpolation_factor=interpolation)
    freqs, _ = peer(positions)
    want_q, want_k = xt.apply_rotary_pos_emb(q, freqs), xt.apply_rotary_pos_emb(k, freqs)
    scaling = None if interpolation == 1.0 else {"rope_type": "linear", "factor": interpolation}
    rope = posenc.RotaryEmbedding(16, rotary_dim=8, interleaved=True, scaling=scaling)
    got_q, got_k = rope(q, k, positions)
    # x-transformers' float32 angles: ~340 * 2**-24 rad off at most
    assert_close(got_q, want_q, rtol=0, atol=1e-4)
    assert_close(got_k, want_k, rtol=0, atol=1e-4)
    assert not torch.allclose(got_q, q, atol=1e-2)  # something turned


@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
def test_vllm_rotary_forward_formula(neox: bool) -> None:
    """vLLM's ``RotaryEmbedding.forward_native(positions, query, key)``: packed tokens
    ``(t,)`` at any positions, ``query (t, h * d)``, ``cos_sin_cache (max_position, r)`` =
    ``cat(cos, sin)`` indexed by ``positions``, the leading ``r`` channels of each head turned
    (NeoX: halves, GPT-J: pairs). posenc: ``rotary_embedding_qk`` on ``(1, t, h, d)`` views,
    ``layout="bshd"``, ``position_ids=positions[None]``, the cache's halves as tables."""
    torch.manual_seed(0)
    t, h, hk, d, r = 9, 4, 2, 16, 8
    angles = _angles(torch.arange(64), r)
    cache = torch.cat((angles.cos(), angles.sin()), -1).float()  # (max_position, r)
    positions = torch.tensor([3, 4, 5, 6, 0, 1, 2, 40, 41])  # three packed sequences
    query, key = torch.randn(t, h * d), torch.randn(t, hk * d)
    cos, sin = angles[positions].cos(), angles[positions].sin()  # (t, r/2), float64
    want_q = _turn(query.view(t, h, d), cos[:, None], sin[:, None], not neox)
    want_k = _turn(key.view(t, hk, d), cos[:, None], sin[:, None], not neox)
    got_q, got_k = posenc.rotary_embedding_qk(
        query.view(1, t, h, d),
        key.view(1, t, hk, d),
        *cache.chunk(2, -1),
        position_ids=positions[None],
        interleaved=not neox,
        layout="bshd",
    )
    assert_close(got_q.view(t, h, d).double(), want_q, rtol=0, atol=1e-6)
    assert_close(got_k.view(t, hk, d).double(), want_k, rtol=0, atol=1e-6)


def test_liger_rotary_pos_emb_formula() -> None:
    """Liger's ``liger_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1)``:
    transformers' formula, ``q * cos + rotate_half(q) * sin`` with full-width tables ``(b,
    n, d)`` = ``cat(freqs, freqs)``. posenc: ``rotary_embedding_qk(q, k, cos.unsqueeze(1),
    sin.unsqueeze(1))`` (the ``unsqueeze_dim``; a full-width table's equal halves read as
    one)."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 12, 16), torch.randn(2, 2, 12, 16)
    angles = _angles(torch.arange(12).expand(2, 12) + torch.tensor([[0], [50]]), 16)
    full = torch.cat((angles, angles), -1)  # (b, n, d)
    cos, sin = full.cos(), full.sin()

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        return torch.cat((-x[..., 8:], x[..., :8]), -1)

    want_q = q.double() * cos[:, None] + rotate_half(q.double()) * sin[:, None]
    want_k = k.double() * cos[:, None] + rotate_half(k.double()) * sin[:, None]
    got_q, got_k = posenc.rotary_embedding_qk(q, k, cos.float()[:, None], sin.float()[:, None])
    assert_close(got_q.double(), want_q, rtol=0, atol=1e-6)
    assert_close(got_k.double(), want_k, rtol=0, atol=1e-6)


def test_torchtune_rotary_positional_embeddings_formula() -> None:
    """torchtune's ``RotaryPositionalEmbeddings(dim)(x, input_pos=)``: ``x (b, s, h, d)``,
    interleaved pairs, ``input_pos (b, s)`` indexing a ``(max_seq_len, d/2)`` cache. posenc:
    ``rotary_embedding(x, cos, sin, input_pos, interleaved=True, layout="bshd")``."""
    torch.manual_seed(0)
    x = torch.randn(2, 7, 3, 16)
    angles = _angles(torch.arange(32), 16)
    input_pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [9, 10, 11, 12, 13, 14, 15]])
    cos, sin = angles[input_pos].cos()[:, :, None], angles[input_pos].sin()[:, :, None]
    want = _turn(x, cos, sin, interleaved=True)
    got = posenc.rotary_embedding(
        x,
        angles.cos().float(),
        angles.sin().float(),
        input_pos,
        interleaved=True,
        layout="bshd",
    )
    assert_close(got.double(), want, rtol=0, atol=1e-6)


# --------------------------------------------------------------------------- docs/peers.md


def _named_tests() -> list[str]:
    """The ``path::name`` entries of the table in ``docs/peers.md``'s section "The rotary
    call conventions"."""
    text = (ROOT / "docs" / "peers.md").read_text()
    section = text.split("## The rotary call conventions", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"`(tests/[\w/]+\.py::\w+)`", section)


def test_every_test_the_peers_table_names_exists() -> None:
    named = _named_tests()
    assert len(named) >= 12, named
    missing = []
    for entry in named:
        path, name = entry.split("::")
        source = ROOT / path
        tree = ast.parse(source.read_text()) if source.exists() else None
        functions = {
            n.name
            for n in ast.walk(tree or ast.Module(body=[], type_ignores=[]))
            if isinstance(n, ast.FunctionDef)
        }
        if not source.exists() or name not in functions:
            missing.append(entry)
    assert not missing, f"docs/peers.md names tests that do not exist: {missing}"
