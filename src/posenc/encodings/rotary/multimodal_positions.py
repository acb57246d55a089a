"""The ``(3, batch, seq)`` positions of multimodal RoPE for a sequence of text, images and
videos, as Qwen2-VL, Qwen2.5-VL and Qwen3-VL number them (transformers 5.24's
``get_rope_index``), and the positions that continue them while decoding with a cache.

Rows are (temporal, height, width). A text token has its index in every row. A vision block
(the tokens of one image or video, a grid ``(t, h, w)`` of patches merged
``spatial_merge_size``² at a time into ``t · h/m · w/m`` tokens) starting where the text has
reached position ``s`` numbers its tokens, in ``(t, h, w)`` order, by

    temporal ``s + floor(i_t · interval)``, height ``s + i_h``, width ``s + i_w``;

the text after it continues at ``s + max(h, w) / m`` (the grid's rows and columns, not its
token count: positions stay short for large images). ``interval`` is 1 for images and for
Qwen2-VL's videos; Qwen2.5-VL spaces video frames by ``tokens_per_second ·
second_per_grid_ts[v]``; Qwen3-VL numbers each video frame as its own ``(1, h, w)`` block (its
frames are separated by timestamp text). Padding (``attention_mask`` 0, left or right) is
skipped, its positions set to 0.

Each row's *delta* (largest position + 1 minus its number of tokens) is what a generated token
adds to its plain index: :func:`continue_multimodal_positions` gives the next positions,
``index + delta`` on every row, as transformers' models do in cached decoding.

Checked against transformers' ``Qwen2VLModel``, ``Qwen2_5_VLModel`` and ``Qwen3VLModel``
(``tests/encodings/rotary/test_multimodal_positions.py``).

Dimension legend: ``b`` batch, ``n`` sequence, ``k`` images or videos.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ...errors import PosencTypeError, PosencValueError, check_bytes
from ..checks import check_positive_int

__all__ = ["continue_multimodal_positions", "multimodal_positions"]

#: ``mm_token_type_ids`` values: text, image, video.
TEXT, IMAGE, VIDEO = 0, 1, 2
_INTEGER = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _check_tokens(name: str, t: object, *, mask: bool = False) -> Tensor:
    """A ``(b, n)`` integer tensor (bool too for a mask) of allowed values."""
    if not isinstance(t, Tensor):
        raise PosencTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _INTEGER and not (mask and t.dtype == torch.bool):
        raise PosencTypeError(f"{name} must be an integer tensor, got dtype {t.dtype}")
    if t.dim() != 2:
        raise PosencValueError(f"{name} must have shape (batch, seq), got {tuple(t.shape)}")
    allowed = (0, 1) if mask else (TEXT, IMAGE, VIDEO)
    bad = t[(t < min(allowed)) | (t > max(allowed))] if t.dtype != torch.bool else t[:0]
    if bad.numel():
        raise PosencValueError(f"{name} must hold only {list(allowed)}, got {bad[0].item()}")
    return t


def _check_grid(name: str, grid: object) -> list[tuple[int, int, int]]:
    """``(k, 3)`` positive integer ``(t, h, w)`` rows, as Python ints."""
    if grid is None:
        return []
    if not isinstance(grid, Tensor):
        raise PosencTypeError(f"{name} must be a torch.Tensor, got {type(grid).__name__}")
    if grid.dtype not in _INTEGER:
        raise PosencTypeError(f"{name} must be an integer tensor, got dtype {grid.dtype}")
    if grid.dim() != 2 or grid.shape[1] != 3:
        raise PosencValueError(f"{name} must have shape (count, 3), got {tuple(grid.shape)}")
    rows = [tuple(row) for row in grid.tolist()]
    for row in rows:
        if min(row) < 1:
            raise PosencValueError(f"{name} must hold (t, h, w) >= 1, got {list(row)}")
    return rows  # type: ignore[return-value]


def _runs(types: list[int]) -> list[tuple[int, int]]:
    """``(kind, length)`` of each run of equal token types."""
    return [(kind, len(list(run))) for kind, run in itertools.groupby(types)]


def _vision_positions(
    start: int, grid: tuple[int, int, int], merge: int, interval: Any, device: Any
) -> Tensor:
    """``(3, t · h/m · w/m)`` positions of one vision block starting at ``start``."""
    t, h, w = grid[0], grid[1] // merge, grid[2] // merge
    temporal = (torch.arange(t, device=device) * interval).long() + start
    height = torch.arange(h, device=device) + start
    width = torch.arange(w, device=device) + start
    grids = torch.meshgrid(temporal, height, width, indexing="ij")  # 3 x (t, h, w)
    return torch.stack(grids).reshape(3, -1)


def multimodal_positions(
    mm_token_type_ids: Tensor,
    *,
    image_grid_thw: Tensor | None = None,
    video_grid_thw: Tensor | None = None,
    attention_mask: Tensor | None = None,
    spatial_merge_size: int = 2,
    tokens_per_second: float | None = None,
    second_per_grid_ts: Tensor | Sequence[float] | None = None,
    frames_as_images: bool = False,
) -> tuple[Tensor, Tensor]:
    """Multimodal RoPE positions ``(3, b, n)`` and each row's delta ``(b, 1)`` (int64).

    Args:
        mm_token_type_ids: ``(b, n)``: 0 text, 1 image, 2 video (what transformers' processors
            return; from ``input_ids``: ``(ids == image_token_id) + 2 * (ids ==
            video_token_id)``). Each run of image or video tokens is one block.
        image_grid_thw, video_grid_thw: ``(k, 3)`` patch grids ``(t, h, w)``, one per block
            of that kind, in order over the whole batch.
        attention_mask: ``(b, n)``, 1 for tokens and 0 for padding (which is skipped).
        spatial_merge_size: patches merged per side into one token (``m``; 2 in Qwen2-VL).
        tokens_per_second: Qwen2.5-VL: video frames are ``tokens_per_second ·
            second_per_grid_ts[v]`` positions apart (``None``: 1 apart, Qwen2-VL).
        second_per_grid_ts: seconds per temporal grid step of each video, in order over the
            batch (default 1 each); only with ``tokens_per_second``.
        frames_as_images: Qwen3-VL: each frame of a video is its own ``(1, h, w)`` block
            (its frames are separated by timestamp text).

    Equal to transformers' ``get_rope_index`` of Qwen2-VL (defaults), Qwen2.5-VL
    (``tokens_per_second=config.vision_config.tokens_per_second``) and Qwen3-VL
    (``frames_as_images=True``). A sequence that is all padding gets positions 0 and delta 0.

    >>> types = torch.tensor([[0, 0, 1, 1, 1, 1, 0]])  # two text tokens, a 4x4 image, text
    >>> positions, deltas = multimodal_positions(types, image_grid_thw=torch.tensor([[1, 4, 4]]))
    >>> positions[:, 0].tolist(), deltas.tolist()
    ([[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]], [[-2]])
    """
    types = _check_tokens("mm_token_type_ids", mm_token_type_ids)
    b, n = types.shape
    if attention_mask is not None:
        attention_mask = _check_tokens("attention_mask", attention_mask, mask=True)
        if attention_mask.shape != types.shape:
            raise PosencValueError(
                f"attention_mask must have the shape of mm_token_type_ids {tuple(types.shape)}, "
                f"got {tuple(attention_mask.shape)}"
            )
    merge = check_positive_int("spatial_merge_size", spatial_merge_size)
    grids = {IMAGE: _check_grid("image_grid_thw", image_grid_thw)}
    videos = _check_grid("video_grid_thw", video_grid_thw)
    if tokens_per_second is None and second_per_grid_ts is not None:
        raise PosencValueError(
            "second_per_grid_ts is given without tokens_per_second (Qwen2.5-VL's "
            "config.vision_config.tokens_per_second), which it multiplies"
        )
    if tokens_per_second is not None and (
        isinstance(tokens_per_second, bool) or not isinstance(tokens_per_second, (int, float))
    ):
        raise PosencTypeError(
            f"tokens_per_second must be a number, got {type(tokens_per_second).__name__}"
        )
    seconds: Sequence[Any] = [1] * len(videos) if second_per_grid_ts is None else second_per_grid_ts
    if len(seconds) < len(videos):
        raise PosencValueError(
            f"second_per_grid_ts has {len(seconds)} entries for {len(videos)} videos"
        )
    if frames_as_images:  # Qwen3-VL: t blocks of one frame each
        videos = [(1, h, w) for t, h, w in videos for _ in range(t)]
        seconds = [1] * len(videos)
    grids[VIDEO] = videos
    # every block's grid and size, checked before anything is allocated
    rows = []  # per sequence, the (kind, length) runs of its tokens, padding left out
    for i, row in enumerate(types.tolist()):
        if attention_mask is not None:
            keep = attention_mask[i].bool().tolist()
            row = [kind for kind, kept in zip(row, keep, strict=True) if kept]
        rows.append(_runs(row))
    used = {IMAGE: 0, VIDEO: 0}
    for runs in rows:
        for kind, length in runs:
            if kind == TEXT:
                continue
            name = "image_grid_thw" if kind == IMAGE else "video_grid_thw"
            if used[kind] >= len(grids[kind]):
                raise PosencValueError(
                    f"{name} has {len(grids[kind])} grids, fewer than the "
                    f"{'image' if kind == IMAGE else 'video'} blocks of mm_token_type_ids"
                )
            t, h, w = grids[kind][used[kind]]
            if length != t * (h // merge) * (w // merge):
                raise PosencValueError(
                    f"{name} grid {[t, h, w]} (spatial_merge_size={merge}) makes "
                    f"{t * (h // merge) * (w // merge)} tokens, but its block has {length}"
                )
            used[kind] += 1
    for kind, name in ((IMAGE, "image_grid_thw"), (VIDEO, "video_grid_thw")):
        if used[kind] != len(grids[kind]):
            raise PosencValueError(
                f"{name} has {len(grids[kind])} grids, but mm_token_type_ids has "
                f"{used[kind]} such blocks"
            )
    device = types.device
    check_bytes("mm_token_type_ids", f"shape {(b, n)}", 3 * b * n * 8, device=device)
    positions = torch.zeros(3, b, n, dtype=torch.long, device=device)
    deltas = []
    blocks = {IMAGE: iter(grids[IMAGE]), VIDEO: iter(grids[VIDEO])}
    video_seconds = iter(seconds)
    for i, runs in enumerate(rows):
        start, pieces = 0, []
        for kind, length in runs:
            if kind == TEXT:
                pieces.append(torch.arange(length, device=device).expand(3, -1) + start)
                start += length
                continue
            grid = next(blocks[kind])
            interval: Any = 1
            if kind == VIDEO and tokens_per_second is not None:
                interval = tokens_per_second * next(video_seconds)
            pieces.append(_vision_positions(start, grid, merge, interval, device))
            start += max(grid[1], grid[2]) // merge
        if not pieces:  # all padding
            deltas.append(0)
            continue
        row = torch.cat(pieces, dim=1)  # (3, tokens of row i)
        if attention_mask is None:
            positions[:, i] = row
        else:
            positions[:, i, attention_mask[i].bool()] = row
        deltas.append(int(row.max()) + 1 - row.shape[1])
    return positions, torch.tensor(deltas, dtype=torch.long, device=device)[:, None]


def continue_multimodal_positions(
    deltas: Tensor,
    num_new: int,
    *,
    cache_length: int | None = None,
    attention_mask: Tensor | None = None,
    rows: int = 3,
) -> Tensor:
    """Positions ``(rows, b, num_new)`` of the next ``num_new`` tokens of each sequence while
    decoding: their plain index plus the sequence's delta, on every row (text tokens), as
    transformers' Qwen2-VL / Qwen2.5-VL / Qwen3-VL models do once the cache holds the prompt
    (``compute_3d_position_ids``).

    Args:
        deltas: ``(b0, 1)`` or ``(b0,)`` from :func:`multimodal_positions`; a batch of ``b``
            sequences (``b`` a multiple of ``b0``: beams, samples) repeats each ``b / b0``
            times.
        num_new: tokens being added.
        cache_length: tokens already cached (padding included): the new indices are
            ``cache_length .. cache_length + num_new - 1``. Without ``attention_mask`` only.
        attention_mask: ``(b, cache + num_new)``, 1 for tokens, 0 for padding: the index of
            a token is the number of tokens before it (so left padding is not counted).
        rows: position rows (3 for the Qwen families).

    >>> continue_multimodal_positions(torch.tensor([[-2]]), 2, cache_length=7)[:, 0].tolist()
    [[5, 6], [5, 6], [5, 6]]
    """
    if not isinstance(deltas, Tensor):
        raise PosencTypeError(f"deltas must be a torch.Tensor, got {type(deltas).__name__}")
    if deltas.dtype not in _INTEGER:
        raise PosencTypeError(f"deltas must be an integer tensor, got dtype {deltas.dtype}")
    if deltas.dim() == 2 and deltas.shape[1] == 1:
        deltas = deltas[:, 0]
    if deltas.dim() != 1 or not deltas.numel():
        raise PosencValueError(f"deltas must have shape (batch, 1), got {tuple(deltas.shape)}")
    if isinstance(num_new, bool) or not isinstance(num_new, int) or num_new < 0:
        raise PosencValueError(f"num_new must be an int >= 0, got {num_new!r}")
    rows = check_positive_int("rows", rows)
    if (cache_length is None) == (attention_mask is None):
        raise PosencValueError(
            "give exactly one of cache_length and attention_mask, got "
            f"cache_length={cache_length!r} and attention_mask "
            f"{'given' if attention_mask is not None else 'None'}"
        )
    if attention_mask is not None:
        mask = _check_tokens("attention_mask", attention_mask, mask=True)
        if mask.shape[1] < num_new:
            raise PosencValueError(
                f"attention_mask covers {mask.shape[1]} tokens, fewer than num_new={num_new}"
            )
        batch = mask.shape[0]
    else:
        if isinstance(cache_length, bool) or not isinstance(cache_length, int):
            raise PosencTypeError(f"cache_length must be an int, got {cache_length!r}")
        if cache_length < 0:
            raise PosencValueError(f"cache_length must be >= 0, got {cache_length}")
        batch = deltas.shape[0]
    if batch % deltas.shape[0]:
        raise PosencValueError(
            f"attention_mask has batch {batch}, not a multiple of the {deltas.shape[0]} deltas"
        )
    check_bytes("num_new", num_new, rows * batch * num_new * 8, device=deltas.device)
    if attention_mask is not None:
        index = mask.long().cumsum(-1) - 1
        index = index.masked_fill(mask == 0, 0)[:, mask.shape[1] - num_new :]  # (b, new)
    else:
        assert cache_length is not None
        index = torch.arange(cache_length, cache_length + num_new, device=deltas.device)[None]
    deltas = deltas.repeat_interleave(batch // deltas.shape[0]).to(index.device)
    return (index + deltas[:, None]).expand(rows, batch, num_new).contiguous()
