"""CPVT's position encoding generator (``peg``): exact in fp32, values and gradients (conv
weight, bias, input), against timm's Twins ``PosConv`` and CPVT's class-token PEG written out
in float64 here from their code (timm cannot be imported beside the CPU torch), and against
the depth-wise convolution written out as a sum of shifted grids; the Encoder applies it
after block ``after_block``; every argument it cannot take is refused by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import posenc
from posenc import PositionEncodingGenerator
from posenc.errors import PosencTypeError, PosencValueError
from tests.misuse import Misuse, cases, check

TOLERANCE = 2e-5  # max|a - b| / max|b|, fp32 against float64


def _relative(got: Tensor, want: Tensor) -> float:
    return float((got.detach().double() - want.detach()).abs().max() / want.detach().abs().max())


class TwinsPosConv(nn.Module):
    """timm ``twins.PosConv`` (stride 1) as timm writes it: a ``Sequential`` holding one
    depth-wise ``Conv2d(in_chans, embed_dim, 3, stride, 1, bias=True, groups=embed_dim)``;
    forward views ``(B, N, C)`` as ``(B, C, *size)``, convolves, adds the input in place and
    flattens back."""

    def __init__(self, in_chans: int, embed_dim: int, kernel: int = 3) -> None:
        super().__init__()
        conv = nn.Conv2d(in_chans, embed_dim, kernel, 1, kernel // 2, bias=True, groups=embed_dim)
        self.proj = nn.Sequential(conv)

    def forward(self, x: Tensor, size: tuple[int, int]) -> Tensor:
        b, _, c = x.shape
        cnn_feat_token = x.transpose(1, 2).view(b, c, *size)
        x = self.proj(cnn_feat_token)
        x += cnn_feat_token
        return x.flatten(2).transpose(1, 2)


def cpvt_peg(x: Tensor, conv: nn.Module, h: int, w: int, cls_tokens: int) -> Tensor:
    """CPVT's PEG with class tokens: the class tokens kept out, the patch tokens convolved on
    their grid and added, the class tokens concatenated back in front."""
    b, _, c = x.shape
    cls_token, feat_token = x[:, :cls_tokens], x[:, cls_tokens:]
    cnn_feat = feat_token.transpose(1, 2).view(b, c, h, w)
    out = conv(cnn_feat) + cnn_feat
    return torch.cat([cls_token, out.flatten(2).transpose(1, 2)], dim=1)


def shifted_sum(x: Tensor, weight: Tensor, bias: Tensor, h: int, w: int, c: int) -> Tensor:
    """The depth-wise convolution written out: ``out[y, x] = in[y, x] + bias + sum_{i, j}
    weight[i, j] · in[y + i - k//2, x + j - k//2]`` (zero outside the grid), per channel."""
    b, _, d = x.shape
    k = weight.shape[-1]
    grid = x[:, c:].reshape(b, h, w, d)
    padded = F.pad(grid, (0, 0, k // 2, k // 2, k // 2, k // 2))  # (b, h + k - 1, w + k - 1, d)
    out = grid + bias
    for i in range(k):
        for j in range(k):
            out = out + weight[:, 0, i, j] * padded[:, i : i + h, j : j + w]
    return torch.cat([x[:, :c], out.reshape(b, h * w, d)], dim=1)


def _peg(dim: int, **kwargs: object) -> PositionEncodingGenerator:
    peg = PositionEncodingGenerator(dim, **kwargs)  # type: ignore[arg-type]
    with torch.no_grad():  # a random bias too (the default initialisation's is small)
        peg.proj.bias.normal_()
    return peg


@pytest.mark.parametrize(
    ("h", "w", "cls_tokens", "kernel"), [(3, 4, 0, 3), (4, 3, 1, 3), (5, 5, 2, 5), (1, 6, 1, 3)]
)
def test_equals_twins_posconv_and_cpvt_values_and_gradients(
    h: int, w: int, cls_tokens: int, kernel: int
) -> None:
    torch.manual_seed(0)
    dim, b = 6, 2
    peg = _peg(dim, kernel_size=kernel, cls_tokens=cls_tokens)
    x = torch.randn(b, cls_tokens + h * w, dim, requires_grad=True)
    upstream = torch.randn(b, cls_tokens + h * w, dim, dtype=torch.float64)
    got = peg(x, PositionEncodingGenerator.grid(h, w, cls_tokens=cls_tokens))
    (got.double() * upstream).sum().backward()

    twins = TwinsPosConv(dim, dim, kernel).double()
    twins.proj[0].load_state_dict({k: v.double() for k, v in peg.proj.state_dict().items()})
    ref_x = x.detach().double().requires_grad_(True)
    patches = twins(ref_x[:, cls_tokens:], (h, w))
    want = torch.cat([ref_x[:, :cls_tokens], patches], dim=1)
    (want * upstream).sum().backward()
    conv = twins.proj[0]
    assert _relative(got, want) <= TOLERANCE
    assert _relative(x.grad, ref_x.grad) <= TOLERANCE
    assert _relative(peg.proj.weight.grad, conv.weight.grad) <= TOLERANCE
    assert _relative(peg.proj.bias.grad, conv.bias.grad) <= TOLERANCE

    with torch.no_grad():  # CPVT's form and the written-out sum: the same numbers
        cpvt = cpvt_peg(ref_x, conv, h, w, cls_tokens)
        written = shifted_sum(ref_x, conv.weight, conv.bias, h, w, cls_tokens)
    torch.testing.assert_close(cpvt, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(written, want, rtol=0, atol=1e-12)
    assert torch.equal(got[:, :cls_tokens], x[:, :cls_tokens])  # class tokens unchanged


def test_infers_the_grid_from_positions_grid_or_square() -> None:
    torch.manual_seed(0)
    peg = _peg(4, cls_tokens=1)
    x = torch.randn(2, 1 + 6, 4)
    want = peg(x, grid=(2, 3))
    coords = PositionEncodingGenerator.grid(2, 3, cls_tokens=1)
    assert torch.equal(peg(x, coords), want)
    assert torch.equal(peg(x, coords + 7), want)  # a grid starting anywhere
    assert torch.equal(peg(x, (coords + torch.tensor([[0], [5]]).unsqueeze(-1)).float()), want)
    assert not torch.equal(peg(x, grid=(3, 2)), want)  # the grid's shape matters
    square = torch.randn(2, 1 + 9, 4)
    assert torch.equal(peg(square), peg(square, grid=(3, 3)))
    fixed = PositionEncodingGenerator(4, grid=(2, 3))
    assert torch.equal(fixed(x[:, 1:]), fixed(x[:, 1:], PositionEncodingGenerator.grid(2, 3)))


def _manual(encoder: posenc.Encoder, x: Tensor, grid: tuple[int, int]) -> Tensor:
    """The encoder's layers in turn, the PEG after block ``after_block``."""
    peg = encoder.pe
    assert isinstance(peg, PositionEncodingGenerator)
    for block, layer in enumerate(encoder.layers):
        if block == peg.after_block:
            x = peg(x, grid=grid)
        x = layer(x)
    if peg.after_block == len(encoder.layers):
        x = peg(x, grid=grid)
    return encoder.norm(x)


@pytest.mark.parametrize("after_block", [0, 1, 3])
def test_encoder_applies_it_after_block(after_block: int) -> None:
    torch.manual_seed(0)
    encoder = posenc.Encoder(
        8, 3, 2, pe="peg", pe_kwargs={"after_block": after_block, "cls_tokens": 1}
    )
    assert all(layer.attn.pe is None for layer in encoder.layers)
    x = torch.randn(2, 1 + 12, 8, requires_grad=True)
    coords = PositionEncodingGenerator.grid(3, 4, cls_tokens=1)
    got = encoder(x, positions=coords)
    want = _manual(encoder, x, (3, 4))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    got.sum().backward()  # the conv is trained through the stack
    assert encoder.pe.proj.weight.grad is not None
    assert encoder.pe.proj.weight.grad.abs().sum() > 0


def test_is_the_conditional_family() -> None:
    assert posenc.entry("peg").family == "conditional"
    assert "conditional" in posenc.FAMILIES
    assert posenc.available("conditional") == ["peg"]
    assert isinstance(posenc.build_for_model("peg", 12, 3), PositionEncodingGenerator)
    assert posenc.build_for_model("peg", 12, 3).dim == 12


X = torch.zeros(2, 1 + 6, 4)


def _encoder(**kwargs: object) -> posenc.Encoder:
    return posenc.Encoder(4, 2, 2, pe="peg", pe_kwargs={"cls_tokens": 1, **kwargs})


GRID = PositionEncodingGenerator.grid(2, 3, cls_tokens=1)
SHUFFLED = GRID[[0, 2, 1, 3, 4, 5, 6]]
PADDING = torch.tensor([[False] * 6 + [True], [False] * 7])

MISUSES = [
    Misuse("dim", lambda: PositionEncodingGenerator(0), PosencValueError, "dim", 0),
    Misuse(
        "even-kernel",
        lambda: PositionEncodingGenerator(4, kernel_size=4),
        PosencValueError,
        "kernel_size",
        4,
    ),
    Misuse(
        "after-block",
        lambda: PositionEncodingGenerator(4, after_block=-1),
        PosencValueError,
        "after_block",
        -1,
    ),
    Misuse(
        "cls-tokens",
        lambda: PositionEncodingGenerator(4, cls_tokens=-2),
        PosencValueError,
        "cls_tokens",
        -2,
    ),
    Misuse(
        "grid", lambda: PositionEncodingGenerator(4, grid=(2, 0)), PosencValueError, "grid[1]", 0
    ),
    Misuse("grid-type", lambda: PositionEncodingGenerator(4, grid=6), PosencTypeError, "grid", 6),
    Misuse("not-square", lambda: _peg(4)(torch.zeros(1, 6, 4)), PosencValueError, "grid", 6),
    Misuse(
        "grid-size",
        lambda: _peg(4)(torch.zeros(1, 6, 4), grid=(2, 2)),
        PosencValueError,
        "grid",
        (2, 2),
    ),
    Misuse(
        "positions-shape",
        lambda: _peg(4)(torch.zeros(1, 6, 4), torch.zeros(6, 3)),
        PosencValueError,
        "positions",
        (6, 3),
    ),
    Misuse(
        "positions-bool",
        lambda: _peg(4)(torch.zeros(1, 6, 4), torch.zeros(6, 2, dtype=bool)),
        PosencTypeError,
        "positions",
        "torch.bool",
    ),
    Misuse(
        "shuffled",
        lambda: _peg(4, cls_tokens=1)(X, SHUFFLED),
        PosencValueError,
        "positions[..., 2, :]",
        (0.0, 2.0),
    ),
    Misuse(
        "partial-grid",
        lambda: _peg(4)(torch.zeros(1, 5, 4), GRID[1:6]),
        PosencValueError,
        "positions",
        (5, 2),
    ),
    Misuse(
        "batch-rows-differ",
        lambda: _peg(4, cls_tokens=1)(X, torch.stack([GRID, torch.flip(GRID, [0])])),
        PosencValueError,
        "positions",
        (2, 7, 2),
    ),
    Misuse(
        "fractional",
        lambda: _peg(4, cls_tokens=1)(X, GRID * 0.5),
        PosencValueError,
        "positions",
        (7, 2),
    ),
    Misuse(
        "only-cls",
        lambda: _peg(4, cls_tokens=7)(X),
        PosencValueError,
        "cls_tokens",
        7,
    ),
    Misuse("after-depth", lambda: _encoder(after_block=3), PosencValueError, "after_block", 3),
    Misuse(
        "random-positions",
        lambda: posenc.Encoder(4, 1, 2, pe="peg", random_positions=64),
        PosencValueError,
        "random_positions",
        64,
    ),
    Misuse(
        "padding",
        lambda: _encoder()(X, positions=GRID, key_padding_mask=PADDING),
        PosencValueError,
        "key_padding_mask",
        "patch tokens",
    ),
    Misuse(
        "cache",
        lambda: _encoder()(X, positions=GRID, cache=posenc.KVCache()),
        PosencValueError,
        "cache=",
        "peg",
    ),
    Misuse(
        "documents",
        lambda: _encoder()(X, positions=GRID, document_ids=torch.zeros(2, 7, dtype=torch.long)),
        PosencValueError,
        "document_ids=",
        "peg",
    ),
    Misuse(
        "window",
        lambda: posenc.Encoder(4, 1, 2, pe="peg", window=2)(X[:, 1:]),
        PosencValueError,
        "window=",
        "peg",
    ),
    Misuse(
        "in-attention",
        lambda: posenc.MultiHeadAttention(4, 2, pe="peg"),
        PosencTypeError,
        "pe=",
        "conditional",
    ),
    Misuse(
        "per-layer",
        lambda: posenc.Encoder(4, 2, 2, pe=["peg", "rope"]),
        PosencValueError,
        "pe[0]",
        "conditional",
    ),
]


@pytest.mark.parametrize("case", cases(MISUSES))
def test_refuses_by_name(case: Misuse) -> None:
    check(case)


def test_a_mask_that_removes_no_patch_is_taken() -> None:
    torch.manual_seed(0)
    encoder = _encoder().eval()
    x = torch.randn(2, 7, 4)
    mask = torch.zeros(2, 7, dtype=torch.bool)
    assert torch.equal(
        encoder(x, positions=GRID, key_padding_mask=mask), encoder(x, positions=GRID)
    )


def test_a_forgotten_class_token_is_named() -> None:
    # positions with a class token given to a PEG built without one: the refusal says so
    peg = PositionEncodingGenerator(4)
    with pytest.raises(PosencValueError, match=r"cls_tokens=1, not 0\?"):
        peg(torch.zeros(1, 7, 4), GRID)
    with pytest.raises(PosencValueError, match=r"after cls_tokens=0"):
        peg(torch.zeros(1, 7, 4))
    with pytest.raises(PosencValueError) as refused:  # patches alone: no such note
        PositionEncodingGenerator(4, cls_tokens=1)(torch.zeros(1, 7, 4), SHUFFLED)
    assert "cls_tokens=2" not in str(refused.value)
