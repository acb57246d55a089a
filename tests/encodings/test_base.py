"""The family protocol of ``posenc.encodings.base``, checked for every registered scheme
(parametrised from the registry, see ``tests/schemes.py``).

- **Properties** (hypothesis, issue #8 part 1): the encoding, the sizes (odd model widths
  where the scheme allows them), the head count, the dtype (fp32, fp64, bf16, fp16), the
  device (``cpu``, ``meta``), the batch and sequence lengths and the kind of positions
  (default, an offset, per-batch, float) are drawn. Every call must give the right shape and
  dtype and finite values; an explicit ``arange`` must give exactly (``torch.equal``) what the
  default positions give, and per-batch positions what each row gives alone. Encodings are
  built the two public ways, ``posenc.build(name, ...)`` with each class's own arguments and
  ``build_for_model(name, dim, num_heads)``.
- **State** (issue #8 part 4): a ``state_dict`` round trip gives exactly the first module's
  outputs; fixed tables (sinusoid rows, cos/sin caches, frequencies, slopes, axis indices)
  are never persisted; a module built on the ``meta`` device, materialised with
  ``to_empty(device="cpu")`` and its public re-initialisation, equals one built on the CPU.
- **The registry**: names, families, ``build`` and ``build_for_model``, and the misuse of
  each. The checks every family shares on ``x`` and on positions are in ``test_checks.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import posenc
from posenc.encodings.checks import compute_dtype
from posenc.encodings.registry import build_for_model
from tests.fuzzing import examples
from tests.misuse import Misuse, check
from tests.misuse import cases as misuse_cases
from tests.schemes import FACTS, NAMES, SEQUENCE, coordinates

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
#: Schemes that read a table by integer position or distance: float positions must hold
#: whole numbers.
INTEGER_ONLY = sorted(name for name in NAMES if FACTS[name].integer_positions)
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
    return FACTS[name].head_dim_multiple


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
        return posenc.build(case.name, **FACTS[case.name].arguments(case.dim, case.heads))


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
    if FACTS[case.name].full_grid:  # one full grid, shifted as the kind shifts the positions
        grid = coordinates(case.name, n, torch.zeros(n, 2, dtype=pos.dtype))  # (n, 2)
        pos = grid + pos[..., :1, None]  # (n, 2) or (b, n, 2): each row's first position
    elif axes > 1:  # coordinates: the position on every axis, shifted per axis
        pos = torch.stack([pos + a for a in range(axes)], dim=-1)
    return pos.to(case.device)


def explicit_default(case: Case, axes: int) -> torch.Tensor:
    """What the default positions are, written out: ``arange(n)`` (or the row ``(t, 0, ...)``
    for axial RoPE; grid coordinates for N-D sinusoidal tables)."""
    n = case.seq
    if axes == 1:
        return torch.arange(n, device=case.device)
    if FACTS[case.name].full_grid:  # a full grid's default: the square one
        side = math.isqrt(n)
        return coordinates(case.name, side * side, torch.zeros(n, 2, dtype=torch.long))
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
        pos = explicit_default(case, pe.axes) if positions is None else positions
        x = {"x": inputs["x"]} if pe.needs_x else {}  # type: ignore[attr-defined]
        return (pe.bias(pos, pos, q=inputs["q"], k=inputs["k"], **x),)
    if pe.family == "conditional":
        return (pe(inputs["x"], positions),)
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
    if pe.family in ("additive", "conditional", "none"):
        return [tuple(inputs["x"].shape)]
    if pe.family == "rotary":
        widen = (*inputs["q"].shape[:-1], inputs["q"].shape[-1] * pe.width_factor)
        return [widen, (*inputs["k"].shape[:-1], inputs["k"].shape[-1] * pe.width_factor)]
    batched = positions is not None and positions.dim() == (2 if pe.axes == 1 else 3)
    b, h, n = case.batch, case.heads, case.seq
    reads = pe.needs_qk or pe.needs_x  # type: ignore[attr-defined]
    return [(b, h, n, n) if batched or reads else (h, n, n)]


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
    if positions is None and axes > 1 and pe.family == "rotary":
        # N-D rotations have no default coordinates (a flattened input has no grid): refused
        with pytest.raises(ValueError, match="needs positions"):
            call(pe, case, positions, inputs)
        return
    if positions is None and FACTS[case.name].full_grid and math.isqrt(case.seq) ** 2 != case.seq:
        # a full grid's default is a square one: another count of tokens is refused
        with pytest.raises(ValueError, match="square"):
            call(pe, case, positions, inputs)
        return
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
    if case.kind == "batched" and pe.family != "none":
        if getattr(pe, "center", 0) is None:
            # xPos centres its decay on the call's largest position by default, so a row alone
            # has another centre: compare with a fixed one
            pe.center = 0.0
            with torch.no_grad():
                outputs = call(pe, case, positions, inputs)
        # per-batch positions: row b is what row b's positions give alone
        for b in range(case.batch):
            row = {key: value[b : b + 1] for key, value in inputs.items()}
            with torch.no_grad():
                alone = call(pe, case, positions[b], row)
            for out, one in zip(outputs, alone, strict=True):
                torch.testing.assert_close(out[b], one.reshape(out[b].shape), msg=str(case))
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
    """Table lookups cannot take a fractional position: a ValueError naming the positions
    (the value is not shown yet: see the ``fractional`` misuse cases)."""
    case = Case(name, 8, 2, torch.float32, "cpu", "float", 1, seq, False)
    pe = build(case)
    inputs = make_inputs(case, pe)
    positions = torch.arange(seq, dtype=torch.float64)
    positions[-1] += frac
    if pe.axes > 1:  # coordinates: the fraction on every axis
        positions = torch.stack([positions] * pe.axes, dim=-1)
    with pytest.raises(ValueError, match="positions"):
        call(pe, case, positions, inputs)


@settings(max_examples=examples(40), deadline=None)
@given(
    name=st.sampled_from(SEQUENCE),
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
    with pytest.raises(ValueError, match="positions") as info:
        call(pe, case, positions, inputs)
    assert repr(bad) in str(info.value)


# --------------------------------------------------------------------------- state

DIM, HEADS = 24, 2  # head dim 12: even, and divisible by 2 * 3 for the 3-D axial RoPE
#: Names of the fixed (derived) buffers the library keeps; none may reach a checkpoint.
TABLE_NAMES = ("table", "cos_cached", "sin_cached", "inv_freq", "slopes", "axis_of_pair")
REINIT_METHODS = ("reset_tables", "reset_slopes", "reset_parameters")


def _probe(pe: posenc.PositionalEncoding) -> tuple[torch.Tensor, ...]:
    """The encoding's output on fixed inputs, through its family hook (positions past the
    initial tables' ends too, so a table rebuilt wrongly or grown wrongly shows)."""
    gen = torch.Generator().manual_seed(1)
    n = 6
    positions = torch.arange(n) + 3
    if pe.axes > 1:
        positions = torch.stack([positions + a for a in range(pe.axes)], dim=-1)
    head_dim = DIM // HEADS
    with torch.no_grad():
        if pe.family == "additive":
            return (pe(torch.randn(2, n, DIM, generator=gen), positions),)
        if pe.family == "rotary":
            q = torch.randn(2, HEADS, n, head_dim, generator=gen)
            k = torch.randn(2, HEADS, n, head_dim, generator=gen)
            default = tuple(pe(q, k)) if pe.axes == 1 else ()  # N-D: coordinates required
            return tuple(pe(q, k, positions)) + default
        if pe.family == "bias":
            q = torch.randn(2, HEADS, n, head_dim, generator=gen)
            k = torch.randn(2, HEADS, n, head_dim, generator=gen)
            x = {"x": torch.randn(2, n, DIM, generator=gen)} if pe.needs_x else {}
            return (pe.bias(positions, positions, q=q, k=k, **x),)
        x = torch.randn(2, n, DIM, generator=gen)
        if pe.family == "conditional":  # a full grid, starting at 3
            return (pe(x, coordinates(str(pe.registry_name()), n, positions) + 3),)
        return (pe(x),)


