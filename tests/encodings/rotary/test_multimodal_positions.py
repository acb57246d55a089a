"""The multimodal RoPE position builder against transformers' own ``get_rope_index`` and
decoding positions (Qwen2-VL, Qwen2.5-VL, Qwen3-VL).

``get_rope_index`` and ``compute_3d_position_ids`` read only a few config fields, the cached
``rope_deltas`` and the cache's length: they are called unbound on a stand-in holding those,
so no model is built, except in the one generation test, which runs a tiny Qwen2-VL model
and records the positions its language model is given at every step.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor

transformers = pytest.importorskip("transformers")

from posenc import (  # noqa: E402
    MemoryBudgetError,
    MultimodalRotaryEmbedding,
    RotaryEmbedding,
    continue_multimodal_positions,
    multimodal_positions,
    set_memory_budget,
)
from posenc.errors import PosencTypeError, PosencValueError  # noqa: E402
from tests.misuse import MISSING, Misuse, cases, check  # noqa: E402

transformers.logging.set_verbosity_error()

MODELS = {
    "qwen2-vl": ("qwen2_vl", "Qwen2VLModel"),
    "qwen2.5-vl": ("qwen2_5_vl", "Qwen2_5_VLModel"),
    "qwen3-vl": ("qwen3_vl", "Qwen3VLModel"),
}
TEXT, IMAGE, VIDEO = 0, 1, 2


def _model(name: str) -> Any:
    module, cls = MODELS[name]
    return getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), cls)


def stand_in(name: str, merge: int = 2, tokens_per_second: int | None = None) -> Any:
    """What ``get_rope_index`` / ``compute_3d_position_ids`` read of a model: the vision
    config's merge size (and Qwen2.5-VL's tokens per second), its own methods, rope_deltas."""
    model = _model(name)
    vision = SimpleNamespace(spatial_merge_size=merge, tokens_per_second=tokens_per_second)
    me = SimpleNamespace(config=SimpleNamespace(vision_config=vision), rope_deltas=None)
    me.get_vision_position_ids = functools.partial(model.get_vision_position_ids, me)
    me.get_rope_index = functools.partial(model.get_rope_index, me)
    return me


def tokens(*parts: tuple[int, int]) -> list[int]:
    """Token types from ``(kind, count)`` runs."""
    return [kind for kind, count in parts for _ in range(count)]


def batch(rows: list[list[int]], *, left: bool = True) -> tuple[Tensor, Tensor]:
    """Types and attention mask of ``rows`` padded to one length (left or right)."""
    n = max(map(len, rows))
    types, mask = [], []
    for row in rows:
        pad = [0] * (n - len(row))
        types.append(pad + row if left else row + pad)
        keep = [0] * len(pad), [1] * len(row)
        mask.append(keep[0] + keep[1] if left else keep[1] + keep[0])
    return torch.tensor(types), torch.tensor(mask)


# Two images of different grids (one wide: text after it continues at max(h, w) / m), videos
# of two frames, text between and after; one sequence opens with a video; the second is
# shorter (padded).
QWEN2_ROWS = [
    tokens((TEXT, 3), (IMAGE, 6), (TEXT, 2), (VIDEO, 8), (TEXT, 2), (IMAGE, 1), (TEXT, 2)),
    tokens((VIDEO, 8), (TEXT, 3), (IMAGE, 6), (TEXT, 1)),
]
QWEN2_IMAGES = torch.tensor([[1, 4, 6], [1, 2, 2], [1, 4, 6]])
QWEN2_VIDEOS = torch.tensor([[2, 4, 4], [2, 4, 4]])
# Qwen3-VL: each video frame its own block, separated by timestamp text
QWEN3_ROWS = [
    tokens((TEXT, 2), (IMAGE, 6), (TEXT, 2), (VIDEO, 4), (TEXT, 3), (VIDEO, 4), (TEXT, 2)),
    tokens((TEXT, 1), (VIDEO, 6), (TEXT, 2), (VIDEO, 6), (TEXT, 2), (VIDEO, 6), (TEXT, 1)),
]
QWEN3_IMAGES = torch.tensor([[1, 4, 6]])
QWEN3_VIDEOS = torch.tensor([[2, 4, 4], [3, 4, 6]])

CASES = {
    "qwen2-vl": (QWEN2_ROWS, QWEN2_IMAGES, QWEN2_VIDEOS, {}, {}),
    # 0.5 s and 1.7 s per grid step at 4 tokens per second: frames 2 and 6.8 positions apart
    "qwen2.5-vl": (
        QWEN2_ROWS,
        QWEN2_IMAGES,
        QWEN2_VIDEOS,
        {"second_per_grid_ts": torch.tensor([0.5, 1.7])},
        {"tokens_per_second": 4, "second_per_grid_ts": torch.tensor([0.5, 1.7])},
    ),
    "qwen3-vl": (QWEN3_ROWS, QWEN3_IMAGES, QWEN3_VIDEOS, {}, {"frames_as_images": True}),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("padding", ["left", "right", "none"])
def test_positions_and_deltas_equal_get_rope_index(name: str, padding: str) -> None:
    rows, images, videos, theirs_kw, ours_kw = CASES[name]
    if padding == "none":
        rows = [rows[0]]
        images = images[:2] if name != "qwen3-vl" else images
        videos = videos[:1]
    types, mask = batch(rows, left=padding == "left")
    input_ids = torch.randint(5, 100, types.shape, generator=torch.Generator().manual_seed(0))
    me = stand_in(name, tokens_per_second=ours_kw.get("tokens_per_second"))
    attention = None if padding == "none" else mask
    want, want_deltas = _model(name).get_rope_index(
        me,
        input_ids,
        mm_token_type_ids=types,
        image_grid_thw=images,
        video_grid_thw=videos,
        attention_mask=attention,
        **theirs_kw,
    )
    got, deltas = multimodal_positions(
        types, image_grid_thw=images, video_grid_thw=videos, attention_mask=attention, **ours_kw
    )
    assert got.dtype == torch.long and deltas.dtype == torch.long
    assert torch.equal(got, want)
    assert torch.equal(deltas, want_deltas)
    assert not torch.equal(got[0], got[1]) and not torch.equal(got[1], got[2])


def test_qwen2_5_temporal_spacing_differs_from_qwen2s() -> None:
    """The case above tells the families apart: Qwen2.5-VL's spaced frames differ."""
    rows, images, videos, _, ours_kw = CASES["qwen2.5-vl"]
    types, mask = batch(rows)
    grids = {"image_grid_thw": images, "video_grid_thw": videos, "attention_mask": mask}
    qwen2 = multimodal_positions(types, **grids)
    qwen25 = multimodal_positions(types, **grids, **ours_kw)
    assert not torch.equal(qwen2[0][0], qwen25[0][0])
    assert torch.equal(qwen2[0][1:], qwen25[0][1:])


