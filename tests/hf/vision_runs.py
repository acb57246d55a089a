"""How the vision census (``tests/hf/vision_census.py``) runs one family: the harness (the
:class:`Family` record, q and k, the error) and one run per calling convention, each making the
family's coordinates the way its tower does, its rotary module's cos and sin, its apply
function on q and k in its attention's layout, and posenc's rotation of the same q and k.

Dimension legend: ``b`` batch (1), ``h`` heads (3 for q, 2 for k), ``n`` tokens, ``d`` head.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from posenc.vision import positions_from_hf_config, rotary_from_hf_config

HEADS_Q, HEADS_K = 3, 2
EXACT, REFUSED, WRONG, CRASHED = "exact", "refused", "wrong", "crashed"
#: The position lines of Qwen2-VL's tower and of Qwen2.5-VL's window reordering.
QWEN_IDS = "get_vision_position_ids(grid_thw, self.spatial_merge_size"
WINDOW = "get_vision_window_index("


def modeling(folder: str) -> ModuleType:
    return importlib.import_module(f"transformers.models.{folder}.modeling_{folder}")


def _qk(n: int, d: int, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, HEADS_Q, n, d, generator=g), torch.randn(1, HEADS_K, n, d, generator=g)


def _nhd(x: Tensor) -> Tensor:
    """``(1, h, n, d)`` -> ``(n, h, d)``, the packed layout of the Qwen-style towers."""
    return x[0].transpose(0, 1)


def _bhnd(x: Tensor) -> Tensor:
    return x.transpose(0, 1).unsqueeze(0)


def error_of(ours: tuple[Tensor, ...], theirs: tuple[Tensor, ...]) -> float:
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        if a.shape != b.shape:
            raise AssertionError(f"shapes differ: posenc {tuple(a.shape)}, family {tuple(b.shape)}")
        worst = max(worst, ((a.double() - b.double()).abs().max() / b.double().abs().max()).item())
    return worst


Run = Callable[["Family", ModuleType, Any], tuple[tuple[Tensor, ...], tuple[Tensor, ...]]]


@dataclass(frozen=True)
class Family:
    """One vision tower: its config's ``model_type``, its folder, the attention classes whose
    apply call it covers, the config overrides that make it tiny, the source lines its
    coordinates reproduce, and how to run it (``None``: posenc refuses it)."""

    model_type: str
    folder: str
    sites: tuple[str, ...]
    run: Run | None
    tiny: dict[str, Any]
    reproduces: tuple[str, ...] = ()
    grid: tuple[tuple[int, int, int], ...] = ((1, 4, 6), (2, 2, 4))
    rotary: str = ""  # the family's rotary class, when the run needs it by name


@dataclass
class Result:
    family: Family
    kind: str
    error: float | None = None
    detail: str = ""


def config_of(family: Family) -> Any:
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[family.model_type](**family.tiny)


def _rotary_class(family: Family, module: ModuleType) -> type:
    if family.rotary:
        return getattr(module, family.rotary)
    names = [n for n in dir(module) if n.endswith("VisionRotaryEmbedding")]
    if len(names) != 1:
        raise AssertionError(f"{family.folder}: vision rotary classes {names}; name one")
    return getattr(module, names[0])


def _posenc(family: Family, config: Any, q: Tensor, k: Tensor, grid: Any, **kw: Any) -> tuple:
    pe = rotary_from_hf_config(config)
    return pe(q, k, positions_from_hf_config(config, grid, **kw))


# ------------------------------------------------------------------ runs, one per convention


def run_qwen(family: Family, module: ModuleType, config: Any) -> tuple[tuple, tuple]:
    """Qwen2-VL and its copies: ``get_vision_position_ids`` (merge or not, Video-LLaMA 3's per
    image), Qwen2.5-VL's window permutation of cos and sin, ``apply_rotary_pos_emb_vision`` on
    packed ``(n, h, d)`` heads."""
    from transformers import vision_utils as vu

    grid = torch.tensor(family.grid)
    lines = " ".join(family.reproduces)
    muse = "position_ids.flip(-1) + 1" in lines
    window = WINDOW in lines or muse
    merge: Any = config.spatial_merge_size if QWEN_IDS in lines else 1
    if "merge_sizes" in lines:
        merge = torch.tensor([2] * len(grid))
    ids = vu.get_vision_position_ids(grid, merge)
    if muse:
        ids = ids.flip(-1) + 1
    n = ids.shape[0]
    rotary = _rotary_class(family, module)(config)
    head = rotary.inv_freq.numel() * 4
    q, k = _qk(n, head, seed=n)
    if window:
        size = 1 if muse else config.spatial_merge_size
        span = config.pos_emb_height * config.patch_size if muse else config.window_size
        index, _ = vu.get_vision_window_index(grid, size, span, config.patch_size)
        if muse:
            cos, sin = rotary(q, ids[index])
        else:
            cos, sin = rotary(q, ids)
            unit = size * size
            cos, sin = (t.reshape(n // unit, unit, -1)[index].reshape(n, -1) for t in (cos, sin))
    else:
        cos, sin = rotary(q, ids)
    fq, fk = module.apply_rotary_pos_emb_vision(_nhd(q), _nhd(k), cos, sin)
    merge_kw = {"merge": [2] * len(grid)} if isinstance(merge, Tensor) else {}
    ours = _posenc(family, config, q, k, grid, **merge_kw)
    return ours, (_bhnd(fq), _bhnd(fk))


def run_packed(family: Family, module: ModuleType, config: Any) -> tuple[tuple, tuple]:
    """Kimi-K2.5, MiniMax-M3-VL, Step3p7: ``get_vision_position_ids`` as their towers call it
    (:attr:`Family.reproduces`), ``apply_rotary_pos_emb_vision`` on ``(n, h, d)``."""
    from transformers import vision_utils as vu

    grid = torch.tensor(family.grid)
    call = family.reproduces[0]
    if "include_temporal" in call:
        ids = vu.get_vision_position_ids(grid, config.spatial_merge_size, include_temporal=True)
    else:
        ids = vu.get_vision_position_ids(grid, 1)
    rotary = _rotary_class(family, module)(config)
    d = rotary_from_hf_config(config).head_dim
    q, k = _qk(ids.shape[0], d, seed=3)
    cos, sin = rotary(q, ids)
    fq, fk = module.apply_rotary_pos_emb_vision(_nhd(q), _nhd(k), cos, sin)
    return _posenc(family, config, q, k, grid), (_bhnd(fq), _bhnd(fk))


def run_inkling(family: Family, module: ModuleType, config: Any) -> tuple[tuple, tuple]:
    """Inkling 2: patches 1-indexed in merge order, a class token at the origin in front of
    each image (``index_copy`` at ``patch_index``)."""
    from transformers import vision_utils as vu

    grid = torch.tensor(family.grid)
    merge = config.spatial_merge_size
    per_image = grid.prod(-1)
    patch_index = torch.arange(int(per_image.sum())) + torch.repeat_interleave(
        torch.arange(1, len(grid) + 1), per_image
    )
    ids = vu.get_vision_position_ids(grid, merge)
    n = int(per_image.sum()) + len(grid)
    ids = ids.new_zeros(n, 2).index_copy(0, patch_index, ids + 1)
    rotary = _rotary_class(family, module)(config)
    q, k = _qk(n, rotary.inv_freq.numel() * 4, seed=5)
    cos, sin = rotary(q, ids)
    fq, fk = module.apply_rotary_pos_emb_vision(_nhd(q), _nhd(k), cos, sin)
    return _posenc(family, config, q, k, grid), (_bhnd(fq), _bhnd(fk))


def run_pixtral(family: Family, module: ModuleType, config: Any) -> tuple[tuple, tuple]:
    """Pixtral: row-major ``(row, col)`` per image, ``apply_rotary_pos_emb(...,
    unsqueeze_dim=0)`` on ``(b, h, n, d)``."""
    grid = torch.tensor(family.grid)
    ids = []
    for _, h, w in family.grid:
        hpos, wpos = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        ids.append(torch.stack([hpos.flatten(), wpos.flatten()], dim=-1))
    ids = torch.cat(ids)
    rotary = module.PixtralVisionRotaryEmbedding(config)
    q, k = _qk(ids.shape[0], config.head_dim, seed=7)
    cos, sin = rotary(q, ids)
    theirs = module.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)
    return _posenc(family, config, q, k, grid), theirs


def run_gemma4(family: Family, module: ModuleType, config: Any) -> tuple[tuple, tuple]:
    """Gemma 4: the processor's ``pixel_position_ids`` ``(b, n, 2)`` as ``(x, y)``,
    ``apply_multidimensional_rope`` on ``(b, n, h, d)``."""
    _, h, w = family.grid[0]
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    ids = torch.stack([xs.flatten(), ys.flatten()], dim=-1).unsqueeze(0)  # (1, n, 2) (x, y)
    rotary = module.Gemma4VisionRotaryEmbedding(config)
    q, k = _qk(h * w, config.head_dim, seed=9)
    cos, sin = rotary(q, ids)
    fq = module.apply_multidimensional_rope(q.transpose(1, 2), cos, sin, ids).transpose(1, 2)
    fk = module.apply_multidimensional_rope(k.transpose(1, 2), cos, sin, ids).transpose(1, 2)
    return _posenc(family, config, q, k, family.grid[:1]), (fq, fk)


def run_llama4(family: Family, module: ModuleType, config: Any) -> tuple[tuple, tuple]:
    """Llama 4: ``freqs_ci`` of the fixed grid (class token last), ``vision_apply_rotary_emb``
    on ``(b, n, h, d)``."""
    side = config.image_size // config.patch_size
    freqs_ci = module.Llama4VisionRotaryEmbedding(config)(torch.zeros(1))
    d = config.hidden_size // config.num_attention_heads
    q, k = _qk(side * side + 1, d, seed=11)
    fq, fk = module.vision_apply_rotary_emb(q.transpose(1, 2), k.transpose(1, 2), freqs_ci)
    return _posenc(family, config, q, k, [(1, side, side)]), (
        fq.transpose(1, 2),
        fk.transpose(1, 2),
    )


def _memory(module: ModuleType) -> type:
    return next(getattr(module, n) for n in dir(module) if n.endswith("VideoMemoryAttention"))


def run_sam_memory(family: Family, module: ModuleType, config: Any) -> tuple[tuple, tuple]:
    """SAM 2 / SAM 3 tracker memory attention: ``precompute_positions`` ``(col, row)`` of the
    feature map; keys are the memory frames' tokens (``repeat_freqs_k``) then object pointers
    left unrotated (``num_k_exclude_rope``)."""
    from posenc.vision import memory_key_positions

    ids = _memory(module).precompute_positions(config)
    w, h = config.memory_attention_rope_feat_sizes
    rotary = _rotary_class(family, module)(config)
    pe = rotary_from_hf_config(config)
    frames, pointers = 2, 3
    q, _ = _qk(h * w, pe.head_dim, seed=13)
    _, k = _qk(h * w * frames + pointers, pe.head_dim, seed=14)
    cos, sin = rotary(q, ids)
    theirs = module.apply_rotary_pos_emb_2d(
        q, k, cos, sin, num_k_exclude_rope=pointers, repeat_freqs_k=True
    )
    coords = positions_from_hf_config(config, [(1, h, w)])
    keys = memory_key_positions(coords, frames=frames, excluded=pointers)
    return (pe.rotate(q, coords), pe.rotate(k, keys)), theirs


def run_edgetam(family: Family, module: ModuleType, config: Any) -> tuple[tuple, tuple]:
    """EdgeTAM video: self-attention on the feature map's ``(col, row)``; cross-attention with
    queries on the feature map and keys per memory frame: temporal tokens unrotated, then the
    ``memory_attention_rope_k_sizes`` map; object pointers last, unrotated."""
    from posenc.vision import memory_key_positions

    memory = _memory(module)
    ids, ids_k = memory.precompute_positions(config), memory.precompute_positions(config, True)
    w, h = config.memory_attention_rope_feat_sizes
    wk, hk = config.memory_attention_rope_k_sizes
    rotary = _rotary_class(family, module)(config)
    pe = rotary_from_hf_config(config)
    q, k_self = _qk(h * w, pe.head_dim, seed=15)
    cos, sin = rotary(q, ids)
    cos_k, sin_k = rotary(q, ids_k)
    frames, temporal, pointers = 2, 3, 2
    _, k = _qk(frames * (temporal + hk * wk) + pointers, pe.head_dim, seed=16)
    self_theirs = module.apply_rotary_pos_emb_2d_self_attn(q, k_self, cos=cos, sin=sin)
    cross_theirs = module.apply_rotary_pos_emb_2d_cross_attn(
        q, k, cos, sin, cos_k, sin_k, num_k_exclude_rope=pointers, repeat_freqs_k=frames
    )
    coords = positions_from_hf_config(config, [(1, h, w)])
    keys = memory_key_positions(
        positions_from_hf_config(config, [(1, hk, wk)]),
        frames=frames,
        temporal_tokens=temporal,
        excluded=pointers,
    )
    ours = (*pe(q, k_self, coords), pe.rotate(k, keys))
    return ours, (*self_theirs, cross_theirs[1])


def run_sam3_vit(family: Family, module: ModuleType, config: Any) -> tuple[tuple, tuple]:
    """SAM 3's ViT: a windowed layer (``(col, row)`` of the window) and a global one (of the
    whole grid, scaled by ``window_size / width``), ``apply_rotary_pos_emb_2d``."""
    layer = module.Sam3ViTLayer
    rotary = module.Sam3ViTRotaryEmbedding(config)
    pe = rotary_from_hf_config(config)
    side = config.image_size // config.patch_size
    ours, theirs = [], []
    for window, grid in ((config.window_size, config.window_size), (0, side)):
        ids = layer.precompute_positions(config, window)
        q, k = _qk(grid * grid, pe.head_dim, seed=17 + window)
        cos, sin = rotary(q, ids)
        theirs += module.apply_rotary_pos_emb_2d(q, k, cos=cos, sin=sin)
        coords = positions_from_hf_config(
            config, [(1, grid, grid)], scale=config.window_size / grid
        )
        ours += pe(q, k, coords)
    return tuple(ours), tuple(theirs)


def run_dinov3(family: Family, module: ModuleType, config: Any) -> tuple[tuple, tuple]:
    """DINOv3, Sapiens 2, EoMT-DINOv3 in eval mode: the rope module of the pixel grid, the
    class and register tokens in front left unrotated by ``apply_rotary_pos_emb``."""
    cls = next(
        getattr(module, n)
        for n in dir(module)
        if n.endswith(("RopePositionEmbedding", "Dinov3RotaryEmbedding"))
    )
    rope = cls(config).eval()
    h, w = 4, 6
    pixels = torch.zeros(1, 3, h * config.patch_size, w * config.patch_size)
    cos, sin = rope(pixels)
    prefix = 1 + config.num_register_tokens
    q, k = _qk(prefix + h * w, config.hidden_size // config.num_attention_heads, seed=19)
    theirs = module.apply_rotary_pos_emb(q, k, cos, sin)
    return _posenc(family, config, q, k, [(1, h, w)]), theirs


def run_loftr(family: Family, module: ModuleType, config: Any) -> tuple[tuple, tuple]:
    """EfficientLoFTR: the aggregated feature map's 1-based ``(row, col)``, the whole hidden
    vector rotated before the head split (``(b, n, 1, hidden)``, ``unsqueeze_dim=2``)."""
    features = torch.zeros(1, config.hidden_size, 12, 8)
    cos, sin = module.EfficientLoFTRRotaryEmbedding(config)(features)
    h = (12 - config.q_aggregation_kernel_size) // config.q_aggregation_stride + 1
    w = (8 - config.q_aggregation_kernel_size) // config.q_aggregation_stride + 1
    cos, sin = (t.reshape(1, h * w, config.hidden_size) for t in (cos, sin))
    q, _ = _qk(h * w, config.hidden_size, seed=21)
    q, k = q[:, :1], q[:, 1:2]
    fq, fk = module.apply_rotary_pos_emb(
        q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2
    )
    return _posenc(family, config, q, k, [(1, h, w)]), (fq.transpose(1, 2), fk.transpose(1, 2))


def run_lightglue(family: Family, module: ModuleType, config: Any) -> tuple[tuple, tuple]:
    """LightGlue: keypoints ``(b, n, 2)`` through the learned projector (copied into posenc's
    ``frequencies``), ``apply_rotary_pos_emb`` on ``(b, h, n, d)``."""
    encoder = module.LightGluePositionalEncoder(config)
    keypoints = torch.rand(1, 9, 2, generator=torch.Generator().manual_seed(23)) * 2 - 1
    cos, sin = encoder(keypoints)[0]
    pe = rotary_from_hf_config(config)
    with torch.no_grad():
        pe.frequencies.copy_(encoder.projector.weight)
    q, k = _qk(9, pe.head_dim, seed=23)
    return pe(q, k, keypoints), module.apply_rotary_pos_emb(q, k, cos, sin)
