"""``posenc.rotary_embedding``: PyTorch PR 187286's ``rotary_embedding`` (its documented formula
written out here in float64), flash-attention's ``bshd`` and packed ``thd`` layouts
(``cu_seqlens``, ``seqlen_offsets``), transformers' full-width tables, in place, and q/k in one
call; every layout stated, never guessed."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.errors import PosencTypeError, PosencValueError

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


def pr_formula(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool):
    """PR 187286's documented rotation of ``x (..., D)`` by tables broadcasting against
    ``(..., w)``, in float64; channels past ``2w`` copied (posenc's partial rotation)."""
    x, cos, sin = x.double(), cos.double(), sin.double()
    w = cos.shape[-1]
    head, rest = x[..., : 2 * w], x[..., 2 * w :]
    if interleaved:
        x1, x2 = head[..., 0::2], head[..., 1::2]
        turned = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        x1, x2 = head[..., :w], head[..., w:]
        turned = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((turned, rest), dim=-1)


def tables(n: int, w: int, dtype=torch.float32):
    angles = torch.rand(n, w, dtype=torch.float64) * 20.0
    return angles.cos().to(dtype), angles.sin().to(dtype)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """One rounding from the float64 value."""
    eps = torch.finfo(got.dtype).eps
    tol = 1e-12 if got.dtype == torch.float64 else 4 * eps
    assert_close(got.double(), want, rtol=tol, atol=tol * max(1.0, want.abs().max().item()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("with_ids", [False, True])
def test_bhsd_is_the_prs_formula(dtype, interleaved, with_ids) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8).to(dtype)
    if with_ids:
        cos, sin = tables(11, 4)
        ids = torch.randint(0, 11, (2, 5))
        got = posenc.rotary_embedding(x, cos, sin, ids, interleaved=interleaved)
        want = pr_formula(x, cos[ids][:, None], sin[ids][:, None], interleaved)
    else:
        cos, sin = tables(5, 4)  # (S, D/2), broadcast against (B, H, S, D/2)
        got = posenc.rotary_embedding(x, cos, sin, interleaved=interleaved)
        want = pr_formula(x, cos, sin, interleaved)
    assert got.dtype == dtype and got.shape == x.shape
    close(got, want)


@pytest.mark.parametrize("interleaved", [False, True])
def test_partial_tables_rotate_the_leading_channels(interleaved) -> None:
    x = torch.randn(1, 2, 4, 16)
    cos, sin = tables(9, 3)  # 6 of 16 channels
    ids = torch.tensor([[8, 0, 3, 3]])
    got = posenc.rotary_embedding(x, cos, sin, ids, interleaved=interleaved)
    close(got, pr_formula(x, cos[ids][:, None], sin[ids][:, None], interleaved))
    assert torch.equal(got[..., 6:], x[..., 6:])


@pytest.mark.parametrize("interleaved", [False, True])
def test_bshd_is_bhsd_transposed_and_reads_flash_attentions_offsets(interleaved) -> None:
    torch.manual_seed(1)
    x = torch.randn(2, 5, 3, 8)  # (B, S, H, D)
    cos, sin = tables(20, 4)
    ids = torch.randint(0, 20, (2, 5))
    got = posenc.rotary_embedding(x, cos, sin, ids, interleaved=interleaved, layout="bshd")
    as_bhsd = posenc.rotary_embedding(x.transpose(1, 2), cos, sin, ids, interleaved=interleaved)
    assert torch.equal(got, as_bhsd.transpose(1, 2))
    for offsets in (7, torch.tensor([0, 12])):
        rows = torch.arange(5) + (offsets if isinstance(offsets, int) else offsets[:, None])
        rows = rows.expand(2, 5)
        got = posenc.rotary_embedding(
            x, cos, sin, interleaved=interleaved, layout="bshd", seqlen_offsets=offsets
        )
        close(got, pr_formula(x, cos[rows][:, :, None], sin[rows][:, :, None], interleaved))


@pytest.mark.parametrize("interleaved", [False, True])
def test_thd_is_each_sequence_alone(interleaved) -> None:
    torch.manual_seed(2)
    lengths = [3, 0, 5, 1]
    cu = torch.tensor([0, 3, 3, 8, 9], dtype=torch.int32)
    x = torch.randn(9, 2, 8)  # (T, H, D)
    cos, sin = tables(30, 4)
    offsets = torch.tensor([0, 4, 10, 2])
    got = posenc.rotary_embedding(
        x, cos, sin, interleaved=interleaved, layout="thd", cu_seqlens=cu,
        seqlen_offsets=offsets, max_seqlen=5,
    )  # fmt: skip
    start = 0
    for length, offset in zip(lengths, offsets.tolist(), strict=True):
        alone = posenc.rotary_embedding(
            x[None, start : start + length], cos, sin, interleaved=interleaved,
            layout="bshd", seqlen_offsets=offset,
        )[0]  # fmt: skip
        assert torch.equal(got[start : start + length], alone)
        start += length
    # the flash-attention formula: token t of sequence b at row t - cu[b] + offset[b]
    rows = torch.cat([torch.arange(n) + o for n, o in zip(lengths, offsets.tolist(), strict=True)])
    close(got, pr_formula(x, cos[rows][:, None], sin[rows][:, None], interleaved))


def test_shapes_that_fit_two_layouts_follow_the_stated_one() -> None:
    """(1, 6, 2, 8) is (B=1, H=6, S=2) as bhsd and (B=1, S=6, H=2) as bshd: each stated
    layout gets its own rotation, and ids of the other's shape are an error."""
    torch.manual_seed(3)
    x = torch.randn(1, 6, 2, 8)
    cos, sin = tables(10, 4)
    ids_bhsd, ids_bshd = torch.tensor([[4, 9]]), torch.tensor([[0, 1, 2, 3, 4, 5]])
    got = posenc.rotary_embedding(x, cos, sin, ids_bhsd, layout="bhsd")
    close(got, pr_formula(x, cos[ids_bhsd][:, None], sin[ids_bhsd][:, None], False))
    got = posenc.rotary_embedding(x, cos, sin, ids_bshd, layout="bshd")
    close(got, pr_formula(x, cos[ids_bshd][:, :, None], sin[ids_bshd][:, :, None], False))
    with pytest.raises(PosencValueError, match=r"position_ids must be \(B, S\) = \(1, 2\)"):
        posenc.rotary_embedding(x, cos, sin, ids_bshd, layout="bhsd")
    with pytest.raises(PosencValueError, match=r"position_ids must be \(B, S\) = \(1, 6\)"):
        posenc.rotary_embedding(x, cos, sin, ids_bhsd, layout="bshd")
    q, k = posenc.rotary_embedding_qk(x, 2 * x, cos, sin, ids_bshd, layout="bshd")
    assert torch.equal(q, posenc.rotary_embedding(x, cos, sin, ids_bshd, layout="bshd"))
    assert torch.equal(k, posenc.rotary_embedding(2 * x, cos, sin, ids_bshd, layout="bshd"))
    # bshd without ids reads rows 0..S-1: a (S, w) table, never broadcast against heads
    got = posenc.rotary_embedding(x, cos[:6], sin[:6], layout="bshd")
    close(got, pr_formula(x, cos[:6][None, :, None], sin[:6][None, :, None], False))


@pytest.mark.parametrize("interleaved", [False, True])
def test_transformers_full_width_tables(interleaved) -> None:
    x = torch.randn(2, 2, 4, 8)
    cos, sin = tables(4, 4)
    full = [
        t.repeat_interleave(2, dim=-1) if interleaved else torch.cat((t, t), dim=-1)
        for t in (cos, sin)
    ]
    want = posenc.rotary_embedding(x, cos, sin, interleaved=interleaved)
    assert torch.equal(posenc.rotary_embedding(x, *full, interleaved=interleaved), want)
    other = torch.cat((cos, sin), dim=-1)  # 8 wide, halves differ
    with pytest.raises(PosencValueError, match=r"cos is full width .* not in transformers' form"):
        posenc.rotary_embedding(x, other, other, interleaved=interleaved)
    with pytest.raises(PosencValueError, match="width 6 fit neither"):
        posenc.rotary_embedding(x, cos.repeat(1, 2)[:, :6], sin.repeat(1, 2)[:, :6])


def test_in_place_and_grouped_qk() -> None:
    torch.manual_seed(4)
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)  # grouped: 4 query, 2 key heads
    cos, sin = tables(7, 4)
    ids = torch.randint(0, 7, (2, 5))
    want_q = posenc.rotary_embedding(q, cos, sin, ids)
    want_k = posenc.rotary_embedding(k, cos, sin, ids)
    got_q, got_k = posenc.rotary_embedding_qk(q, k, cos, sin, ids)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    same_q, same_k = posenc.rotary_embedding_qk(q, k, cos, sin, ids, inplace=True)
    assert same_q is q and same_k is k
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    x = torch.randn(1, 1, 5, 8)
    want = posenc.rotary_embedding(x, cos, sin, ids[:1])
    assert posenc.rotary_embedding(x, cos, sin, ids[:1], out=x) is x
    assert torch.equal(x, want)
    with pytest.raises(PosencValueError, match="out must be None or x itself"):
        posenc.rotary_embedding(x, cos, sin, ids[:1], out=torch.empty_like(x))
    with pytest.raises(PosencValueError, match="must agree in every dim but their heads"):
        posenc.rotary_embedding_qk(q, k[:, :, :4], cos, sin)


def test_bad_arguments_are_named() -> None:
    x = torch.randn(2, 3, 5, 8)
    cos, sin = tables(7, 4)
    cases = [
        (lambda: posenc.rotary_embedding(x, cos, sin, layout="sbhd"), PosencValueError, "layout"),
        (lambda: posenc.rotary_embedding(x, cos, sin, layout="thd"), PosencValueError,
         r"x of shape \(2, 3, 5, 8\) cannot be layout='thd'"),
        (lambda: posenc.rotary_embedding(x[0], cos, sin, layout="thd"), PosencValueError,
         "needs cu_seqlens"),
        (lambda: posenc.rotary_embedding(x[0], cos, sin, torch.zeros(2, 3, dtype=torch.long),
                                         layout="thd", cu_seqlens=torch.tensor([0, 2])),
         PosencValueError, "position_ids cannot be given with layout='thd'"),
        (lambda: posenc.rotary_embedding(x, cos, sin, cu_seqlens=torch.tensor([0, 2])),
         PosencValueError, "cu_seqlens is for layout='thd'"),
        (lambda: posenc.rotary_embedding(x, cos, sin, torch.full((2, 5), 7)), PosencValueError,
         "position_ids reach rows 7..7 but the tables have 7 rows"),
        (lambda: posenc.rotary_embedding(x, cos, sin, torch.zeros(2, 5)), PosencTypeError,
         "position_ids must be an integer tensor"),
        (lambda: posenc.rotary_embedding(x, cos, sin, seqlen_offsets=3), PosencValueError,
         "seqlen_offsets is for layout='bshd' or 'thd'"),
        (lambda: posenc.rotary_embedding(x[0], cos, sin, layout="thd",
                                         cu_seqlens=torch.tensor([0, 1, 2]), max_seqlen=1),
         PosencValueError, "cu_seqlens must rise from 0 to the 3 packed tokens"),
        (lambda: posenc.rotary_embedding(x[0], cos, sin, layout="thd",
                                         cu_seqlens=torch.tensor([0, 1, 3]), max_seqlen=1),
         PosencValueError, "max_seqlen=1 but cu_seqlens holds a sequence of 2 tokens"),
    ]  # fmt: skip
    for call, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            call()


def test_transformers_batch_first_tables_are_not_read_as_heads() -> None:
    """transformers' rotary module gives full-width ``(b, n, D)`` tables, which its
    ``apply_rotary_pos_emb`` unsqueezes at the heads axis; broadcast as they are against
    ``(B, H, S, D)`` they would be read per head. With ``b == H`` and ``b > 1`` they are
    refused by name (both entry points), never rotated per head; ``unsqueeze(1)`` is the
    transformers reading, ``(1, n, D)`` is one reading either way."""
    torch.manual_seed(6)
    x = torch.randn(4, 4, 5, 8)  # B == H
    cos, sin = tables(5 * 4, 4)
    cos, sin = cos.view(4, 5, 4), sin.view(4, 5, 4)  # (b, n, D/2): per batch row
    full = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)  # transformers' (b, n, D)
    for call in (posenc.rotary_embedding, posenc.apply_rotary):
        with pytest.raises(PosencValueError, match=r"\(4, 5, 8\).*unsqueeze\(1\)"):
            call(x, *full)
        got = call(x, full[0].unsqueeze(1), full[1].unsqueeze(1))
        close(got, pr_formula(x, cos[:, None], sin[:, None], False))
        one = call(x[:1], full[0][:1], full[1][:1])  # (1, n, D): one reading either way
        close(one, pr_formula(x[:1], cos[:1, None], sin[:1, None], False))