def _assert_same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=0.0, rtol=0.0)


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip(name: str) -> None:
    torch.manual_seed(0)
    original = build_for_model(name, DIM, HEADS)
    torch.manual_seed(1234)  # a different initialisation, overwritten by the checkpoint
    restored = build_for_model(name, DIM, HEADS)
    state = original.state_dict()
    restored.load_state_dict(state)  # strict: every key matches
    for key, value in restored.state_dict().items():
        torch.testing.assert_close(value, state[key], atol=0.0, rtol=0.0)
    _assert_same(_probe(restored), _probe(original))


@pytest.mark.parametrize("name", NAMES)
def test_fixed_tables_are_never_persisted(name: str) -> None:
    pe = build_for_model(name, DIM, HEADS)
    _probe(pe)  # grow the caches first: a grown table must not be persisted either
    state = pe.state_dict()
    parameters = {key for key, _ in pe.named_parameters()}
    assert set(state) <= parameters, f"buffers in the checkpoint: {set(state) - parameters}"
    for key in state:
        assert key.rsplit(".", 1)[-1] not in TABLE_NAMES, key
    buffers = {key for key, _ in pe.named_buffers()}
    assert not buffers & set(state)


@pytest.mark.parametrize("name", NAMES)
def test_meta_then_materialised_equals_built_directly(name: str) -> None:
    torch.manual_seed(0)
    direct = build_for_model(name, DIM, HEADS)
    with torch.device("meta"):
        lazy = build_for_model(name, DIM, HEADS)
    assert all(t.is_meta for t in [*lazy.parameters(), *lazy.buffers()])
    lazy = lazy.to_empty(device="cpu")
    for method in REINIT_METHODS:  # the public re-initialisation, where the class has one
        if hasattr(lazy, method):
            getattr(lazy, method)()
    # the fixed buffers come back exactly, without any checkpoint
    direct_buffers = dict(direct.named_buffers())
    lazy_buffers = dict(lazy.named_buffers())
    assert direct_buffers.keys() == lazy_buffers.keys()
    for key, value in direct_buffers.items():
        assert lazy_buffers[key].dtype == value.dtype, key
        torch.testing.assert_close(lazy_buffers[key], value, atol=0.0, rtol=0.0)
    # learned weights come from the checkpoint, as they would after meta initialisation
    lazy.load_state_dict(direct.state_dict())
    _assert_same(_probe(lazy), _probe(direct))


