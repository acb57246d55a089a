"""Layouts stated, never guessed (issue #44 item 2): every rotary entry point fed tensors whose
shape fits two layouts rotates along the one it is told, checked against eq. 34 written out in
float64 here (RoPE) or against the same module on the tensor laid out as ``bhsd`` by hand (the
other schemes, each checked against its own formula in its own tests); ``thd`` packing with
flash-attention's ``cu_seqlens``/``seqlen_offsets``; ``position_ids`` as ``positions``'s other
name; transformers' full-width tables in :func:`posenc.apply_rotary`."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.errors import PosencValueError

D = 8


def rope64(x: torch.Tensor, positions: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Eq. 34 in float64 for ``x`` ``(b, h, n, d)`` at ``positions`` ``(n,)`` or ``(b, n)``."""
    x = x.double()
    inv = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (d/2,)
    angle = positions.double()[..., None] * inv  # (..., n, d/2)
    if angle.dim() == 3:
        angle = angle[:, None]
    cos, sin = angle.cos(), angle.sin()
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(-2)
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_rope_rotates_along_the_stated_layout(interleaved: bool, inplace: bool) -> None:
    torch.manual_seed(0)
    rope = posenc.RotaryEmbedding(D, interleaved=interleaved)
    q, k = torch.randn(1, 6, 2, D), torch.randn(1, 6, 2, D)  # (b, n, h, d) or (b, h, n, d)
    for layout, n_axis in (("bhsd", 2), ("bshd", 1)):
        qq, kk = q.clone(), k.clone()
        got_q, got_k = rope(qq, kk, inplace=inplace, layout=layout)
        assert got_q.shape == q.shape and (got_q is qq) == inplace
        positions = torch.arange(q.shape[n_axis])
        for got, x in ((got_q, q), (got_k, k)):
            bhsd = x if layout == "bhsd" else x.transpose(1, 2)
            want = rope64(bhsd, positions, interleaved)
            want = want if layout == "bhsd" else want.transpose(1, 2)
            torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=0)
        one = rope.rotate(q.clone(), layout=layout)
        torch.testing.assert_close(one, got_q, atol=0, rtol=0)
    # the two readings differ: a wrong layout would be seen
    assert not torch.allclose(rope(q, k, layout="bshd")[0], rope(q, k)[0])


def test_thd_reads_flash_attentions_packing() -> None:
    torch.manual_seed(1)
    rope = posenc.RotaryEmbedding(D)
    cu = torch.tensor([0, 3, 7])
    offsets = torch.tensor([2, 5])
    q, k = torch.randn(7, 2, D), torch.randn(7, 1, D)  # (t, h, d)
    got_q, got_k = rope(q, k, layout="thd", cu_seqlens=cu, seqlen_offsets=offsets, max_seqlen=4)
    positions = torch.tensor([2, 3, 4, 5, 6, 7, 8])  # t - cu[b] + offsets[b]
    for got, x in ((got_q, q), (got_k, k)):
        want = rope64(x.transpose(0, 1)[None], positions)[0].transpose(0, 1)
        torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=0)
    with pytest.raises(PosencValueError, match="layout='thd'"):
        rope(q, k, positions, layout="thd", cu_seqlens=cu)
    with pytest.raises(PosencValueError, match="max_seqlen=2"):
        rope(q, k, layout="thd", cu_seqlens=cu, max_seqlen=2)
    with pytest.raises(PosencValueError, match=r"cannot be layout='thd', which is \(t, h, d\)"):
        rope(q[None], k[None], layout="thd", cu_seqlens=cu)
    with pytest.raises(PosencValueError, match="cu_seqlens is for layout='thd'"):
        rope(q[None], k[None], layout="bshd", cu_seqlens=cu)


def test_bshd_offsets_are_positions_per_row() -> None:
    torch.manual_seed(2)
    rope = posenc.RotaryEmbedding(D)
    q = torch.randn(2, 3, 2, D)  # (b, n, h, d)
    got = rope.rotate(q, layout="bshd", seqlen_offsets=torch.tensor([0, 4]))
    want = rope64(q.transpose(1, 2), torch.tensor([[0, 1, 2], [4, 5, 6]])).transpose(1, 2)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=0)


def test_positions_that_do_not_fit_the_layout_name_both() -> None:
    rope = posenc.RotaryEmbedding(D)
    q = torch.randn(1, 6, 2, D)
    with pytest.raises(PosencValueError, match=r"layout='bshd' \(b, n, h, d\)"):
        rope(q, q.clone(), torch.arange(2), layout="bshd")
    with pytest.raises(PosencValueError, match="layout must be one of"):
        rope(q, q.clone(), layout="bsdh")  # type: ignore[arg-type]
    # q and k that differ in length are named as given, not as the (b, h, n, d) views
    with pytest.raises(PosencValueError, match=r"q \(1, 6, 2, 8\) and k \(1, 5, 2, 8\)"):
        rope(q, q[:, :5].clone(), layout="bshd")
    with pytest.raises(PosencValueError, match=r"q \(6, 2, 8\) and k \(5, 2, 8\)"):
        rope(q[0], q[0, :5].clone(), layout="thd", cu_seqlens=torch.tensor([0, 6]))


