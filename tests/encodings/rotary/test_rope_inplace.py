"""The rotary modules with ``inplace=True`` (equal to out of place for every layout, dtype,
partial rotation, offset, per-batch positions, scaling, xPos and axial RoPE), and in-place
rotation inside ``torch.compile(fullgraph=True)`` and ``torch.export`` (the decode path:
``test_rope_decode.py``)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc import PosencValueError, RotaryEmbedding, XPos
from posenc.encodings.rotary.kernels import native
from tests.native import NATIVE

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def fused_qk(
    b: int, n: int, hq: int, hk: int, d: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """q ``(b, hq, n, d)`` and k ``(b, hk, n, d)`` as views into one fused projection output
    ``(b, n, (hq + 2 hk) d)``, the way attention slices them."""
    fused = torch.randn(b, n, (hq + 2 * hk) * d).to(dtype)
    q = fused[..., : hq * d].view(b, n, hq, d).transpose(1, 2)
    k = fused[..., hq * d : (hq + hk) * d].view(b, n, hk, d).transpose(1, 2)
    return q, k


def modules() -> list[tuple[str, torch.nn.Module, int]]:
    """(label, module, coordinate axes) for every rotary scheme and option."""
    return [
        ("rope", RotaryEmbedding(16), 0),
        ("rope-interleaved", RotaryEmbedding(16, interleaved=True), 0),
        ("partial", RotaryEmbedding(16, rotary_dim=6), 0),
        ("partial-interleaved", RotaryEmbedding(16, rotary_dim=10, interleaved=True), 0),
        ("yarn", RotaryEmbedding(16, scaling={"rope_type": "yarn", "factor": 4.0},
                                 max_position_embeddings=32), 0),
        ("dynamic", RotaryEmbedding(16, scaling={"rope_type": "dynamic", "factor": 2.0},
                                    max_position_embeddings=8), 0),
        ("llama3", RotaryEmbedding(16, scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}), 0),
        ("learned", RotaryEmbedding(16, learned_freq=True), 0),
        ("xpos", XPos(16), 0),
        ("xpos-interleaved-center", XPos(16, interleaved=True, center=3.0), 0),
        ("rope2d", posenc.Rotary2DEmbedding(16), 2),
        ("rope3d-interleaved", posenc.Rotary3DEmbedding(12, interleaved=True), 3),
    ]  # fmt: skip


def positions_for(kind: str, b: int, n: int, axes: int) -> torch.Tensor | None:
    """Positions ``(n,)``/``(b, n)``, or coordinates ``(n, axes)``/``(b, n, axes)``."""
    torch.manual_seed(1)
    tail = (axes,) if axes else ()
    if kind == "default":
        return None
    if kind == "offset":
        return (torch.arange(37, 37 + n)[:, None] + torch.zeros(tail, dtype=torch.long)).squeeze(-1)
    if kind == "per-batch":
        return torch.randint(0, 50, (b, n, *tail))
    if kind == "scattered":
        return torch.randint(0, 5000, (n, *tail))
    assert kind == "float"
    return torch.rand(n, *tail, dtype=torch.float64) * 100


@pytest.mark.parametrize(
    "label, module, axes", modules(), ids=lambda v: v if isinstance(v, str) else ""
)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["default", "offset", "per-batch", "scattered", "float"])
def test_in_place_equals_out_of_place(
    label: str, module: torch.nn.Module, axes: int, dtype: torch.dtype, kind: str
) -> None:
    """q and k from a fused projection (grouped-query head counts), rotated in place: the
    same values as out of place, the same tensors returned, the projection's other columns
    untouched."""
    b, n, d = 2, 9, module.head_dim
    q, k = fused_qk(b, n, 4, 2, d, dtype)
    positions = positions_for(kind, b, n, axes)
    if positions is None and axes > 1:  # N-D coordinates have no default: refused, in place too
        for inplace in (False, True):
            with pytest.raises(ValueError, match="needs positions"):
                module(q, k, inplace=inplace)
        return
    with torch.no_grad():
        want_q, want_k = module(q, k, positions)
        fused_before = q._base.clone()
        got_q, got_k = module(q, k, positions, inplace=True)
    assert got_q is q and got_k is k
    tolerance = {"rtol": 2 * torch.finfo(dtype).eps, "atol": 1e-6}
    assert_close(q, want_q, **tolerance)
    assert_close(k, want_k, **tolerance)
    v_columns = fused_before[..., 6 * d :]
    assert torch.equal(q._base[..., 6 * d :], v_columns)


@pytest.mark.parametrize(
    "label, module, axes", modules(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_rotate_one_tensor_in_place(label: str, module: torch.nn.Module, axes: int) -> None:
    _, k = fused_qk(2, 7, 3, 3, module.head_dim, torch.float32)
    positions = positions_for("offset" if not axes else "per-batch", 2, 7, axes)
    with torch.no_grad():
        want = module.rotate(k, positions)
        assert module.rotate(k, positions, inplace=True) is k
    assert_close(k, want, rtol=1e-6, atol=1e-6)


def test_in_place_under_autograd_trains_like_out_of_place() -> None:
    """Gradients through RotaryEmbedding(inplace=True) on q, k from a fused projection equal
    those of the out-of-place call (xPos and axial too)."""
    torch.manual_seed(0)
    b, n, h, d = 2, 6, 2, 12
    proj = torch.nn.Linear(h * d, 3 * h * d).double()
    x = torch.randn(b, n, h * d, dtype=torch.float64)
    for module, positions in (
        (RotaryEmbedding(d, rotary_dim=8), torch.arange(3, 3 + n)),
        (XPos(d, interleaved=True), None),
        (posenc.Rotary3DEmbedding(d), torch.randint(0, 5, (b, n, 3))),
    ):
        grads = []
        for inplace in (False, True):
            proj.zero_grad()
            qkv = proj(x).view(b, n, 3, h, d)
            q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
            q, k = module(q, k, positions, inplace=inplace)
            (q @ k.transpose(-1, -2)).square().sum().backward()
            grads.append(proj.weight.grad.clone())
        assert_close(grads[1], grads[0], rtol=1e-12, atol=1e-12)


def test_in_place_gradcheck_through_a_module() -> None:
    rope = RotaryEmbedding(8, interleaved=True).double()
    positions = torch.tensor([4, 9, 2])

    def rotate(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope(q * 1, k * 1, positions, inplace=True)

    q = torch.randn(1, 2, 3, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(rotate, (q, k))


def test_in_place_refusals_in_modules() -> None:
    learned = RotaryEmbedding(8, learned_freq=True)
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(PosencValueError, match="learned"):
        learned(q.clone(), q.clone(), inplace=True)
    with torch.no_grad():  # without autograd the learned frequencies are just numbers
        learned(q.clone(), q.clone(), inplace=True)
    with pytest.raises(PosencValueError, match="q and k share memory"):
        RotaryEmbedding(8)(q, q, inplace=True)
    with pytest.raises(TypeError, match="inplace must be a bool"):
        RotaryEmbedding(8)(q, q.clone(), inplace="yes")


def _overlapping_rotations() -> list[tuple[str, torch.nn.Module, torch.Tensor | None]]:
    """(label, module, positions): the pair kernel call (one table), the decode lane (table
    rows read where they lie) and two tables (xPos: one rotation each)."""
    return [
        ("rope", RotaryEmbedding(8), None),
        ("rope-decode", RotaryEmbedding(8), torch.tensor([41])),
        ("rope-offset", RotaryEmbedding(8, interleaved=True), torch.arange(3, 8)),
        ("xpos", XPos(8), None),
    ]


@pytest.mark.parametrize("kernel", [NATIVE, "torch"])
@pytest.mark.parametrize("case", _overlapping_rotations(), ids=lambda c: c[0])
def test_in_place_refuses_q_and_k_that_partly_overlap(
    case: tuple, kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Views that share some elements (not their first) would turn those twice: refused by
    name, nothing written; neighbours that do not overlap (halves of one buffer, the heads of
    a fused projection) rotate as they would out of place."""
    _, module, positions = case
    monkeypatch.setenv("POSENC_ROTARY_KERNEL", kernel)
    n = 1 if positions is not None and positions.numel() == 1 else 5
    buf = torch.randn(1, 2, n, 16)
    before = buf.clone()
    with pytest.raises(PosencValueError, match=r"q and k share memory \(q at byte"):
        module(buf[..., :8], buf[..., 4:12], positions, inplace=True)
    assert torch.equal(buf, before)  # nothing turned before the refusal
    with pytest.raises(PosencValueError, match="q and k share memory"):  # k's last head, q's first
        module(buf[:, :1, :, 8:], buf.view(1, 2, n, 2, 8)[:, :, :, 1], positions, inplace=True)
    assert torch.equal(buf, before)
    want = module(buf[..., :8], buf[..., 8:], positions)
    got = module(buf[..., :8], buf[..., 8:], positions, inplace=True)
    assert got[0].data_ptr() == buf.data_ptr()
    assert_close(torch.cat(got, -1), torch.cat(want, -1), rtol=0, atol=0)
    q, k = fused_qk(2, n, 2, 1, 8, torch.float32)
    want = module(q, k, positions)
    got = module(q, k, positions, inplace=True)
    assert got[0] is q and got[1] is k
    assert_close(got, want, rtol=0, atol=0)


