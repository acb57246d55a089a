"""``posenc.export_onnx(..., rotary_op=True)``: each rotation exported as ONNX opset 23's
``RotaryEmbedding`` and run by onnxruntime equals posenc's; the default export stays
decomposed (no such node)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.export import Dim

import posenc
from posenc.errors import PosencValueError

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extra")
onnx = pytest.importorskip("onnx", reason="onnx is in the test extra")
pytest.importorskip("onnxscript", reason="torch's dynamo ONNX exporter needs onnxscript")

pytestmark = pytest.mark.slow  # each export traces the model (seconds)


class Pair(torch.nn.Module):
    def __init__(self, rope: posenc.RotaryEmbedding) -> None:
        super().__init__()
        self.rope = rope

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        return self.rope(q, k, positions)


def _ops(path: Path) -> list[str]:
    return [node.op_type for node in onnx.load(str(path)).graph.node]


@pytest.mark.parametrize(
    "rope",
    [
        posenc.RotaryEmbedding(16),
        posenc.RotaryEmbedding(16, rotary_dim=8, interleaved=True),
        posenc.RotaryEmbedding(16, scaling={"rope_type": "yarn", "factor": 4.0,
                                            "original_max_position_embeddings": 8}),
    ],
    ids=["half", "interleaved-partial", "yarn"],
)  # fmt: skip
def test_rotary_op_runs_in_onnxruntime_and_equals_posenc(rope, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Pair(rope).eval()
    q, k = torch.randn(2, 4, 6, 16), torch.randn(2, 2, 6, 16)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
    path = tmp_path / "rope.onnx"
    n = Dim("n", min=2, max=64)
    posenc.export_onnx(
        model, (q, k, positions), str(path), rotary_op=True,
        dynamic_shapes=({2: n}, {2: n}, {1: n}),
    )  # fmt: skip
    ops = _ops(path)
    assert ops.count("RotaryEmbedding") == 2, ops
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for length in (6, 11):
        q, k = torch.randn(2, 4, length, 16), torch.randn(2, 2, length, 16)
        positions = torch.arange(length).expand(2, length) + torch.tensor([[0], [3]])
        feeds = dict(zip(names, (q.numpy(), k.numpy(), positions.numpy()), strict=True))
        got = session.run(None, feeds)
        with torch.no_grad():
            want = model(q, k, positions)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(torch.from_numpy(g), w, rtol=1e-5, atol=1e-5)


def test_half_precision_is_rotated_in_float32_and_rounded_once(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = Pair(posenc.RotaryEmbedding(16)).eval()
    q, k = torch.randn(1, 2, 5, 16).half(), torch.randn(1, 2, 5, 16).half()
    positions = torch.arange(100, 105)[None]
    path = tmp_path / "half.onnx"
    posenc.export_onnx(model, (q, k, positions), str(path), rotary_op=True)
    assert _ops(path).count("RotaryEmbedding") == 2
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    got = session.run(
        None, dict(zip(names, (q.numpy(), k.numpy(), positions.numpy()), strict=True))
    )
    with torch.no_grad():
        want = model(q, k, positions)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.numpy().dtype
        torch.testing.assert_close(torch.from_numpy(g), w, rtol=1e-3, atol=1e-3)


def test_the_default_export_stays_decomposed_and_old_opsets_are_refused(tmp_path: Path) -> None:
    model = Pair(posenc.RotaryEmbedding(16)).eval()
    args = (torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16), torch.arange(4)[None])
    path = tmp_path / "plain.onnx"
    posenc.export_onnx(model, args, str(path))
    assert "RotaryEmbedding" not in _ops(path)
    with pytest.raises(PosencValueError, match="opset_version >= 23"):
        posenc.export_onnx(model, args, str(tmp_path / "old.onnx"), rotary_op=True,
                           opset_version=18)  # fmt: skip
