"""rope-dinov3 against transformers' ``dinov3_vit`` rope module and apply function: values and
gradients in eval mode, the training-time shift/jitter/rescale drawn equally under one seed,
prefix tokens unrotated; the extent read from the positions or from ``grid=``; its checks."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.encodings.rotary.dinov3 import DINOv3RotaryEmbedding
from posenc.errors import PosencValueError

transformers = pytest.importorskip("transformers")
from transformers import DINOv3ViTConfig  # noqa: E402
from transformers.models.dinov3_vit import modeling_dinov3_vit as hf  # noqa: E402

H, W, PATCH, PREFIX, HEAD, HEADS = 3, 5, 4, 2, 16, 4
AUGMENT = {"pos_embed_shift": 0.2, "pos_embed_jitter": 1.5, "pos_embed_rescale": 2.0}


def _family(**config: float) -> hf.DINOv3ViTRopePositionEmbedding:
    cfg = DINOv3ViTConfig(
        hidden_size=HEAD * HEADS, num_attention_heads=HEADS, patch_size=PATCH, rope_theta=100.0,
        **config,
    )  # fmt: skip
    return hf.DINOv3ViTRopePositionEmbedding(cfg)


def _coords() -> torch.Tensor:
    prefix = torch.full((PREFIX, 2), -1)
    return torch.cat([prefix, posenc.AxialRotaryEmbedding.grid(H, W)])


def _run(rope: torch.nn.Module, pe: DINOv3RotaryEmbedding, seed: int) -> list[torch.Tensor]:
    """Rotated q, k and their gradients, by the family and by posenc, from one seed each."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, HEADS, PREFIX + H * W, HEAD, generator=g)
    k = torch.randn(2, HEADS, PREFIX + H * W, HEAD, generator=g)
    weight = torch.randn(2, HEADS, PREFIX + H * W, HEAD, generator=g)
    out = []
    for side in ("family", "posenc"):
        q1, k1 = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
        torch.manual_seed(seed)
        if side == "family":
            cos, sin = rope(torch.zeros(1, 3, H * PATCH, W * PATCH))
            rq, rk = hf.apply_rotary_pos_emb(q1, k1, cos, sin)
        else:
            rq, rk = pe(q1, k1, _coords())
        ((rq * weight).sum() + (rk * weight).square().sum()).backward()
        out += [rq.detach(), rk.detach(), q1.grad, k1.grad]
    return out


@pytest.mark.parametrize("train", [False, True])
def test_values_and_gradients_equal_transformers(train: bool) -> None:
    rope = _family(**AUGMENT).train(train)
    pe = DINOv3RotaryEmbedding(HEAD, base=100.0, shift=0.2, jitter=1.5, rescale=2.0).train(train)
    for seed in (1, 2):
        got = _run(rope, pe, seed)
        for a, b in zip(got[4:], got[:4], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-5 * b.abs().max().item())


def test_augmentation_is_seeded_and_off_in_eval() -> None:
    pe = DINOv3RotaryEmbedding(HEAD, shift=0.2, jitter=1.5, rescale=2.0)
    q = torch.randn(1, 1, PREFIX + H * W, HEAD)
    turned = {}
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        turned.setdefault(seed, []).append(pe.rotate(q, _coords()))
    assert torch.equal(turned[1][0], turned[1][1])
    assert not torch.allclose(turned[1][0], turned[2][0])
    pe.eval()
    torch.manual_seed(1)
    plain = pe.rotate(q, _coords())
    torch.manual_seed(2)
    assert torch.equal(plain, pe.rotate(q, _coords()))
    quiet = DINOv3RotaryEmbedding(HEAD)  # no augmentation asked: training changes nothing
    assert torch.equal(quiet.rotate(q, _coords()), quiet.eval().rotate(q, _coords()))
    torch.testing.assert_close(plain[:, :, :PREFIX], q[:, :, :PREFIX], rtol=0, atol=0)


def test_the_extent_comes_from_grid_or_from_the_positions() -> None:
    q = torch.randn(2, 1, H * W, HEAD, dtype=torch.float64)
    coords = posenc.AxialRotaryEmbedding.grid(H, W)
    free = DINOv3RotaryEmbedding(HEAD).rotate(q, coords)
    fixed = DINOv3RotaryEmbedding(HEAD, grid=(H, W)).rotate(q, coords)
    torch.testing.assert_close(free, fixed, rtol=0, atol=0)
    # a crop of the grid: normalised by its own extent unless grid= says otherwise
    crop = coords[coords[:, 0] < 2]
    own = DINOv3RotaryEmbedding(HEAD).rotate(q[:, :, : len(crop)], crop)
    small = DINOv3RotaryEmbedding(HEAD, grid=(2, W)).rotate(q[:, :, : len(crop)], crop)
    big = DINOv3RotaryEmbedding(HEAD, grid=(H, W)).rotate(q[:, :, : len(crop)], crop)
    torch.testing.assert_close(own, small, rtol=0, atol=0)
    torch.testing.assert_close(big, fixed[:, :, : len(crop)], rtol=0, atol=0)
    halved = coords.clone()
    halved[:, 0] //= 2  # rows 0..1: an extent of 2 in this batch row only
    batched = DINOv3RotaryEmbedding(HEAD).rotate(q, torch.stack([coords, halved]))
    torch.testing.assert_close(batched[:1], free[:1], rtol=0, atol=0)
    alone = DINOv3RotaryEmbedding(HEAD, grid=(2, W)).rotate(q[1:], halved)
    torch.testing.assert_close(batched[1:], alone, rtol=0, atol=0)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(PosencValueError, match="divisible by 4"):
        DINOv3RotaryEmbedding(6)
    with pytest.raises(PosencValueError, match="jitter must be >= 1"):
        DINOv3RotaryEmbedding(8, jitter=0.5)
    with pytest.raises(PosencValueError, match="grid"):
        DINOv3RotaryEmbedding(8, grid=(3,))  # type: ignore[arg-type]
    with pytest.raises(PosencValueError, match="needs positions"):
        DINOv3RotaryEmbedding(8).rotate(torch.randn(1, 1, 4, 8))
