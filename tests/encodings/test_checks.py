"""posenc.encodings.checks, the validation every encoding shares: each check returns a good
value unchanged and refuses a bad one with an error naming the argument and the value, before
any work; ``resolve_positions`` makes the default ``arange`` and accepts exactly the shapes
``(n,)``, ``(b, n)`` and ``(1, n)``.
"""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.encodings.checks import (
    check_bool,
    check_float_dtype,
    check_input,
    check_positive_float,
    check_positive_int,
    check_probability,
    compute_dtype,
    resolve_bounded_positions,
    resolve_positions,
)
from posenc.errors import PosencTypeError, PosencValueError
from tests.misuse import Misuse, cases, check

NAN, INF = float("nan"), float("inf")
X = torch.randn(2, 5, 8)
SINUSOIDAL = posenc.SinusoidalPositionalEncoding(8)

MISUSE = [
    # the input x of an additive encoding (check_input)
    Misuse("x-list", lambda: SINUSOIDAL([[1.0]]), TypeError, "x", "list"),
    Misuse("x-int", lambda: SINUSOIDAL(X.long()), TypeError, "x", torch.int64),
    Misuse("x-rank", lambda: SINUSOIDAL(X[0]), ValueError, "x", (5, 8)),
    Misuse("x-width", lambda: posenc.SinusoidalPositionalEncoding(7)(X), ValueError, "x", 8),
    # positions (resolve_positions)
    Misuse("positions-length", lambda: SINUSOIDAL(X, torch.arange(4)), ValueError, "positions",
           (4,)),
    Misuse("positions-negative", lambda: SINUSOIDAL(X, torch.arange(-1, 4)), ValueError,
           "positions", -1),
    Misuse("positions-nan", lambda: SINUSOIDAL(X, torch.tensor([0.0, 1.0, NAN, 3.0, 4.0])),
           ValueError, "positions", NAN),
    Misuse("positions-inf", lambda: SINUSOIDAL(X, torch.tensor([0.0, 1.0, INF, 3.0, 4.0])),
           ValueError, "positions", INF),
    Misuse("positions-bool", lambda: SINUSOIDAL(X, torch.ones(5, dtype=torch.bool)), TypeError,
           "positions", torch.bool),
    Misuse("positions-batch", lambda: SINUSOIDAL(X, torch.zeros(3, 5, dtype=torch.long)),
           ValueError, "positions", 3),
    Misuse("positions-list", lambda: SINUSOIDAL(X, [0, 1, 2, 3, 4]), TypeError, "positions",
           "list"),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse_names_the_argument_and_the_value(case: Misuse) -> None:
    check(case)


def test_scalar_checks_return_good_values_and_name_bad_ones() -> None:
    assert check_positive_int("n", 3) == 3
    assert check_positive_float("base", 2) == 2.0 and isinstance(
        check_positive_float("b", 2), float
    )
    assert check_probability("p", 0) == 0.0 and check_probability("p", 0.5) == 0.5
    assert check_bool("flag", False) is False
    assert check_float_dtype("dtype", torch.bfloat16) is torch.bfloat16
    refused = [
        (check_positive_int, True, PosencTypeError),  # a bool is not an int here
        (check_positive_int, 2.0, PosencTypeError),
        (check_positive_int, 0, PosencValueError),
        (check_positive_float, INF, PosencValueError),
        (check_positive_float, NAN, PosencValueError),
        (check_positive_float, 0.0, PosencValueError),
        (check_positive_float, "1", PosencTypeError),
        (check_probability, 1.0, PosencValueError),
        (check_probability, -0.1, PosencValueError),
        (check_probability, False, PosencTypeError),
        (check_bool, 1, PosencTypeError),
        (check_bool, "no", PosencTypeError),
        (check_float_dtype, torch.int64, PosencTypeError),
        (check_float_dtype, "float32", PosencTypeError),
    ]
    for checker, value, error in refused:
        with pytest.raises(error, match=f"the_arg.*{value}"):
            checker("the_arg", value)


def test_resolve_positions_default_and_accepted_shapes() -> None:
    assert torch.equal(resolve_positions(None, 4), torch.arange(4))
    per_batch = torch.tensor([[0, 1, 2], [5, 6, 7]])
    assert resolve_positions(per_batch, 3, batch=2) is per_batch
    shared = torch.tensor([[0.0, 2.0, 4.0]])
    assert resolve_positions(shared, 3, batch=5, integer=True) is shared  # (1, n) broadcasts
    with pytest.raises(PosencValueError, match=r"whole numbers.*0\.5"):
        resolve_positions(torch.tensor([0.0, 0.5, 1.0]), 3, integer=True)
    assert resolve_positions(torch.tensor([0.0, 0.5, 1.0]), 3).dtype == torch.float32
    with pytest.raises(PosencValueError, match="batch size 2 but the input has batch size 3"):
        resolve_positions(per_batch, 3, batch=3)
    meta = torch.full((3,), -1.0, device="meta")  # values cannot be read: not checked
    assert resolve_positions(meta, 3, integer=True) is meta


#: The first whole numbers float64 cannot hold (2**53 + 1 rounds to 2**53: an angle 0.71 rad off
#: at RoPE's first frequency) and the largest position taken.
PAST = 2**53 + 1
LIMIT = 2**53


def test_positions_past_exact_float64_integers_are_refused_by_name() -> None:
    """Integer and float positions, 1-D and per batch, on every path that reads them: the
    shared checks, RoPE's reads (a decode step, a run, a few, many), xPos, an additive and a
    bias encoding. 2**53 itself is exact and taken."""
    message = rf"positions must be at most 2\*\*53 = {LIMIT}.*got a maximum of {PAST}"
    bad = {
        "int64": torch.tensor([0, PAST, 2]),
        "float64": torch.tensor([0.0, 2.0**53 + 2, 1.0], dtype=torch.float64),
    }
    for t in bad.values():
        largest = float(t.max()) if t.is_floating_point() else PAST
        expected = message.replace(str(PAST), str(largest))
        for given in (t, t[None].expand(2, 3)):
            with pytest.raises(PosencValueError, match=expected):
                resolve_positions(given, 3, batch=2)
            with pytest.raises(PosencValueError, match=expected):
                resolve_bounded_positions(given, 3, batch=2, device=None, name="positions")
    at_limit = torch.tensor([0, LIMIT, 1])
    assert resolve_positions(at_limit, 3) is at_limit
    assert resolve_bounded_positions(at_limit, 3, batch=1, device=None, name="positions")[1] == (
        LIMIT,
        True,
    )
    rope, xpos = posenc.RotaryEmbedding(8), posenc.XPos(8)
    for n, positions in [
        (1, torch.tensor([PAST])),  # a decode step
        (3, torch.tensor([PAST - 2, PAST - 1, PAST])),  # a run
        (3, torch.tensor([5, PAST, 0])),  # a few
        (20, torch.arange(PAST - 19, PAST + 1)),  # many
        (3, torch.tensor([[0, 1, 2], [4, PAST, 6]])),  # per batch
        (3, torch.tensor([0.0, 1.0, 2.0**53 + 2], dtype=torch.float64)),
    ]:
        q = torch.randn(2, 2, n, 8)
        expected = message if not positions.is_floating_point() else "at most 2"
        for module in (rope, xpos):
            with pytest.raises(PosencValueError, match=expected):
                module(q, q.clone(), positions)
        x = torch.randn(2, n, 8)
        with pytest.raises(PosencValueError, match=expected):
            SINUSOIDAL(x, positions)
        with pytest.raises(PosencValueError, match=expected):
            posenc.MultiHeadAttention(8, 2, pe="alibi")(x, positions=positions)
    q = torch.randn(1, 2, 1, 8)
    got = rope(q, q.clone(), torch.tensor([LIMIT]))[0]
    angles = LIMIT * rope.inv_freq.double()  # (the module's own float64 frequencies)
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = q.double()[..., :4], q.double()[..., 4:]
    want = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)


def test_check_input_and_compute_dtype() -> None:
    assert check_input(X, 8) is X
    with pytest.raises(PosencValueError, match="h must have 4 dimensions"):
        check_input(X, 8, name="h", rank=4)
    assert [compute_dtype(d) for d in (torch.float16, torch.bfloat16)] == [torch.float32] * 2
    assert [compute_dtype(d) for d in (torch.float32, torch.float64)] == [
        torch.float32,
        torch.float64,
    ]
