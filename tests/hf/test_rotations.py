"""The lean path of a patched transformers model (``src/posenc/hf/rotations.py`` and the
tables of ``src/posenc/hf/patch.py``): the rotary module gathers its rows from the rope's
float32 tables and marks full-width tables for the C kernel; the patched apply function
turns q and k by that mark. Each is checked against the path it stands in for (the rope's
own ``cos_sin``, the selector's rotation: equal bit for bit) and against transformers' own
apply function run in float64 on the same tables (one rounding).

Dimension legend: ``b`` batch, ``h`` heads, ``n`` positions, ``d`` head size.
"""

from __future__ import annotations

import importlib

import pytest
import torch

transformers = pytest.importorskip("transformers")

import posenc.hf  # noqa: E402
from posenc.encodings.rotary.kernels import native  # noqa: E402
from posenc.errors import PosencValueError  # noqa: E402
from posenc.hf import rotations  # noqa: E402
from posenc.hf.rows import gathered, read  # noqa: E402
from tests.native import NEEDS_KERNEL  # noqa: E402

patch_module = importlib.import_module("posenc.hf.patch")
rows_module = importlib.import_module("posenc.hf.rows")

MODELING = transformers.models.llama.modeling_llama
HEADS, KV_HEADS, D = 4, 2, 16


def _patched() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=HEADS * D,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=100,
        max_position_embeddings=256,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    posenc.hf.patch(model)
    return model


def _rope(model: torch.nn.Module):
    return model.model.rotary_emb.__dict__[patch_module.TABLES].ropes[None]


def _apply():
    """posenc's apply function for Llama, as the patch makes it."""
    return rotations.rotation(
        "llama",
        MODELING.apply_rotary_pos_emb,
        "apply_rotary_pos_emb",
        tables_interleaved=False,
        pairs_interleaved=False,
    )


def _qk(b: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k as Llama's attention makes them: projections' outputs, viewed and transposed."""
    g = torch.Generator().manual_seed(n)
    q = torch.randn(b, n, HEADS * D, generator=g).to(dtype).view(b, n, HEADS, D).transpose(1, 2)
    k = torch.randn(b, n, KV_HEADS * D, generator=g).to(dtype).view(b, n, KV_HEADS, D)
    return q, k.transpose(1, 2)


def _float64(q, k, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' own apply function in float64 on the same tables."""
    return MODELING.apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double())


def _within_one_rounding(got: torch.Tensor, want: torch.Tensor) -> None:
    ulp = torch.finfo(got.dtype).eps
    error = float((got.double() - want).abs().max() / want.abs().max())
    assert error <= ulp, (error, ulp)


POSITIONS = {
    "decode": [[7]],
    "run": [list(range(100, 140))],
    "rows that differ": [list(range(32)), [0, 0, 0, *range(29)]],  # (left padding)
    "few": [[3, 1, 2]],
}


