"""``RotaryEmbedding(rotary_heads=...)`` and per-head frequency tables (``base=[...]``,
``inv_freq=(H, r/2)``): against x-transformers' own ``Attention(rotate_num_heads=...)`` and
against eq. 15 written out in float64 per head, forward and gradients, on the C kernel and
the torch path, in place and out, under grouped-query attention, and through a KV cache and a
StreamingCache (cached = full forward).

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim, ``r`` rotary dim.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from torch import Tensor

import posenc
from posenc import RotaryEmbedding
from posenc.encodings.registry import build, build_for_model
from tests.misuse import Misuse, cases, check

B, N, D = 2, 5, 8
TOL = 2e-5  # max|a - b| / max|b|, fp32


def close(got: Tensor, want: Tensor, tol: float = TOL) -> None:
    scale = want.abs().max().clamp_min(1e-30)
    err = ((got.double() - want.double()).abs().max() / scale).item()
    assert err <= tol, f"relative error {err:.3g} > {tol}"


def inv_freq64(base: float, r: int) -> Tensor:
    return base ** -(torch.arange(0, r, 2, dtype=torch.float64) / r)  # (r/2,)


def formula(
    x: Tensor, positions: Tensor, rows: Sequence[Tensor | None], interleaved: bool
) -> Tensor:
    """Eq. 15 in float64: head ``j`` of ``x`` ``(b, h, n, d)`` turned by frequencies
    ``rows[j]`` ``(r/2,)`` at ``positions`` ``(n,)`` or ``(b, n)``; ``None``: untouched."""
    out = x.double().clone()
    pos = positions.double()
    for j, freq in enumerate(rows):
        if freq is None:
            continue
        half = freq.shape[0]
        angle = pos[..., None] * freq  # (n, r/2) or (b, n, r/2)
        cos, sin = angle.cos(), angle.sin()
        xj = x[:, j].double()  # (b, n, d)
        if interleaved:
            a, b = xj[..., 0 : 2 * half : 2], xj[..., 1 : 2 * half : 2]
            out[:, j, :, 0 : 2 * half : 2] = a * cos - b * sin
            out[:, j, :, 1 : 2 * half : 2] = b * cos + a * sin
        else:
            a, b = xj[..., :half], xj[..., half : 2 * half]
            out[:, j, :, :half] = a * cos - b * sin
            out[:, j, :, half : 2 * half] = b * cos + a * sin
    return out


def selected(h: int, count: int, last: bool, freq: Sequence[Tensor]) -> list[Tensor | None]:
    """Per head of ``h``: the rotated ones' rows ``freq`` in order, ``None`` for the rest."""
    chosen = range(h - count, h) if last else range(count)
    rows: list[Tensor | None] = [None] * h
    for i, j in enumerate(chosen):
        rows[j] = freq[i]
    return rows


