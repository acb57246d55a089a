"""``torch.compile(fullgraph=True)`` of the ``Encoder`` (issue #8, part 2).

One small encoder per family (additive ``sinusoidal``, rotary ``rope``, bias ``alibi``,
none) is compiled with the **inductor** backend (real C++ code generation on this CPU, about
5-10 s per graph): the compiled output equals eager within float32 tolerance, the whole
forward is one graph (``fullgraph=True`` raises on any graph break, and dynamo's counters show
one graph and no break), and a new batch size does not recompile (the batch dimension is
marked dynamic and ``error_on_recompile`` turns any recompilation into an error).

Every other registered encoding goes through the same checks with the ``aot_eager`` backend
(dynamo and AOTAutograd tracing without code generation, about 1-2 s each), so that every
scheme's forward is known to trace as one graph.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.utils import counters

import posenc

#: One encoding per family, compiled with inductor.
FAMILY_REPRESENTATIVES = {
    "additive": "sinusoidal",
    "rotary": "rope",
    "bias": "alibi",
    "none": "none",
}
OTHERS = [n for n in posenc.available() if n not in FAMILY_REPRESENTATIVES.values()]
ATOL, RTOL = 1e-5, 1e-5  # float32: compiled kernels may sum in another order


def _encoder(name: str) -> tuple[posenc.Encoder, torch.Tensor | None]:
    """A small encoder (width 24, 2 heads, head dim 12: even and divisible by 6, so the 3-D
    axial RoPE fits) and the positions its scheme needs (coordinates for N-D tables)."""
    torch.manual_seed(0)
    encoder = posenc.Encoder(24, 2, 2, pe=name, causal=False).eval()
    axes = encoder.pe.axes
    positions = None
    if encoder.pe.family == "additive" and axes > 1:
        positions = torch.stack([torch.arange(8) % 3 + a for a in range(axes)], dim=-1)
    return encoder, positions


def _check_compiled(name: str, backend: str) -> None:
    dynamo.reset()
    counters.clear()
    encoder, positions = _encoder(name)
    compiled = torch.compile(encoder, fullgraph=True, backend=backend)
    first = torch.randn(2, 8, 24)
    dynamo.mark_dynamic(first, 0)  # the batch dimension: one graph for every batch size
    with torch.no_grad():
        torch.testing.assert_close(
            compiled(first, positions=positions),
            encoder(first, positions=positions),
            atol=ATOL,
            rtol=RTOL,
        )
        assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
        assert not counters["graph_break"], dict(counters["graph_break"])
        with dynamo.config.patch(error_on_recompile=True):
            for batch in (3, 5):
                x = torch.randn(batch, 8, 24)
                torch.testing.assert_close(
                    compiled(x, positions=positions),
                    encoder(x, positions=positions),
                    atol=ATOL,
                    rtol=RTOL,
                )
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILY_REPRESENTATIVES))
def test_encoder_compiles_fullgraph_with_inductor(family: str) -> None:
    _check_compiled(FAMILY_REPRESENTATIVES[family], "inductor")


@pytest.mark.slow
@pytest.mark.parametrize("name", OTHERS)
def test_every_other_encoding_compiles_fullgraph_aot_eager(name: str) -> None:
    _check_compiled(name, "aot_eager")


def test_explicit_positions_compile_without_graph_breaks() -> None:
    """Per-batch offsets (a KV cache, packing) through a compiled rotary encoder: one graph,
    the eager output."""
    dynamo.reset()
    counters.clear()
    encoder, _ = _encoder("rope")
    compiled = torch.compile(encoder, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 8, 24)
    positions = torch.arange(8) + torch.tensor([[0], [100]])  # (b, n)
    with torch.no_grad():
        torch.testing.assert_close(
            compiled(x, positions=positions), encoder(x, positions=positions), atol=ATOL, rtol=RTOL
        )
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]
    dynamo.reset()
