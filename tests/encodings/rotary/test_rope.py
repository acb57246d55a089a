"""RoPE (``src/posenc/encodings/rotary/rope.py``): float64 formula, peers (rotary-embedding-torch,
transformers), the relative property, positions/offsets/caches, precision after casts,
gradients and bad input (the models: test_rope_in_models.py). xPos and axial RoPE have their
own files (test_xpos.py, test_axial.py); the arithmetic is in ../kernels/."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc import (
    AxialRotaryEmbedding,
    RotaryEmbedding,
    XPos,
    apply_rotary,
    build,
)
from posenc.errors import MemoryBudgetError
from tests.misuse import Misuse, cases, check

# --------------------------------------------------------------------------- reference


def rope_reference(
    x: torch.Tensor,
    angles: torch.Tensor,
    *,
    interleaved: bool,
    scale: torch.Tensor | float = 1.0,
) -> torch.Tensor:
    """RoFormer eq. 34 in float64, pair by pair with explicit 2x2 rotation matrices.

    x ``(..., n, d)``; angles ``(..., n, r/2)`` broadcastable; returns float64."""
    x = x.double()
    out = x.clone()
    half = angles.shape[-1]
    for i in range(half):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
        theta = angles[..., i].double()
        s = scale[..., i] if isinstance(scale, torch.Tensor) else scale
        rot = torch.stack(
            (
                torch.stack((theta.cos(), -theta.sin()), -1),
                torch.stack((theta.sin(), theta.cos()), -1),
            ),
            -2,
        )  # (..., n, 2, 2)
        pair = torch.stack((x[..., a], x[..., b]), -1).unsqueeze(-1)  # (..., n, 2, 1)
        rotated = (rot * s if isinstance(s, float) else rot * s[..., None, None]) @ pair
        out[..., a], out[..., b] = rotated[..., 0, 0], rotated[..., 1, 0]
    return out


def inv_freq64(r: int, base: float = 10000.0) -> torch.Tensor:
    return base ** -(torch.arange(0, r, 2, dtype=torch.float64) / r)


def qk(
    b: int = 2, h: int = 3, n: int = 10, d: int = 16, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(b, h, n, d, dtype=dtype), torch.randn(b, h, n, d, dtype=dtype)


# --------------------------------------------------------------------------- formula


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 8, 2])
def test_matches_float64_formula(interleaved: bool, rotary_dim: int | None) -> None:
    rope = RotaryEmbedding(16, rotary_dim=rotary_dim, interleaved=interleaved, base=500.0)
    r = rotary_dim or 16
    q, k = qk(dtype=torch.float64)
    positions = torch.tensor([0, 1, 2, 7, 100, 1000, 5, 3, 9, 40000])
    got_q, got_k = rope(q, k, positions)
    angles = positions.double()[:, None] * inv_freq64(r, 500.0)
    assert_close(got_q, rope_reference(q, angles, interleaved=interleaved), rtol=1e-12, atol=1e-12)
    assert_close(got_k, rope_reference(k, angles, interleaved=interleaved), rtol=1e-12, atol=1e-12)
    assert torch.equal(got_q[..., r:], q[..., r:])  # partial rotary passes the rest through


@pytest.mark.parametrize("interleaved", [False, True])
def test_float32_is_exact_to_float32_rounding_at_far_positions(interleaved: bool) -> None:
    rope = RotaryEmbedding(64, interleaved=interleaved)
    q, k = qk(1, 2, 6, 64)
    positions = torch.tensor([0, 4000, 65535, 100_000, 500_000, 1_000_000])
    got_q, _ = rope(q, k, positions)
    want = rope_reference(q, positions.double()[:, None] * inv_freq64(64), interleaved=interleaved)
    assert got_q.dtype == torch.float32
    assert_close(got_q.double(), want, rtol=0.0, atol=2e-6)


def test_learned_frequencies_start_at_the_formula_and_train() -> None:
    rope = RotaryEmbedding(8, learned_freq=True)
    fixed = RotaryEmbedding(8)
    q, k = qk(d=8)
    assert_close(rope(q, k)[0], fixed(q, k)[0], rtol=1e-6, atol=1e-6)
    rope(q, k)[0].square().sum().backward()
    assert rope.freq.grad is not None and rope.freq.grad.abs().sum() > 0


# --------------------------------------------------------------------------- peers


def test_half_layout_matches_transformers_llama() -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=64, num_attention_heads=2, max_position_embeddings=4096)
    hf = LlamaRotaryEmbedding(config)
    q, k = qk(2, 2, 50, 32)
    positions = torch.randint(0, 3000, (2, 50))
    cos, sin = hf(q, positions)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    got_q, got_k = RotaryEmbedding(32)(q, k, positions)
    # transformers forms float32 angles: ~3000 * 6e-8 rad off at most
    assert_close(got_q, want_q, rtol=1e-3, atol=1e-3)
    assert_close(got_k, want_k, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_interleaved_matches_rotary_embedding_torch(rotary_dim: int) -> None:
    ret = pytest.importorskip("rotary_embedding_torch")
    peer = ret.RotaryEmbedding(rotary_dim)
    q, k = qk(2, 3, 200, 16)
    want_q, want_k = peer.rotate_queries_or_keys(q), peer.rotate_queries_or_keys(k)
    got_q, got_k = RotaryEmbedding(16, rotary_dim=rotary_dim, interleaved=True)(q, k)
    assert_close(got_q, want_q, rtol=1e-4, atol=1e-4)
    assert_close(got_k, want_k, rtol=1e-4, atol=1e-4)
    assert_close(build("rope-interleaved", head_dim=16, rotary_dim=rotary_dim)(q, k)[0], got_q)


# --------------------------------------------------------------------------- relative property


def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-2, -1)


@pytest.mark.parametrize(
    "module",
    [
        RotaryEmbedding(16),
        RotaryEmbedding(16, interleaved=True, rotary_dim=8),
        RotaryEmbedding(
            16, scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
        ),
        XPos(16, center=0.0),
    ],
    ids=["half", "interleaved-partial", "yarn", "xpos"],
)
def test_scores_depend_only_on_relative_position(module: torch.nn.Module) -> None:
    """<R(m) q, R(n) k> = <R(m+s) q, R(n+s) k> for every shift s (RoFormer eq. 16)."""
    q, k = qk(1, 2, 12, 16, dtype=torch.float64)
    positions = torch.randint(0, 50, (12,))
    base = _scores(*module(q, k, positions))
    for shift in (1, 17, 900):
        assert_close(_scores(*module(q, k, positions + shift)), base, rtol=1e-9, atol=1e-9)
    # and it really is position-dependent
    assert not torch.allclose(_scores(*module(q, k, positions.flip(0))), base)


# --------------------------------------------------------------------------- positions & caches


@pytest.mark.parametrize("interleaved", [False, True])
def test_explicit_arange_equals_default_exactly(interleaved: bool) -> None:
    rope = RotaryEmbedding(16, interleaved=interleaved)
    q, k = qk()
    default = rope(q, k)
    for positions in (torch.arange(10), torch.arange(10)[None].expand(2, 10), torch.arange(10.0)):
        got = rope(q, k, positions)
        assert torch.equal(got[0], default[0]) and torch.equal(got[1], default[1])


def test_slice_at_an_offset_equals_rows_of_the_full_run() -> None:
    rope = RotaryEmbedding(16)
    q, k = qk(n=60)
    full_q, full_k = rope(q, k)
    part_q, part_k = rope(q[:, :, 40:50], k[:, :, 40:50], torch.arange(40, 50))
    assert torch.equal(part_q, full_q[:, :, 40:50]) and torch.equal(part_k, full_k[:, :, 40:50])
    assert torch.equal(rope.rotate(k[:, :, 40:50], torch.arange(40, 50)), full_k[:, :, 40:50])


def test_tables_grow_on_demand_without_stale_rows() -> None:
    rope = RotaryEmbedding(16)
    q, k = qk(n=4)
    rope(q, k)
    assert rope.cos_cached.shape[0] == RotaryEmbedding.initial_table_size
    near = torch.tensor([10, 500, 2000, 4000])  # within the table
    got = rope(q, k, near)
    assert rope.cos_cached.shape[0] == RotaryEmbedding.initial_table_size
    fresh = RotaryEmbedding(16)(q.double(), k.double(), near)  # float64: no table at all
    assert_close(got[0].double(), fresh[0], rtol=0, atol=3e-6)
    q, k = qk(n=5000)  # a longer sequence: the table doubles to cover it
    got = rope(q, k)
    assert rope.cos_cached.shape[0] == 2 * RotaryEmbedding.initial_table_size
    fresh = RotaryEmbedding(16)(q.double(), k.double())
    assert_close(got[0].double(), fresh[0], rtol=0, atol=3e-6)


def test_far_position_does_not_build_a_table_up_to_it() -> None:
    """One new token at position 10^9 (a long KV cache): the angles of that position only,
    the same float32 values a table row would hold, and the table stays as it was."""
    rope = RotaryEmbedding(16)
    q, k = qk(n=1)
    got_q, got_k = rope(q, k, torch.tensor([10**9]))
    assert rope.cos_cached.shape[0] == RotaryEmbedding.initial_table_size  # not grown
    angles = torch.tensor([1e9], dtype=torch.float64)[:, None] * inv_freq64(16)  # (1, 8)
    expected_q = rope_reference(q, angles, interleaved=False)
    assert_close(got_q.double(), expected_q, rtol=0, atol=1e-5)
    assert_close(got_k.double(), rope_reference(k, angles, interleaved=False), rtol=0, atol=1e-5)
    # and a second call near 0 reads the usual table
    rope(q, k, torch.tensor([3]))
    assert rope.cos_cached.shape[0] == RotaryEmbedding.initial_table_size


def test_cast_to_bfloat16_keeps_float32_tables_and_bf16_rounding_at_100k() -> None:
    rope = RotaryEmbedding(64)
    rope(*qk(d=64))  # build tables first, then cast
    rope = rope.to(torch.bfloat16)
    assert rope.cos_cached.dtype == torch.float32 and rope.inv_freq.dtype == torch.float64
    q, k = qk(1, 2, 5, 64, dtype=torch.bfloat16)
    positions = torch.tensor([0, 4000, 65537, 99_999, 100_000])
    got_q, got_k = rope(q, k, positions)
    assert got_q.dtype == torch.bfloat16
    angles = positions.double()[:, None] * inv_freq64(64)
    for got, x in ((got_q, q), (got_k, k)):
        want = rope_reference(x, angles, interleaved=False)
        # within one bf16 rounding of the exact value (relative 2^-8), plus fp32 noise
        assert_close(got.double(), want, rtol=2**-8, atol=1e-5)


def test_half_precision_inputs_are_rotated_in_float32_and_cast_once() -> None:
    rope = RotaryEmbedding(16)
    q, k = qk(dtype=torch.float16)
    got_q, _ = rope(q, k, torch.arange(1000, 1010))
    want_q, _ = rope(q.float(), k.float(), torch.arange(1000, 1010))
    assert torch.equal(got_q, want_q.half())


def test_to_empty_from_meta_rebuilds_frequencies_and_tables() -> None:
    meta = RotaryEmbedding(16, scaling={"rope_type": "linear", "factor": 2.0}, device="meta")
    real = meta.to_empty(device="cpu")
    q, k = qk()
    want = RotaryEmbedding(16, scaling={"rope_type": "linear", "factor": 2.0})(q, k)
    assert torch.equal(real(q, k)[0], want[0])


def test_tables_are_not_in_the_state_dict() -> None:
    rope = RotaryEmbedding(16)
    rope(*qk())
    assert rope.state_dict() == {}
    assert set(RotaryEmbedding(16, learned_freq=True).state_dict()) == {"freq"}


def test_dynamic_ntk_changes_the_base_under_cached_keys() -> None:
    """Dynamic NTK: a long call grows the base; keys cached from an earlier call were rotated
    with the old base, so they no longer equal a recomputation and their scores against new
    queries are no longer a function of m - n. A short call resets the base."""
    scaling = {"rope_type": "dynamic", "factor": 4.0}
    rope = RotaryEmbedding(16, scaling=scaling, max_position_embeddings=32)
    original = RotaryEmbedding(16)
    q, k = qk(1, 1, 64, 16, dtype=torch.float64)
    cached_k = rope.rotate(k[:, :, :20], torch.arange(20))  # prefill: the original base
    assert torch.equal(cached_k, original.rotate(k[:, :, :20], torch.arange(20)))

    rope.rotate(q[:, :, 60:], torch.arange(60, 64))  # decode at 63 > 32: the base grows
    stretch = 4.0 * 64 / 32 - 3.0  # factor * L / L0 - (factor - 1)
    assert_close(rope.inv_freq, inv_freq64(16, 1e4 * stretch ** (16 / 14)), rtol=1e-12, atol=0)
    # a recomputation of the whole cache (positions up to 63 keep the grown base)
    recomputed_k = rope.rotate(k, torch.arange(64))[:, :, :20]
    assert (recomputed_k - cached_k).abs().max() > 1e-2  # the cached keys are stale

    # one query and one key vector placed at every position
    q_at = rope.rotate(q[:, :, :1].expand(1, 1, 64, 16), torch.arange(64))[0, 0]  # (64, d)
    k_at = rope.rotate(k[:, :, :1].expand(1, 1, 64, 16), torch.arange(64))[0, 0]
    stale_k_at = original.rotate(k[:, :, :1].expand(1, 1, 20, 16), torch.arange(20))[0, 0]
    fresh = torch.stack([q_at[40 + i] @ k_at[i] for i in range(20)])  # all at m - n = 40
    stale = torch.stack([q_at[40 + i] @ stale_k_at[i] for i in range(20)])
    assert_close(fresh, fresh[:1].expand(20), rtol=1e-9, atol=1e-9)
    assert (stale - stale[0]).abs().max() > 1e-3  # no longer a function of m - n

    rope.rotate(k[:, :, :5], torch.arange(5))  # a short call: back to the original base
    assert torch.equal(rope.inv_freq, original.inv_freq)


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("r", [6, 4])
def test_apply_rotary_gradcheck(interleaved: bool, r: int) -> None:
    x = torch.randn(2, 2, 3, 6, dtype=torch.float64, requires_grad=True)
    angles = torch.rand(3, r // 2, dtype=torch.float64) * 10
    cos = angles.cos().requires_grad_()
    sin = angles.sin().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x, c, s: apply_rotary(x, c, s, interleaved=interleaved), (x, cos, sin)
    )


def test_modules_gradcheck() -> None:
    q, k = (t.requires_grad_() for t in qk(1, 2, 4, 8, dtype=torch.float64))
    coords = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1]])  # a 2 x 2 grid
    for module, positions in (
        (RotaryEmbedding(8), None),
        (XPos(8), None),
        (AxialRotaryEmbedding(8, ndim=2), coords),
    ):
        assert torch.autograd.gradcheck(lambda q, k, m=module, p=positions: m(q, k, p), (q, k))
    learned = RotaryEmbedding(8, learned_freq=True).double()
    assert torch.autograd.gradcheck(
        lambda f: torch.func.functional_call(learned, {"freq": f}, (q, k))[0],
        (learned.freq.detach().clone().requires_grad_(),),
    )


# --------------------------------------------------------------------------- bad input


NAN, INF = float("nan"), float("inf")
Q = torch.randn(2, 2, 5, 4)


def _rope(**kwargs: object) -> RotaryEmbedding:
    return RotaryEmbedding(**{"head_dim": 16, **kwargs})  # type: ignore[arg-type]


def _forward(q: object, k: object, positions: object = None) -> object:
    return RotaryEmbedding(16)(q, k, positions)


Q16, K16 = torch.randn(2, 3, 10, 16), torch.randn(2, 3, 10, 16)

MISUSE = [
    # construction
    Misuse("head-dim-odd", lambda: RotaryEmbedding(15), ValueError, "head_dim", 15),
    Misuse("head-dim-zero", lambda: RotaryEmbedding(0), ValueError, "head_dim", 0),
    Misuse("head-dim-float", lambda: RotaryEmbedding(16.0), TypeError, "head_dim", 16.0),
    Misuse("rotary-dim-odd", lambda: _rope(rotary_dim=7), ValueError, "rotary_dim", 7),
    Misuse("rotary-dim-wide", lambda: _rope(rotary_dim=32), ValueError, "rotary_dim", 32),
    Misuse("base-one", lambda: _rope(base=1.0), ValueError, "base", 1.0),
    Misuse("base-negative", lambda: _rope(base=-5), ValueError, "base", -5),
    Misuse("base-nan", lambda: _rope(base=NAN), ValueError, "base", NAN),
    Misuse("max-position-zero", lambda: _rope(max_position_embeddings=0), ValueError,
           "max_position_embeddings", 0),
    Misuse("scaling-str", lambda: _rope(scaling="yarn"), TypeError, "scaling", "str"),
    Misuse("scaling-list", lambda: _rope(scaling=[1]), TypeError, "scaling", "list"),
    Misuse("theta-conflict",
           lambda: _rope(base=7.0, scaling={"rope_type": "linear", "factor": 2, "rope_theta": 5.0}),
           ValueError, "rope_theta", 5.0),
    Misuse("theta-nan", lambda: _rope(scaling={"rope_theta": NAN}), ValueError, "base", NAN),
    Misuse("partial-conflict", lambda: _rope(rotary_dim=4, scaling={"partial_rotary_factor": 0.5}),
           ValueError, "partial_rotary_factor", 0.5),
    Misuse("partial-zero", lambda: _rope(scaling={"partial_rotary_factor": 0.0}), ValueError,
           "partial_rotary_factor", 0.0),
    Misuse("partial-nan", lambda: _rope(scaling={"partial_rotary_factor": NAN}), ValueError,
           "partial_rotary_factor", NAN),
    Misuse("learned-freq-dynamic",
           lambda: _rope(learned_freq=True, max_position_embeddings=16,
                         scaling={"rope_type": "dynamic", "factor": 2}),
           ValueError, "learned_freq", "dynamic"),
    Misuse("size-head-dim", lambda: RotaryEmbedding(10**10), MemoryBudgetError, "head_dim",
           10**10),
    Misuse("xpos-scale-base-zero", lambda: XPos(8, scale_base=0), ValueError, "scale_base", 0.0),
    Misuse("xpos-center-nan", lambda: XPos(8, center=NAN), ValueError, "center", NAN),
    Misuse("xpos-center-str", lambda: XPos(8, center="0"), TypeError, "center", "0"),
    Misuse("axial-ndim-zero", lambda: AxialRotaryEmbedding(8, ndim=0), ValueError, "ndim", 0),
    Misuse("axial-head-dim", lambda: AxialRotaryEmbedding(14, ndim=2), ValueError, "head_dim",
           14),
    Misuse("rope2d-head-dim", lambda: posenc.Rotary2DEmbedding(6), ValueError, "head_dim", 6),
    # forward
    Misuse("positions-length", lambda: _forward(Q16, K16, torch.arange(9)), ValueError,
           "positions", (9,)),
    Misuse("positions-batch", lambda: _forward(Q16, K16, torch.zeros(3, 10, dtype=torch.long)),
           ValueError, "positions", 3),
    Misuse("positions-negative", lambda: _forward(Q16, K16, torch.arange(10) - 1), ValueError,
           "positions", -1),
    Misuse("positions-bool", lambda: _forward(Q16, K16, torch.ones(10, dtype=torch.bool)),
           TypeError, "positions", torch.bool),
    Misuse("positions-nan",
           lambda: RotaryEmbedding(4)(Q, Q, torch.tensor([0.0, 1.0, NAN, 3.0, 4.0])),
           ValueError, "positions", NAN),
    Misuse("rotate-positions-inf",
           lambda: RotaryEmbedding(4).rotate(Q, torch.tensor([0.0, 1.0, INF, 3.0, 4.0])),
           ValueError, "positions", INF),
    Misuse("seq-mismatch", lambda: _forward(Q16, K16[:, :, :5]), ValueError, "k",
           (2, 3, 5, 16)),
    Misuse("k-head-dim", lambda: _forward(Q16, K16[..., :8]), ValueError, "k", 8),
    Misuse("q-head-dim", lambda: RotaryEmbedding(8)(Q, Q), ValueError, "q", 4),
    Misuse("q-rank", lambda: _forward(Q16[0], K16), ValueError, "q", (3, 10, 16)),
    Misuse("q-int", lambda: _forward(Q16.long(), K16), TypeError, "q", torch.int64),
    Misuse("q-list", lambda: _forward([1.0], [1.0]), TypeError, "q", "list"),
    Misuse("k-list", lambda: _forward(Q16, K16.tolist()), TypeError, "k", "list"),
    Misuse("axial-positions-shape",
           lambda: AxialRotaryEmbedding(16, ndim=2)(Q16, K16, torch.zeros(10, 3)), ValueError,
           "positions", (10, 3)),
    Misuse("axial-positions-nan",
           lambda: posenc.Rotary2DEmbedding(4)(Q, Q, torch.full((5, 2), NAN)), ValueError,
           "positions", NAN),
    # apply_rotary
    Misuse("apply-cos-sin-differ",
           lambda: apply_rotary(Q16, torch.zeros(10, 8), torch.zeros(10, 4)), ValueError, "cos",
           (10, 8)),
    Misuse("apply-too-wide", lambda: apply_rotary(Q16, torch.zeros(10, 9), torch.zeros(10, 9)),
           ValueError, "cos/sin", (10, 9)),
    Misuse("apply-cos-int",
           lambda: apply_rotary(Q, torch.ones(5, 2, dtype=torch.long),
                                torch.ones(5, 2, dtype=torch.long)),
           TypeError, "cos", torch.int64),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse_names_the_argument_and_the_value(case: Misuse) -> None:
    check(case)


def test_rotate_one_tensor_equals_forward() -> None:
    q, k = qk()
    positions = torch.arange(3, 13)
    xpos = XPos(16, center=5.0)
    want_q, want_k = xpos(q, k, positions)
    assert torch.equal(xpos.rotate(q, positions), want_q)
    assert torch.equal(xpos.rotate(k, positions, key=True), want_k)
    axial = AxialRotaryEmbedding(16, ndim=2)
    coords = torch.randint(0, 9, (10, 2))
    assert torch.equal(axial.rotate(k, coords), axial(q, k, coords)[1])


@pytest.mark.slow
def test_torch_compile_fullgraph_matches_eager() -> None:
    rope = RotaryEmbedding(
        16, scaling={"rope_type": "yarn", "factor": 2.0}, max_position_embeddings=64
    )
    q, k = qk()
    compiled = torch.compile(rope, fullgraph=True)
    got, want = compiled(q, k), rope(q, k)
    assert_close(got[0], want[0], rtol=1e-6, atol=1e-6)
    assert_close(got[1], want[1], rtol=1e-6, atol=1e-6)


def test_table_grown_under_inference_mode_still_trains() -> None:
    """A table that grew inside ``torch.inference_mode`` (evaluation at a longer length) must
    not be an inference tensor: a later training step saves cos/sin for backward."""
    rope = RotaryEmbedding(8)
    rope.reset_tables(16)  # a short table, so that 300 positions grow it
    q = torch.randn(1, 2, 300, 8)  # float32: read from the table (float64 never is)
    with torch.inference_mode():
        rope(q, q)  # grows the table
    leaf = q.clone().requires_grad_()
    rq, rk = rope(leaf, leaf)
    (rq.sum() + rk.sum()).backward()
    assert leaf.grad is not None
    assert not rope.cos_cached.is_inference()


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_narrow_integer_positions_are_positions_not_a_mask(dtype: torch.dtype) -> None:
    # torch reads a uint8 index as a boolean mask and refuses int8/int16 indices
    torch.manual_seed(0)
    q, k = qk(n=6)
    positions = torch.tensor([[3, 4, 5, 9, 10, 11], [7, 1, 2, 3, 4, 5]])
    angles = positions[:, None, :, None].double() * inv_freq64(16)
    for rope in (RotaryEmbedding(16), RotaryEmbedding(16, interleaved=True)):
        got_q, got_k = rope(q, k, positions.to(dtype))
        for got, x in ((got_q, q), (got_k, k)):
            want = rope_reference(x, angles, interleaved=rope.interleaved)
            assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
