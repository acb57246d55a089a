"""Patch coordinates of images and videos as vision towers lay them out, and the rotary
embedding of a transformers vision tower from its config.

A grid is ``grid_thw``: ``(images, 3)`` integers ``(t, h, w)`` per image or video, in patches
(before any spatial merge), as transformers' processors return ``image_grid_thw``. The
coordinates come in the order the tower's tokens come:

* :func:`grid_coordinates`: ``(row, col)`` (or ``(t, row, col)``) of every patch, frame after
  frame, in ``merge x merge`` blocks (Qwen2-VL's spatial merge order; ``merge=1`` is
  row-major);
* :func:`window_order`: Qwen2.5-VL's window reordering of those tokens;
* :func:`patch_centres`: DINOv3's patch centres in ``[-1, 1]``;
* :func:`positions`: a family's recipe (:class:`posenc.hf.vision.GridRecipe`) applied to a
  grid; :func:`positions_from_hf_config` and :func:`rotary_from_hf_config` read the recipe and
  the rotary embedding from a config.

>>> import torch, posenc.vision as pv
>>> pv.grid_coordinates(torch.tensor([[1, 2, 4]]), merge=2).tolist()
[[0, 0], [0, 1], [1, 0], [1, 1], [0, 2], [0, 3], [1, 2], [1, 3]]

Dimension legend: ``n`` tokens, ``a`` axes of a coordinate.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .encodings.rotary.grid import GridRotaryEmbedding
from .errors import PosencTypeError, PosencValueError
from .hf.vision import GridRecipe, vision_rotary_from_hf_config

__all__ = [
    "grid_coordinates",
    "memory_key_positions",
    "patch_centres",
    "positions",
    "positions_from_hf_config",
    "rotary_from_hf_config",
    "window_order",
]


def _grids(grid_thw: Any) -> list[tuple[int, int, int]]:
    """``grid_thw`` as a list of positive ``(t, h, w)``."""
    if not isinstance(grid_thw, Tensor):
        grid_thw = torch.as_tensor(grid_thw)
    if grid_thw.is_floating_point() or grid_thw.dtype == torch.bool:
        raise PosencTypeError(f"grid_thw must hold integers, got {grid_thw.dtype}")
    if grid_thw.dim() == 1:
        grid_thw = grid_thw.unsqueeze(0)
    if grid_thw.dim() != 2 or grid_thw.shape[1] != 3 or grid_thw.shape[0] == 0:
        raise PosencValueError(
            f"grid_thw must have shape (images, 3) of (t, h, w), got {tuple(grid_thw.shape)}"
        )
    grids = [tuple(int(v) for v in row) for row in grid_thw.tolist()]
    if any(v < 1 for row in grids for v in row):
        raise PosencValueError(f"grid_thw entries must be positive, got {grids}")
    return grids  # type: ignore[return-value]


def _merges(merge: Any, count: int) -> list[int]:
    if isinstance(merge, Tensor):  # Video-LLaMA 3's merge_sizes
        merge = merge.tolist()
    merges = [merge] * count if isinstance(merge, int) else list(merge)
    if len(merges) != count or any(
        isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in merges
    ):
        raise PosencValueError(
            f"merge must be a positive int or one per image ({count}), got {merge!r}"
        )
    return merges


def _merged_rows_cols(h: int, w: int, m: int) -> tuple[Tensor, Tensor]:
    """Row and column of every patch of one frame, in ``m x m`` blocks, block-major."""
    if h % m or w % m:
        raise PosencValueError(f"grid (h={h}, w={w}) is not divisible by merge {m}")
    shape = (h // m, w // m, m, m)  # (block row, block col, row in block, col in block)
    rows = torch.arange(h).view(h // m, 1, m, 1).expand(shape)
    cols = torch.arange(w).view(1, w // m, 1, m).expand(shape)
    return rows.reshape(-1), cols.reshape(-1)


def grid_coordinates(
    grid_thw: Any, *, merge: int | list[int] = 1, temporal: bool = False
) -> Tensor:
    """``(n, 2)`` ``(row, col)`` of every patch (``(n, 3)`` ``(t, row, col)`` with
    ``temporal=True``), image after image and frame after frame, each frame in ``merge x
    merge`` blocks taken block-major (one ``merge`` for all images, or one per image)."""
    grids = _grids(grid_thw)
    out = []
    for (t, h, w), m in zip(grids, _merges(merge, len(grids)), strict=True):
        rows, cols = _merged_rows_cols(h, w, m)
        spatial = torch.stack([rows, cols], dim=-1).repeat(t, 1)  # (t·h·w, 2)
        if temporal:
            frames = torch.arange(t).repeat_interleave(h * w).unsqueeze(-1)
            spatial = torch.cat([frames, spatial], dim=-1)
        out.append(spatial)
    return torch.cat(out)


def window_order(grid_thw: Any, *, merge: int, window: int) -> Tensor:
    """Qwen2.5-VL's token order for window attention: the index (into the order of
    :func:`grid_coordinates` with ``merge``) of each token, windows of ``window x window``
    merged tokens taken row-major within a frame (the last ones cut at the grid's edge), the
    ``merge²`` patches of a merged token kept together."""
    grids = _grids(grid_thw)
    unit, start, order = merge * merge, 0, []
    for t, h, w in grids:
        if h % merge or w % merge:
            raise PosencValueError(f"grid (h={h}, w={w}) is not divisible by merge {merge}")
        rows, cols = h // merge, w // merge
        frame = torch.arange(t).view(t, 1, 1).expand(t, rows, cols)
        row = torch.arange(rows).view(1, rows, 1).expand(t, rows, cols)
        col = torch.arange(cols).view(1, 1, cols).expand(t, rows, cols)
        windows_across = -(-cols // window)
        key = (frame * (-(-rows // window)) + row // window) * windows_across + col // window
        merged = torch.argsort(key.reshape(-1), stable=True) + start  # merged tokens, windowed
        order.append((merged.unsqueeze(-1) * unit + torch.arange(unit)).reshape(-1))
        start += t * rows * cols
    return torch.cat(order)


def patch_centres(h: int, w: int) -> Tensor:
    """``(h·w, 2)`` float64 ``(y, x)`` of the patch centres of an ``h x w`` grid, row-major,
    scaled to ``[-1, 1]`` (DINOv3's ``get_patches_center_coordinates``)."""
    ys = (torch.arange(h, dtype=torch.float64) + 0.5) / h * 2 - 1
    xs = (torch.arange(w, dtype=torch.float64) + 0.5) / w * 2 - 1
    return torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).reshape(-1, 2)


def positions(
    recipe: GridRecipe,
    grid_thw: Any,
    *,
    merge: int | list[int] | Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """The coordinates ``(n, a)`` a family's tower gives the tokens of ``grid_thw``, in their
    order (``recipe`` from :func:`posenc.hf.vision.vision_rotary_from_hf_config`). ``merge``
    overrides the recipe's (Video-LLaMA 3 takes one per image in its forward); ``scale``
    overrides its scale (SAM 3's global layers)."""
    if not isinstance(recipe, GridRecipe):
        raise PosencTypeError(f"recipe must be a GridRecipe, got {type(recipe).__name__}")
    grids = _grids(grid_thw)
    merge = recipe.merge if merge is None else merge
    scale = recipe.scale if scale is None else scale
    if recipe.centred:
        parts = [patch_centres(h, w).repeat(t, 1) for t, h, w in grids]
    else:
        coords = grid_coordinates(grids, merge=merge, temporal=recipe.temporal) + recipe.offset
        if recipe.temporal:
            coords[:, 0] -= recipe.offset  # frames count from 0
        if recipe.swap:
            coords[:, -2:] = coords[:, -2:].flip(-1)
        if recipe.window is not None:
            if not isinstance(merge, int):
                raise PosencValueError("window reordering takes one merge for all images")
            coords = coords[window_order(grids, merge=merge, window=recipe.window)]
        sizes = [t * h * w for t, h, w in grids]
        parts = list(coords.split(sizes))
    if recipe.class_tokens is not None:
        if recipe.class_tokens not in ("before", "after"):
            raise PosencValueError(
                f"class_tokens must be 'before' or 'after', got {recipe.class_tokens!r}"
            )
        origin = [torch.zeros(1, p.shape[1], dtype=p.dtype) for p in parts]
        pairs = (
            zip(origin, parts, strict=True)
            if recipe.class_tokens == "before"
            else zip(parts, origin, strict=True)
        )
        parts = [piece for pair in pairs for piece in pair]
    out = torch.cat(parts)
    if recipe.prefix:
        out = torch.cat([torch.zeros(recipe.prefix, out.shape[1], dtype=out.dtype), out])
    return out if scale == 1.0 else out.to(torch.float64) * scale


def memory_key_positions(
    coords: Tensor, *, frames: int, temporal_tokens: int = 0, excluded: int = 0
) -> Tensor:
    """Key coordinates of SAM 2-style memory attention: for each of ``frames`` memory frames,
    ``temporal_tokens`` tokens at the origin (EdgeTAM's) then ``coords`` (the memory's feature
    map); then ``excluded`` tokens (object pointers) at the origin. A token at the origin is
    not rotated."""
    if not isinstance(coords, Tensor) or coords.dim() != 2:
        raise PosencValueError(
            f"coords must be a tensor of shape (n, axes), got {getattr(coords, 'shape', coords)}"
        )
    for name, value, low in (
        ("frames", frames, 1),
        ("temporal_tokens", temporal_tokens, 0),
        ("excluded", excluded, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise PosencValueError(f"{name} must be an int >= {low}, got {value!r}")
    origin = coords.new_zeros(temporal_tokens, coords.shape[1])
    frame = torch.cat([origin, coords])
    return torch.cat([frame.repeat(frames, 1), coords.new_zeros(excluded, coords.shape[1])])


def rotary_from_hf_config(config: Any) -> GridRotaryEmbedding:
    """The rotary embedding of the vision tower ``config`` describes (transformers 5.24's
    families; see ``docs/vision.md``); its positions are :func:`positions_from_hf_config`'s."""
    return vision_rotary_from_hf_config(config)[0]


def positions_from_hf_config(
    config: Any, grid_thw: Any, *, merge: int | list[int] | None = None, scale: float | None = None
) -> Tensor:
    """The coordinates the vision tower ``config`` describes gives the patches of
    ``grid_thw``, in its token order (see :func:`positions`)."""
    return positions(vision_rotary_from_hf_config(config)[1], grid_thw, merge=merge, scale=scale)
