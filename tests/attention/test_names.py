"""transformers' names at the attention and model level (``posenc.attention.names``):
``position_ids=`` is ``positions=``, and a tokenizer's ``attention_mask=`` (1 = attend) is
``key_padding_mask = attention_mask == 0``, in ``MultiHeadAttention``, ``Encoder`` and
``TransformerModel`` (forward, and ``generate``'s mask); both of a pair, a float or 4-D mask,
other integers or another shape are refused naming the argument and the value."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.errors import PosencTypeError, PosencValueError

B, N, DIM, HEADS, VOCAB = 2, 6, 16, 2, 20
PADDING = torch.tensor([[True, True, False, False, False, False], [False] * N])  # left padded
ATTEND = (~PADDING).long()  # as a tokenizer returns it
POSITIONS = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])


def _modules() -> dict[str, tuple[torch.nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    x = torch.randn(B, N, DIM)
    tokens = torch.randint(1, VOCAB, (B, N), generator=torch.Generator().manual_seed(0))
    return {
        "MultiHeadAttention": (posenc.MultiHeadAttention(DIM, HEADS, pe="rope").eval(), x),
        "Encoder": (posenc.Encoder(DIM, 1, HEADS, pe="rope").eval(), x),
        "TransformerModel": (
            posenc.TransformerModel(VOCAB, DIM, 1, HEADS, pe="rope", causal=True).eval(),
            tokens,
        ),
    }


MODULES = ["MultiHeadAttention", "Encoder", "TransformerModel"]


@pytest.mark.parametrize("name", MODULES)
@pytest.mark.parametrize("attend", [ATTEND, ~PADDING, ATTEND.int()], ids=["int64", "bool", "int32"])
def test_attention_mask_equals_the_key_padding_mask(name: str, attend: torch.Tensor) -> None:
    module, x = _modules()[name]
    with torch.no_grad():
        want = module(x, key_padding_mask=PADDING)
        got = module(x, attention_mask=attend)
        unmasked = module(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.allclose(want[0, 2:], unmasked[0, 2:])  # the mask matters here


@pytest.mark.parametrize("name", MODULES)
def test_position_ids_equal_positions(name: str) -> None:
    module, x = _modules()[name]
    with torch.no_grad():
        want = module(x, positions=POSITIONS)
        got = module(x, position_ids=POSITIONS)
        default = module(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.allclose(want, default)  # the positions matter here


def test_generate_takes_the_tokenizers_attention_mask() -> None:
    model = _modules()["TransformerModel"][0]
    _, tokens = _modules()["TransformerModel"]
    want = model.generate(tokens, 4, key_padding_mask=PADDING)
    got = model.generate(tokens, 4, attention_mask=ATTEND)
    assert torch.equal(got, want)
    with pytest.raises(PosencValueError, match=r"attention_mask.*not both"):
        model.generate(tokens, 4, attention_mask=ATTEND, key_padding_mask=PADDING)


BAD_MASKS = [
    (ATTEND.float(), PosencTypeError, r"attention_mask must be bool or 0/1 .*torch\.float32"),
    (
        ATTEND[:, None, None, :].bool(),
        PosencValueError,
        r"attention_mask must be \(batch, seq\) = \(2, 6\), got a 4-D tensor of shape "
        r"\(2, 1, 1, 6\) \(transformers' expanded 4-D mask",
    ),
    (ATTEND * 2, PosencValueError, r"attention_mask must hold 0 .* and 1 .* got values \[2\]"),
    (
        ATTEND[:, :4],
        PosencValueError,
        r"attention_mask must be \(batch, seq\) = \(2, 6\), got shape \(2, 4\)",
    ),
    (ATTEND.tolist(), PosencTypeError, r"attention_mask must be a .* tensor.*got list"),
    (  # a row of zeros: nothing to attend to, said in attention_mask's convention
        ATTEND * torch.tensor([[1], [0]]),
        PosencValueError,
        r"row\(s\) \[1\] .*(an attention_mask with no 1 in the row)",
    ),
]


@pytest.mark.parametrize("name", MODULES)
@pytest.mark.parametrize(
    ("mask", "error", "message"), BAD_MASKS, ids=["float", "4d", "two", "shape", "list", "empty"]
)
def test_bad_attention_masks_are_refused_by_name(
    name: str, mask: object, error: type, message: str
) -> None:
    module, x = _modules()[name]
    with pytest.raises(error, match=message):
        module(x, attention_mask=mask)


@pytest.mark.parametrize("name", MODULES)
def test_both_names_of_one_argument_are_refused(name: str) -> None:
    module, x = _modules()[name]
    with pytest.raises(PosencValueError, match=r"attention_mask .* or key_padding_mask .*not both"):
        module(x, attention_mask=ATTEND, key_padding_mask=PADDING)
    with pytest.raises(
        PosencValueError,
        match=r"positions or position_ids .*not both: got positions of shape \(2, 6\) and "
        r"position_ids of shape \(2, 6\)",
    ):
        module(x, positions=POSITIONS, position_ids=POSITIONS)
