"""Reading the rotary embedding of a transformers vision tower (transformers 5.24): which axis
each rotated pair follows, its frequency, where its channels sit (a
:class:`~posenc.encodings.rotary.grid.GridRotaryEmbedding`), and how the family lays out its
patch coordinates (a :class:`GridRecipe`, which :func:`posenc.vision.positions` turns into
coordinates for a grid ``(t, h, w)``).

The families were found from their attention's call site (the apply function called on the
vision attention's q and k; ``tests/hf/vision_census.py``); each reader below names the
rotary class whose tables it reproduces. Notation: ``d`` head dim, ``k = d/4``,
``f = base^(-2i/(d/2))`` for ``i < k`` (what most families' ``compute_axial_rope_parameters``
returns).

Refused by name (:data:`REFUSED`): V-JEPA 2 (its pairs are not rotations) and MLCD (its class
token turns by learned angles).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..encodings.rope_types.builtin import default_inv_freq
from ..encodings.rotary.grid import GridRotaryEmbedding, axial_frequencies
from ..errors import PosencTypeError, PosencValueError
from .fields import Fields, number, positive_int

__all__ = ["REFUSED", "VISION_MODEL_TYPES", "GridRecipe", "vision_rotary_from_hf_config"]


@dataclass(frozen=True)
class GridRecipe:
    """How a family lays out the coordinates of a grid ``(t, h, w)`` of patches, in the order
    its tokens come (:func:`posenc.vision.positions` follows it).

    Attributes:
        merge: spatial merge size: tokens come in ``merge x merge`` blocks, block-major
            (Qwen2-VL's order); ``1`` is row-major.
        temporal: coordinates ``(t, row, col)`` instead of ``(row, col)``.
        swap: ``(col, row)`` instead of ``(row, col)``.
        offset: added to every patch coordinate (``1``: patches counted from 1).
        window: Qwen2.5-VL's window attention: tokens reordered window by window, the window
            ``window`` merged tokens on a side (``None``: no reordering).
        scale: every coordinate multiplied by it (SAM 3's global layers).
        centred: coordinates of patch centres scaled to ``[-1, 1]`` (DINOv3).
        class_tokens: ``"before"`` one token at the origin in front of each image,
            ``"after"`` one after it, ``None`` none.
        prefix: tokens at the origin in front of everything (DINOv3's class and register
            tokens).
    """

    merge: int = 1
    temporal: bool = False
    swap: bool = False
    offset: int = 0
    window: int | None = None
    scale: float = 1.0
    centred: bool = False
    class_tokens: str | None = None
    prefix: int = 0


#: Families posenc refuses, with the reason (model type -> why).
REFUSED: dict[str, str] = {
    "vjepa2": "V-JEPA 2's rotate_queries_or_keys pairs channels (2i, 2i+1) but tiles its angles "
    "in halves (sin.repeat(..., 2)): the two channels of a pair turn by different angles, so "
    "the map is not a rotation and scores do not depend on coordinate differences alone",
    "mlcd_vision_model": "MLCD turns its class token by a learned vector of angles "
    "(class_pos_emb), which no coordinate of an axial rotation gives",
}


def _fields(config: Any) -> tuple[Fields, str]:
    if config is None or isinstance(config, (str, bytes, int, float, list, tuple)):
        raise PosencTypeError(
            f"config must be a transformers config or a config.json dict, got "
            f"{type(config).__name__}"
        )
    cfg = Fields(config)
    model_type = cfg.get("model_type")
    if model_type not in VISION_MODEL_TYPES and model_type not in REFUSED:
        vision = cfg.get("vision_config")
        if vision is not None:
            return _fields(vision)
    if not isinstance(model_type, str):
        raise PosencValueError(
            "config has no model_type: posenc cannot tell which vision tower it describes"
        )
    return cfg, model_type


def _head_dim(cfg: Fields, width: str = "hidden_size") -> int:
    head_dim = cfg.get("head_dim")
    if head_dim is not None:
        return positive_int("head_dim", head_dim)
    field = "num_attention_heads" if cfg.get("num_attention_heads") is not None else "num_heads"
    for name in (width, field):
        if cfg.get(name) is None:
            raise PosencValueError(
                f"config has no head_dim and no {name}: the vision tower's head size is unknown"
            )
    hidden = positive_int(width, cfg.get(width))
    heads = positive_int(field, cfg.get(field))
    if hidden % heads:
        raise PosencValueError(f"config {width} ({hidden}) is not divisible by {field} ({heads})")
    return hidden // heads


def _base(cfg: Fields, rope_type: str | None = "axial") -> float:
    """``rope_parameters['rope_theta']``, its ``rope_type`` checked (``None``: the family
    keeps ``rope_theta`` as a field of its own; ``"any"``: the family reads no type)."""
    if rope_type is None:
        return number("rope_theta", cfg.get("rope_theta"))
    params = cfg.get("rope_parameters") or {}
    found = params.get("rope_type", params.get("type", rope_type))
    if rope_type != "any" and found != rope_type:
        raise PosencValueError(
            f"config rope_parameters['rope_type'] is {found!r}; this vision tower builds only "
            f"{rope_type!r} rotary tables"
        )
    if "rope_theta" not in params:
        raise PosencValueError("config rope_parameters has no 'rope_theta'")
    return number("rope_parameters['rope_theta']", params["rope_theta"])


def _quarter(head_dim: int, what: str = "head_dim") -> int:
    if head_dim % 4:
        raise PosencValueError(f"{what} ({head_dim}) must be divisible by 4 for 2-D RoPE")
    return head_dim // 4


def _axial(
    head_dim: int,
    axes: list[int],
    freqs: Tensor,
    ndim: int = 2,
    **kwargs: Any,
) -> GridRotaryEmbedding:
    return GridRotaryEmbedding(head_dim, axial_frequencies(axes, freqs, ndim), **kwargs)


Reading = tuple[GridRotaryEmbedding, GridRecipe]


def _qwen(width: str = "hidden_size", merge: bool = True, window: bool = False) -> Any:
    """Qwen2-VL's ``VisionRotaryEmbedding`` and its copies: ``cat(h·f, w·f)`` in the half
    layout over the whole head; coordinates ``get_vision_position_ids(grid_thw,
    spatial_merge_size)``, reordered by ``get_vision_window_index`` where the tower windows."""

    def read(cfg: Fields) -> Reading:
        d = _head_dim(cfg, width)
        k, f = _quarter(d), default_inv_freq(d // 2, _base(cfg))
        size = positive_int("spatial_merge_size", cfg.get("spatial_merge_size")) if merge else 1
        win = None
        if window:
            win = _window(cfg, size)
        pe = _axial(d, [0] * k + [1] * k, torch.cat([f, f]))
        return pe, GridRecipe(merge=size, window=win)

    return read


def _window(cfg: Fields, merge: int) -> int:
    """Qwen2.5-VL's window side in merged tokens: ``window_size // merge // patch_size``."""
    window = positive_int("window_size", cfg.get("window_size"))
    patch = positive_int("patch_size", cfg.get("patch_size"))
    side = window // merge // patch
    if side < 1:
        raise PosencValueError(
            f"config window_size ({window}) is smaller than one merged patch "
            f"(spatial_merge_size {merge} x patch_size {patch})"
        )
    return side


def _muse(cfg: Fields) -> Reading:
    """Muse Glimmer / Spark: Qwen2-VL's tables on ``(col + 1, row + 1)``, unmerged (the
    merge comes after the tower), reordered in windows of ``pos_emb_height`` patches."""
    d = _head_dim(cfg)
    k, f = _quarter(d), default_inv_freq(d // 2, _base(cfg))
    window = positive_int("pos_emb_height", cfg.get("pos_emb_height"))
    pe = _axial(d, [0] * k + [1] * k, torch.cat([f, f]))
    return pe, GridRecipe(window=window, swap=True, offset=1)


def _pixtral(cfg: Fields) -> Reading:
    """Pixtral: ``inv = base^(-2j/d)``; rows turn by ``inv[0::2]``, columns by ``inv[1::2]``,
    half layout; coordinates row-major per image."""
    d = _head_dim(cfg)
    k, inv = _quarter(d), default_inv_freq(d, _base(cfg))
    return _axial(d, [0] * k + [1] * k, torch.cat([inv[0::2], inv[1::2]])), GridRecipe()


def _inkling(cfg: Fields) -> Reading:
    """Inkling 2: ``cat(w·f, h·f)`` with each angle on an interleaved pair; patches at
    ``(row + 1, col + 1)`` in merge order, a class token at the origin before each image."""
    d = _head_dim(cfg)
    k, f = _quarter(d), default_inv_freq(d // 2, _base(cfg))
    merge = positive_int("spatial_merge_size", cfg.get("spatial_merge_size"))
    pe = _axial(d, [1] * k + [0] * k, torch.cat([f, f]), interleaved=True)
    return pe, GridRecipe(merge=merge, offset=1, class_tokens="before")


def _kimi(cfg: Fields) -> Reading:
    """Kimi-K2.5: the frequencies alternate columns and rows (``w·f0, h·f0, w·f1, ...``),
    half layout; coordinates row-major (``spatial_merge_size=1``)."""
    d = _head_dim(cfg)
    k, f = _quarter(d), default_inv_freq(d // 2, _base(cfg))
    return _axial(d, [1, 0] * k, f.repeat_interleave(2)), GridRecipe()


def _minimax(cfg: Fields) -> Reading:
    """MiniMax-M3-VL: three axes ``(t, row, col)`` of ``2·(d // 6)`` channels each, half
    layout over them, the rest of the head passed through."""
    d = _head_dim(cfg)
    k = d // 3 // 2
    if k < 1:
        raise PosencValueError(f"head_dim ({d}) is too small for three rotary axes")
    f = default_inv_freq(2 * k, _base(cfg))
    merge = positive_int("spatial_merge_size", cfg.get("spatial_merge_size"))
    pe = _axial(d, [0] * k + [1] * k + [2] * k, f.repeat(3), ndim=3)
    return pe, GridRecipe(merge=merge, temporal=True)


def _step(cfg: Fields) -> Reading:
    """Step3p7's vision tower: ``cat(w·f, h·f)``, half layout, row-major coordinates."""
    d = _head_dim(cfg)
    k, f = _quarter(d), default_inv_freq(d // 2, _base(cfg))
    return _axial(d, [1] * k + [0] * k, torch.cat([f, f])), GridRecipe()


def _gemma4(cfg: Fields) -> Reading:
    """Gemma 4's vision tower: the head split in two blocks, rows then columns, each block in
    its own half layout (``apply_multidimensional_rope``); its processor gives patch
    positions as ``(x, y)``: coordinates ``(col, row)``."""
    d = _head_dim(cfg)
    k, f = _quarter(d), default_inv_freq(d // 2, _base(cfg))
    pe = _axial(d, [0] * k + [1] * k, torch.cat([f, f]), blocks=2)
    return pe, GridRecipe(swap=True)


def _llama4(cfg: Fields) -> Reading:
    """Llama 4's vision tower: ``freqs_ci`` on interleaved pairs, columns then rows, patches
    at ``(col + 1, row + 1)`` of the fixed ``image_size // patch_size`` grid, the class token
    last, unrotated (its rotary reads ``rope_theta`` whatever ``rope_type`` says)."""
    d = _head_dim(cfg)
    k, f = _quarter(d), default_inv_freq(d // 2, _base(cfg, "any"))
    pe = _axial(d, [0] * k + [1] * k, torch.cat([f, f]), interleaved=True)
    return pe, GridRecipe(swap=True, offset=1, class_tokens="after")


def _sam_memory(cfg: Fields) -> Reading:
    """SAM 2 / SAM 3 tracker / EdgeTAM video memory attention: ``cat(x·f, y·f)`` on
    interleaved pairs over the attention's head (``memory_attention_hidden_size //
    (memory_attention_downsample_rate · memory_attention_num_attention_heads)``); positions
    ``(col, row)`` of ``memory_attention_rope_feat_sizes``."""
    hidden = positive_int("memory_attention_hidden_size", cfg.get("memory_attention_hidden_size"))
    rate = positive_int(
        "memory_attention_downsample_rate", cfg.get("memory_attention_downsample_rate")
    )
    heads = positive_int(
        "memory_attention_num_attention_heads", cfg.get("memory_attention_num_attention_heads")
    )
    d = hidden // (rate * heads)
    k, f = _quarter(d, "the memory attention's head size"), default_inv_freq(d // 2, _base(cfg))
    pe = _axial(d, [0] * k + [1] * k, torch.cat([f, f]), interleaved=True)
    return pe, GridRecipe(swap=True)


def _sam3_vit(cfg: Fields) -> Reading:
    """SAM 3's ViT: the same tables as SAM 2's memory attention over its own heads, positions
    ``(col, row)`` of a window (or, in global layers, of the whole grid scaled to the window:
    ``scale = window_size / grid width``, which :func:`posenc.vision.positions` takes as
    ``scale=``)."""
    d = _head_dim(cfg)
    k, f = _quarter(d), default_inv_freq(d // 2, _base(cfg))
    pe = _axial(d, [0] * k + [1] * k, torch.cat([f, f]), interleaved=True)
    return pe, GridRecipe(swap=True)


def _dinov3(own_theta: bool) -> Any:
    """DINOv3 (and Sapiens 2, EoMT-DINOv3): periods ``base^(4i/d)``, angles ``2π·c/period``
    for the patch centres ``c`` in ``[-1, 1]``, rows then columns, half layout; the class and
    register tokens in front are not rotated. Training-time coordinate augmentation
    (``pos_embed_shift``/``jitter``/``rescale``) is not part of this module."""

    def read(cfg: Fields) -> Reading:
        d = _head_dim(cfg)
        k = _quarter(d)
        f = 2 * math.pi * default_inv_freq(d // 2, _base(cfg, None if own_theta else "default"))
        registers = cfg.get("num_register_tokens") or 0
        pe = _axial(d, [0] * k + [1] * k, torch.cat([f, f]))
        return pe, GridRecipe(centred=True, prefix=1 + int(registers))

    return read


def _loftr(cfg: Fields) -> Reading:
    """EfficientLoFTR: rotates the whole hidden vector before it is split into heads (so
    ``head_dim`` here is ``hidden_size``): pair ``2j`` by the row, ``2j + 1`` by the column,
    both with ``f_j = base^(-2j/r)``, ``r = head size · partial_rotary_factor``, interleaved;
    coordinates ``(row + 1, col + 1)`` of the aggregated feature map."""
    hidden = positive_int("hidden_size", cfg.get("hidden_size"))
    params = cfg.get("rope_parameters") or {}
    r = int(
        _head_dim(cfg) * number("partial_rotary_factor", params.get("partial_rotary_factor", 1))
    )
    f = default_inv_freq(r, _base(cfg, "default"))
    pe = GridRotaryEmbedding(
        hidden, axial_frequencies([0, 1] * f.numel(), f.repeat_interleave(2), 2), interleaved=True
    )
    return pe, GridRecipe(offset=1)


def _lightglue(cfg: Fields) -> Reading:
    """LightGlue: the keypoints' ``(x, y)`` projected by a learned ``Linear(2, d/2)`` (its
    ``projector.weight`` is ``frequencies``), each angle on an interleaved pair. The
    frequencies are initialised as ``nn.Linear`` initialises its weight; copy the model's."""
    dim = positive_int("descriptor_dim", cfg.get("descriptor_dim"))
    heads = positive_int("num_attention_heads", cfg.get("num_attention_heads"))
    d = dim // heads
    weight = torch.nn.Linear(2, d // 2, bias=False).weight.detach()
    return GridRotaryEmbedding(d, weight, interleaved=True, learned=True), GridRecipe()


#: model type -> reader of its vision tower's rotary embedding.
VISION_MODEL_TYPES: dict[str, Callable[[Fields], Reading]] = {
    **dict.fromkeys(
        (
            "cohere_compass_vision",
            "dots3_note_vision_encoder",
            "ernie4_5_vl_moe_vision",
            "glm4v_moe_vision",
            "glm4v_vision",
            "glm5_next_vision",
            "glm_ocr_vision",
            "lfm3_vl_vision",
            "qwen3_5_moe_vision",
            "qwen3_5_vision",
            "qwen3_omni_moe_vision_encoder",
            "qwen3_vl_moe_vision",
            "qwen3_vl_vision",
            "qwen4_exp_vision",
        ),
        _qwen(),
    ),
    "qwen2_vl_vision": _qwen("embed_dim"),
    "video_llama_3_vision": _qwen(merge=False),
    "paddleocr_vl_vision": _qwen(merge=False),
    **dict.fromkeys(
        ("qwen2_5_vl_vision", "qwen2_5_omni_vision_encoder", "exaone4_5_vision"),
        _qwen(window=True),
    ),
    "muse_glimmer_vision": _muse,
    "muse_spark_vision": _muse,
    "pixtral": _pixtral,
    "inkling2_vision": _inkling,
    "kimi_k25_vision": _kimi,
    "minimax_m3_vl_vision": _minimax,
    "step3p5_vision": _step,
    "gemma4_vision": _gemma4,
    "llama4_vision_model": _llama4,
    **dict.fromkeys(("sam2_video", "sam3_tracker_video", "edgetam_video"), _sam_memory),
    "sam3_vit_model": _sam3_vit,
    "dinov3_vit": _dinov3(own_theta=True),
    "sapiens2": _dinov3(own_theta=True),
    "eomt_dinov3": _dinov3(own_theta=False),
    "efficientloftr": _loftr,
    "lightglue": _lightglue,
}


def vision_rotary_from_hf_config(config: Any) -> tuple[GridRotaryEmbedding, GridRecipe]:
    """The rotary embedding of the vision tower ``config`` describes (a vision config, or a
    composite config read through its ``vision_config``) and its coordinate recipe.

    Raises :class:`~posenc.errors.PosencValueError` naming the model type when posenc does
    not read it (:data:`REFUSED` says why for the families it refuses), or naming a field
    that is missing or contradicts another."""
    cfg, model_type = _fields(config)
    if model_type in REFUSED:
        raise PosencValueError(f"model_type {model_type!r} is refused: {REFUSED[model_type]}")
    reader = VISION_MODEL_TYPES.get(model_type)
    if reader is None:
        raise PosencValueError(
            f"model_type {model_type!r} is not a vision tower posenc reads (transformers "
            f"5.24 families: {sorted(VISION_MODEL_TYPES)})"
        )
    return reader(cfg)