SCHEMES = {
    "xpos": lambda: posenc.build("xpos", head_dim=D),
    "pope": lambda: posenc.build("pope", head_dim=D, num_heads=2),
    "mrope": lambda: posenc.MultimodalRotaryEmbedding(D, mrope_section=[2, 1, 1]),
    "rope2d": lambda: posenc.build("rope2d", head_dim=D),
    "fope": lambda: posenc.build("fope", head_dim=D, max_position_embeddings=16),
    "rope-mixed": lambda: posenc.build("rope-mixed", head_dim=D, num_heads=2),
    "rope-dinov3": lambda: posenc.build("rope-dinov3", head_dim=D),
}
#: The schemes whose positions are grid coordinates ``(n, a)``.
GRIDS = ("rope2d", "rope-mixed", "rope-dinov3")


@pytest.mark.parametrize("name", list(SCHEMES))
def test_every_scheme_rotates_along_the_stated_layout(name: str) -> None:
    torch.manual_seed(3)
    pe = SCHEMES[name]()
    q, k = torch.randn(1, 6, 2, D), torch.randn(1, 6, 2, D)  # fits bhsd (n=2) and bshd (n=6)
    grid = torch.stack((torch.arange(6) // 3, torch.arange(6) % 3), -1)  # (6, 2)
    positions = grid if name in GRIDS else None
    got_q, got_k = pe(q, k, positions, layout="bshd")
    want_q, want_k = pe(q.transpose(1, 2), k.transpose(1, 2), positions)
    torch.testing.assert_close(got_q, want_q.transpose(1, 2), atol=0, rtol=0)
    torch.testing.assert_close(got_k, want_k.transpose(1, 2), atol=0, rtol=0)
    if hasattr(pe, "rotate") and name != "pope":
        got = pe.rotate(q, positions, layout="bshd")
        want = pe.rotate(q.transpose(1, 2), positions)
        torch.testing.assert_close(got, want.transpose(1, 2), atol=0, rtol=0)
    if name in GRIDS:
        with pytest.raises(PosencValueError, match="coordinates"):
            pe(q[0], k[0], layout="thd", cu_seqlens=torch.tensor([0, 6]))
        with pytest.raises(PosencValueError, match="coordinates"):
            pe(q, k, layout="bshd", seqlen_offsets=2)
        with pytest.raises(PosencValueError, match=r"layout='bshd' \(b, n, h, d\)"):
            pe(q, k, grid[:2], layout="bshd")  # the bhsd reading's coordinates
    elif name == "fope":  # packed: each sequence as if alone
        cu = torch.tensor([0, 2, 6])
        got_q, got_k = pe(q[0], k[0], layout="thd", cu_seqlens=cu)
        for a, b in ((0, 2), (2, 6)):
            want_q, want_k = pe(q[:, a:b].transpose(1, 2), k[:, a:b].transpose(1, 2))
            torch.testing.assert_close(got_q[a:b], want_q[0].transpose(0, 1), atol=0, rtol=0)
            torch.testing.assert_close(got_k[a:b], want_k[0].transpose(0, 1), atol=0, rtol=0)
        assert not torch.allclose(got_q, pe(q, k)[0], equal_nan=True)  # the other reading
    elif name == "pope":  # the other reading: 6 heads, which PoPE's phases refuse
        with pytest.raises(PosencValueError, match="6 heads"):
            pe(q, k)
    else:
        assert not torch.allclose(got_q, pe(q, k)[0], equal_nan=True)  # the other reading


@pytest.mark.parametrize("name", ["rope", *SCHEMES])
def test_position_ids_is_positions_other_name(name: str) -> None:
    torch.manual_seed(4)
    pe = posenc.RotaryEmbedding(D) if name == "rope" else SCHEMES[name]()
    q, k = torch.randn(1, 2, 3, D), torch.randn(1, 2, 3, D)
    ids = torch.tensor([[4, 5, 7]])
    if name in GRIDS:
        ids = torch.tensor([[[0, 1], [1, 1], [2, 0]]])
    by_ids = pe(q, k, position_ids=ids)
    by_positions = pe(q, k, ids)
    for a, b in zip(by_ids, by_positions, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    with pytest.raises(PosencValueError, match="positions and position_ids"):
        pe(q, k, ids, position_ids=ids)


@pytest.mark.parametrize("name", ["sinusoidal", "learned", "abacus"])
def test_additive_encodings_take_position_ids(name: str) -> None:
    pe = posenc.build(name, dim=D, max_len=16)
    x, ids = torch.randn(1, 3, D), torch.tensor([[3, 1, 2]])
    torch.testing.assert_close(pe(x, position_ids=ids), pe(x, ids), atol=0, rtol=0)
    with pytest.raises(PosencValueError, match="positions and position_ids"):
        pe(x, ids, position_ids=ids)


@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_takes_transformers_full_width_tables(interleaved: bool) -> None:
    torch.manual_seed(5)
    x = torch.randn(1, 2, 3, D)
    angle = torch.arange(3.0)[:, None] * torch.rand(D // 2)  # (n, d/2)
    cos, sin = angle.cos(), angle.sin()
    double = (lambda t: t.repeat_interleave(2, -1)) if interleaved else (lambda t: t.repeat(1, 2))
    want = posenc.apply_rotary(x, cos, sin, interleaved=interleaved)
    got = posenc.apply_rotary(x, double(cos), double(sin), interleaved=interleaved)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    with pytest.raises(PosencValueError, match="not in transformers' form"):
        posenc.apply_rotary(x, torch.rand(3, D), torch.rand(3, D), interleaved=interleaved)