@pytest.mark.parametrize("ids", POSITIONS.values(), ids=POSITIONS.keys())
def test_gathered_rows_are_the_ropes_own(ids: list) -> None:
    model = _patched()
    rope, position_ids = _rope(model), torch.tensor(ids)
    want = read(rope, position_ids)
    joints: dict = {}
    for full in (False, True):
        got = gathered(rope, position_ids, joints, full, full)
        assert got is not None
        for g, w in zip(got, want, strict=True):
            assert g.shape == (*position_ids.shape, D if full else D // 2)
            assert torch.equal(g, torch.cat((w, w), -1) if full else w)
    # the patched module's tables: cat(freqs, freqs), as transformers' module gives them
    x = torch.zeros(position_ids.shape[0], position_ids.shape[1], HEADS * D)
    cos, sin = model.model.rotary_emb(x, position_ids)
    assert torch.equal(cos, torch.cat((want[0], want[0]), -1))
    assert torch.equal(sin, torch.cat((want[1], want[1]), -1))


def test_positions_outside_the_table_take_the_ropes_path() -> None:
    """A position past the table: the rope's path (its formula, or a grown table; the joint
    table follows); a negative one: the rope's error."""
    model = _patched()
    rope = _rope(model)
    far = torch.tensor([[rope.cos_cached.shape[0] + 5]])
    assert gathered(rope, far, {}, None, True) is None
    cos, _ = model.model.rotary_emb(torch.zeros(1, 1, HEADS * D), far)
    assert torch.equal(cos[..., : D // 2], read(rope, far)[0])
    rope.reset_tables(rope.cos_cached.shape[0] + 8)  # the tables grow: the joint one is remade
    joints: dict = {}
    got = gathered(rope, far, joints, None, False)
    assert got is not None and torch.equal(got[0], read(rope, far)[0])
    assert joints[None][0] is rope.cos_cached
    with pytest.raises(PosencValueError, match="position"):
        model.model.rotary_emb(torch.zeros(1, 1, HEADS * D), torch.tensor([[-1]]))


@NEEDS_KERNEL
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("ids", POSITIONS.values(), ids=POSITIONS.keys())
def test_the_prepared_rotation_is_the_selected_one(ids: list, dtype: torch.dtype) -> None:
    model, apply = _patched(), _apply()
    position_ids = torch.tensor(ids)
    b, n = position_ids.shape
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(torch.zeros(b, n, HEADS * D), position_ids)
        assert getattr(cos, rotations.PREPARED)[0] is sin
        q, k = _qk(b, n, dtype)
        want = _float64(q, k, cos, sin)
        selected = apply(q.clone(), k.clone(), cos.clone(), sin.clone())  # (unmarked tables)
        got = apply(q, k, cos, sin)
    assert got[0] is q and got[1] is k  # in their own storage
    for g, s, w in zip(got, selected, want, strict=True):
        assert torch.equal(g, s)
        _within_one_rounding(g, w)


@NEEDS_KERNEL
def test_the_rotation_reads_what_the_tables_hold() -> None:
    """The mark describes the tables' own memory: a change made to them after the rotary
    module gave them is what the rotation reads."""
    model, apply = _patched(), _apply()
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(torch.zeros(1, 8, HEADS * D), torch.arange(8)[None])
        cos.mul_(0.5)
        sin[..., 0] = 1.0
        sin[..., D // 2] = 1.0
        q, k = _qk(1, 8, torch.float32)
        want = _float64(q, k, cos, sin)
        got = apply(q, k, cos, sin)
    for g, w in zip(got, want, strict=True):
        _within_one_rounding(g, w)


@NEEDS_KERNEL
def test_a_key_the_kernel_refuses_is_turned_on_its_own() -> None:
    """A key of one head expanded over two (stride 0: no kernel writes it in place): the
    prepared call, which checks both before it writes, turns neither; then q turns in place,
    k into a new tensor."""
    model, apply = _patched(), _apply()
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(torch.zeros(1, 8, HEADS * D), torch.arange(8)[None])
        q, _ = _qk(1, 8, torch.float32)
        k = torch.randn(1, 1, 8, D).expand(1, KV_HEADS, 8, D)
        want = _float64(q, k, cos, sin)
        got = apply(q, k, cos, sin)
    assert got[0] is q and got[1] is not k
    for g, w in zip(got, want, strict=True):
        _within_one_rounding(g, w)


@NEEDS_KERNEL
def test_q_and_k_in_one_storage_take_the_selected_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """q and k sliced from one fused projection: the prepared call turns neither, the
    selector's path turns both, and the values beside them stay as they were."""
    model, apply = _patched(), _apply()
    turned = []
    inner = rotations.turn_prepared_pair
    monkeypatch.setattr(
        rotations, "turn_prepared_pair", lambda *a: turned.append(inner(*a)) or turned[-1]
    )
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(torch.zeros(1, 8, HEADS * D), torch.arange(8)[None])
        qkv = torch.randn(1, 8, 3, HEADS, D)  # (b, n, q/k/v, h, d)
        v = qkv[:, :, 2].clone()
        q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
        want = _float64(q, k, cos, sin)
        got = apply(q, k, cos, sin)
    assert turned == [False]
    assert torch.equal(qkv[:, :, 2], v)
    for g, w in zip(got, want, strict=True):
        _within_one_rounding(g, w)


def test_under_autograd_the_rotation_is_out_of_place() -> None:
    """With autograd on, the rotation is the selector's (out of place, differentiable),
    whatever the mark."""
    model, apply = _patched(), _apply()
    cos, sin = model.model.rotary_emb(torch.zeros(1, 8, HEADS * D), torch.arange(8)[None])
    q, k = _qk(1, 8, torch.float32)
    q.requires_grad_()
    want = _float64(q.detach(), k, cos, sin)
    got = apply(q, k, cos, sin)
    assert got[0] is not q and got[0].requires_grad
    for g, w in zip(got, want, strict=True):
        _within_one_rounding(g.detach(), w)


@NEEDS_KERNEL
@pytest.mark.parametrize("ids", POSITIONS.values(), ids=POSITIONS.keys())
def test_the_lean_module_call_is_the_first_calls(
    ids: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the joint table exists, the patched module takes :func:`~posenc.hf.rows.lean`:
    the same tables bit for bit as the first call's (:func:`gathered`), marked with the same
    descriptions as :func:`~posenc.hf.rotations.prepare` makes, and the rotation by them is
    the selector's."""
    model, apply = _patched(), _apply()
    position_ids = torch.tensor(ids)
    b, n = position_ids.shape
    x = torch.zeros(b, n, HEADS * D)
    leaned = []
    inner = patch_module.lean
    monkeypatch.setattr(patch_module, "lean", lambda *a: leaned.append(inner(*a)) or leaned[-1])
    with torch.no_grad():
        first = model.model.rotary_emb(x, position_ids)  # (makes the joint table)
        cos, sin = model.model.rotary_emb(x, position_ids)
        assert leaned[0] is None and leaned[1] is not None
        for g, w in zip((cos, sin), first, strict=True):
            assert g.dtype is torch.float32 and torch.equal(g, w)
        mark = getattr(cos, rotations.PREPARED)
        assert mark[0] is sin
        if native._native is not None:
            tables = native.prepare_tables(cos, sin)
            assert mark[1] == tuple(rotations._first_half(t) for t in tables)
        q, k = _qk(b, n, torch.float32)
        selected = apply(q.clone(), k.clone(), cos.clone(), sin.clone())  # (unmarked tables)
        got = apply(q, k, cos, sin)
    for g, s in zip(got, selected, strict=True):
        assert torch.equal(g, s)


def test_the_lean_module_call_falls_back() -> None:
    """int32 or 1-D positions, positions past the table, a grown table and empty
    positions take the first path, with its values."""
    model = _patched()
    rope = _rope(model)
    module = model.model.rotary_emb
    with torch.no_grad():
        module(torch.zeros(1, 1, HEADS * D), torch.tensor([[3]]))  # (makes the joint table)
        joint = module.__dict__[patch_module.TABLES].joints[None]
        size = rope.cos_cached.shape[0]
        for position_ids in (
            torch.tensor([[3, 9]], dtype=torch.int32),
            torch.tensor([[size + 2]]),
            torch.tensor([[1.0]]).long()[:, :0],
        ):
            assert rows_module.lean(rope, position_ids, joint) is None
        cos, _ = module(torch.zeros(1, 2, HEADS * D), torch.tensor([[3, 9]], dtype=torch.int32))
        assert torch.equal(cos[..., : D // 2], read(rope, torch.tensor([[3, 9]]))[0])
        rope.reset_tables(size + 8)  # a new table: the old joint one is not read
        assert rows_module.lean(rope, torch.tensor([[size + 2]]), joint) is None
        cos, _ = module(torch.zeros(1, 1, HEADS * D), torch.tensor([[size + 2]]))
        assert torch.equal(cos[..., : D // 2], read(rope, torch.tensor([[size + 2]]))[0])
