"""Property-based tests over every registered encoding (issue #8, part 1).

Hypothesis draws the encoding, the sizes (odd model widths where the scheme allows them),
the head count, the dtype (fp32, fp64, bf16, fp16), the device (``cpu``, ``meta``), the batch
and sequence lengths and the kind of positions (default, an offset, per-batch, float). Every
call must give the right shape and dtype, finite values, and an explicit ``arange`` must give
exactly (``torch.equal``) what the default positions give.

Encodings are built the two public ways, ``posenc.build(name, ...)`` with each class's own
arguments and ``build_for_model(name, dim, num_heads)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from fuzzing import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import posenc
from posenc.encodings.base import build_for_model, compute_dtype

NAMES = posenc.available()
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
#: Schemes that read a table by integer position or distance: float positions must hold
#: whole numbers.
INTEGER_ONLY = {"learned", "t5", "shaw", "xl"}
PROPERTY_SETTINGS = settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass
class Case:
    name: str
    dim: int
    heads: int
    dtype: torch.dtype
    device: str
    kind: str  # "default", "offset", "batched", "float"
    batch: int
    seq: int
    via_build: bool  # posenc.build(name, **own_args) instead of build_for_model


def _head_dim_multiple(name: str) -> int:
    cls = posenc.entry(name).cls
    if cls.family == "rotary":
        return 2 * cls.axes  # pairs, split evenly over the axes
    return 1


@st.composite
def cases(draw: st.DrawFn, names: list[str] = NAMES) -> Case:
    name = draw(st.sampled_from(names))
    family = posenc.entry(name).family
    heads = draw(st.integers(1, 4))
    if family == "additive":
        dim = draw(st.integers(1, 33))  # any width, odd included
    else:
        multiple = _head_dim_multiple(name)
        head_dim = multiple * draw(st.integers(1, 12 // multiple))
        dim = heads * head_dim
    return Case(
        name=name,
        dim=dim,
        heads=heads,
        dtype=draw(st.sampled_from(DTYPES)),
        device=draw(st.sampled_from(["cpu", "meta"])),
        kind=draw(st.sampled_from(["default", "offset", "batched", "float"])),
        batch=draw(st.integers(1, 3)),
        seq=draw(st.integers(1, 9)),
        via_build=draw(st.booleans()),
    )


def build(case: Case) -> posenc.PositionalEncoding:
    """The encoding for ``case`` on its device (built there, as a user would with
    ``with torch.device("meta")``)."""
    with torch.device(case.device):
        if not case.via_build:
            return build_for_model(case.name, case.dim, case.heads)
        cls = posenc.entry(case.name).cls
        head_dim = case.dim // case.heads
        if cls.family == "additive":
            return posenc.build(case.name, dim=case.dim)
        if cls.family == "rotary":
            return posenc.build(case.name, head_dim=head_dim)
        if cls.family == "none":
            return posenc.build(case.name)
        if case.name in ("cope", "shaw", "xl"):
            return posenc.build(case.name, num_heads=case.heads, head_dim=head_dim)
        return posenc.build(case.name, num_heads=case.heads)


def positions_for(case: Case, axes: int) -> torch.Tensor | None:
    """Positions of the drawn kind: ``(n,)``/``(b, n)``, or coordinates ``(..., n, axes)``."""
    n, b = case.seq, case.batch
    if case.kind == "default":
        return None
    if case.kind == "offset":
        pos = torch.arange(n) + 5
    elif case.kind == "batched":
        pos = torch.arange(n) + 3 * torch.arange(b)[:, None]  # (b, n): a different offset each
    else:
        # fractional where the scheme allows it, whole numbers in a float tensor elsewhere
        step = 1.0 if case.name in INTEGER_ONLY else 0.75
        pos = torch.arange(n, dtype=torch.float64) * step + 2.0
    if axes > 1:  # coordinates: the position on every axis, shifted per axis
        pos = torch.stack([pos + a for a in range(axes)], dim=-1)
    return pos.to(case.device)


def explicit_default(case: Case, axes: int) -> torch.Tensor:
    """What the default positions are, written out: ``arange(n)`` (or the row ``(t, 0, ...)``
    for axial RoPE; grid coordinates for N-D sinusoidal tables)."""
    n = case.seq
    if axes == 1:
        return torch.arange(n, device=case.device)
    coords = torch.zeros(n, axes, dtype=torch.long, device=case.device)
    coords[:, 0] = torch.arange(n, device=case.device)
    return coords


def call(
    pe: posenc.PositionalEncoding, case: Case, positions: Any, inputs: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """Run the family hook of ``pe`` and return its outputs as a tuple."""
    if pe.family == "additive":
        return (pe(inputs["x"], positions),)
    if pe.family == "rotary":
        return tuple(pe(inputs["q"], inputs["k"], positions))
    if pe.family == "bias":
        pos = explicit_default(case, 1) if positions is None else positions
        return (pe.bias(pos, pos, q=inputs["q"], k=inputs["k"]),)
    return (pe(inputs["x"]),)


def make_inputs(case: Case, pe: posenc.PositionalEncoding) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(case.seq * 31 + case.dim)
    b, n, h = case.batch, case.seq, case.heads

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(case.device, case.dtype)

    inputs = {"x": rand(b, n, case.dim)}
    if pe.family in ("additive", "none") and pe.axes > 1 and case.kind == "default":
        # N-D tables without coordinates take a grid: (b, n, 2, d) or (b, n, 2, 2, d)
        inputs["x"] = rand(b, n, *([2] * (pe.axes - 1)), case.dim)
    head_dim = case.dim // h
    inputs["q"], inputs["k"] = rand(b, h, n, head_dim), rand(b, h, n, head_dim)
    return inputs


def expected_shapes(
    pe: posenc.PositionalEncoding, case: Case, inputs: dict[str, torch.Tensor], positions: Any
) -> list[tuple[int, ...]]:
    if pe.family in ("additive", "none"):
        return [tuple(inputs["x"].shape)]
    if pe.family == "rotary":
        return [tuple(inputs["q"].shape), tuple(inputs["k"].shape)]
    batched = positions is not None and positions.dim() == 2
    b, h, n = case.batch, case.heads, case.seq
    return [(b, h, n, n) if batched or pe.needs_qk else (h, n, n)]


def grid_default(case: Case, pe: posenc.PositionalEncoding, x: torch.Tensor) -> torch.Tensor:
    """Grid coordinates ``(*spatial, axes)`` of an N-D input, written out."""
    axes = torch.meshgrid(*(torch.arange(s) for s in x.shape[1:-1]), indexing="ij")
    return torch.stack(axes, dim=-1).to(case.device)


@PROPERTY_SETTINGS
@given(case=cases())
def test_every_encoding_shape_dtype_finite_and_explicit_arange(case: Case) -> None:
    pe = build(case).eval()
    axes = pe.axes
    inputs = make_inputs(case, pe)
    positions = positions_for(case, axes)
    with torch.no_grad():
        outputs = call(pe, case, positions, inputs)
    assert [tuple(o.shape) for o in outputs] == expected_shapes(pe, case, inputs, positions)
    for out in outputs:
        want = compute_dtype(case.dtype) if pe.family == "bias" else case.dtype
        assert out.dtype == want, (case, out.dtype)
        assert out.device.type == case.device
    if case.device == "meta":
        return  # no values on meta: shapes and dtypes are all there is
    for out in outputs:
        assert torch.isfinite(out.float()).all(), case
    if case.kind != "default" or pe.family == "none":
        return
    # an explicit arange (or the equivalent coordinates) must give exactly the default
    if pe.family == "additive" and axes > 1:
        explicit = grid_default(case, pe, inputs["x"])
    else:
        explicit = explicit_default(case, axes)
    with torch.no_grad():
        again = call(pe, case, explicit, inputs)
    for out, out2 in zip(outputs, again, strict=True):
        assert torch.equal(out, out2), case


@settings(max_examples=examples(40), deadline=None)
@given(
    name=st.sampled_from(sorted(INTEGER_ONLY)),
    seq=st.integers(2, 8),
    frac=st.floats(0.05, 0.95),
)
def test_integer_schemes_reject_fractional_positions(name: str, seq: int, frac: float) -> None:
    """Table lookups cannot take a fractional position: a ValueError naming the positions."""
    case = Case(name, 8, 2, torch.float32, "cpu", "float", 1, seq, False)
    pe = build(case)
    inputs = make_inputs(case, pe)
    positions = torch.arange(seq, dtype=torch.float64)
    positions[-1] += frac
    with pytest.raises(ValueError, match="positions must hold whole numbers"):
        call(pe, case, positions, inputs)


@settings(max_examples=examples(40), deadline=None)
@given(
    name=st.sampled_from([n for n in NAMES if posenc.entry(n).cls.axes == 1]),
    bad=st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    where=st.integers(0, 4),
)
def test_non_finite_positions_are_rejected(name: str, bad: float, where: int) -> None:
    """NaN or ±inf among float positions is a ValueError naming ``positions``, never a NaN
    output (found by this suite: every scheme used to accept them)."""
    case = Case(name, 8, 2, torch.float32, "cpu", "float", 1, 5, False)
    pe = build(case)
    if pe.family == "none":
        return  # NoPE takes no positions
    inputs = make_inputs(case, pe)
    positions = torch.arange(5, dtype=torch.float64)
    positions[where] = bad
    with pytest.raises(ValueError, match=r"positions must be finite, got (nan|inf|-inf)"):
        call(pe, case, positions, inputs)


@settings(max_examples=examples(40), deadline=None)
@given(
    name=st.sampled_from(NAMES),
    heads=st.integers(1, 3),
    batch=st.integers(1, 3),
    seq=st.integers(1, 7),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    causal=st.booleans(),
)
def test_encoder_every_encoding_shape_finite_and_explicit_arange(
    name: str, heads: int, batch: int, seq: int, dtype: torch.dtype, causal: bool
) -> None:
    """The whole ``Encoder`` with each scheme: ``(b, n, D)`` in the input's dtype, finite, and
    explicit positions (``arange``, or coordinates for N-D schemes) equal to the default."""
    cls = posenc.entry(name).cls
    head_dim = 2 * cls.axes * 2 if cls.family == "rotary" else 4
    dim = heads * head_dim
    torch.manual_seed(0)
    encoder = posenc.Encoder(dim, 1, heads, pe=name, causal=causal).to(dtype).eval()
    x = torch.randn(batch, seq, dim, dtype=dtype)
    coords = torch.zeros(seq, cls.axes, dtype=torch.long)
    coords[:, 0] = torch.arange(seq)
    explicit = torch.arange(seq) if cls.axes == 1 else coords
    with torch.no_grad():
        out = encoder(x, positions=explicit)
        assert out.shape == x.shape and out.dtype == dtype
        assert torch.isfinite(out).all()
        if cls.axes == 1 or cls.family == "rotary":  # N-D tables need coordinates
            torch.testing.assert_close(encoder(x), out, atol=0.0, rtol=0.0)
