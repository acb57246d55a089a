"""Tests of the options of ``src/posenc/encodings/rotary/axial.py``: pixel frequencies against
rotary-embedding-torch itself; EVA's resolution rescaling against timm's
``build_rotary_pos_embed`` and ``apply_rot_embed_cat`` written out in float64 (timm cannot be
imported beside this CPU torch); unequal channel splits per axis against diffusers'
``FluxPosEmbed``/``get_1d_rotary_pos_embed``/``apply_rotary_emb`` written out in float64
(diffusers is not installed). Values and gradients of q and k, whole tensors,
max|a − b| / max|b| ≤ 2e-5 in fp32; and every bad option refused by name.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` tokens, ``d`` head dim, ``a`` axes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

import posenc
from posenc import AxialRotaryEmbedding
from posenc.encodings.registry import build_for_model
from posenc.errors import PosencTypeError, PosencValueError
from tests.encodings.rotary.test_rope import inv_freq64, rope_reference
from tests.native import NATIVE

F64 = torch.float64
TOL = 2e-5


def assert_relative(got: Tensor, want: Tensor, tol: float = TOL) -> None:
    err = ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()
    assert err <= tol, f"max|a - b| / max|b| = {err:.2e} > {tol:.0e}"


def check_against(
    pe: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
    reference: Callable[[Tensor], Tensor],
    shape: tuple[int, ...],
) -> None:
    """posenc's rotated q, k (fp32) and their gradients under a random upstream gradient,
    against ``reference`` run in float64 with autograd."""
    torch.manual_seed(0)
    q, k = (torch.randn(shape, requires_grad=True) for _ in range(2))
    grads = [torch.randn(shape) for _ in range(2)]
    got = pe(q, k)
    sum((out * g).sum() for out, g in zip(got, grads, strict=True)).backward()
    for x, out, g in zip((q, k), got, grads, strict=True):
        x64 = x.detach().double().requires_grad_()
        want = reference(x64)
        (want * g.double()).sum().backward()
        assert_relative(out, want)
        assert_relative(x.grad, x64.grad)


# ------------------------------------------------------------------ pixel frequencies


@pytest.mark.parametrize(("shape", "max_freq"), [((5, 7), 10.0), ((4, 6), 64.0), ((2, 3, 4), 20)])
def test_pixel_frequencies_match_rotary_embedding_torch(shape: tuple, max_freq: float) -> None:
    """Heads as rotary-embedding-torch's users build them: ``RotaryEmbedding(d_axis,
    freqs_for="pixel", max_freq=...)``, ``get_axial_freqs(*shape)`` (coordinates
    ``linspace(-1, 1)`` per axis), ``apply_rotary_emb``; its frequencies learned, so their
    gradient is compared too (posenc holds one copy per axis: the copies' sum)."""
    ret = pytest.importorskip("rotary_embedding_torch")
    a, per_axis = len(shape), 8
    d, n = a * per_axis, math.prod(shape)
    peer = ret.RotaryEmbedding(per_axis, freqs_for="pixel", max_freq=max_freq, learned_freq=True)
    ours = AxialRotaryEmbedding(
        d, ndim=a, interleaved=True, freqs_for="pixel", max_freq=max_freq, learned_freq=True
    )
    coords = AxialRotaryEmbedding.pixel_grid(*shape)
    freqs = peer.get_axial_freqs(*shape).reshape(n, d)  # (n, d): angles, each twice
    torch.manual_seed(1)
    q, k = torch.randn(2, 3, n, d, requires_grad=True), torch.randn(2, 3, n, d)
    g = torch.randn(2, 3, n, d)
    mine = ours(q, k, coords)
    theirs = (ret.apply_rotary_emb(freqs, q), ret.apply_rotary_emb(freqs, k))
    q_grad = torch.autograd.grad((mine[0] * g).sum(), q, retain_graph=True)[0]
    peer_q_grad = torch.autograd.grad((theirs[0] * g).sum(), q, retain_graph=True)[0]
    for got, want in zip(mine, theirs, strict=True):
        assert_relative(got, want)
    assert_relative(q_grad, peer_q_grad)
    loss = lambda pair: sum((x * g).sum() for x in pair)  # noqa: E731
    freq_grad = torch.autograd.grad(loss(mine), ours.freq)[0]
    peer_freq_grad = torch.autograd.grad(loss(theirs), peer.freqs)[0]
    assert_relative(freq_grad.view(a, -1).sum(0), peer_freq_grad)
    assert_relative(ours.freq.detach().view(a, -1)[0], peer.freqs.detach())


# ------------------------------------------------------------------ EVA (timm) rescaling


def timm_rotary_cat(
    feat_shape: tuple[int, ...],
    dim: int,
    *,
    temperature: float = 10000.0,
    in_pixels: bool = False,
    max_res: float = 224.0,
    ref_feat_shape: tuple[int, ...] | None = None,
    grid_offset: float = 0.0,
    grid_indexing: str = "ij",
) -> tuple[Tensor, Tensor]:
    """timm's ``build_rotary_pos_embed`` (``linear_bands=True`` for pixels) in float64:
    ``(sin, cos)``, each ``(prod(feat_shape), dim)`` with every angle twice (interleaved)."""
    bands_n = dim // 4
    if in_pixels:
        bands = torch.linspace(1.0, max_res / 2, bands_n, dtype=F64) * math.pi
    else:
        bands = 1.0 / temperature ** (torch.arange(bands_n, dtype=F64) / bands_n)
    if grid_indexing == "xy":
        feat_shape = (feat_shape[1], feat_shape[0], *feat_shape[2:])
        if ref_feat_shape is not None:
            ref_feat_shape = (ref_feat_shape[1], ref_feat_shape[0], *ref_feat_shape[2:])
    if in_pixels:
        t = [torch.linspace(-1.0, 1.0, s, dtype=F64) for s in feat_shape]
    else:
        t = [torch.arange(s, dtype=F64) + grid_offset for s in feat_shape]
    if ref_feat_shape is not None:
        t = [x / f * r for x, f, r in zip(t, feat_shape, ref_feat_shape, strict=True)]
    grid = torch.stack(torch.meshgrid(t, indexing=grid_indexing), dim=-1).unsqueeze(-1)
    pos = grid * bands  # (..., a, bands)
    n = math.prod(feat_shape)
    return (
        pos.sin().reshape(n, -1).repeat_interleave(2, -1),
        pos.cos().reshape(n, -1).repeat_interleave(2, -1),
    )


def timm_apply_rot_embed_cat(x: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
    """timm's ``apply_rot_embed_cat(x, cat(sin, cos), half=False)``: ``x·cos + rot(x)·sin``
    with ``rot(x) = [-x1, x0, -x3, x2, ...]``."""
    rot = torch.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape)
    return x * cos + rot * sin


EVA_CASES = {
    # name: (feat (h, w), ref, in_pixels, grid_offset, grid_indexing, give feat_shape)
    "larger-grid": ((6, 8), (4, 4), False, 0.0, "ij", True),
    "from-positions": ((6, 8), (4, 4), False, 0.0, "ij", False),
    "smaller-grid": ((3, 5), (8, 6), False, 0.0, "ij", True),
    "xy": ((3, 5), (4, 6), False, 0.0, "xy", True),
    "xy-from-positions": ((3, 5), (4, 6), False, 0.0, "xy", False),
    "grid-offset": ((4, 3), (5, 5), False, 0.5, "ij", True),
    "pixels": ((5, 4), (8, 8), True, 0.0, "ij", True),
    "no-rescaling": ((3, 4), None, False, 0.0, "ij", False),
}


@pytest.mark.parametrize("case", EVA_CASES)
def test_eva_rescaling_matches_timm_rotary_embedding_cat(case: str) -> None:
    """timm's ``RotaryEmbeddingCat(head_dim, in_pixels=..., ref_feat_shape=...)`` as EVA-02
    uses it (interleaved pairs over the whole head); posenc given the grid's coordinates
    (``(col, row)`` with both shapes swapped for ``grid_indexing="xy"``; the offset added to
    the coordinates)."""
    (h, w), ref, in_pixels, offset, indexing, give_feat = EVA_CASES[case]
    d, max_res = 16, 32.0
    sin, cos = timm_rotary_cat(
        (h, w), d, temperature=100.0, in_pixels=in_pixels, max_res=max_res,
        ref_feat_shape=ref, grid_offset=offset, grid_indexing=indexing,
    )  # fmt: skip
    grid = AxialRotaryEmbedding.pixel_grid(h, w) if in_pixels else AxialRotaryEmbedding.grid(h, w)
    coords, feat = grid + offset, (h, w)
    if indexing == "xy":
        coords, feat = coords.flip(-1), (w, h)
        ref = None if ref is None else (ref[1], ref[0])
    options = {"freqs_for": "pixel", "max_freq": max_res} if in_pixels else {"base": 100.0}
    pe = posenc.build(
        "rope2d", head_dim=d, interleaved=True, ref_feat_shape=ref,
        feat_shape=feat if give_feat else None, **options,
    )  # fmt: skip
    check_against(
        lambda q, k: pe(q, k, coords),
        lambda x: timm_apply_rot_embed_cat(x, sin, cos),
        (2, 3, h * w, d),
    )


def test_eva_extent_from_positions_is_per_batch_row() -> None:
    """Without ``feat_shape`` each batch row's grid is its own largest coordinate + 1: a
    3 × 4 and a 4 × 3 grid in one batch each match timm at their own shape."""
    pe = AxialRotaryEmbedding(16, ndim=2, interleaved=True, ref_feat_shape=(6, 6))
    coords = torch.stack([AxialRotaryEmbedding.grid(3, 4), AxialRotaryEmbedding.grid(4, 3)])
    shapes = [(3, 4), (4, 3)]
    tables = [timm_rotary_cat(s, 16, ref_feat_shape=(6, 6)) for s in shapes]
    sin, cos = (torch.stack([t[i] for t in tables])[:, None] for i in (0, 1))  # (b, 1, n, d)
    check_against(
        lambda q, k: pe(q, k, coords),
        lambda x: timm_apply_rot_embed_cat(x, sin, cos),
        (2, 2, 12, 16),
    )


def test_eva_rescaling_keeps_the_reference_range_of_angles() -> None:
    """The point of the rescaling: the last patch of an 8 × 8 grid turns as the last patch of
    the 4 × 4 reference would turn at coordinate 4·(7/8), in every pair."""
    pe = AxialRotaryEmbedding(8, ndim=2, ref_feat_shape=(4, 4))
    plain = AxialRotaryEmbedding(8, ndim=2)
    got = pe.cos_sin(AxialRotaryEmbedding.grid(8, 8), torch.float64)
    want = plain.cos_sin(AxialRotaryEmbedding.grid(8, 8).double() * 0.5, torch.float64)
    for a, b in zip(got, want, strict=True):
        assert (a - b).abs().max() <= 1e-15


# ------------------------------------------------------------------ unequal splits (Flux)


def flux_cos_sin(ids: Tensor, theta: float, axes_dim: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """diffusers' ``FluxPosEmbed(theta, axes_dim)(ids)`` in float64: per axis
    ``get_1d_rotary_pos_embed(axes_dim[i], ids[:, i], theta, use_real=True,
    repeat_interleave_real=True)``, concatenated; ``(n, sum(axes_dim))`` each."""
    cos_out, sin_out = [], []
    for i, dim in enumerate(axes_dim):
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=F64) / dim))
        angles = torch.outer(ids[:, i].double(), freqs)  # (n, dim/2)
        cos_out.append(angles.cos().repeat_interleave(2, dim=1))
        sin_out.append(angles.sin().repeat_interleave(2, dim=1))
    return torch.cat(cos_out, dim=-1), torch.cat(sin_out, dim=-1)


