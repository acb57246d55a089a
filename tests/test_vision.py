"""posenc.vision: the grid helpers against transformers' own (``vision_utils``'s
``get_vision_position_ids`` and ``get_vision_window_index``, DINOv3's patch centres) on many
grids, the recipes' class tokens and prefixes, the config reading (composite configs, dicts,
refusals), and the checks. The families themselves are compared in the vision census
(``tests/hf/test_vision_census.py``)."""

from __future__ import annotations

import itertools

import pytest
import torch

import posenc.vision as pv
from posenc.errors import PosencTypeError, PosencValueError
from posenc.hf.vision import REFUSED, GridRecipe

transformers = pytest.importorskip("transformers")
vision_utils = pytest.importorskip("transformers.vision_utils")

GRIDS = [
    [[1, 2, 2]],
    [[1, 4, 6], [2, 2, 4]],
    [[3, 6, 2], [1, 8, 10], [1, 2, 2]],
]


@pytest.mark.parametrize(("grid", "merge"), list(itertools.product(range(len(GRIDS)), (1, 2))))
def test_grid_coordinates_equal_transformers(grid: int, merge: int) -> None:
    thw = torch.tensor(GRIDS[grid])
    theirs = vision_utils.get_vision_position_ids(thw, merge)
    assert torch.equal(pv.grid_coordinates(thw, merge=merge), theirs)
    with_t = vision_utils.get_vision_position_ids(thw, merge, include_temporal=True)
    assert torch.equal(pv.grid_coordinates(thw, merge=merge, temporal=True), with_t)
    per_image = torch.tensor([merge] * len(thw))
    assert torch.equal(pv.grid_coordinates(thw, merge=[merge] * len(thw)), theirs)
    assert torch.equal(vision_utils.get_vision_position_ids(thw, per_image), theirs)
    assert torch.equal(pv.grid_coordinates(thw, merge=per_image), theirs)


@pytest.mark.parametrize(
    ("grid", "merge", "window", "patch"),
    [
        ([[1, 8, 12]], 2, 56, 14),
        ([[1, 6, 10], [2, 4, 4]], 2, 56, 14),
        ([[2, 10, 6], [1, 2, 2]], 2, 112, 14),
        ([[1, 5, 7]], 1, 42, 14),
    ],
)
def test_window_order_equals_transformers(grid: list, merge: int, window: int, patch: int) -> None:
    thw = torch.tensor(grid)
    index, _ = vision_utils.get_vision_window_index(thw, merge, window, patch)
    unit = merge * merge
    theirs = (index.unsqueeze(-1) * unit + torch.arange(unit)).reshape(-1)  # patches of tokens
    ours = pv.window_order(thw, merge=merge, window=window // merge // patch)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize(("h", "w"), [(1, 1), (3, 5), (4, 4)])
def test_patch_centres_equal_dinov3(h: int, w: int) -> None:
    from transformers.models.dinov3_vit.modeling_dinov3_vit import get_patches_center_coordinates

    theirs = get_patches_center_coordinates(h, w, dtype=torch.float64, device="cpu")
    torch.testing.assert_close(pv.patch_centres(h, w), theirs, rtol=0, atol=1e-15)


def test_recipe_class_tokens_prefix_offset_swap() -> None:
    thw = [[1, 2, 3], [1, 1, 2]]
    before = pv.positions(GridRecipe(offset=1, class_tokens="before"), thw)
    assert before.tolist() == [
        [0, 0], [1, 1], [1, 2], [1, 3], [2, 1], [2, 2], [2, 3], [0, 0], [1, 1], [1, 2],
    ]  # fmt: skip
    after = pv.positions(GridRecipe(swap=True, offset=1, class_tokens="after"), [[1, 1, 2]])
    assert after.tolist() == [[1, 1], [2, 1], [0, 0]]
    prefixed = pv.positions(GridRecipe(centred=True, prefix=2), [[1, 1, 2]])
    assert prefixed.tolist() == [[0.0, 0.0], [0.0, 0.0], [0.0, -0.5], [0.0, 0.5]]
    video = pv.positions(GridRecipe(temporal=True, offset=1), [[2, 1, 1]])
    assert video.tolist() == [[0, 1, 1], [1, 1, 1]]
    scaled = pv.positions(GridRecipe(swap=True), [[1, 2, 2]], scale=0.5)
    assert scaled.tolist() == [[0.0, 0.0], [0.5, 0.0], [0.0, 0.5], [0.5, 0.5]]


def test_memory_key_positions() -> None:
    coords = torch.tensor([[1, 2], [3, 4]])
    keys = pv.memory_key_positions(coords, frames=2, temporal_tokens=1, excluded=2)
    assert keys.tolist() == [[0, 0], [1, 2], [3, 4], [0, 0], [1, 2], [3, 4], [0, 0], [0, 0]]
    with pytest.raises(PosencValueError, match="frames"):
        pv.memory_key_positions(coords, frames=0)


def test_composite_configs_and_dicts_are_read_through_their_vision_config() -> None:
    from transformers import Qwen2_5_VLConfig

    config = Qwen2_5_VLConfig(vision_config={"hidden_size": 64, "num_heads": 4})
    pe = pv.rotary_from_hf_config(config)
    assert (pe.head_dim, pe.rotary_dim, pe.interleaved) == (16, 16, False)
    as_dict = {
        "model_type": "qwen2_5_vl_vision",
        "hidden_size": 64,
        "num_heads": 4,
        "spatial_merge_size": 2,
        "window_size": 112,
        "patch_size": 14,
        "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0},
    }
    grid = [[1, 8, 8]]
    assert torch.equal(
        pv.positions_from_hf_config(config, grid), pv.positions_from_hf_config(as_dict, grid)
    )
    torch.testing.assert_close(pv.rotary_from_hf_config(as_dict).frequencies, pe.frequencies)


def test_refusals_and_bad_input_are_named() -> None:
    for model_type in REFUSED:
        with pytest.raises(PosencValueError, match=f"'{model_type}' is refused"):
            pv.rotary_from_hf_config({"model_type": model_type})
    with pytest.raises(PosencValueError, match="'llama' is not a vision tower"):
        pv.rotary_from_hf_config({"model_type": "llama"})
    with pytest.raises(PosencValueError, match="rope_type"):
        pv.rotary_from_hf_config(
            {"model_type": "pixtral", "hidden_size": 64, "num_attention_heads": 4,
             "rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}
        )  # fmt: skip
    with pytest.raises(PosencValueError, match="num_heads"):
        pv.rotary_from_hf_config({"model_type": "qwen3_vl_vision", "hidden_size": 64})
    with pytest.raises(PosencTypeError, match="config"):
        pv.rotary_from_hf_config("qwen2_vl")
    with pytest.raises(PosencValueError, match="not divisible by merge 2"):
        pv.grid_coordinates([[1, 3, 4]], merge=2)
    with pytest.raises(PosencValueError, match=r"shape \(images, 3\)"):
        pv.grid_coordinates([[1, 3]])
    with pytest.raises(PosencTypeError, match="integers"):
        pv.grid_coordinates(torch.tensor([[1.0, 2.0, 2.0]]))
    with pytest.raises(PosencValueError, match="positive"):
        pv.grid_coordinates([[0, 2, 2]])
    with pytest.raises(PosencValueError, match="one per image"):
        pv.grid_coordinates([[1, 2, 2]], merge=[1, 2])