# --------------------------------------------------------------------------- compile, export


class FusedAttention(torch.nn.Module):
    """A fused qkv projection whose q and k are rotated in place, then attention."""

    def __init__(self, pe: torch.nn.Module, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.pe = pe

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        b, n, _ = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.heads, self.head_dim)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (b, h, n, d) views
        q, k = self.pe(q, k, positions, inplace=True)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return out.transpose(1, 2).reshape(b, n, -1)


@pytest.mark.slow
@pytest.mark.parametrize("pe", ["rope", "rope-interleaved", "xpos"])
def test_in_place_compiles_as_one_graph_and_trains(pe: str) -> None:
    """torch.compile(fullgraph=True) with inductor: forward and backward equal eager."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = FusedAttention(posenc.build(pe, head_dim=16))
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(2, 10, 32)
    positions = torch.arange(5, 15)
    with torch.no_grad():
        assert_close(compiled(x, positions), model(x, positions), rtol=1e-5, atol=1e-5)
    grads = []
    for run in (model, compiled):
        model.zero_grad()
        run(x, positions).square().sum().backward()
        grads.append(model.qkv.weight.grad.clone())
    assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("interleaved", [False, True])
def test_compiled_in_place_rotates_the_inputs_own_storage(
    interleaved: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without autograd, a compiled in-place rotation calls the fast path on q's and k's own
    storage (the ``posenc::rotary_`` operator), not a fresh tensor copied back: values equal
    the eager in-place rotation and the tensors keep their memory."""
    from posenc.encodings.rotary.kernels import ops

    torch._dynamo.reset()
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, interleaved=interleaved)
    compiled = torch.compile(lambda q, k, p: rope(q, k, p, inplace=True), fullgraph=True)
    q, k, positions = torch.randn(2, 3, 9, 16), torch.randn(2, 1, 9, 16), torch.arange(4, 13)
    want = rope(q.clone(), k.clone(), positions)
    calls = []
    fast = ops.turn_or_fallback

    def counted(kernel: object, x: torch.Tensor, out: torch.Tensor, *args: object) -> None:
        calls.append((x.data_ptr(), out.data_ptr()))
        fast(kernel, x, out, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ops, "turn_or_fallback", counted)
    pointers = (q.data_ptr(), k.data_ptr())
    with torch.no_grad():
        got = compiled(q, k, positions)
    assert got[0] is q or got[0].data_ptr() == pointers[0]
    assert (q.data_ptr(), k.data_ptr()) == pointers
    assert sorted(calls) == sorted((ptr, ptr) for ptr in pointers)
    assert_close(q, want[0], rtol=0, atol=0)
    assert_close(k, want[1], rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("interleaved", [False, True])
def test_compiled_out_of_place_is_one_operator_with_its_gradient(
    interleaved: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the native kernel is built, a compiled out-of-place rotation is the
    ``posenc::rotary`` operator (the kernel, one pass over memory): values and gradients equal
    eager's, and the backward is the same operator turning the gradient back."""
    from posenc.encodings.rotary.kernels import ops

    if native._native is None:
        pytest.skip("the native rotary kernel is not built here (no C compiler at install)")
    torch._dynamo.reset()
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, interleaved=interleaved)
    compiled = torch.compile(lambda q, k, p: rope(q, k, p), fullgraph=True)
    q, k, positions = torch.randn(2, 3, 9, 16), torch.randn(2, 1, 9, 16), torch.arange(4, 13)
    calls = []
    fast = ops.turn_or_fallback

    def counted(kernel: object, x: torch.Tensor, out: torch.Tensor, *args: object) -> None:
        calls.append(x.shape)
        fast(kernel, x, out, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ops, "turn_or_fallback", counted)
    grads = []
    for run in (rope, compiled):
        calls.clear()
        qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
        out = run(qg, kg, positions)
        (out[0].square().sum() + (out[1] * 3).sum()).backward()
        grads.append((out[0].detach(), out[1].detach(), qg.grad, kg.grad))
    assert len(calls) == 4  # the compiled forward (q, k) and backward (their gradients)
    for got, want in zip(grads[1], grads[0], strict=True):
        assert_close(got, want, rtol=0, atol=0)


@pytest.mark.slow
def test_in_place_exports() -> None:
    torch.manual_seed(0)
    model = FusedAttention(RotaryEmbedding(16)).eval()
    x, positions = torch.randn(2, 10, 32), torch.arange(3, 13)
    exported = torch.export.export(model, (x, positions))
    with torch.no_grad():
        assert_close(exported.module()(x, positions), model(x, positions), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated")
def test_export_sees_the_rotation_as_one_operator() -> None:
    """torch.export keeps ``posenc::rotary`` (where the native kernel is built) through
    ``run_decompositions``, and the program equals the eager Encoder; an ONNX export gets the
    formula instead (tests/model/test_encoder.py runs it in onnxruntime)."""

    torch.manual_seed(0)
    encoder = posenc.Encoder(16, 1, 2, pe="rope").eval()
    x = torch.randn(2, 8, 16)
    program = torch.export.export(encoder, (x,)).run_decompositions()
    targets = {str(node.target) for node in program.graph.nodes}
    assert ("posenc.rotary.default" in targets) == (native._native is not None), targets
    with torch.no_grad():
        assert_close(program.module()(x), encoder(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("per_batch", [False, True])
def test_one_call_rotates_q_and_k_inside_a_fused_projection(
    interleaved: bool, per_batch: bool
) -> None:
    """The recipe for attention with a fused qkv projection: rotate the heads-last
    ``(b, n, 2, h, d)`` slice holding q and k in one in-place call, with the module's tables
    given two unit axes, and only then unbind; equal to rotating q and k (values and
    gradients), and v untouched."""
    torch.manual_seed(0)
    b, n, h, d = 2, 7, 3, 8
    rope = RotaryEmbedding(d, interleaved=interleaved).double()
    proj = torch.nn.Linear(h * d, 3 * h * d).double()
    x = torch.randn(b, n, h * d, dtype=torch.float64)
    positions = torch.randint(0, 50, (b, n)) if per_batch else torch.arange(4, 4 + n)
    cos, sin = rope.cos_sin(positions, n, dtype=torch.float64)  # (n, r/2) or (b, 1, n, r/2)
    heads_last = (cos.squeeze(1) if per_batch else cos)[..., None, None, :]
    heads_last_sin = (sin.squeeze(1) if per_batch else sin)[..., None, None, :]

    def attention_inputs(fused: bool) -> tuple[torch.Tensor, ...]:
        qkv = proj(x).view(b, n, 3, h, d)
        if fused:
            posenc.apply_rotary_(qkv[:, :, :2], heads_last, heads_last_sin, interleaved=interleaved)
            return tuple(t.transpose(1, 2) for t in qkv.unbind(2))
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
        return (*rope(q, k, positions), v)

    grads = []
    for fused in (False, True):
        proj.zero_grad()
        q, k, v = attention_inputs(fused)
        (q @ k.transpose(-1, -2) @ v).square().sum().backward()
        grads.append((q.detach(), k.detach(), v.detach(), proj.weight.grad.clone()))
    for want, got in zip(*grads, strict=True):
        assert_close(got, want, rtol=1e-12, atol=1e-12)