def test_position_ids_and_seqlen_offsets_are_one_or_the_other() -> None:
    """Offsets are never dropped without a word where position ids are given."""
    x = torch.randn(1, 3, 2, 8)
    cos, sin = tables(10, 4)
    ids = torch.tensor([[0, 1, 2]])
    for layout, offsets in (("bhsd", 2), ("bshd", 2), ("bshd", torch.tensor([4]))):
        xl = x if layout == "bshd" else x.transpose(1, 2)
        with pytest.raises(PosencValueError, match="position_ids and seqlen_offsets"):
            posenc.rotary_embedding(xl, cos, sin, ids, layout=layout, seqlen_offsets=offsets)
        with pytest.raises(PosencValueError, match="position_ids and seqlen_offsets"):
            posenc.rotary_embedding_qk(xl, xl, cos, sin, ids, layout=layout, seqlen_offsets=offsets)


def test_full_width_tables_are_checked_on_the_rows_read() -> None:
    """A full-width table is checked on the rows the ids pick, not on the whole table (a
    decode step's cost does not grow with the table): rows never read may hold anything."""
    x = torch.randn(1, 2, 1, 8)
    cos, sin = tables(6, 4)
    full = [torch.cat((t, t), -1) for t in (cos, sin)]  # (6, 8)
    for t in full:
        t[0, 0] += 1.0  # row 0's halves differ
    ids = torch.tensor([[3]])
    got = posenc.rotary_embedding(x, *full, ids)
    close(got, pr_formula(x, cos[ids][:, None], sin[ids][:, None], False))
    with pytest.raises(PosencValueError, match="its two copies differ"):
        posenc.rotary_embedding(x, *full, torch.tensor([[0]]))


