"""Swin's and BEiT's 2-D relative position bias (``swin-bias``): exact against transformers
5.24's ``SwinRelativePositionBias`` and ``BeitRelativePositionBias`` (class-token rows and the
table resized to a new window included), against the index written out pair by pair, its
``score_mod`` against its bias (values and gradients), and in the Encoder."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.testing import assert_close
from transformers import BeitConfig, Swinv2Config
from transformers.models.beit.modeling_beit import BeitRelativePositionBias
from transformers.models.swin.modeling_swin import SwinRelativePositionBias
from transformers.models.swinv2.modeling_swinv2 import Swinv2SelfAttention

import posenc
from posenc import SwinRelativeBias, SwinV2ContinuousBias
from posenc.encodings.bias.swin import window_coordinates
from posenc.errors import PosencTypeError, PosencValueError
from tests.encodings.bias.scores import on_grid
from tests.encodings.bias.test_score_mod_training import _captured, _Reads
from tests.misuse import Misuse, cases, check
from tests.schemes import GRID_BIAS

HEADS = 3


def _random(pe: SwinRelativeBias) -> SwinRelativeBias:
    with torch.no_grad():
        pe.relative_position_bias_table.copy_(torch.randn_like(pe.relative_position_bias_table))
    return pe


def test_are_the_grid_bias_schemes() -> None:
    assert GRID_BIAS == ["swin-bias", "swinv2-cpb"]
    assert isinstance(posenc.build_for_model("swin-bias", 16, 4), SwinRelativeBias)
    assert isinstance(posenc.build_for_model("swinv2-cpb", 16, 4), SwinV2ContinuousBias)


@pytest.mark.parametrize("window", [(3, 3), (2, 3), (4, 2)])
def test_equals_transformers_swin(window: tuple[int, int]) -> None:
    torch.manual_seed(0)
    theirs = SwinRelativePositionBias(HEADS, window)
    with torch.no_grad():
        theirs.relative_position_bias_table.copy_(
            torch.randn_like(theirs.relative_position_bias_table)
        )
    ours = SwinRelativeBias(HEADS, window=window)
    with torch.no_grad():
        ours.relative_position_bias_table.copy_(theirs.relative_position_bias_table)
    coords = window_coordinates(*window)
    assert torch.equal(ours.bias(coords, coords), theirs()[0])
    index = ours.relative_position_index(coords, coords)
    assert torch.equal(index.flatten(), theirs.relative_position_index)


def _beit(window: int) -> BeitRelativePositionBias:
    config = BeitConfig(
        hidden_size=8,
        num_attention_heads=HEADS,
        intermediate_size=16,
        image_size=2 * window,
        patch_size=2,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = BeitRelativePositionBias(config)
    with torch.no_grad():
        module.relative_position_bias_table.copy_(
            torch.randn_like(module.relative_position_bias_table)
        )
    return module


def _from_beit(module: BeitRelativePositionBias) -> SwinRelativeBias:
    ours = SwinRelativeBias(HEADS, window=module.window_size, cls_token=True)
    with torch.no_grad():
        ours.relative_position_bias_table.copy_(module.relative_position_bias_table)
    return ours


def test_equals_transformers_beit_with_its_class_token() -> None:
    torch.manual_seed(0)
    theirs = _beit(3)
    ours = _from_beit(theirs)
    coords = window_coordinates(3, 3, cls_token=True)  # (10, 2): the class token first
    with torch.no_grad():
        want = theirs((3, 3))[0]
    assert torch.equal(ours.bias(coords, coords), want)
    # the class token anywhere in the sequence reads the same rows
    order = torch.tensor([4, 0, 7, 1, 2, 3, 5, 6, 8, 9])
    assert torch.equal(ours.bias(coords[order], coords[order]), want[:, order][:, :, order])


@pytest.mark.parametrize("new", [2, 4, 5])
def test_resize_equals_transformers_beit(new: int) -> None:
    """BEiT at a new window bilinearly resizes its offset table; class rows are kept."""
    torch.manual_seed(0)
    theirs = _beit(3)
    ours = _from_beit(theirs)
    before = ours.relative_position_bias_table.detach().clone()
    resized = ours.resize(new)
    assert resized.window == (new, new)
    assert resized.relative_position_bias_table.shape == ((2 * new - 1) ** 2 + 3, HEADS)
    assert torch.equal(ours.relative_position_bias_table, before)  # unchanged
    with torch.no_grad():
        want = theirs((new, new))[0]
    coords = window_coordinates(new, new, cls_token=True)
    got = resized.bias(coords, coords)
    assert ((got - want).abs().max() / want.abs().max()).item() <= 2e-5


def test_index_equals_the_formula_pair_by_pair() -> None:
    """index = (Δy + Wh - 1)(2Ww - 1) + (Δx + Ww - 1), offsets clipped to ±(W - 1); written
    out per pair, for coordinates spanning more than the window and in batched form."""
    wh, ww = 2, 3
    pe = SwinRelativeBias(HEADS, window=(wh, ww))
    torch.manual_seed(1)
    coords = torch.randint(0, 6, (2, 7, 2))
    got = pe.relative_position_index(coords, coords)
    assert got.shape == (2, 7, 7)
    for b in range(2):
        for i in range(7):
            for j in range(7):
                dy = int(coords[b, i, 0] - coords[b, j, 0])
                dx = int(coords[b, i, 1] - coords[b, j, 1])
                dy, dx = max(-(wh - 1), min(wh - 1, dy)), max(-(ww - 1), min(ww - 1, dx))
                assert got[b, i, j] == (dy + wh - 1) * (2 * ww - 1) + (dx + ww - 1)
    bias = pe.bias(coords, coords)
    assert bias.shape == (2, HEADS, 7, 7)
    assert torch.equal(bias[1], pe.bias(coords[1], coords[1]))


def test_relative_and_float_whole_numbers() -> None:
    pe = _random(SwinRelativeBias(HEADS, window=3))
    coords = window_coordinates(3, 3)
    assert torch.equal(pe.bias(coords + 5, coords + 5), pe.bias(coords, coords))
    assert torch.equal(pe.bias(coords.double(), coords.double()), pe.bias(coords, coords))


@pytest.mark.parametrize("cls_token", [False, True])
@pytest.mark.parametrize("batched", [False, True])
def test_score_mod_values_and_gradients_equal_the_bias(cls_token: bool, batched: bool) -> None:
    torch.manual_seed(0)
    pe = _random(SwinRelativeBias(HEADS, window=(2, 3), cls_token=cls_token)).double()
    coords = window_coordinates(3, 3, cls_token=cls_token)  # past the window: clipped
    if batched:
        coords = torch.stack([coords, coords.flip(0)])
    n = coords.shape[-2]
    mod = pe.score_mod(coords, coords)
    assert mod is not None
    got = on_grid(mod, 2, HEADS, n, n)
    want = pe.bias(coords, coords).expand(2, HEADS, n, n)
    assert_close(got, want, rtol=0, atol=0)
    weight = torch.randn(2, HEADS, n, n, dtype=torch.float64)
    table = pe.relative_position_bias_table
    (grad,) = torch.autograd.grad((got * weight).sum(), [table])
    (grad_want,) = torch.autograd.grad((want * weight).sum(), [table])
    assert_close(grad, grad_want, rtol=1e-12, atol=1e-12)
    learned = [t for t in _captured(mod) if t.requires_grad]
    assert learned
    with _Reads(learned) as reads:
        mod(torch.zeros((), dtype=torch.float64), *(torch.tensor(i) for i in (1, 2, 3, 0)))
    assert all(reads.reads[id(t)] == [True] for t in learned)  # one read: flex's backward


def test_attention_equals_softmax_written_out() -> None:
    """MultiHeadAttention with swin-bias: softmax(q kᵀ/√d + B) v, as written, in float64."""
    torch.manual_seed(0)
    attn = posenc.MultiHeadAttention(12, HEADS, pe=SwinRelativeBias(HEADS, window=3)).double()
    _random(attn.pe)
    coords = window_coordinates(3, 3)
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    got = attn(x, positions=coords)
    q, k, v = attn.qkv(x).view(2, 9, 3, HEADS, 4).permute(2, 0, 3, 1, 4)  # (b, h, n, d) each
    bias = attn.pe.bias(coords, coords)
    weights = torch.softmax(q @ k.transpose(-1, -2) / 2.0 + bias, dim=-1)
    want = attn.out((weights @ v).transpose(1, 2).reshape(2, 9, 12))
    assert_close(got, want, rtol=1e-10, atol=1e-10)
    encoder = posenc.Encoder(12, 2, HEADS, pe="swin-bias")
    assert encoder(x.float(), positions=coords).shape == (2, 9, 12)


def test_encoder_refuses_missing_coordinates() -> None:
    enc = posenc.Encoder(12, 1, HEADS, pe="swin-bias")
    with pytest.raises(PosencValueError, match=r"needs positions.*\(seq, 2\)"):
        enc(torch.zeros(1, 9, 12))


# --------------------------------------------------------------------------- swinv2-cpb


def _swinv2(window: tuple[int, int], pretrained: tuple[int, int]) -> Swinv2SelfAttention:
    config = Swinv2Config(embed_dim=4 * HEADS, qkv_bias=True)
    theirs = Swinv2SelfAttention(
        config, 4 * HEADS, HEADS, window, pretrained_window_size=list(pretrained)
    )
    with torch.no_grad():
        for p in theirs.continuous_position_bias_mlp.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return theirs


def _ours_from(theirs: Swinv2SelfAttention, window, pretrained) -> SwinV2ContinuousBias:  # type: ignore[no-untyped-def]
    ours = SwinV2ContinuousBias(HEADS, window=window, pretrained_window=pretrained)
    ours.continuous_position_bias_mlp.load_state_dict(
        theirs.continuous_position_bias_mlp.state_dict()
    )
    return ours


@pytest.mark.parametrize(
    ("window", "pretrained"),
    [((3, 3), (0, 0)), ((2, 3), (0, 0)), ((1, 3), (0, 0)), ((4, 4), (3, 3))],
)
def test_cpb_equals_transformers_swinv2(
    window: tuple[int, int], pretrained: tuple[int, int]
) -> None:
    """Swinv2SelfAttention with zero query and key weights attends by softmax(16·sigmoid(...))
    alone: its attention probabilities are the softmax of posenc's bias."""
    torch.manual_seed(0)
    theirs = _swinv2(window, pretrained)
    ours = _ours_from(theirs, window, pretrained)
    with torch.no_grad():
        for layer in (theirs.query, theirs.key):
            layer.weight.zero_()
            layer.bias.zero_() if layer.bias is not None else None
        n = window[0] * window[1]
        _, probs = theirs(torch.randn(1, n, 4 * HEADS), output_attentions=True)
        coords = window_coordinates(*window)
        bias = ours.bias(coords, coords)
        # their bias, read from their own buffers and MLP as their forward reads it
        table = theirs.continuous_position_bias_mlp(theirs.relative_coords_table).view(-1, HEADS)
        want = 16 * torch.sigmoid(table[theirs.relative_position_index.view(-1)].view(n, n, HEADS))
    assert ((bias - want.permute(2, 0, 1)).abs().max() / want.abs().max()).item() <= 2e-6
    assert_close(torch.softmax(bias, dim=-1), probs[0], rtol=2e-5, atol=1e-7)