def test_text_only_positions_are_plain_indices_and_deltas_zero() -> None:
    types, mask = batch([[TEXT] * 5, [TEXT] * 3])
    positions, deltas = multimodal_positions(types, attention_mask=mask)
    expected = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]])
    assert torch.equal(positions, expected.expand(3, -1, -1))
    assert deltas.tolist() == [[0], [0]]
    empty, deltas = multimodal_positions(types[:1], attention_mask=torch.zeros_like(types[:1]))
    assert not empty.any() and deltas.tolist() == [[0]]


class _Cache:
    def __init__(self, length: int) -> None:
        self.length = length

    def get_seq_length(self) -> int:
        return self.length


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("with_mask", [True, False])
def test_decoding_continues_as_compute_3d_position_ids(name: str, with_mask: bool) -> None:
    rows, images, videos, _, ours_kw = CASES[name]
    types, mask = batch(rows)
    _, deltas = multimodal_positions(
        types, image_grid_thw=images, video_grid_thw=videos, attention_mask=mask, **ours_kw
    )
    me = stand_in(name)
    me.rope_deltas = deltas
    b, n = types.shape
    for step, new in ((0, 1), (1, 1), (2, 3)):
        cache = n + step
        full = torch.cat((mask, torch.ones(b, step + new, dtype=torch.long)), 1)
        want = _model(name).compute_3d_position_ids(
            me,
            input_ids=None,
            inputs_embeds=torch.zeros(b, new, 4),
            image_grid_thw=None,
            video_grid_thw=None,
            attention_mask=full if with_mask else None,
            cache=_Cache(cache),
        )
        if with_mask:
            got = continue_multimodal_positions(deltas, new, attention_mask=full)
            want = want[..., -new:]  # (transformers numbers the whole mask)
        else:
            got = continue_multimodal_positions(deltas, new, cache_length=cache)
        assert torch.equal(got, want)


