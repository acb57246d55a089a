"""DeBERTa's disentangled attention against transformers 5.24 with the weights copied: DeBERTa-v2's
``DisentangledSelfAttention`` (clipped distances, log buckets, c2p alone; DeBERTa-v3's shared
keys and normed embeddings) and DeBERTa's (v1: the fused projection with head-interleaved rows,
no key bias), through posenc's ``MultiHeadAttention`` on math and SDPA, outputs and gradients
in float32; the log buckets
against transformers' ``make_log_bucket_position``; the bias against eq. 4 written out."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DebertaConfig, DebertaV2Config
from transformers.models.deberta.modeling_deberta import (
    DisentangledSelfAttention as DebertaV1Attention,
)
from transformers.models.deberta_v2.modeling_deberta_v2 import (
    DisentangledSelfAttention,
    make_log_bucket_position,
)

import posenc
from posenc.encodings.bias.deberta import DeBERTa, log_bucket_position
from tests.misuse import Misuse, cases, check

D, H, N = 16, 2, 9
#: Under autograd on the CPU flex and auto run SDPA (flex has no CPU backward); the flex
#: score_mod is checked against the bias by the registry's grid (tests/test_differential.py).
BACKENDS = ["math", "sdpa"]


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    error = (got.detach().double() - want.detach().double()).abs().max()
    return float(error / want.detach().double().abs().max())


def _attention(pe: DeBERTa, backend: str) -> posenc.MultiHeadAttention:
    """posenc's attention with DeBERTa's content scale and an identity output projection (the
    peers' self-attention returns the heads before their output layer)."""
    attn = posenc.MultiHeadAttention(
        D, H, pe=pe, backend=backend, softmax_scale=pe.softmax_scale, compile_flex=False
    )
    with torch.no_grad():
        attn.out.weight.copy_(torch.eye(D))
        attn.out.bias.zero_()
    return attn


def _compare(attn, peer, x, peer_call, params: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Outputs and the gradients of ``x`` and of each (posenc, peer) parameter pair."""
    got = attn(x)
    want = peer_call(x)
    assert _relative_error(got, want) <= 2e-5, attn.last_backend
    weight = torch.randn_like(got)
    ours = torch.autograd.grad((got * weight).sum(), [x, *(a for a, _ in params)])
    theirs = torch.autograd.grad((want * weight).sum(), [x, *(b for _, b in params)])
    for a, b in zip(ours, theirs, strict=True):
        assert _relative_error(a, b) <= 2e-5


@pytest.mark.parametrize(
    ("buckets", "max_relative", "terms"),
    [(-1, 3, ["c2p", "p2c"]), (4, 6, ["c2p", "p2c"]), (-1, 4, ["c2p"])],
    ids=["clipped", "buckets", "c2p"],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_deberta_v2_matches_transformers(
    buckets: int, max_relative: int, terms: list[str], backend: str
) -> None:
    config = DebertaV2Config(
        hidden_size=D, num_attention_heads=H, relative_attention=True, pos_att_type=terms,
        position_buckets=buckets, max_relative_positions=max_relative, share_att_key=False,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    peer = DisentangledSelfAttention(config)
    pe = DeBERTa(
        H, D // H, max_relative_positions=max_relative, position_buckets=buckets, terms=terms
    )
    span = pe.span
    with torch.no_grad():
        pe.rel_embeddings.normal_()
        pe.pos_key.load_state_dict(peer.pos_key_proj.state_dict())
        if "p2c" in terms:
            pe.pos_query.load_state_dict(peer.pos_query_proj.state_dict())
    attn = _attention(pe, backend)
    with torch.no_grad():
        for part in ("weight", "bias"):
            fused = torch.cat([getattr(getattr(peer, f"{n}_proj"), part)
                               for n in ("query", "key", "value")])  # fmt: skip
            getattr(attn.qkv, part).copy_(fused)
    x = torch.randn(2, N, D, requires_grad=True)
    mask = torch.ones(2, 1, N, N, dtype=torch.bool)

    def peer_call(t: torch.Tensor) -> torch.Tensor:
        return peer(t, mask, rel_embeddings=pe.rel_embeddings[: 2 * span])[0]

    params = [(pe.rel_embeddings, pe.rel_embeddings), (pe.pos_key.weight, peer.pos_key_proj.weight)]
    _compare(attn, peer, x, peer_call, params)


@pytest.mark.parametrize("backend", BACKENDS)
def test_deberta_v3_shared_keys_and_normed_embeddings_match_transformers(backend: str) -> None:
    """DeBERTa-v3's settings: ``share_att_key`` (the layer's own query and key projections
    project ``P``), log buckets, ``P`` layer-normed as ``DebertaV2Encoder`` norms it."""
    config = DebertaV2Config(
        hidden_size=D, num_attention_heads=H, relative_attention=True,
        pos_att_type=["p2c", "c2p"], position_buckets=4, max_relative_positions=6,
        share_att_key=True, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        layer_norm_eps=1e-7,
    )  # fmt: skip
    torch.manual_seed(2)
    peer = DisentangledSelfAttention(config)
    pe = DeBERTa(
        H, D // H, max_relative_positions=6, position_buckets=4, norm=True, share_att_key=True
    )
    assert pe.pos_key is None and pe.pos_query is None and pe.needs_layer
    with torch.no_grad():
        pe.rel_embeddings.normal_()
        pe.norm.weight.uniform_(0.5, 1.5)
        pe.norm.bias.normal_()
    attn = _attention(pe, backend)
    with torch.no_grad():
        for part in ("weight", "bias"):
            fused = torch.cat([getattr(getattr(peer, f"{n}_proj"), part)
                               for n in ("query", "key", "value")])  # fmt: skip
            getattr(attn.qkv, part).copy_(fused)
    x = torch.randn(2, N, D, requires_grad=True)
    mask = torch.ones(2, 1, N, N, dtype=torch.bool)

    def peer_call(t: torch.Tensor) -> torch.Tensor:
        normed = torch.nn.functional.layer_norm(
            pe.rel_embeddings, (D,), pe.norm.weight, pe.norm.bias, 1e-7
        )
        return peer(t, mask, rel_embeddings=normed)[0]

    got = attn(x)
    assert _relative_error(got, peer_call(x)) <= 2e-5, attn.last_backend
    weight = torch.randn_like(got)
    ours = torch.autograd.grad((got * weight).sum(), [x, pe.rel_embeddings, attn.qkv.weight])
    want = peer_call(x)
    theirs = torch.autograd.grad(
        (want * weight).sum(), [x, pe.rel_embeddings, peer.query_proj.weight, peer.key_proj.weight]
    )
    assert _relative_error(ours[0], theirs[0]) <= 2e-5
    assert _relative_error(ours[1], theirs[1]) <= 2e-5
    assert _relative_error(ours[2][:D], theirs[2]) <= 2e-5
    assert _relative_error(ours[2][D : 2 * D], theirs[3]) <= 2e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_deberta_v1_matches_transformers(backend: str) -> None:
    config = DebertaConfig(
        hidden_size=D, num_attention_heads=H, relative_attention=True,
        pos_att_type=["c2p", "p2c"], max_relative_positions=5,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(1)
    peer = DebertaV1Attention(config)
    with torch.no_grad():
        peer.q_bias.normal_()
        peer.v_bias.normal_()
    pe = DeBERTa(H, D // H, max_relative_positions=5, key_bias=False)
    with torch.no_grad():
        pe.rel_embeddings.normal_()
        pe.pos_key.weight.copy_(peer.pos_proj.weight)
        pe.pos_query.load_state_dict(peer.pos_q_proj.state_dict())
    attn = _attention(pe, backend)
    d = D // H
    rows = peer.in_proj.weight.view(H, 3, d, D)  # head-interleaved: (q, k, v) per head
    with torch.no_grad():
        attn.qkv.weight.copy_(rows.transpose(0, 1).reshape(3 * D, D))
        attn.qkv.bias.copy_(torch.cat([peer.q_bias, torch.zeros(D), peer.v_bias]))
    x = torch.randn(2, N, D, requires_grad=True)
    mask = torch.ones(2, 1, N, N, dtype=torch.bool)
    relative = torch.arange(N)[:, None] - torch.arange(N)[None, :]

    def peer_call(t: torch.Tensor) -> torch.Tensor:
        return peer(t, mask, relative_pos=relative[None], rel_embeddings=pe.rel_embeddings)[0]

    params = [(pe.rel_embeddings, pe.rel_embeddings), (pe.pos_query.weight, peer.pos_q_proj.weight)]
    _compare(attn, peer, x, peer_call, params)


def test_log_buckets_match_transformers() -> None:
    relative = torch.arange(-700, 700)
    for buckets, largest in [(256, 512), (8, 20), (4, 4), (6, 3)]:
        want = make_log_bucket_position(relative, buckets, largest).long()
        assert torch.equal(log_bucket_position(relative, buckets, largest), want)


def test_deberta_follows_equation_4() -> None:
    """``(q_i · K^r[δ] + k_j · Q^r[δ]) / sqrt(3d)``, ``δ = clip(i - j, -k, k - 1) + k``, entry
    by entry in float64, at positions with gaps."""
    torch.manual_seed(3)
    pe = DeBERTa(H, 4, dim=6, max_relative_positions=3).double()
    q, k = (
        torch.randn(1, H, 4, 4, dtype=torch.float64),
        torch.randn(1, H, 5, 4, dtype=torch.float64),
    )
    qp, kp = torch.tensor([0, 2, 5, 9]), torch.tensor([0, 1, 4, 5, 6])
    got = pe.bias(qp, kp, q=q, k=k)
    keys = pe.pos_key(pe.rel_embeddings).view(6, H, 4)
    queries = pe.pos_query(pe.rel_embeddings).view(6, H, 4)
    for h in range(H):
        for a, i in enumerate(qp.tolist()):
            for c, j in enumerate(kp.tolist()):
                delta = min(max(i - j, -3), 2) + 3
                want = (q[0, h, a] @ keys[delta, h] + k[0, h, c] @ queries[delta, h]) / math.sqrt(
                    12
                )
                assert abs(float(got[0, h, a, c]) - float(want)) <= 1e-12


MISUSE = [
    Misuse("terms", lambda: DeBERTa(2, 4, terms=("c2c",)), ValueError, "terms", "c2c"),
    Misuse("buckets", lambda: DeBERTa(2, 4, position_buckets=2), ValueError, "position_buckets",
           2),
    Misuse("no-k", lambda: DeBERTa(2, 4).bias(torch.arange(3), torch.arange(3),
                                               q=torch.randn(1, 2, 3, 4)), ValueError, "k=",
           "(b, h, n, d)"),
    Misuse("no-layer", lambda: DeBERTa(2, 4, share_att_key=True).bias(
        torch.arange(3), torch.arange(3), q=torch.randn(1, 2, 3, 4), k=torch.randn(1, 2, 3, 4)),
        ValueError, "layer=", "NoneType"),
    Misuse("fractional", lambda: DeBERTa(2, 4).bias(torch.tensor([0.5]), torch.arange(3)),
           ValueError, "q_positions", 0.5),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_bad_input_is_a_clear_error(case: Misuse) -> None:
    check(case)