@pytest.fixture(params=["native", "torch"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "native":
        from posenc.encodings.rotary.kernels import native

        if native._native is None:
            pytest.skip("the C kernel is not built here")
    monkeypatch.setenv("POSENC_ROTARY_KERNEL", request.param)
    return request.param


# --------------------------------------------------------------------------- x-transformers


class _Captured(Exception):
    pass


class _Given(torch.nn.Module):
    """A projection that returns what ``make()`` gives, whatever its input."""

    def __init__(self, make: object) -> None:
        super().__init__()
        self.make = make

    def forward(self, _: Tensor) -> Tensor:
        return self.make()  # type: ignore[operator]


class _Capture(torch.nn.Module):
    """In place of x-transformers' ``Attend``: keeps the q and k it is handed, and stops."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, Tensor] = {}

    def forward(self, q: Tensor, k: Tensor, v: Tensor, **_: object) -> None:
        self.seen["q"], self.seen["k"] = q, k
        raise _Captured


@pytest.mark.parametrize(
    ("rotary_dim", "count", "xpos"),
    [(D, 1, False), (D, 3, False), (D // 2, 3, False), (D, 2, True)],
)
def test_matches_x_transformers_rotate_num_heads(rotary_dim: int, count: int, xpos: bool) -> None:
    """x-transformers' own Attention.forward (its head split and apply_rotary_pos_emb, with
    xPos's scales where ``use_xpos``) on the same q, k: forward and gradients."""
    xt = pytest.importorskip("x_transformers.x_transformers")
    torch.manual_seed(0)
    h = 4
    attn = xt.Attention(h * D, heads=h, dim_head=D, rotate_num_heads=count)
    q_leaf = torch.randn(B, h, N, D, requires_grad=True)
    k_leaf = torch.randn(B, h, N, D, requires_grad=True)
    flat = {  # (b, n, h * d), what the projections would give
        "q": lambda: q_leaf.transpose(1, 2).reshape(B, N, h * D),
        "k": lambda: k_leaf.transpose(1, 2).reshape(B, N, h * D),
    }
    attn.to_q, attn.to_k = _Given(flat["q"]), _Given(flat["k"])
    attn.attend = capture = _Capture()
    seen = capture.seen
    freqs = xt.RotaryEmbedding(rotary_dim, use_xpos=xpos).forward(torch.arange(N))
    with pytest.raises(_Captured):
        attn(torch.randn(B, N, h * D), rotary_pos_emb=freqs)
    options = {"rotary_dim": rotary_dim, "interleaved": True, "rotary_heads": count}
    rope: torch.nn.Module = (
        posenc.XPos(D, **options, rotary_heads_at="last")
        if xpos
        else RotaryEmbedding(D, **options, rotary_heads_at="last")
    )
    q2 = q_leaf.detach().requires_grad_()
    k2 = k_leaf.detach().requires_grad_()
    got_q, got_k = rope(q2, k2)
    close(got_q, seen["q"])
    close(got_k, seen["k"])
    gq, gk = torch.randn_like(got_q), torch.randn_like(got_k)
    ((seen["q"] * gq).sum() + (seen["k"] * gk).sum()).backward()
    ((got_q * gq).sum() + (got_k * gk).sum()).backward()
    assert q_leaf.grad is not None and q2.grad is not None
    assert k_leaf.grad is not None and k2.grad is not None
    close(q2.grad, q_leaf.grad)
    close(k2.grad, k_leaf.grad)


# --------------------------------------------------------------------------- the formula


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_rotary_heads_is_the_formula(
    kernel: str, interleaved: bool, last: bool, inplace: bool
) -> None:
    torch.manual_seed(1)
    h, count = 4, 3
    at = "last" if last else "first"
    rope = RotaryEmbedding(D, interleaved=interleaved, rotary_heads=count, rotary_heads_at=at)
    q, k = torch.randn(B, h, N, D), torch.randn(B, h, N, D)
    positions = torch.tensor([[3, 4, 5, 6, 7], [0, 1, 2, 0, 1]])
    rows = selected(h, count, last, [inv_freq64(1e4, D)] * count)
    want_q, want_k = (
        formula(q, positions, rows, interleaved),
        formula(k, positions, rows, interleaved),
    )
    q_in, k_in = q.clone(), k.clone()
    got_q, got_k = rope(q_in, k_in, positions, inplace=inplace)
    close(got_q, want_q)
    close(got_k, want_k)
    untouched = slice(0, 1) if last else slice(count, h)
    assert torch.equal(got_q[:, untouched], q[:, untouched])  # bit for bit
    if inplace:
        assert got_q is q_in and got_k is k_in
    else:
        assert torch.equal(q_in, q) and torch.equal(k_in, k)  # the inputs left as they were


@pytest.mark.parametrize("inplace", [False, True])
def test_gradients_are_the_formula_s(kernel: str, inplace: bool) -> None:
    torch.manual_seed(2)
    h, count = 4, 2
    rope = RotaryEmbedding(D, rotary_heads=count, base=[10.0, 1e4])
    q_leaf = torch.randn(B, h, N, D, requires_grad=True)
    k_leaf = torch.randn(B, h, N, D, requires_grad=True)
    got_q, got_k = rope(q_leaf * 1, k_leaf * 1, inplace=inplace)
    gq, gk = torch.randn_like(got_q), torch.randn_like(got_k)
    ((got_q * gq).sum() + (got_k * gk).sum()).backward()
    q64 = q_leaf.detach().double().requires_grad_()
    k64 = k_leaf.detach().double().requires_grad_()
    rows = selected(h, count, False, [inv_freq64(10.0, D), inv_freq64(1e4, D)])
    pos = torch.arange(N)
    want = (formula(q64, pos, rows, False) * gq).sum() + (formula(k64, pos, rows, False) * gk).sum()
    want.backward()
    assert q_leaf.grad is not None and k_leaf.grad is not None
    close(q_leaf.grad, q64.grad)
    close(k_leaf.grad, k64.grad)


@pytest.mark.parametrize("interleaved", [False, True])
def test_per_head_bases_are_the_formula_per_head(kernel: str, interleaved: bool) -> None:
    torch.manual_seed(3)
    bases = [10.0, 100.0, 1e4, 5e5]
    rope = RotaryEmbedding(D, base=bases, interleaved=interleaved, rotary_dim=6)
    q, k = torch.randn(B, 4, N, D), torch.randn(B, 4, N, D)
    positions = torch.arange(7, 7 + N)
    rows = [inv_freq64(b, 6) for b in bases]
    got_q, got_k = rope(q, k, positions)
    close(got_q, formula(q, positions, rows, interleaved))
    close(got_k, formula(k, positions, rows, interleaved))
    cos, _ = rope.cos_sin(positions, N, dtype=torch.float64)
    assert cos.shape == (4, N, 3)
    given = RotaryEmbedding(D, inv_freq=torch.stack(rows), interleaved=interleaved, rotary_dim=6)
    for a, b in zip(given(q, k, positions), (got_q, got_k), strict=True):
        close(a, b, 1e-6)


def test_learned_per_head_frequencies_get_their_gradient() -> None:
    torch.manual_seed(4)
    rope = RotaryEmbedding(D, base=[10.0, 1e4], learned_freq=True)
    assert rope.freq.shape == (2, D // 2)
    q, k = torch.randn(1, 2, N, D), torch.randn(1, 2, N, D)
    got_q, got_k = rope(q, k)
    (got_q.sum() + got_k.sum()).backward()
    freq = rope.freq.detach().double().requires_grad_()
    pos = torch.arange(N)
    want = formula(q, pos, list(freq), False).sum() + formula(k, pos, list(freq), False).sum()
    (grad,) = torch.autograd.grad(want, freq)
    close(got_q, formula(q, pos, list(freq.detach()), False))
    assert rope.freq.grad is not None
    close(rope.freq.grad, grad)


@pytest.mark.parametrize("inplace", [False, True])
def test_xpos_on_some_heads_is_xpos_on_those(kernel: str, inplace: bool) -> None:
    """XPos(rotary_heads=2) under GQA: its own full rotation (checked against the formula in
    test_xpos.py) on query heads 0-1 and key head 0, the rest untouched, keys alone too."""
    torch.manual_seed(8)
    q, k = torch.randn(B, 4, N, D), torch.randn(B, 2, N, D)
    full = posenc.XPos(D, center=2.0)
    some = posenc.XPos(D, center=2.0, rotary_heads=2)
    want_q, want_k = full(q, k)
    got_q, got_k = some(q.clone(), k.clone(), inplace=inplace)
    assert torch.equal(got_q[:, 2:], q[:, 2:]) and torch.equal(got_k[:, 1:], k[:, 1:])
    close(got_q[:, :2], want_q[:, :2])
    close(got_k[:, :1], want_k[:, :1])
    close(some.rotate(k, key=True, query_heads=4), torch.cat((want_k[:, :1], k[:, 1:]), 1))


# --------------------------------------------------------------------------- grouped heads


def test_grouped_heads_rotate_whole_groups(kernel: str) -> None:
    """hq = 6, hk = 3 (g = 2): rotary_heads=4 turns query heads 0-3 and key heads 0-1; a
    per-head table has one row per rotated key head, query head i reading row i // 2."""
    torch.manual_seed(5)
    q, k = torch.randn(B, 6, N, D), torch.randn(B, 3, N, D)
    pos = torch.arange(N)
    f1, f2 = inv_freq64(10.0, D), inv_freq64(1e4, D)
    shared = RotaryEmbedding(D, rotary_heads=4)
    got_q, got_k = shared(q, k, pos)
    close(got_q, formula(q, pos, [f2, f2, f2, f2, None, None], False))
    close(got_k, formula(k, pos, [f2, f2, None], False))
    per_head = RotaryEmbedding(D, rotary_heads=4, base=[10.0, 1e4])
    got_q, got_k = per_head(q, k, pos)
    close(got_q, formula(q, pos, [f1, f1, f2, f2, None, None], False))
    close(got_k, formula(k, pos, [f1, f2, None], False))
    last = RotaryEmbedding(D, rotary_heads=2, rotary_heads_at="last", inv_freq=f1.float()[None])
    got_q, got_k = last(q, k, pos)
    close(got_q, formula(q, pos, [None] * 4 + [f1, f1], False))
    close(got_k, formula(k, pos, [None, None, f1], False))
    # keys alone, as a cache rotates them: told the query heads
    close(per_head.rotate(k, pos, query_heads=6), formula(k, pos, [f1, f2, None], False))


def test_scores_stay_relative_with_per_head_tables_under_gqa() -> None:
    """q at m, k at n: q head i and the key head it reads turn alike, so each head's scores
    depend on m - n only."""
    torch.manual_seed(6)
    rope = RotaryEmbedding(D, base=[7.0, 1e3])
    q, k = torch.randn(1, 4, 1, D), torch.randn(1, 2, 1, D)
    scores = []
    for m, n in ((3, 1), (10, 8)):
        rq, _ = rope(q, q[:, :2], torch.tensor([m]))
        _, rk = rope(q, k, torch.tensor([n]))
        rk = rk.repeat_interleave(2, dim=1)
        scores.append((rq * rk).sum(-1))
    close(scores[0], scores[1], 1e-5)


# --------------------------------------------------------------------------- caches


@pytest.mark.parametrize(
    "options", [{"rotary_heads": 2}, {"base": [10.0, 1e4]}, {"rotary_heads": 2, "base": [1e4]}]
)
def test_a_kv_cache_decodes_like_one_forward(options: dict) -> None:
    torch.manual_seed(7)
    pe = RotaryEmbedding(D, **options)
    model = posenc.Encoder(4 * D, 2, 4, pe=pe, causal=True, num_kv_heads=2).eval()
    x = torch.randn(2, 8, 4 * D)
    with torch.no_grad():
        full = model(x)
        cache = posenc.KVCache()
        out = torch.cat([model(s, cache=cache) for s in (x[:, :5], x[:, 5:6], x[:, 6:])], 1)
        stream = posenc.StreamingCache(sink_tokens=0, window=64)
        streamed = torch.cat([model(s, cache=stream) for s in (x[:, :5], x[:, 5:6], x[:, 6:])], 1)
    close(out, full, 1e-5)
    close(streamed, full, 1e-5)


def test_options_pass_through_the_registry() -> None:
    rope = build("rope", head_dim=D, rotary_heads=2, base=[10.0, 1e4])
    assert isinstance(rope, RotaryEmbedding) and rope.rotary_heads == 2
    inter = build_for_model("rope-interleaved", 4 * D, 4, rotary_heads=3, rotary_heads_at="last")
    assert inter.interleaved and inter.heads.count == 3 and inter.heads.last
    assert repr(inter) == (
        "InterleavedRotaryEmbedding(head_dim=8, rotary_dim=8, base=10000, interleaved=True, "
        "rotary_heads=3, rotary_heads_at='last')"
    )
    assert "base=(10.0, 10000.0)" in repr(rope) and "rotary_heads=2" in repr(rope)
    given = RotaryEmbedding(D, inv_freq=torch.ones(3, D // 2))
    assert repr(given) == "RotaryEmbedding(head_dim=8, rotary_dim=8, inv_freq=(3, 4))"
    scaled = rope.with_scaling({"rope_type": "linear", "factor": 2.0})
    assert scaled.rotary_heads == 2 and scaled.bases == (10.0, 1e4)
    close(scaled.inv_freq, torch.stack([inv_freq64(10.0, D), inv_freq64(1e4, D)]) / 2, 1e-12)


def test_an_encoder_takes_the_options_by_name() -> None:
    torch.manual_seed(9)
    model = posenc.Encoder(4 * D, 1, 4, pe="rope", pe_kwargs={"rotary_heads": 2})
    assert isinstance(model.pe, RotaryEmbedding) and model.pe.rotary_heads == 2
    assert model(torch.randn(1, 3, 4 * D)).shape == (1, 3, 4 * D)
    with pytest.raises(posenc.PosencValueError, match=r"rotary_heads \(5\)"):
        posenc.Encoder(4 * D, 1, 4, pe="rope", pe_kwargs={"rotary_heads": 5})


@pytest.mark.slow  # (a compile: about 12 s)
def test_compiled_is_eager() -> None:
    """One graph: the head slices and a per-head table's head axis are views inductor takes."""
    torch.manual_seed(10)
    rope = RotaryEmbedding(D, rotary_heads=2, base=[10.0])
    q = torch.randn(B, 4, N, D, requires_grad=True)
    k = torch.randn(B, 2, N, D)
    got = torch.compile(rope, fullgraph=True)(q, k)
    want = rope(q, k)
    for a, b in zip(got, want, strict=True):
        close(a, b, 1e-6)
    (grad,) = torch.autograd.grad(got[0].sum(), q)
    (want_grad,) = torch.autograd.grad(want[0].sum(), q)
    close(grad, want_grad, 1e-6)


def _forward(rope: RotaryEmbedding, hq: int, hk: int) -> object:
    return rope(torch.randn(1, hq, 2, D), torch.randn(1, hk, 2, D))


MISUSE = [
    Misuse("zero", lambda: RotaryEmbedding(D, rotary_heads=0), ValueError, "rotary_heads", 0),
    Misuse("float", lambda: RotaryEmbedding(D, rotary_heads=2.0), TypeError, "rotary_heads", 2.0),
    Misuse("bool", lambda: RotaryEmbedding(D, rotary_heads=True), TypeError, "rotary_heads", True),
    Misuse("at", lambda: RotaryEmbedding(D, rotary_heads_at="mid"), ValueError, "rotary_heads_at",
           "mid"),
    Misuse("more-than-heads", lambda: _forward(RotaryEmbedding(D, rotary_heads=5), 4, 4),
           ValueError, "rotary_heads", 5),
    Misuse("model-heads", lambda: build_for_model("rope", 4 * D, 4, rotary_heads=5), ValueError,
           "rotary_heads", 5),
    Misuse("split-group", lambda: _forward(RotaryEmbedding(D, rotary_heads=3), 4, 2), ValueError,
           "rotary_heads", 3),
    Misuse("ragged-groups", lambda: _forward(RotaryEmbedding(D, rotary_heads=2), 4, 3),
           ValueError, "key heads", 3),
    Misuse("rows-per-query-head", lambda: _forward(RotaryEmbedding(D, base=[1e1, 1e2, 1e3, 1e4]),
                                                   4, 2), ValueError, "frequencies for", 4),
    Misuse("rows-vs-heads", lambda: _forward(RotaryEmbedding(D, base=[1e1, 1e2, 1e3]), 4, 4),
           ValueError, "frequencies for", 3),
    Misuse("attention-groups", lambda: posenc.MultiHeadAttention(
        4 * D, 4, pe=RotaryEmbedding(D, rotary_heads=3), num_kv_heads=2), ValueError,
           "rotary_heads", 3),
    Misuse("encoder-rows", lambda: posenc.Encoder(4 * D, 1, 4, pe="rope", num_kv_heads=2,
                                                  pe_kwargs={"base": [1e1, 1e2, 1e3, 1e4]}),
           ValueError, "base=[...]", 4),
    Misuse("encoder-rotated-rows", lambda: posenc.Encoder(
        4 * D, 1, 4, pe="rope", num_kv_heads=2, pe_kwargs={"base": [1e1, 1e2],
                                                           "rotary_heads": 2}),
           ValueError, "frequencies for", 2),
    Misuse("bad-base", lambda: RotaryEmbedding(D, base=[1e4, -1.0]), ValueError, "base[1]", -1.0),
    Misuse("empty-base", lambda: RotaryEmbedding(D, base=[]), ValueError, "base", "empty"),
    Misuse("freq-shape", lambda: RotaryEmbedding(D, inv_freq=torch.ones(2, 3)), ValueError,
           "inv_freq", (2, 3)),
    Misuse("freq-int", lambda: RotaryEmbedding(D, inv_freq=torch.ones(4, dtype=torch.long)),
           TypeError, "inv_freq", "torch.int64"),
    Misuse("freq-nan", lambda: RotaryEmbedding(D, inv_freq=torch.full((4,), float("nan"))),
           ValueError, "inv_freq", "finite"),
    Misuse("freq-and-base", lambda: RotaryEmbedding(D, base=500.0, inv_freq=torch.ones(4)),
           ValueError, "inv_freq", 500.0),
    Misuse("mrope", lambda: posenc.MultimodalRotaryEmbedding(D, mrope_section=[2, 1, 1],
                                                              rotary_heads=2), ValueError,
           "rotary_heads", 2),
    Misuse("xpos-zero", lambda: posenc.XPos(D, rotary_heads=0), ValueError, "rotary_heads", 0),
    Misuse("xpos-split-group", lambda: _forward(posenc.XPos(D, rotary_heads=1), 4, 2),
           ValueError, "rotary_heads", 1),
    Misuse("query-heads", lambda: RotaryEmbedding(D, rotary_heads=2).rotate(
        torch.randn(1, 2, 2, D), query_heads=3), ValueError, "query_heads", 3),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_bad_input_is_a_clear_error(case: Misuse) -> None:
    check(case)