def test_overlapping_q_and_k_and_non_bool_flags_are_refused() -> None:
    x = torch.randn(1, 2, 3, 8)
    cos, sin = tables(3, 4)
    with pytest.raises(PosencValueError, match="q and k share memory"):
        posenc.rotary_embedding_qk(x, x, cos, sin, inplace=True)
    assert not torch.equal(posenc.rotary_embedding_qk(x, x, cos, sin)[0], x)  # out of place: fine
    with pytest.raises(PosencTypeError, match=r"inplace must be a bool, got str \('no'\)"):
        posenc.rotary_embedding_qk(x, x.clone(), cos, sin, inplace="no")
    with pytest.raises(PosencTypeError, match=r"interleaved must be a bool, got str \('no'\)"):
        posenc.rotary_embedding(x, cos, sin, interleaved="no")


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_narrow_integer_position_ids_are_positions_not_a_mask(dtype) -> None:
    # torch reads a uint8 index as a boolean mask and refuses int8/int16 indices; ids of any
    # integer dtype are rows of the tables
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8)
    cos, sin = tables(11, 4)
    ids = torch.randint(0, 11, (2, 5))
    want = pr_formula(x, cos[ids][:, None], sin[ids][:, None], False)
    close(posenc.rotary_embedding(x, cos, sin, ids.to(dtype)), want)
    q, _ = posenc.rotary_embedding_qk(x, x[:, :1], cos, sin, ids.to(dtype))
    close(q, want)
    close(
        posenc.rotary_embedding(x.transpose(1, 2), cos, sin, ids.to(dtype), layout="bshd"),
        want.transpose(1, 2),
    )


