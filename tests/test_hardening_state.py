"""State: checkpoints, fixed tables, the meta device and safetensors (issue #8, part 4).

For every registered encoding:

- ``state_dict`` round trip: a second module (built from another seed) that loads the first's
  state gives exactly the first's outputs;
- fixed tables (sinusoid rows, cos/sin caches, frequencies, slopes, axis indices) are never
  persisted: every key of ``state_dict`` is a parameter, and no key names a known table;
- a module built on the ``meta`` device, materialised with ``to_empty(device="cpu")`` and its
  public re-initialisation (``reset_tables`` / ``reset_slopes`` / ``reset_parameters`` where
  the class has one; learned weights then loaded from a checkpoint), has exactly the buffers
  and the outputs of a module built directly on the CPU.

And for a model with each encoding: ``safetensors.torch.save_model`` / ``load_model`` into a
freshly built model gives identical outputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import posenc
from posenc.encodings.base import build_for_model

NAMES = posenc.available()
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
            return tuple(pe(q, k, positions)) + tuple(pe(q, k))
        if pe.family == "bias":
            q = torch.randn(2, HEADS, n, head_dim, generator=gen)
            k = torch.randn(2, HEADS, n, head_dim, generator=gen)
            return (pe.bias(positions, positions, q=q, k=k),)
        x = torch.randn(2, n, DIM, generator=gen)
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


@pytest.mark.parametrize("name", ["sinusoidal", "rope", "alibi", "rope2d"])
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


def _model(name: str) -> posenc.TransformerModel:
    return posenc.TransformerModel(50, DIM, 2, HEADS, pe=name, causal=True).eval()


@pytest.mark.parametrize("name", NAMES)
def test_safetensors_save_and_load_model(name: str, tmp_path: Path) -> None:
    from safetensors.torch import load_model, save_model

    torch.manual_seed(0)
    model = _model(name)
    path = tmp_path / "model.safetensors"
    save_model(model, str(path))
    torch.manual_seed(99)
    fresh = _model(name)
    tokens = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(3))
    positions = None
    if fresh.encoder.pe.axes > 1:
        positions = torch.stack([torch.arange(9) + a for a in range(fresh.encoder.pe.axes)], -1)
    missing, unexpected = load_model(fresh, str(path))
    assert not missing and not unexpected
    with torch.no_grad():
        torch.testing.assert_close(
            fresh(tokens, positions=positions),
            model(tokens, positions=positions),
            atol=0.0,
            rtol=0.0,
        )