def test_cpb_equals_the_formula_in_float64() -> None:
    """16·sigmoid(W2 relu(W1 f(Δ) + b1)) with f the log-spaced offset, per pair, float64,
    for coordinates spanning more than the window (the MLP extrapolates)."""
    torch.manual_seed(2)
    pe = SwinV2ContinuousBias(HEADS, window=(3, 4), mlp_dim=16).double()
    coords = torch.randint(0, 6, (5, 2))
    got = pe.bias(coords, coords, q=torch.zeros(1, HEADS, 5, 4, dtype=torch.float64))
    w1, b1 = pe.continuous_position_bias_mlp[0].weight, pe.continuous_position_bias_mlp[0].bias
    w2 = pe.continuous_position_bias_mlp[2].weight
    for i in range(5):
        for j in range(5):
            f = []
            for axis, size in enumerate((3, 4)):
                u = 8.0 * float(coords[i, axis] - coords[j, axis]) / (size - 1)
                f.append(math.copysign(math.log2(1 + abs(u)), u) / 3.0)
            hidden = torch.relu(w1 @ torch.tensor(f, dtype=torch.float64) + b1)
            want = 16 * torch.sigmoid(w2 @ hidden)
            assert_close(got[:, i, j], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("batched", [False, True])
def test_cpb_score_mod_values_and_gradients_equal_the_bias(batched: bool) -> None:
    torch.manual_seed(0)
    pe = SwinV2ContinuousBias(HEADS, window=(2, 3), mlp_dim=8).double()
    coords = window_coordinates(3, 3)
    if batched:
        coords = torch.stack([coords, coords.flip(0) + 4])
    q = torch.zeros(2, HEADS, 9, 4, dtype=torch.float64)
    mod = pe.score_mod(coords, coords, q=q)
    assert mod is not None
    got = on_grid(mod, 2, HEADS, 9, 9)
    want = pe.bias(coords, coords, q=q).expand(2, HEADS, 9, 9)
    assert_close(got, want, rtol=0, atol=0)
    weight = torch.randn(2, HEADS, 9, 9, dtype=torch.float64)
    params = list(pe.parameters())
    grads = torch.autograd.grad((got * weight).sum(), params)
    wants = torch.autograd.grad((want * weight).sum(), params)
    for grad, grad_want in zip(grads, wants, strict=True):
        assert_close(grad, grad_want, rtol=1e-10, atol=1e-12)
    learned = [t for t in _captured(mod) if t.requires_grad]
    assert learned
    with _Reads(learned) as reads:
        mod(torch.zeros((), dtype=torch.float64), *(torch.tensor(i) for i in (1, 2, 3, 0)))
    assert all(reads.reads[id(t)] == [True] for t in learned)


def test_cpb_in_attention_and_relative() -> None:
    torch.manual_seed(0)
    attn = posenc.MultiHeadAttention(12, HEADS, pe="swinv2-cpb")
    coords = window_coordinates(3, 3)
    x = torch.randn(2, 9, 12)
    assert_close(attn(x, positions=coords + 7), attn(x, positions=coords), rtol=0, atol=0)


MISUSE = [
    Misuse("heads 0", lambda: SwinRelativeBias(0), PosencValueError, "num_heads", 0),
    Misuse(
        "window 0", lambda: SwinRelativeBias(2, window=(3, 0)), PosencValueError, "window[1]", 0
    ),
    Misuse("window str", lambda: SwinRelativeBias(2, window="7"), PosencTypeError, "window", "7"),  # type: ignore[arg-type]
    Misuse("cls int", lambda: SwinRelativeBias(2, cls_token=1), PosencTypeError, "cls_token", 1),  # type: ignore[arg-type]
    Misuse(
        "1-D positions",
        lambda: SwinRelativeBias(2).bias(torch.arange(4), torch.arange(4)),
        PosencValueError,
        "q_positions",
        (4,),
    ),
    Misuse(
        "fractional",
        lambda: SwinRelativeBias(2).bias(torch.full((2, 2), 0.5), torch.zeros(2, 2)),
        PosencValueError,
        "q_positions",
        0.5,
    ),
    Misuse(
        "negative with cls",
        lambda: SwinRelativeBias(2, cls_token=True).bias(
            torch.tensor([[0, -2]]), torch.zeros(1, 2)
        ),
        PosencValueError,
        "q_positions",
        [0, -2],
    ),
    Misuse(
        "batch mismatch",
        lambda: SwinRelativeBias(2).bias(torch.zeros(2, 3, 2), torch.zeros(3, 3, 2)),
        PosencValueError,
        "k_positions",
        (3, 3, 2),
    ),
    Misuse("resize 0", lambda: SwinRelativeBias(2).resize(0), PosencValueError, "window[0]", 0),
    Misuse("cpb mlp 0", lambda: SwinV2ContinuousBias(2, mlp_dim=0), PosencValueError, "mlp_dim", 0),
    Misuse(
        "cpb pretrained",
        lambda: SwinV2ContinuousBias(2, pretrained_window=(3, -1)),
        PosencValueError,
        "pretrained_window[1]",
        -1,
    ),
]


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse(case: Misuse) -> None:
    check(case)