def test_bshd_tables_already_at_the_positions_are_pointed_to_apply_rotary() -> None:
    # without ids, bshd reads flash-attention's (N, D/2) tables at seqlen_offsets + 0..S-1;
    # tables already gathered per token were refused as "to be indexed by positions" that the
    # caller never gave
    x = torch.randn(2, 5, 3, 8)
    cos, sin = tables(5, 4)
    for shape in ((2, 5, 1, 4), (2, 5, 4), (2, 5, 1, 8)):
        c = cos.expand(2, 5, 4).reshape((*shape[:-1], -1))[..., :4]
        c = torch.cat((c, c), -1) if shape[-1] == 8 else c
        with pytest.raises(PosencValueError, match=r"layout='bshd'.*seqlen_offsets.*apply_rotary"):
            posenc.rotary_embedding(x, c, c, layout="bshd")
    got = posenc.apply_rotary(x, cos[None, :, None], sin[None, :, None])
    close(got, pr_formula(x, cos[None, :, None], sin[None, :, None], False))


def _hf_rotation(x, cos, sin, interleaved):
    """transformers' rotation by full-width tables, the gradient reference."""
    if interleaved:
        pairs = torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)
    else:
        w = x.shape[-1] // 2
        pairs = torch.cat((-x[..., w:], x[..., :w]), -1)
    return x * cos + pairs * sin


