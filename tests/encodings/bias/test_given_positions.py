"""Positions given explicitly (``positions=``, no cache: no host bound on the distances)
on a GPU are never read on the host (issue #43 item 2): the value checks run only where
values are read (:func:`~posenc.encodings.checks.reads_values`), a table by distance gives
way to the bias formed per score (KERPLE, Sandwich, DeBERTa's buckets) or from the distances
themselves (DPB), Inkling takes its whole window and Swin V2 the window's offsets, NaN past
them. CPU tensors walk that path with ``CPU_IS_HOST`` cleared; every host read is counted
and the output compared with the float64 math backend on the reading (CPU) path."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.attention.backends import Backend
from posenc.encodings import checks
from posenc.encodings.bias.swin import window_coordinates
from tests.encodings.bias.scores import on_grid
from tests.host_reads import host_reads

DIM, HEADS = 16, 2
SCHEMES = {
    "alibi": {}, "t5": {}, "fire": {}, "kerple": {}, "kerple-power": {"kernel": "power"},
    "dpb": {}, "sandwich": {}, "shaw": {}, "cope": {}, "fox": {}, "inkling": {},
    "deberta": {}, "deberta-buckets": {"position_buckets": 8, "max_relative_positions": 32},
}  # fmt: skip
#: Gaps, a far jump and rows that differ: no range a table could guess.
POSITIONS = torch.tensor([[3, 4, 9, 10, 70], [0, 1, 2, 3, 4]])


def _pair(scheme: str, backend: str) -> tuple[posenc.MultiHeadAttention, ...]:
    """Attention on ``backend`` and a float64 copy on the math backend."""
    torch.manual_seed(0)
    pe = posenc.build_for_model(scheme.split("-")[0], DIM, HEADS, **SCHEMES[scheme])
    attn = posenc.MultiHeadAttention(DIM, HEADS, pe=pe, causal=True, backend=backend).eval()
    attn.compile_flex = False
    ref = copy.deepcopy(attn).double()
    ref.backend = Backend.MATH
    return attn, ref


@pytest.mark.parametrize("dtype", [torch.long, torch.float32], ids=["int", "float"])
@pytest.mark.parametrize("backend", ["flex", "math"])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_given_positions_read_nothing_and_equal_float64(
    scheme: str, backend: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    attn, ref = _pair(scheme, backend)
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    positions = POSITIONS.to(dtype)
    with torch.no_grad():
        want = ref(x.double(), positions=positions)  # (the reading path: CPU_IS_HOST set)
        monkeypatch.setattr(checks, "CPU_IS_HOST", False)
        with host_reads(monkeypatch, own=True, named=True) as calls:
            got = attn(x, positions=positions)
    assert attn.last_backend == backend
    assert calls == [], calls
    assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_the_reading_path_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """(The count above can fail: on the CPU the same call reads, its range and checks.)"""
    attn, _ = _pair("kerple", "flex")
    with torch.no_grad(), host_reads(monkeypatch, own=True) as calls:
        attn(torch.randn(2, 5, DIM), positions=POSITIONS)
    assert "tolist" in calls


@pytest.mark.parametrize("scheme", ["kerple", "kerple-power", "sandwich", "dpb", "fire"])
def test_fractional_positions_on_a_device_are_fused_exactly(
    scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Positions that are not whole numbers (a table by distance cannot hold them; on the
    CPU, read, they take the materialised bias): the formula per score, unread, equals
    the float64 bias."""
    attn, ref = _pair(scheme, "flex")
    x = torch.randn(1, 4, DIM, generator=torch.Generator().manual_seed(2))
    positions = torch.tensor([[0.5, 1.25, 3.0, 7.75]])
    with torch.no_grad():
        want = ref(x.double(), positions=positions)
        monkeypatch.setattr(checks, "CPU_IS_HOST", False)
        with host_reads(monkeypatch, own=True) as calls:
            got = attn(x, positions=positions)
    assert calls == [], calls
    assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_value_checks_run_only_where_values_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fractional positions for T5 (whole numbers required) and NaN positions: refused on
    the CPU, unread (and unchecked) on a device, refused there too under
    ``POSENC_CHECK_POSITIONS=1``."""
    attn, _ = _pair("t5", "flex")
    x = torch.randn(1, 3, DIM)
    cases = [([[0.0, 1.5, 2.0]], "whole numbers"), ([[0.0, float("nan"), 2.0]], "finite")]
    for bad, match in cases:
        with pytest.raises(posenc.PosencValueError, match=match), torch.no_grad():
            attn(x, positions=torch.tensor(bad))
    monkeypatch.setattr(checks, "CPU_IS_HOST", False)
    with torch.no_grad(), host_reads(monkeypatch, own=True) as calls:
        attn(x, positions=torch.tensor([[0.0, 1.5, 2.0]]))
    assert calls == [], calls
    monkeypatch.setenv(checks.CHECK_VARIABLE, "1")  # a GPU's positions read and checked
    with pytest.raises(posenc.PosencValueError, match="whole numbers"), torch.no_grad():
        attn(x, positions=torch.tensor([[0.0, 1.5, 2.0]]))


# --------------------------------------------------------------------------- Swin


@pytest.mark.parametrize("scheme", ["swin-bias", "swinv2-cpb"])
def test_window_coordinates_read_nothing_and_equal_float64(
    scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One window of 3 x 3 patches (BEiT's class token in front for swin-bias): no read,
    the output of flex equals the float64 math backend's on the CPU's path."""
    torch.manual_seed(0)
    kwargs = {"window": 3, "cls_token": True} if scheme == "swin-bias" else {"window": 3}
    pe = posenc.build_for_model(scheme, DIM, HEADS, **kwargs)
    attn = posenc.MultiHeadAttention(DIM, HEADS, pe=pe, backend="flex").eval()
    attn.compile_flex = False
    ref = copy.deepcopy(attn).double()
    ref.backend = Backend.MATH
    coords = window_coordinates(3, 3)  # (9, 2)
    if scheme == "swin-bias":
        coords = torch.cat([torch.tensor([[-1, -1]]), coords])  # the class token
    x = torch.randn(2, coords.shape[0], DIM, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(x.double(), positions=coords)
        monkeypatch.setattr(checks, "CPU_IS_HOST", False)
        with host_reads(monkeypatch, own=True, named=True) as calls:
            got = attn(x, positions=coords)
    assert calls == [], calls
    assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_swin_class_token_check_only_where_values_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pe = posenc.build_for_model("swin-bias", DIM, HEADS, window=3, cls_token=True)
    bad = torch.tensor([[0, 0], [-2, 1]])
    with pytest.raises(posenc.PosencValueError, match=r"holds \[-2, 1\]"):
        pe.bias(bad, bad)
    monkeypatch.setattr(checks, "CPU_IS_HOST", False)
    with host_reads(monkeypatch, own=True) as calls:
        pe.bias(bad, bad)
    assert calls == [], calls


def test_swinv2_offsets_past_the_window_are_nan_on_a_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Coordinates of a 4 x 5 grid under a 3 x 3 window: unread, the table spans the
    window's offsets (|dy|, |dx| <= 2); past it the bias is NaN, within it exactly the
    reading path's (bias and score_mod alike)."""
    torch.manual_seed(0)
    pe = posenc.build_for_model("swinv2-cpb", DIM, HEADS, window=3).double()
    coords = window_coordinates(4, 5)  # (20, 2)
    n = coords.shape[0]
    q = torch.zeros(1, HEADS, n, 4, dtype=torch.float64)  # (the dtype the bias is made in)
    want = pe.bias(coords, coords, q=q)  # (h, n, n), the span read
    monkeypatch.setattr(checks, "CPU_IS_HOST", False)
    with host_reads(monkeypatch, own=True) as calls:
        got = pe.bias(coords, coords, q=q)
        mod = pe.score_mod(coords, coords, q=q)
    assert calls == [], calls
    assert mod is not None
    fused = on_grid(mod, 1, HEADS, n)[0]
    delta = (coords.unsqueeze(1) - coords.unsqueeze(0)).abs()  # (n, n, 2)
    far = (delta > 2).any(-1)
    assert far.any() and (~far).any()
    for values in (got, fused):
        assert values[:, far].isnan().all()
        assert_close(values[:, ~far], want[:, ~far], atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize(
    "positions",
    [
        POSITIONS,
        POSITIONS[1],
        POSITIONS * 100_003 + 10**9,  # far apart, far out: the angle sums in float64
        torch.tensor([[0.5, 1.25, 2.0, 7.5, 8.0]]),  # not whole: nothing is indexed by them
    ],
    ids=["rows", "one-row", "far", "fractional"],
)
def test_transformer_xl_given_positions_read_nothing_and_equal_float64(
    positions: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Transformer-XL with positions given on a GPU's path (no host bound): terms (b) + (d)
    by angle sums, with no read, equal to the paper's equation (the sinusoid ``R_t`` of each
    pair's distance) written out in float64."""
    torch.manual_seed(0)
    pe = posenc.build_for_model("xl", DIM, HEADS, rel_dim=11).double()  # (odd: a lone sine)
    b, n, d = 2, 5, DIM // HEADS
    q, k = torch.randn(b, HEADS, n, d, dtype=torch.float64), torch.randn(b, 1, n, d).double()
    pos = positions.double() if positions.is_floating_point() else positions
    t = pos.unsqueeze(-1) - pos.unsqueeze(-2)  # (nq, nk) | (b, nq, nk)
    r = posenc.encodings.absolute.sinusoidal.sinusoidal_encode(t, 11, dtype=torch.float64)
    wr = torch.einsum("...r,xr->...x", r, pe.pos_proj.weight).unflatten(-1, (HEADS, d))
    wr = wr if wr.dim() == 5 else wr.expand(b, *wr.shape)  # (b, nq, nk, h, d)
    qv = q + pe.v.unsqueeze(1)
    want = (
        torch.einsum("bhid,bijhd->bhij", qv, wr)
        + torch.einsum("hd,bjd->bhj", pe.u, k[:, 0])[:, :, None]
    )
    want = want / d**0.5
    monkeypatch.setattr(checks, "CPU_IS_HOST", False)
    with torch.no_grad(), host_reads(monkeypatch, own=True, named=True) as calls:
        got = pe.bias(positions, positions, q=q, k=k)
    assert calls == [], calls
    # each angle p·ω of a position near 10^9 is off by up to |p|·2^-53 ≈ 1e-7 in float64 (the
    # reference's distances are exact), below float32's rounding of the bias
    tolerance = 2e-7 if positions.abs().max() > 10**6 else 1e-9
    assert_close(got, want, atol=tolerance, rtol=0)
