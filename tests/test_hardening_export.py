"""``torch.export`` and ONNX export of the ``Encoder`` (issue #8, part 3).

Encoders with the sinusoidal, learned, RoPE and ALiBi encodings are exported with a dynamic
sequence length (``torch.export.Dim``), then run at a length different from the one traced,
to prove the length really is symbolic: the exported program and the ONNX model (run by
onnxruntime) must give the eager output.

ONNX export uses torch's dynamo exporter (``torch.onnx.export(..., dynamo=True)``), which
needs ``onnxscript``; onnxruntime runs the result. All three are in the ``test`` extra.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.export import Dim

import posenc

NAMES = ["sinusoidal", "learned", "rope", "alibi"]
TRACE_LEN, RUN_LENS = 8, (5, 13)
ATOL, RTOL = 1e-5, 1e-5  # float32 against float32; ONNX kernels may sum in another order


def _encoder(name: str, *, causal: bool = False) -> posenc.Encoder:
    torch.manual_seed(0)
    return posenc.Encoder(16, 2, 2, pe=name, causal=causal).eval()


def _dynamic_seq() -> dict[str, object]:
    # the learned table has 2048 rows: the exported program may be asked for at most that
    return {"x": {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=2, max=1024)}}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_torch_export_dynamic_sequence_length(name: str, causal: bool) -> None:
    encoder = _encoder(name, causal=causal)
    program = torch.export.export(
        encoder, (torch.randn(2, TRACE_LEN, 16),), dynamic_shapes=_dynamic_seq()
    )
    exported = program.module()
    for batch, n in ((2, RUN_LENS[0]), (3, RUN_LENS[1])):
        x = torch.randn(batch, n, 16)
        with torch.no_grad():
            torch.testing.assert_close(exported(x), encoder(x), atol=ATOL, rtol=RTOL)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated")
@pytest.mark.parametrize("name", NAMES)
def test_onnx_export_runs_in_onnxruntime_at_other_lengths(name: str, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extra")
    pytest.importorskip("onnxscript", reason="torch's dynamo ONNX exporter needs onnxscript")
    encoder = _encoder(name)
    path = tmp_path / f"{name}.onnx"
    torch.onnx.export(
        encoder,
        (torch.randn(2, TRACE_LEN, 16),),
        str(path),
        input_names=["x"],
        output_names=["y"],
        dynamic_shapes=_dynamic_seq(),
        dynamo=True,
        verbose=False,
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch, n in ((2, RUN_LENS[0]), (3, RUN_LENS[1])):
        x = torch.randn(batch, n, 16)
        (y,) = session.run(["y"], {"x": x.numpy()})
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(y), encoder(x), atol=ATOL, rtol=RTOL)


def test_exported_learned_encoder_still_refuses_past_its_table() -> None:
    """The learned table's length check survives export as a runtime assertion rather than
    reading garbage rows: asking the exported program for more positions than the table has
    fails."""
    encoder = posenc.Encoder(16, 1, 2, pe="learned", pe_kwargs={"max_len": 32}).eval()
    program = torch.export.export(
        encoder,
        (torch.randn(1, TRACE_LEN, 16),),
        dynamic_shapes={"x": {1: Dim("seq", min=2, max=32)}},
    )
    with torch.no_grad():
        x = torch.randn(1, 20, 16)
        torch.testing.assert_close(program.module()(x), encoder(x), atol=ATOL, rtol=RTOL)
        with pytest.raises((RuntimeError, AssertionError, ValueError)):
            program.module()(torch.randn(1, 40, 16))
