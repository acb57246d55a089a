"""rope-mixed against timm's ``RotaryEmbeddingMixed`` written out here in float64 (timm cannot
be imported beside this CPU torch): its starting frequencies (``init_random_2d_freqs``, one
layer, the same draws under one seed), ``get_mixed_grid(..., 'xy')``, ``get_mixed_freqs`` and
``apply_rot_embed_cat(..., half=False)``; values, gradients of q, k and the frequencies;
a layer per module; its checks."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.encodings.rotary.mixed import RotaryMixed
from posenc.errors import PosencValueError

HEAD, HEADS, H, W = 16, 3, 3, 4


def timm_init(head_dim: int, depth: int, num_heads: int, temperature: float = 10.0) -> torch.Tensor:
    """timm ``init_random_2d_freqs``: ``(2, depth, heads, head_dim // 2)``."""
    mag = 1.0 / (temperature ** (torch.arange(0, head_dim, 4, dtype=torch.float32) / head_dim))
    mag = mag.unsqueeze(0).unsqueeze(0)
    angles = torch.rand(depth, num_heads, 1, dtype=torch.float32) * 2 * torch.pi
    fx = torch.cat([mag * torch.cos(angles), mag * torch.cos(angles + torch.pi / 2)], dim=-1)
    fy = torch.cat([mag * torch.sin(angles), mag * torch.sin(angles + torch.pi / 2)], dim=-1)
    return torch.stack([fx, fy], dim=0)


def timm_rotate(x: torch.Tensor, freqs: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """timm's mixed rope for one layer, float64: ``get_mixed_grid([h, w], 'xy')`` (``t_x`` the
    column, ``t_y`` the row, row-major), ``get_mixed_freqs`` (sin and cos repeated in pairs),
    ``apply_rot_embed_cat(x, emb, half=False)``."""
    y_pos, x_pos = torch.meshgrid(
        torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij"
    )
    t_x, t_y = x_pos.flatten(), y_pos.flatten()
    f = freqs.double()
    combined = t_x.unsqueeze(-1) @ f[0].unsqueeze(-2) + t_y.unsqueeze(-1) @ f[1].unsqueeze(-2)
    sin = combined.sin().repeat_interleave(2, -1)  # (heads, n, d)
    cos = combined.cos().repeat_interleave(2, -1)
    rot = torch.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape)
    return x * cos + rot * sin


def test_starting_frequencies_are_timms_draws() -> None:
    torch.manual_seed(3)
    theirs = timm_init(HEAD, 1, HEADS)[:, 0]
    torch.manual_seed(3)
    ours = RotaryMixed(HEAD, HEADS).freqs.detach()
    assert torch.equal(ours, theirs)
    axial = RotaryMixed(HEAD, HEADS, rotate=False).freqs.detach()
    mag = 10.0 ** (-torch.arange(0, HEAD, 4) / HEAD)
    torch.testing.assert_close(axial[0, :, : HEAD // 4], mag.expand(HEADS, -1), rtol=0, atol=1e-7)
    torch.testing.assert_close(axial[1, :, HEAD // 4 :], mag.expand(HEADS, -1), rtol=0, atol=1e-7)


def test_values_and_gradients_equal_timm() -> None:
    torch.manual_seed(4)
    pe = RotaryMixed(HEAD, HEADS).double()
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, HEADS, H * W, HEAD, generator=g, dtype=torch.float64)
    k = torch.randn(2, HEADS, H * W, HEAD, generator=g, dtype=torch.float64)
    weight = torch.randn(2, HEADS, H * W, HEAD, generator=g, dtype=torch.float64)
    coords = posenc.AxialRotaryEmbedding.grid(H, W)
    grads = []
    for side in ("timm", "posenc"):
        q1, k1 = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
        freqs = pe.freqs.detach().clone().requires_grad_(True)
        if side == "timm":
            rq, rk = timm_rotate(q1, freqs, H, W), timm_rotate(k1, freqs, H, W)
        else:
            pe.freqs.grad = None
            rq, rk = pe(q1, k1, coords)
        ((rq * weight).sum() + (rk * weight).square().sum()).backward()
        grads.append((rq.detach(), rk.detach(), q1.grad, k1.grad))
        grads[-1] += (freqs.grad if side == "timm" else pe.freqs.grad,)
    for a, b in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_scores_depend_on_differences_and_layers_own_their_frequencies() -> None:
    pe = RotaryMixed(HEAD, HEADS).double()
    q = torch.randn(1, HEADS, 5, HEAD, dtype=torch.float64)
    coords = torch.randn(5, 2, dtype=torch.float64)
    moved = coords + torch.tensor([3.0, -2.0], dtype=torch.float64)
    a, b = pe.rotate(q, coords), pe.rotate(q, moved)
    torch.testing.assert_close(a @ a.transpose(-1, -2), b @ b.transpose(-1, -2), atol=1e-10, rtol=0)
    layers = RotaryMixed.per_layer(3, HEAD, HEADS)
    assert len({id(m.freqs) for m in layers}) == 3
    encoder = posenc.Encoder(HEAD * HEADS, 3, HEADS, pe=layers)
    assert len([p for n, p in encoder.named_parameters() if n.endswith("freqs")]) == 3
    out = encoder(
        torch.randn(1, H * W, HEAD * HEADS), positions=posenc.AxialRotaryEmbedding.grid(H, W)
    )
    assert out.shape == (1, H * W, HEAD * HEADS) and math.isfinite(out.sum().item())


def test_bad_arguments_are_named() -> None:
    with pytest.raises(PosencValueError, match="divisible by 4"):
        RotaryMixed(6, 2)
    pe = RotaryMixed(8, 2)
    with pytest.raises(PosencValueError, match="k has 1 heads"):
        pe(torch.randn(1, 2, 4, 8), torch.randn(1, 1, 4, 8), pe.grid(2, 2))
    with pytest.raises(PosencValueError, match="needs positions"):
        pe(torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8))
