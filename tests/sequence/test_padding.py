"""Padding never changes a real token's output: every registered scheme, every attention
backend, causal and bidirectional, a batch of one and a batch of three, with left padding,
right padding and none. Each row's outputs at its real tokens must equal that row run alone,
unpadded (positions given explicitly where the padding shifts them).

This is the differential test behind the batch-of-one bug: SDPA's ``is_causal`` shortcut was
taken whenever the mask had one row, which a padded batch of one also has, so its padding was
dropped. Shortcuts stay where they are fast; this grid says whether they are right.

Flex attention runs its eager reference here (``compile_flex=False``); compiled flex and
``torch.compile`` of the whole encoder run on one scheme per family (slow).
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
import posenc.attention.flex
from tests.schemes import FACTS, NAMES, coordinates

BACKENDS = ["auto", "sdpa", "math", "flex"]
#: One scheme per family, for the compiled paths.
REPRESENTATIVES = ["sinusoidal", "rope", "alibi", "none"]
DIM, HEADS, N = 24, 2, 7  # head dim 12: even, and divisible by 4 and 6 for rope2d/rope3d
#: Real lengths of the rows of each batch (the batch is padded to N).
LENGTHS = {1: [4], 3: [7, 4, 5]}
#: float32 sums in another order (another batch size, another kernel): a few ulps of O(1)
ATOL, RTOL = 2e-5, 1e-4


def _encoder(name: str, backend: str, causal: bool, *, compile_flex: bool = False):
    torch.manual_seed(0)
    encoder = posenc.Encoder(DIM, 2, HEADS, pe=name, causal=causal, backend=backend).eval()
    for layer in encoder.layers:
        layer.attn.compile_flex = compile_flex
    return encoder


def _coordinates(name: str, n: int) -> torch.Tensor | None:
    """Positions for an N-D scheme (``(n, axes)`` coordinates), ``None`` for a 1-D one."""
    axes = posenc.entry(name).cls.axes
    if axes == 1:
        return None
    return coordinates(name, n, torch.stack([torch.arange(n) % 3 + a for a in range(axes)], -1))


def _padded_batch(name: str, batch: int, padding: str) -> tuple:
    """``x (b, N, D)``, the positions to pass, the key padding mask (or ``None``), and per row
    the indices of its real tokens and the positions it takes when run alone."""
    gen = torch.Generator().manual_seed(batch)
    x = torch.randn(batch, N, DIM, generator=gen)
    coords = _coordinates(name, N)
    if padding == "none":
        rows = [(torch.arange(N), torch.arange(N) if coords is None else coords)] * batch
        return x, coords, None, rows
    mask = torch.zeros(batch, N, dtype=torch.bool)
    positions = torch.zeros(batch, N, dtype=torch.long)
    rows = []
    for r, length in enumerate(LENGTHS[batch]):
        real = torch.arange(length) + (N - length if padding == "left" else 0)
        mask[r] = True
        mask[r, real] = False
        positions[r, real] = torch.arange(length)
        alone = torch.arange(length) if coords is None else coords[:length]
        rows.append((real, alone))
    if coords is not None:  # N-D schemes: right padding only, one set of coordinates
        return x, coords, mask, rows
    # left padding shifts the real tokens: their positions are given (and must be what
    # positions_from_padding makes); right padding keeps them at 0..L-1, where the default
    # arange puts them
    assert torch.equal(posenc.positions_from_padding(mask), positions)
    return x, positions if padding == "left" else None, mask, rows


def _check_rows(encoder, name: str, batch: int, padding: str, reference=None) -> None:
    reference = encoder if reference is None else reference
    x, positions, mask, rows = _padded_batch(name, batch, padding)
    if mask is not None and FACTS[name].full_grid:  # padding removes tokens of its grid
        if mask.any():
            with pytest.raises(posenc.PosencValueError, match="key_padding_mask"):
                encoder(x, positions=positions, key_padding_mask=mask)
        return
    out = encoder(x, positions=positions, key_padding_mask=mask)
    for r, (real, alone_positions) in enumerate(rows):
        alone = reference(x[r : r + 1, real], positions=alone_positions)
        assert_close(
            out[r, real],
            alone[0],
            atol=ATOL,
            rtol=RTOL,
            msg=lambda m, r=r: f"{name}, batch {batch}, {padding} padding, row {r}: {m}",
        )


def _paddings(name: str) -> list[str]:
    return ["none", "right"] if posenc.entry(name).cls.axes > 1 else ["none", "left", "right"]


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
def test_padded_rows_equal_each_row_alone(name: str, backend: str, causal: bool) -> None:
    encoder = _encoder(name, backend, causal)
    with torch.no_grad():  # the inference path (fused layers, in-place rotation)
        for batch in (1, 3):
            for padding in _paddings(name):
                _check_rows(encoder, name, batch, padding)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("name", NAMES)
def test_padded_rows_equal_each_row_alone_under_autograd(name: str, causal: bool) -> None:
    """The training path (autograd on: no fused layers, flex falls back on a CPU)."""
    encoder = _encoder(name, "auto", causal)
    for batch in (1, 3):
        _check_rows(encoder, name, batch, _paddings(name)[-1])


@pytest.mark.slow
@pytest.mark.parametrize("name", REPRESENTATIVES)
def test_compiled_flex_padded_rows_equal_each_row_alone(name: str) -> None:
    """Compiled flex attention (block masks for the padding) against each row alone on the
    math backend."""
    if not posenc.attention.flex.flex_available():
        pytest.skip("this torch has no flex_attention")
    encoder = _encoder(name, "flex", True, compile_flex=True)
    reference = _encoder(name, "math", True)
    with torch.no_grad():
        for batch in (1, 3):
            _check_rows(encoder, name, batch, "left", reference)


@pytest.mark.slow
@pytest.mark.parametrize("name", REPRESENTATIVES)
def test_compiled_encoder_padded_rows_equal_each_row_alone(name: str) -> None:
    """``torch.compile`` of the whole encoder (inductor) against each row alone, eager."""
    torch._dynamo.reset()
    encoder = _encoder(name, "auto", True)
    compiled = torch.compile(encoder, fullgraph=True)
    with torch.no_grad():
        for batch in (1, 3):
            _check_rows(compiled, name, batch, "left", encoder)
    torch._dynamo.reset()
