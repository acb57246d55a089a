"""GridRotaryEmbedding: the rotation written out pair by pair in float64 (half, interleaved and
blocked layouts, partial rotary, learned frequencies and their gradients), equal to
AxialRotaryEmbedding for an axial table, the same inside MultiHeadAttention, and its checks."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.encodings.rope_types.builtin import default_inv_freq
from posenc.encodings.rotary.grid import GridRotaryEmbedding, axial_frequencies
from posenc.errors import PosencTypeError, PosencValueError


def reference(
    x: torch.Tensor, coords: torch.Tensor, freqs: torch.Tensor, pairs: list
) -> torch.Tensor:
    """Rotate ``x`` (b, h, n, d) in float64: pair ``p`` = channels ``pairs[p]`` turned by
    ``coords @ freqs[p]``."""
    out = x.double().clone()
    angles = coords.double() @ freqs.double().T  # (..., n, p)
    if angles.dim() == 3:
        angles = angles.unsqueeze(1)
    for p, (i, j) in enumerate(pairs):
        a = angles[..., p]
        xi, xj = x.double()[..., i], x.double()[..., j]
        out[..., i] = xi * a.cos() - xj * a.sin()
        out[..., j] = xj * a.cos() + xi * a.sin()
    return out


def _pairs(r: int, layout: str, blocks: int = 1) -> list[tuple[int, int]]:
    if layout == "interleaved":
        return [(2 * p, 2 * p + 1) for p in range(r // 2)]
    c = r // blocks
    return [(b * c + i, b * c + i + c // 2) for b in range(blocks) for i in range(c // 2)]


@pytest.mark.parametrize(
    ("layout", "blocks", "head_dim"),
    [("half", 1, 16), ("interleaved", 1, 16), ("half", 2, 16), ("half", 3, 14), ("half", 1, 20)],
)
def test_rotation_equals_the_formula_per_pair(layout: str, blocks: int, head_dim: int) -> None:
    g = torch.Generator().manual_seed(0)
    pairs = 6 if blocks == 3 else 8  # rotary dim 12 or 16 (partial for head_dim 14 and 20)
    freqs = torch.randn(pairs, 3, generator=g, dtype=torch.float64)
    pe = GridRotaryEmbedding(head_dim, freqs, interleaved=layout == "interleaved", blocks=blocks)
    q = torch.randn(2, 3, 5, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(2, 1, 5, head_dim, generator=g, dtype=torch.float64)
    coords = torch.randn(2, 5, 3, generator=g, dtype=torch.float64) * 4
    rq, rk = pe(q, k, coords)
    layout_pairs = _pairs(2 * pairs, layout, blocks)
    torch.testing.assert_close(rq, reference(q, coords, freqs, layout_pairs), rtol=0, atol=1e-12)
    torch.testing.assert_close(rk, reference(k, coords, freqs, layout_pairs), rtol=0, atol=1e-12)
    torch.testing.assert_close(pe.rotate(q, coords), rq, rtol=0, atol=0)
    state = pe.position_state(coords, q.transpose(1, 2))
    torch.testing.assert_close(state(q, k)[0], rq, rtol=0, atol=0)


def test_an_axial_table_is_axial_rope() -> None:
    f = default_inv_freq(8, 100.0)
    table = axial_frequencies([0] * 4 + [1] * 4, torch.cat([f, f]), 2)
    for interleaved in (False, True):
        grid = GridRotaryEmbedding(16, table, interleaved=interleaved)
        axial = posenc.AxialRotaryEmbedding(16, ndim=2, base=100.0, interleaved=interleaved)
        q, k = torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16)
        coords = axial.grid(3, 4)
        for a, b in zip(grid(q, k, coords), axial(q, k, coords), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_origin_is_not_rotated_and_scores_depend_on_differences() -> None:
    pe = GridRotaryEmbedding(8, torch.randn(4, 2, dtype=torch.float64))
    q = torch.randn(1, 1, 3, 8, dtype=torch.float64)
    torch.testing.assert_close(pe.rotate(q, torch.zeros(3, 2)), q, rtol=0, atol=0)
    coords = torch.randn(3, 2, dtype=torch.float64)
    shifted = coords + torch.tensor([2.5, -1.0], dtype=torch.float64)
    a = pe.rotate(q, coords) @ pe.rotate(q, coords).transpose(-1, -2)
    b = pe.rotate(q, shifted) @ pe.rotate(q, shifted).transpose(-1, -2)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_learned_frequencies_get_the_formula_gradient() -> None:
    g = torch.Generator().manual_seed(1)
    start = torch.randn(4, 2, generator=g, dtype=torch.float64)
    pe = GridRotaryEmbedding(8, start, interleaved=True, learned=True).double()
    assert isinstance(pe.frequencies, torch.nn.Parameter)
    q = torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64)
    coords = torch.randn(5, 2, generator=g, dtype=torch.float64)
    pe.rotate(q, coords).square().mul(torch.arange(8.0, dtype=torch.float64)).sum().backward()
    freqs = pe.frequencies.detach().clone().requires_grad_(True)  # the float32-rounded start
    ref = reference(q, coords, freqs, _pairs(8, "interleaved"))
    ref.square().mul(torch.arange(8.0, dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(pe.frequencies.grad, freqs.grad, rtol=0, atol=1e-10)


def test_a_fixed_table_stays_float64_and_attention_takes_it() -> None:
    table = axial_frequencies([0, 1, 0, 1], [1.0, 1.0, 0.1, 0.1], 2)
    pe = GridRotaryEmbedding(8, table).float()
    assert pe.frequencies.dtype == torch.float64
    attn = posenc.MultiHeadAttention(16, 2, pe=pe)
    x = torch.randn(2, 6, 16)
    coords = posenc.AxialRotaryEmbedding.grid(2, 3)
    assert attn(x, positions=coords).shape == (2, 6, 16)
    blocked = GridRotaryEmbedding(8, table, blocks=2)
    assert posenc.MultiHeadAttention(16, 2, pe=blocked)(x, positions=coords).shape == (2, 6, 16)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(PosencTypeError, match="frequencies"):
        GridRotaryEmbedding(8, [[1.0, 0.0]])  # type: ignore[arg-type]
    with pytest.raises(PosencValueError, match="pairs, axes"):
        GridRotaryEmbedding(8, torch.ones(4))
    with pytest.raises(PosencValueError, match="head_dim"):
        GridRotaryEmbedding(6, torch.ones(4, 2))
    with pytest.raises(PosencValueError, match="blocks=2 needs interleaved=False"):
        GridRotaryEmbedding(8, torch.ones(4, 2), interleaved=True, blocks=2)
    with pytest.raises(PosencValueError, match="finite"):
        GridRotaryEmbedding(8, torch.full((4, 2), float("nan")))
    with pytest.raises(PosencValueError, match="one axis and one frequency"):
        axial_frequencies([0, 1], [1.0], 2)
    pe = GridRotaryEmbedding(8, torch.ones(4, 2))
    with pytest.raises(PosencValueError, match="needs positions"):
        pe(torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8))
    with pytest.raises(PosencValueError, match=r"\(seq, 2\)"):
        pe(torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8), torch.zeros(3, 3))