def test_beams_repeat_each_sequences_delta() -> None:
    deltas = torch.tensor([[-3], [5]])
    mask = torch.ones(4, 6, dtype=torch.long)
    got = continue_multimodal_positions(deltas, 2, attention_mask=mask)
    assert got[0].tolist() == [[1, 2], [1, 2], [9, 10], [9, 10]]


def test_a_tiny_qwen2_vl_generates_with_these_positions() -> None:
    """transformers' ``generate`` on a tiny Qwen2-VL (random weights) with a left-padded batch
    of two prompts holding an image: the positions its language model receives for the
    prompt and for every generated token are the builder's and its continuation."""
    config = transformers.Qwen2VLConfig(
        text_config={
            "hidden_size": 32,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "num_hidden_layers": 1,
            "intermediate_size": 32,
            "vocab_size": 64,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1e4,
                "mrope_section": [2, 3, 3],
            },
        },
        vision_config={
            "depth": 1,
            "embed_dim": 16,
            "hidden_size": 32,
            "num_heads": 2,
            "patch_size": 2,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
            "mlp_ratio": 1,
        },
        image_token_id=60,
        video_token_id=61,
        vision_start_token_id=62,
        vision_end_token_id=63,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2VLForConditionalGeneration(config).eval()
    seen: list[Tensor] = []
    language = model.model.language_model
    language.rotary_emb.register_forward_pre_hook(lambda _, args: seen.append(args[1].clone()))
    prompt = [5, 6, 62, 60, 60, 60, 60, 60, 60, 63, 7, 8]  # an image (1, 4, 6): 6 tokens
    ids = torch.tensor([prompt, [0, 0, *prompt[:-2]]])
    mask = (ids != 0).long()
    types = (ids == 60).long()
    grid = torch.tensor([[1, 4, 6], [1, 4, 6]])
    pixels = torch.randn(2 * 24, 3 * 2 * 2 * 2)
    steps = 3
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        pixel_values=pixels,
        image_grid_thw=grid,
        mm_token_type_ids=types,
        max_new_tokens=steps,
        min_new_tokens=steps,
        do_sample=False,
    )
    assert out.shape[1] == ids.shape[1] + steps and len(seen) == steps
    positions, deltas = multimodal_positions(types, image_grid_thw=grid, attention_mask=mask)
    assert torch.equal(seen[0][-3:], positions)
    full = torch.cat((mask, torch.ones(2, steps, dtype=torch.long)), 1)
    for step in range(1, steps):
        got = continue_multimodal_positions(
            deltas, 1, attention_mask=full[:, : ids.shape[1] + step]
        )
        assert torch.equal(seen[step][-3:], got)
    # and the module rotates with them as the model's own rotary module and apply do
    rope = RotaryEmbedding.from_hf_config(config)
    assert isinstance(rope, MultimodalRotaryEmbedding)
    q = torch.randn(2, 2, ids.shape[1], 16)
    cos, sin = language.rotary_emb(q, positions)
    modeling = importlib.import_module("transformers.models.qwen2_vl.modeling_qwen2_vl")
    want_q, want_k = modeling.apply_rotary_pos_emb(q, q[:, :1], cos, sin)
    got_q, got_k = rope(q, q[:, :1], positions)
    torch.testing.assert_close(got_q, want_q, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(got_k, want_k, atol=2e-5, rtol=2e-5)


def test_sizes_are_checked_against_the_memory_budget_before_allocating() -> None:
    types = torch.zeros(1, 10, dtype=torch.long)
    set_memory_budget(100)
    try:
        with pytest.raises(MemoryBudgetError, match="mm_token_type_ids"):
            multimodal_positions(types)
        with pytest.raises(MemoryBudgetError, match="num_new"):
            continue_multimodal_positions(torch.tensor([[0]]), 100, cache_length=0)
    finally:
        set_memory_budget(None)


def _build(**kwargs: Any) -> Callable[[], object]:
    types = torch.tensor([tokens((TEXT, 2), (IMAGE, 4), (TEXT, 1))])
    arguments = {"image_grid_thw": torch.tensor([[1, 4, 4]]), **kwargs}
    given = arguments.pop("mm_token_type_ids", types)
    return lambda: multimodal_positions(given, **arguments)


def _continue(deltas: Any = None, num_new: Any = 1, **kwargs: Any) -> Callable[[], object]:
    deltas = torch.tensor([[1]]) if deltas is None else deltas
    kwargs = kwargs or {"cache_length": 4}
    return lambda: continue_multimodal_positions(deltas, num_new, **kwargs)


# fmt: off
MISUSE = [
    Misuse("types-float", _build(mm_token_type_ids=torch.zeros(1, 7)), PosencTypeError,
           "mm_token_type_ids", "torch.float32"),
    Misuse("types-1d", _build(mm_token_type_ids=torch.zeros(7, dtype=torch.long)),
           PosencValueError, "mm_token_type_ids", (7,)),
    Misuse("types-value", _build(mm_token_type_ids=torch.tensor([[0, 3]])), PosencValueError,
           "mm_token_type_ids", 3),
    Misuse("types-list", _build(mm_token_type_ids=[[0, 0]]), PosencTypeError,
           "mm_token_type_ids", "list"),
    Misuse("mask-shape", _build(attention_mask=torch.ones(1, 6, dtype=torch.long)),
           PosencValueError, "attention_mask", (1, 6)),
    Misuse("mask-value", _build(attention_mask=torch.full((1, 7), 2)), PosencValueError,
           "attention_mask", 2),
    Misuse("grid-missing", _build(image_grid_thw=None), PosencValueError, "image_grid_thw",
           MISSING),
    Misuse("grid-extra", _build(image_grid_thw=torch.tensor([[1, 4, 4], [1, 2, 2]])),
           PosencValueError, "image_grid_thw", 2),
    Misuse("grid-size", _build(image_grid_thw=torch.tensor([[1, 4, 6]])), PosencValueError,
           "image_grid_thw", [1, 4, 6]),
    Misuse("grid-shape", _build(image_grid_thw=torch.tensor([4, 4])), PosencValueError,
           "image_grid_thw", (2,)),
    Misuse("grid-zero", _build(image_grid_thw=torch.tensor([[0, 4, 4]])), PosencValueError,
           "image_grid_thw", [0, 4, 4]),
    Misuse("grid-float", _build(image_grid_thw=torch.tensor([[1.0, 4, 4]])), PosencTypeError,
           "image_grid_thw", "torch.float32"),
    Misuse("video-grid-extra", _build(video_grid_thw=torch.tensor([[2, 4, 4]])),
           PosencValueError, "video_grid_thw", 1),
    Misuse("merge", _build(spatial_merge_size=0), PosencValueError, "spatial_merge_size", 0),
    Misuse("seconds-without-rate", _build(second_per_grid_ts=[1.0]), PosencValueError,
           "second_per_grid_ts", MISSING),
    Misuse("rate-type", _build(tokens_per_second="4"), PosencTypeError, "tokens_per_second",
           "str"),
    Misuse("seconds-short", _build(video_grid_thw=torch.tensor([[2, 4, 4]]), tokens_per_second=2,
                                   second_per_grid_ts=[]), PosencValueError,
           "second_per_grid_ts", 0),
    Misuse("deltas-float", _continue(torch.tensor([[0.5]])), PosencTypeError, "deltas",
           "torch.float32"),
    Misuse("deltas-shape", _continue(torch.zeros(2, 2, dtype=torch.long)), PosencValueError,
           "deltas", (2, 2)),
    Misuse("num-new", _continue(num_new=-1), PosencValueError, "num_new", -1),
    Misuse("neither", _continue(cache_length=None), PosencValueError, "cache_length", None),
    Misuse("both", _continue(cache_length=3, attention_mask=torch.ones(1, 4, dtype=torch.long)),
           PosencValueError, "attention_mask", MISSING),
    Misuse("cache-negative", _continue(cache_length=-2), PosencValueError, "cache_length", -2),
    Misuse("mask-too-short", _continue(num_new=5, attention_mask=torch.ones(1, 4,
                                                                            dtype=torch.long)),
           PosencValueError, "attention_mask", 4),
    Misuse("mask-batch", _continue(torch.tensor([[1], [2]]),
                                   attention_mask=torch.ones(3, 4, dtype=torch.long)),
           PosencValueError, "attention_mask", 3),
]
# fmt: on


@pytest.mark.parametrize("case", cases(MISUSE))
def test_bad_arguments_are_refused_naming_them(case: Misuse) -> None:
    check(case)