def diffusers_apply_rotary_emb(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """diffusers' ``apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=-1,
    sequence_dim=1)`` on ``x`` ``(b, n, h, d)``, without its cast back."""
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    return x * cos + rotated * sin


def flux_ids(text: int, h: int, w: int) -> Tensor:
    """Flux's ids: text tokens at ``(0, 0, 0)``, then the latent patches at ``(0, row, col)``."""
    image = torch.cat([torch.zeros(h * w, 1, dtype=torch.long), AxialRotaryEmbedding.grid(h, w)], 1)
    return torch.cat([torch.zeros(text, 3, dtype=torch.long), image])  # (n, 3)


def test_axes_dim_matches_diffusers_flux_pos_embed() -> None:
    """Flux.1's transformer: head dim 128, ``axes_dims_rope=(16, 56, 56)``, theta 10000;
    q and k ``(b, n, h, d)`` as diffusers holds them (``layout="bshd"``)."""
    ids = flux_ids(3, 4, 6) + torch.tensor([0, 30, 40])  # far rows and columns too
    cos, sin = flux_cos_sin(ids, 10000.0, (16, 56, 56))
    pe = posenc.build("rope3d", head_dim=128, axes_dim=(16, 56, 56), interleaved=True)
    check_against(
        lambda q, k: pe(q, k, ids, layout="bshd"),
        lambda x: diffusers_apply_rotary_emb(x, cos, sin),
        (1, ids.shape[0], 2, 128),
    )


def test_axes_dim_with_a_base_per_axis_matches_the_formula() -> None:
    """Unequal groups in the half layout, each axis with its own base (as Cosmos's per-axis
    NTK factors make them), partial rotary: RoFormer's rotation pair by pair in float64."""
    axes_dim, bases = (4, 6, 2), (50.0, 1000.0, 3.0)
    pe = AxialRotaryEmbedding(16, ndim=3, rotary_dim=12, axes_dim=axes_dim, base=bases)
    coords = torch.rand(2, 5, 3, dtype=F64) * 20
    freqs = [inv_freq64(c, b) for c, b in zip(axes_dim, bases, strict=True)]
    angles = torch.cat([coords[..., a : a + 1] * f for a, f in enumerate(freqs)], -1)[:, None]
    check_against(
        lambda q, k: pe(q, k, coords),
        lambda x: rope_reference(x, angles, interleaved=False),
        (2, 2, 5, 16),
    )


def test_equal_axes_dim_is_the_default_split() -> None:
    default = AxialRotaryEmbedding(24, ndim=3, base=500.0)
    stated = AxialRotaryEmbedding(24, ndim=3, base=(500.0,) * 3, axes_dim=(8, 8, 8))
    assert torch.equal(default.inv_freq, stated.inv_freq)
    assert torch.equal(default.axis_of_pair, stated.axis_of_pair)


# ------------------------------------------------------------------ surfaces and refusals


@pytest.mark.parametrize("kernel", [NATIVE, "torch"])
def test_options_run_on_every_cpu_kernel(kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The options only change the fp32 tables; each forced kernel rotates by them."""
    monkeypatch.setenv("POSENC_ROTARY_KERNEL", kernel)
    ids = flux_ids(2, 3, 3)
    cos, sin = flux_cos_sin(ids, 10000.0, (4, 6, 6))
    pe = AxialRotaryEmbedding(16, ndim=3, axes_dim=(4, 6, 6), interleaved=True)
    check_against(
        lambda q, k: pe(q, k, ids, layout="bshd"),
        lambda x: diffusers_apply_rotary_emb(x, cos, sin),
        (2, ids.shape[0], 2, 16),
    )


def test_options_pass_through_the_registry_and_the_encoder() -> None:
    enc = posenc.Encoder(32, 1, 2, pe="rope3d", pe_kwargs={"axes_dim": (4, 6, 6)})
    assert enc(torch.randn(1, 6, 32), positions=flux_ids(2, 2, 2)).shape == (1, 6, 32)
    pe = build_for_model("rope2d", 32, 2, freqs_for="pixel", max_freq=64, ref_feat_shape=(4, 4),
                         feat_shape=(8, 8))  # fmt: skip
    assert "freqs_for='pixel', max_freq=64" in repr(pe)
    assert "ref_feat_shape=(4, 4), feat_shape=(8, 8)" in repr(pe)
    assert "axes_dim=(4, 6, 6)" in repr(posenc.build("rope3d", head_dim=16, axes_dim=(4, 6, 6)))
    assert "base=(10, 100)" in repr(posenc.build("rope2d", head_dim=8, base=(10, 100)))


REFUSALS = [
    # (constructor arguments, error, words the message must hold)
    ({"ndim": 3, "axes_dim": (16, 56, 54)}, PosencValueError, ["axes_dim", "(16, 56, 54)", "128"]),
    ({"ndim": 3, "axes_dim": (15, 57, 56)}, PosencValueError, ["axes_dim", "even", "15"]),
    ({"ndim": 3, "axes_dim": (64, 64)}, PosencValueError, ["axes_dim", "(64, 64)"]),
    ({"ndim": 3, "axes_dim": (0, 64, 64)}, PosencValueError, ["axes_dim[0]", "0"]),
    ({"ndim": 2, "axes_dim": "64,64"}, PosencTypeError, ["axes_dim", "'64,64'"]),
    ({"freqs_for": "log"}, PosencValueError, ["freqs_for", "'log'"]),
    ({"freqs_for": "pixel", "max_freq": -1.0}, PosencValueError, ["max_freq", "-1"]),
    ({"freqs_for": "pixel", "max_freq": float("nan")}, PosencValueError, ["max_freq", "nan"]),
    ({"max_freq": 10.0}, PosencValueError, ["max_freq", "10", "pixel"]),
    ({"freqs_for": "pixel", "base": 100.0}, PosencValueError, ["base", "100", "pixel"]),
    ({"base": (100.0, 1.0)}, PosencValueError, ["base", "1.0"]),
    ({"base": (100.0, -2.0)}, PosencValueError, ["base[1]", "-2"]),
    ({"base": (100.0,)}, PosencValueError, ["base", "(100.0,)"]),
    ({"ref_feat_shape": (4,)}, PosencValueError, ["ref_feat_shape", "(4,)"]),
    ({"ref_feat_shape": (4, 0)}, PosencValueError, ["ref_feat_shape[1]", "0"]),
    ({"ref_feat_shape": (4, 2.5)}, PosencTypeError, ["ref_feat_shape[1]", "2.5"]),
    ({"feat_shape": (4, 4)}, PosencValueError, ["feat_shape", "ref_feat_shape"]),
    ({"freqs_for": "pixel", "ref_feat_shape": (4, 4)}, PosencValueError, ["feat_shape", "pixel"]),
]


@pytest.mark.parametrize(("kwargs", "error", "words"), REFUSALS)
def test_bad_options_are_refused_by_name(kwargs: dict, error: type, words: list[str]) -> None:
    for make in (
        lambda: AxialRotaryEmbedding(128, **kwargs),
        lambda: posenc.build(f"rope{kwargs.get('ndim', 2)}d", head_dim=128,
                             **{k: v for k, v in kwargs.items() if k != "ndim"}),
    ):  # fmt: skip
        with pytest.raises(error) as caught:
            make()
        for word in words:
            assert word in str(caught.value), (word, str(caught.value))


def test_a_directly_built_module_states_its_own_axes() -> None:
    """``AxialRotaryEmbedding(d, ndim=2)`` built by hand takes 2-D positions, as ``rope2d``
    does: a window beside it is refused by the axes it has, when the attention is built."""
    pe = AxialRotaryEmbedding(8, ndim=2)
    assert pe.axes == 2 and AxialRotaryEmbedding(12, ndim=3).axes == 3
    with pytest.raises(PosencValueError, match="2-D positions"):
        posenc.MultiHeadAttention(16, 2, pe=pe, window=2)