@pytest.mark.parametrize("interleaved", [False, True])
def test_full_width_tables_get_transformers_gradient(interleaved) -> None:
    # each copy of an angle turns its own channel, as in transformers' formula: the gradient
    # of the second copy was zero (the table was cut to its first half)
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    grad = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    angles = torch.rand(11, 4, dtype=torch.float64) * 6
    twice = angles.repeat_interleave(2, -1) if interleaved else torch.cat((angles, angles), -1)
    ids = torch.randint(0, 11, (2, 5))
    calls = {
        "apply_rotary": lambda c, s, v: posenc.apply_rotary(
            v, c[ids][:, None], s[ids][:, None], interleaved=interleaved
        ),
        "rotary_embedding": lambda c, s, v: posenc.rotary_embedding(
            v, c, s, ids, interleaved=interleaved
        ),
    }
    cos, sin, xx = (t.clone().requires_grad_() for t in (twice.cos(), twice.sin(), x))
    turned = _hf_rotation(xx, cos[ids][:, None], sin[ids][:, None], interleaved)
    turned.mul(grad).sum().backward()
    want = (cos.grad, sin.grad, xx.grad)
    for name, call in calls.items():
        cos, sin, xx = (t.clone().requires_grad_() for t in (twice.cos(), twice.sin(), x))
        out = call(cos, sin, xx)
        close(out, turned.detach())
        out.mul(grad).sum().backward()
        for got, expected in zip((cos.grad, sin.grad, xx.grad), want, strict=True):
            assert_close(got, expected, rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [8, 4])  # D/2 (Persimmon's 0.5) and D/4