@pytest.mark.parametrize(
    "name", [n for n in NAMES if any(True for _ in build_for_model(n, DIM, HEADS).buffers())]
)
def test_reset_after_to_empty_is_public_and_idempotent(name: str) -> None:
    """Calling the public re-initialisation again changes nothing (no hidden state)."""
    with torch.device("meta"):
        lazy = build_for_model(name, DIM, HEADS)
    lazy = lazy.to_empty(device="cpu")
    method = next(m for m in REINIT_METHODS if hasattr(lazy, m))
    before = {k: v.clone() for k, v in lazy.named_buffers()}
    getattr(lazy, method)()
    for key, value in lazy.named_buffers():
        torch.testing.assert_close(value, before[key], atol=0.0, rtol=0.0)


# --------------------------------------------------------------------------- registry


def test_every_registered_scheme_is_described_for_the_tests() -> None:
    """A newcomer's scheme is tested everywhere once ``tests/schemes.py`` says what the tests
    must know about it: its constructor arguments and which properties to check."""
    missing = sorted(set(NAMES) - set(FACTS))
    assert not missing, f"add {missing} to FACTS in tests/schemes.py"
    stale = sorted(set(FACTS) - set(NAMES))
    assert not stale, f"{stale} are in FACTS in tests/schemes.py but not registered"


@pytest.mark.parametrize("name", NAMES)
def test_registry_entry_builds_its_class_both_ways(name: str) -> None:
    entry = posenc.entry(name)
    assert entry.family in posenc.FAMILIES and entry.summary
    assert entry.paper == entry.cls.paper
    built = posenc.build(name, **FACTS[name].arguments(24, 2))
    sized = build_for_model(name, 24, 2)
    assert type(built) is entry.cls and type(sized) is entry.cls
    assert built.registry_name() == name and built.family == entry.family


def test_known_names_and_nope() -> None:
    assert {"none", "sinusoidal", "learned", "rope", "alibi", "t5"} <= set(posenc.available())
    assert isinstance(posenc.build("none"), posenc.NoPE)


# --------------------------------------------------------------------------- bad input

MISUSE = [
    # the registry
    Misuse("build-unknown", lambda: posenc.build("nope"), ValueError, "positional encoding",
           "nope"),
    Misuse("build-name-int", lambda: posenc.build(3), TypeError, "encoding name", "int"),
    Misuse("build-bad-keyword", lambda: posenc.build("sinusoidal", dim=8, foo=1), TypeError,
           "keyword argument", "foo"),
    Misuse("build-for-model-heads-zero", lambda: build_for_model("rope", 8, 0), ValueError,
           "num_heads", 0),
    Misuse("build-for-model-dim-str", lambda: build_for_model("rope", "8", 2), TypeError, "dim",
           "8"),
    Misuse("build-for-model-indivisible", lambda: build_for_model("rope", 10, 3), ValueError,
           "num_heads", 3),
]  # fmt: skip


@pytest.mark.parametrize("case", misuse_cases(MISUSE))
def test_misuse_names_the_argument_and_the_value(case: Misuse) -> None:
    check(case)
