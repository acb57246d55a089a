"""The feed-forward, encoder layer, encoder stack and model of ``posenc.model.encoder`` against
independent references (the layer against ``torch.nn.TransformerEncoderLayer`` with the same
weights, the feed-forward written out in float64), paths that must agree (inference and
autograd, explicit and default positions), the encoder with every registered scheme
(properties, ``torch.compile(fullgraph=True)``, ``torch.export`` and ONNX, safetensors), and
bad input.

Compilation (issue #8, part 2): one small encoder per family is compiled with the **inductor**
backend (real C++ code generation on this CPU, about 5-10 s per graph), every other scheme
with ``aot_eager`` (dynamo and AOTAutograd tracing, 1-2 s each): the compiled output equals
eager, the whole forward is one graph (``fullgraph=True`` raises on a graph break and
dynamo's counters show one graph), and a new batch size does not recompile.

Export (issue #8, part 3): encoders with the sinusoidal, learned, RoPE and ALiBi encodings are
exported with a dynamic sequence length (``torch.export.Dim``) and run at other lengths: the
exported program and the ONNX model (torch's dynamo exporter, run by onnxruntime; all in the
``test`` extra) give the eager output.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch._dynamo as dynamo
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch._dynamo.utils import counters
from torch.export import Dim
from torch.testing import assert_close

import posenc
from posenc import (
    ALiBi,
    Encoder,
    EncoderLayer,
    FeedForward,
    RotaryEmbedding,
    TransformerModel,
)
from posenc.errors import MemoryBudgetError
from tests.fuzzing import examples
from tests.misuse import Misuse, cases, check
from tests.schemes import FACTS, NAMES, SEQUENCE, coordinates, of_family

#: Schemes the encoder adds to its input (and NoPE): explicit positions through ``pe(x)``.
ADDED = [n for n in SEQUENCE if posenc.entry(n).family in ("additive", "none")]
ATOL, RTOL = 1e-5, 1e-5  # float32 against float32: compiled kernels may sum in another order


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_layer_matches_torch_transformer_encoder_layer(norm_first: bool, grad: bool) -> None:
    """With autograd on (out-of-place residuals) and off (residuals accumulated by the output
    projections' GEMMs, ReLU fused into the up-projection), and torch's side on its fused
    fast path when autograd is off."""
    dim, heads, ffn = 32, 4, 64
    ours = EncoderLayer(dim, heads, ffn_dim=ffn, norm_first=norm_first).double().eval()
    theirs = (
        nn.TransformerEncoderLayer(
            dim, heads, ffn, dropout=0.0, batch_first=True, norm_first=norm_first
        )
        .double()
        .eval()
    )
    with torch.no_grad():
        theirs.self_attn.in_proj_weight.copy_(ours.attn.qkv.weight)
        theirs.self_attn.in_proj_bias.copy_(ours.attn.qkv.bias)
        theirs.self_attn.out_proj.weight.copy_(ours.attn.out.weight)
        theirs.self_attn.out_proj.bias.copy_(ours.attn.out.bias)
        theirs.linear1.load_state_dict(ours.ffn.up.state_dict())
        theirs.linear2.load_state_dict(ours.ffn.down.state_dict())
        theirs.norm1.load_state_dict(ours.norm1.state_dict())
        theirs.norm2.load_state_dict(ours.norm2.state_dict())
    x = torch.randn(3, 9, dim, dtype=torch.float64)
    padding = torch.zeros(3, 9, dtype=torch.bool)
    padding[0, 6:] = True
    with torch.set_grad_enabled(grad):
        got = ours(x, key_padding_mask=padding)
        want = theirs(x, src_key_padding_mask=padding)
    assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward_equals_its_equation(activation: str) -> None:
    """``ffn(x) = act(x W1ᵀ + b1) W2ᵀ + b2``."""
    ffn = FeedForward(6, 10, activation=activation).double()  # type: ignore[arg-type]
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    act = torch.relu if activation == "relu" else torch.nn.functional.gelu
    expected = act(x @ ffn.up.weight.T + ffn.up.bias) @ ffn.down.weight.T + ffn.down.bias
    assert_close(ffn(x), expected, rtol=0, atol=1e-14)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_encoder_inference_equals_autograd_path(dropout: float) -> None:
    """Eval mode: the fused inference path equals the autograd path; train mode with dropout
    keeps the plain one (dropout before the residual add) and is seeded-reproducible."""
    torch.manual_seed(0)
    enc = Encoder(32, 2, 4, pe="rope", dropout=dropout).double().eval()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    with torch.no_grad():
        fused = enc(x)
    assert_close(fused, enc(x), rtol=0, atol=1e-12)
    enc.train()
    torch.manual_seed(1)
    first = enc(x)
    torch.manual_seed(1)
    assert torch.equal(first, enc(x))
    if dropout:
        assert not torch.allclose(first, fused)


def test_feed_forward_formula() -> None:
    ffn = FeedForward(6, 10).double()
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    expected = torch.relu(x @ ffn.up.weight.T + ffn.up.bias) @ ffn.down.weight.T + ffn.down.bias
    assert_close(ffn(x), expected, rtol=0, atol=1e-14)


def test_encoder_adds_additive_encoding_once() -> None:
    enc = Encoder(16, 2, 4, pe="sinusoidal").double().eval()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    manual = enc.pe(x)
    for layer in enc.layers:
        manual = layer(manual)
    assert_close(enc(x), enc.norm(manual), rtol=0, atol=0)


@pytest.mark.parametrize("pe", ADDED)
def test_encoder_positions_paths_agree(pe: str) -> None:
    enc = Encoder(16, 2, 2, pe=pe).eval()
    x = torch.randn(2, 6, 16)
    assert torch.equal(enc(x, positions=torch.arange(6)), enc(x))


def test_padding_does_not_leak() -> None:
    enc = Encoder(16, 2, 4, pe="sinusoidal").eval()
    x = torch.randn(1, 8, 16)
    pad = torch.zeros(1, 8, dtype=torch.bool)
    pad[0, 5:] = True
    y = enc(x, key_padding_mask=pad)
    x2 = x.clone()
    x2[0, 5:] = 100.0  # change only padded tokens
    assert_close(enc(x2, key_padding_mask=pad)[:, :5], y[:, :5])


def test_causal_does_not_see_future() -> None:
    enc = Encoder(16, 2, 4, pe="sinusoidal", causal=True).eval()
    x = torch.randn(1, 8, 16)
    x2 = x.clone()
    x2[0, 6:] = -3.0
    assert_close(enc(x2)[:, :6], enc(x)[:, :6])


def test_nope_encoder_is_permutation_equivariant() -> None:
    enc = Encoder(16, 2, 4, pe="none").double().eval()
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    perm = torch.randperm(7)
    assert_close(enc(x[:, perm]), enc(x)[:, perm], rtol=0, atol=1e-12)
    enc_pe = Encoder(16, 2, 4, pe="sinusoidal").double().eval()
    assert (enc_pe(x[:, perm]) - enc_pe(x)[:, perm]).abs().max() > 1e-3


@pytest.mark.parametrize("pe", [of_family(family)[0] for family in posenc.FAMILIES])
def test_model_embeds_scaled_and_predicts(pe: str) -> None:
    model = TransformerModel(50, 16, 1, 2, pe=pe, num_outputs=7).eval()
    tokens = torch.randint(0, 50, (3, 4))  # (4 tokens: a 2 x 2 grid, peg's default)
    logits = model(tokens)
    assert logits.shape == (3, 4, 7)
    x = model.embed(tokens) * 4.0  # sqrt(16)
    assert_close(logits, model.head(model.encoder(x)))


@pytest.mark.slow
def test_training_step_learns() -> None:
    torch.manual_seed(0)
    model = TransformerModel(10, 32, 2, 4, pe="sinusoidal")
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 10, (16, 8))
    losses = []
    for _ in range(30):  # learn to copy the input
        loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


# --------------------------------------------------------------------------- every scheme


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
    """The whole ``Encoder`` with each scheme: ``(b, n, D)`` in the input's dtype, finite,
    explicit positions (``arange``) equal to the default (N-D schemes take coordinates and
    refuse to run without them), and each row of the batch equal to that row run alone."""
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
        if cls.axes == 1:
            torch.testing.assert_close(encoder(x), out, atol=0.0, rtol=0.0)
        elif FACTS[name].full_grid:  # a full grid's default is the square one, if any
            side = math.isqrt(seq)
            if side * side == seq:
                square = coordinates(name, seq, coords)
                assert_close(encoder(x), encoder(x, positions=square), atol=0.0, rtol=0.0)
            else:
                with pytest.raises(ValueError, match="square"):
                    encoder(x)
        else:  # N-D schemes need coordinates
            with pytest.raises(ValueError, match="positions"):
                encoder(x)
        for b in range(batch):  # the batch is a batch: each row is that row run alone
            torch.testing.assert_close(encoder(x[b : b + 1], positions=explicit), out[b : b + 1])


def _model(name: str) -> posenc.TransformerModel:
    return posenc.TransformerModel(50, 24, 2, 2, pe=name, causal=True).eval()


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
        positions = coordinates(name, 9, positions)
    missing, unexpected = load_model(fresh, str(path))
    assert not missing and not unexpected
    with torch.no_grad():
        torch.testing.assert_close(
            fresh(tokens, positions=positions),
            model(tokens, positions=positions),
            atol=0.0,
            rtol=0.0,
        )


# --------------------------------------------------------------------------- torch.compile


#: One encoding per family, compiled with inductor.
FAMILY_REPRESENTATIVES = {
    "additive": "sinusoidal",
    "rotary": "rope",
    "bias": "alibi",
    "none": "none",
}
OTHERS = [n for n in NAMES if n not in FAMILY_REPRESENTATIVES.values()]


def _small_encoder(name: str) -> tuple[posenc.Encoder, torch.Tensor | None]:
    """A small encoder (width 24, 2 heads, head dim 12: even and divisible by 6, so the 3-D
    axial RoPE fits) and the positions its scheme needs (coordinates for N-D schemes)."""
    torch.manual_seed(0)
    encoder = posenc.Encoder(24, 2, 2, pe=name, causal=False).eval()
    axes = encoder.pe.axes
    positions = None
    if axes > 1:
        positions = torch.stack([torch.arange(8) % 3 + a for a in range(axes)], dim=-1)
        positions = coordinates(name, 8, positions)
    return encoder, positions


def _check_compiled_with_graph_breaks(name: str, backend: str) -> None:
    """A scheme that reads its grid from the positions' values (:attr:`Facts.full_grid`):
    compiled with graph breaks it equals eager; ``fullgraph=True`` is refused by dynamo."""
    dynamo.reset()
    encoder, positions = _small_encoder(name)
    x = torch.randn(2, 8, 24)
    with torch.no_grad():
        compiled = torch.compile(encoder, backend=backend)
        torch.testing.assert_close(
            compiled(x, positions=positions), encoder(x, positions=positions), atol=ATOL, rtol=RTOL
        )
        dynamo.reset()
        with pytest.raises(dynamo.exc.Unsupported, match=r"[Dd]ata-dependent"):
            torch.compile(encoder, fullgraph=True, backend=backend)(x, positions=positions)
    dynamo.reset()


def _check_compiled(name: str, backend: str) -> None:
    if FACTS[name].full_grid:
        _check_compiled_with_graph_breaks(name, backend)
        return
    dynamo.reset()
    counters.clear()
    encoder, positions = _small_encoder(name)
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
    encoder, _ = _small_encoder("rope")
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


# --------------------------------------------------------------------------- torch.export and ONNX


EXPORTED = ["sinusoidal", "learned", "rope", "alibi"]
TRACE_LEN, RUN_LENS = 8, (5, 13)


def _export_encoder(name: str, *, causal: bool = False) -> posenc.Encoder:
    torch.manual_seed(0)
    return posenc.Encoder(16, 2, 2, pe=name, causal=causal).eval()


def _dynamic_seq() -> dict[str, object]:
    # the learned table has 2048 rows: the exported program may be asked for at most that
    return {"x": {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=2, max=1024)}}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", EXPORTED)
def test_torch_export_dynamic_sequence_length(name: str, causal: bool) -> None:
    encoder = _export_encoder(name, causal=causal)
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
@pytest.mark.parametrize("name", EXPORTED)
def test_onnx_export_runs_in_onnxruntime_at_other_lengths(name: str, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extra")
    pytest.importorskip("onnxscript", reason="torch's dynamo ONNX exporter needs onnxscript")
    encoder = _export_encoder(name)
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


# --------------------------------------------------------------------------- bad input

NAN = float("nan")
X = torch.randn(2, 5, 8)

MISUSE = [
    Misuse("encoder-heads-indivisible", lambda: Encoder(12, 2, 5), ValueError, "num_heads", 5),
    Misuse("encoder-depth-zero", lambda: Encoder(8, 0, 2), ValueError, "depth", 0),
    Misuse("encoder-pe-unknown", lambda: Encoder(8, 1, 2, pe="nope"), ValueError,
           "positional encoding", "nope"),
    Misuse("encoder-pe-int", lambda: Encoder(8, 1, 2, pe=3), TypeError, "pe", "int"),
    Misuse("encoder-ffn-zero", lambda: Encoder(8, 1, 2, ffn_dim=0), ValueError, "ffn_dim", 0),
    Misuse("encoder-dropout-nan", lambda: Encoder(8, 1, 2, dropout=NAN), ValueError, "dropout",
           NAN),
    Misuse("encoder-activation", lambda: Encoder(8, 1, 2, activation="tanh"), ValueError,
           "activation", "tanh"),
    Misuse("encoder-pe-head-dim", lambda: Encoder(8, 1, 2, pe=RotaryEmbedding(8)), ValueError,
           "head_dim", 8),
    Misuse("encoder-pe-heads", lambda: Encoder(16, 1, 4, pe=posenc.build("alibi", num_heads=3)),
           ValueError, "num_heads", 3),
    Misuse("encoder-norm-first-str", lambda: Encoder(8, 1, 2, norm_first="no"), TypeError,
           "norm_first", "no"),
    Misuse("encoder-causal-int", lambda: Encoder(8, 1, 2, causal=1), TypeError, "causal", 1),
    Misuse("encoder-pe-kwargs-list", lambda: Encoder(8, 1, 2, pe="rope", pe_kwargs=[1]),
           TypeError, "pe_kwargs", "list"),
    Misuse("encoder-pe-kwargs-module", lambda: Encoder(8, 1, 2, pe=ALiBi(2), pe_kwargs={"a": 1}),
           TypeError, "pe_kwargs", {"a": 1}),
    Misuse("encoder-size", lambda: Encoder(10**6, 2, 4), MemoryBudgetError,
           "dim x depth x ffn_dim", "1000000 x 2 x 4000000"),
    Misuse("encoder-x-width", lambda: Encoder(8, 1, 2)(torch.zeros(1, 3, 9)), ValueError, "x", 9),
    Misuse("encoder-x-rank", lambda: Encoder(8, 1, 2)(torch.zeros(3, 8)), ValueError, "x",
           (3, 8)),
    Misuse("encoder-mask-shape",
           lambda: Encoder(8, 1, 2)(torch.zeros(1, 3, 8),
                                    key_padding_mask=torch.zeros(1, 4, dtype=torch.bool)),
           ValueError, "key_padding_mask", (1, 4)),
    Misuse("encoder-mask-float",
           lambda: Encoder(8, 1, 2)(torch.zeros(1, 3, 8), key_padding_mask=torch.zeros(1, 3)),
           TypeError, "key_padding_mask", torch.float32),
    Misuse("encoder-positions-length",
           lambda: Encoder(8, 1, 2)(torch.zeros(1, 3, 8), positions=torch.arange(4)),
           ValueError, "positions", (4,)),
    Misuse("encoder-learned-too-long",
           lambda: Encoder(8, 1, 2, pe="learned", pe_kwargs={"max_len": 4})(X), ValueError,
           "input has", 5),
    Misuse("encoder-positions-negative", lambda: Encoder(8, 1, 2)(X, positions=torch.arange(-2, 3)),
           ValueError, "positions", -2),
    Misuse("encoder-alibi-positions-inf",
           lambda: Encoder(8, 1, 2, pe="alibi")(X,
                                                positions=torch.tensor([0.0, 1, math.inf, 3, 4])),
           ValueError, "positions", math.inf),
    Misuse("model-vocab-zero", lambda: TransformerModel(0, 8, 1, 2), ValueError, "vocab_size", 0),
    Misuse("model-dim-zero", lambda: TransformerModel(10, 0, 1, 2), ValueError, "dim", 0),
    Misuse("model-padding-idx", lambda: TransformerModel(10, 8, 1, 2, padding_idx=20),
           ValueError, "padding_idx", 20),
    Misuse("model-num-outputs-zero", lambda: TransformerModel(10, 8, 1, 2, num_outputs=0),
           ValueError, "num_outputs", 0),
    Misuse("model-tokens-float", lambda: TransformerModel(10, 8, 1, 2)(torch.zeros(2, 3)),
           TypeError, "tokens", torch.float32),
    Misuse("model-tokens-range", lambda: TransformerModel(5, 8, 1, 2)(torch.tensor([[0, 5]])),
           ValueError, "token ids", "[0, 5]"),
    Misuse("model-size-vocab", lambda: TransformerModel(10**9, 64, 2, 4), MemoryBudgetError,
           "vocab_size x dim", "1000000000 x 64"),
    Misuse("ffn-hidden-zero", lambda: FeedForward(8, 0), ValueError, "hidden", 0),
    Misuse("layer-norm-first-str", lambda: EncoderLayer(8, 2, norm_first="yes"), TypeError,
           "norm_first", "yes"),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse_names_the_argument_and_the_value(case: Misuse) -> None:
    check(case)


# --------------------------------------------------------------------------- positions once


def _host_syncs(enc: Encoder, x: torch.Tensor, positions: torch.Tensor | None) -> int:
    """``aten::_local_scalar_dense`` calls (``.item()``, ``int(t)``, a tensor in an ``if``)
    in one forward after warm-up."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        enc(x, positions=positions)  # warm-up: tables grow here
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            enc(x, positions=positions)
    return sum(e.count for e in prof.key_averages() if e.key == "aten::_local_scalar_dense")


@pytest.mark.parametrize("pe", ["sinusoidal", "learned", "rope", "alibi", "t5"])
def test_host_syncs_do_not_grow_with_depth(pe: str) -> None:
    """Positions are resolved, and the encoding asked, once per forward: the host syncs of
    depth 4 and depth 8 are the same small constant with explicit positions, and zero with
    the default ones."""
    torch.manual_seed(0)
    x = torch.randn(2, 16, 32)
    explicit = torch.arange(16) + 3
    counts = {}
    for depth in (4, 8):
        enc = Encoder(32, depth, 4, pe=pe).eval()
        counts[depth] = (_host_syncs(enc, x, None), _host_syncs(enc, x, explicit))
    assert counts[4] == counts[8], counts
    default, given = counts[4]
    assert default == 0
    assert given <= 2  # validating the positions (and, for a table, their largest one)


def _operations_per_layer(pe: str) -> float:
    """Operations (torch profiler events) one more layer adds to an eval causal Encoder of
    width 64 and 4 heads at positions ``arange(128) + 7``: (depth 8 - depth 4) / 4."""
    from torch.profiler import ProfilerActivity, profile

    counts = []
    x, positions = torch.randn(1, 128, 64), torch.arange(128) + 7
    for depth in (4, 8):
        torch.manual_seed(0)
        enc = Encoder(64, depth, 4, pe=pe, causal=True).eval()
        with torch.no_grad():
            enc(x, positions=positions)  # tables built
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                enc(x, positions=positions)
        counts.append(sum(event.count for event in prof.key_averages()))
    return (counts[1] - counts[0]) / 4


@pytest.mark.parametrize("pe", ["t5", "alibi"])
def test_a_bias_scheme_adds_few_operations_per_layer(pe: str) -> None:
    """The bias, and its additive mask for SDPA, are made once per forward: a layer of a T5
    or ALiBi model runs at most 15 operations more than a layer of a NoPE model (T5 ran 18
    more when the mask was made again in each layer)."""
    assert _operations_per_layer(pe) - _operations_per_layer("none") <= 15


@pytest.mark.parametrize("pe", ["alibi", "t5", "kerple", "fire", "dpb"])
def test_bias_is_computed_once_per_forward(pe: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bias that reads neither q nor k is made at the first layer and reused by the rest;
    the result equals each layer asking for it (the MultiHeadAttention path)."""
    torch.manual_seed(0)
    enc = Encoder(16, 3, 2, pe=pe, backend="sdpa").double().eval()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    calls = []
    original = type(enc.pe).bias

    def counting(self: object, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(type(enc.pe), "bias", counting)
    with torch.no_grad():
        got = enc(x)
    assert len(calls) == 1
    h = x
    for layer in enc.layers:  # each layer asks the encoding itself, with autograd on
        h = layer(h, pe=enc.pe)
    assert_close(got, enc.norm(h), rtol=0, atol=1e-12)


@pytest.mark.parametrize("pe", ["rope", "xpos", "rope-interleaved", "alibi", "t5", "shaw"])
def test_position_state_equals_asking_each_layer(pe: str) -> None:
    """The Encoder's once-per-forward state gives the output of each layer asking the
    encoding with the same explicit positions (float64, autograd path)."""
    torch.manual_seed(0)
    enc = Encoder(16, 2, 2, pe=pe).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    positions = torch.tensor([[0, 2, 3, 5, 8, 9], [1, 2, 3, 4, 5, 6]])
    h = x
    for layer in enc.layers:
        h = layer(h, positions=positions, pe=enc.pe)
    assert_close(enc(x, positions=positions), enc.norm(h), rtol=0, atol=1e-12)


def test_causal_encoder_builds_unidirectional_t5_buckets() -> None:
    """T5's decoder sees one direction: a causal Encoder's T5 bias equals Hugging Face's
    ``T5Attention(is_decoder=True)`` bias; ``bidirectional`` given explicitly still wins."""
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    enc = Encoder(32, 1, 4, pe="t5", causal=True)
    assert enc.pe.bidirectional is False
    assert Encoder(32, 1, 4, pe="t5").pe.bidirectional is True
    kept = Encoder(32, 1, 4, pe="t5", causal=True, pe_kwargs={"bidirectional": True})
    assert kept.pe.bidirectional is True
    config = T5Config(d_model=32, d_kv=8, num_heads=4, is_decoder=True)
    hf = T5Attention(config, has_relative_attention_bias=True)
    with torch.no_grad():
        hf.relative_attention_bias.weight.copy_(enc.pe.relative_attention_bias.weight)
        want = hf.compute_bias(40, 40)[0]  # (h, q, k)
    got = enc.pe.bias(torch.arange(40), torch.arange(40))
    assert_close(got, want, rtol=0, atol=0)


# --------------------------------------------------------------------------- randomized


@pytest.mark.parametrize("pe", ["sinusoidal", "rope", "alibi", "learned"])
def test_encoder_random_positions_train_only(pe: str) -> None:
    """``Encoder(random_positions=L)`` feeds randomized positions in training (the same as
    passing them explicitly after the same draw) and the plain ones in evaluation."""
    torch.manual_seed(0)
    enc = Encoder(16, 2, 2, pe=pe, random_positions=64).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    torch.manual_seed(5)
    got = enc(x)
    torch.manual_seed(5)
    drawn = posenc.randomize_positions(None, 9, 64)
    enc.random_positions = None
    assert_close(got, enc(x, positions=drawn), rtol=0, atol=1e-12)
    enc.random_positions = 64
    enc.eval()
    assert_close(enc(x), enc(x, positions=torch.arange(9)), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"random_positions.*0"):
        Encoder(16, 1, 2, random_positions=0)