def test_transformers_partial_tables_are_refused_and_their_first_copy_rotates(
    interleaved, rotary_dim
) -> None:
    """transformers' tables of a partial rotation (``rotary_dim = r < D``: ``cat(f, f)`` of
    ``r/2`` angles, or each angle twice) have the shape of a half-width table of ``r`` angles,
    which turns ``2r`` channels: refused by name, every layout; their first copy rotates the
    leading ``r`` channels as transformers does (``rotate_half`` on ``x[..., :r]``)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 16, dtype=torch.float64)
    angles = torch.arange(11.0, dtype=torch.float64)[:, None] * torch.rand(rotary_dim // 2)
    twice = angles.repeat_interleave(2, -1) if interleaved else torch.cat((angles, angles), -1)
    cos, sin = twice.cos(), twice.sin()  # (row p: position p)
    ids = torch.randint(1, 11, (2, 5))
    with pytest.raises(PosencValueError, match=f"width {rotary_dim} repeat every angle"):
        posenc.rotary_embedding(x, cos, sin, ids, interleaved=interleaved)
    with pytest.raises(PosencValueError, match="repeat every angle"):
        posenc.rotary_embedding(x, cos[ids][:, None], sin[ids][:, None], interleaved=interleaved)
    with pytest.raises(PosencValueError, match="repeat every angle"):
        posenc.rotary_embedding(x.transpose(1, 2), cos, sin, layout="bshd", interleaved=interleaved)
    first = (lambda t: t[..., ::2]) if interleaved else (lambda t: t[..., : rotary_dim // 2])
    got = posenc.rotary_embedding(x, first(cos), first(sin), ids, interleaved=interleaved)
    head = _hf_rotation(x[..., :rotary_dim], cos[ids][:, None], sin[ids][:, None], interleaved)
    close(got, torch.cat((head, x[..., rotary_dim:]), -1))
    # at position 0 alone (every sine 0) the two readings agree: the identity, not refused
    assert torch.equal(posenc.rotary_embedding(x, cos, sin, torch.zeros(2, 5, dtype=torch.long)), x)


def test_table_value_checks_read_nothing_on_a_gpus_path(monkeypatch) -> None:
    """With CPU tensors standing in for a GPU's (``checks.CPU_IS_HOST`` cleared), a call with
    full-width or half-width tables reads no value on the host (each check would synchronise
    every call there) and rotates as on the CPU; ``POSENC_CHECK_POSITIONS=1`` turns the
    full-width check back on."""
    from posenc.encodings import checks
    from tests.host_reads import host_reads

    x = torch.randn(1, 2, 3, 8)
    cos, sin = tables(6, 4)
    full = [torch.cat((t, t), -1) for t in (cos, sin)]
    ids = torch.tensor([[3, 0, 5]])
    want = posenc.rotary_embedding(x, *full, ids)
    monkeypatch.setattr(checks, "CPU_IS_HOST", False)
    for c, s in (full, (cos, sin)):
        with host_reads(monkeypatch, own=True) as reads:
            got = posenc.rotary_embedding(x, c, s, ids)
        assert reads == [] and torch.equal(got, want)
    bad = [t.clone() for t in full]
    bad[0][3, 0] += 1.0
    monkeypatch.setenv(checks.CHECK_VARIABLE, "1")
    with pytest.raises(PosencValueError, match="its two copies differ"):
        posenc.rotary_embedding(x, *bad, ids)


def test_ids_outside_the_table_fail_where_their_range_is_not_read(monkeypatch) -> None:
    """On a GPU's path (CPU tensors standing in) the ids' range is not read; a negative id
    still fails in the gather, never counted from the table's end."""
    from posenc.encodings import checks

    monkeypatch.setattr(checks, "CPU_IS_HOST", False)
    x = torch.randn(1, 2, 3, 8)
    cos, sin = tables(6, 4)
    for ids in (torch.tensor([[0, -1, 2]]), torch.tensor([[0, 6, 2]])):
        with pytest.raises(IndexError):
            posenc.rotary_embedding(x, cos, sin, ids)
