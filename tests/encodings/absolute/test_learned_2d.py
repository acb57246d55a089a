"""The learned 2-D table of vision transformers: the add, resampling to another grid (against a
float64 bicubic written out here, and against every transformers 5.24 family whose
``interpolate_pos_encoding`` resizes a learned 2-D table), and bad input."""

from __future__ import annotations

import importlib
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import transformers
from torch.testing import assert_close

from posenc import LearnedPositionalEncoding2D
from posenc.errors import PosencTypeError, PosencValueError
from tests.misuse import Misuse, cases, check

DIM = 8


def test_adds_the_table() -> None:
    pe = LearnedPositionalEncoding2D(DIM, (2, 3), cls_tokens=2)
    assert pe.weight.shape == (2 + 6, DIM)
    x = torch.randn(3, 8, DIM)
    assert torch.equal(pe(x), x + pe.weight)
    pe(x).sum().backward()
    assert pe.weight.grad is not None and (pe.weight.grad == 3).all()


def test_grid_mismatch_names_both_sizes() -> None:
    pe = LearnedPositionalEncoding2D(DIM, (2, 3))
    with pytest.raises(PosencValueError, match=r"x has 8 tokens but the table holds 7.*2x3"):
        pe(torch.zeros(1, 8, DIM))


def test_resample_makes_a_new_module() -> None:
    pe = LearnedPositionalEncoding2D(DIM, (4, 4), cls_tokens=1, dropout=0.1)
    before = pe.weight.detach().clone()
    new = pe.resample((3, 5))
    assert new is not pe and new.grid == (3, 5) and new.weight.shape == (1 + 15, DIM)
    assert new.dropout.p == 0.1 and new.weight.requires_grad
    assert torch.equal(pe.weight, before)  # the original is unchanged
    assert torch.equal(new.weight[:1], before[:1])  # class rows are copied
    with torch.no_grad():
        new.weight.zero_()
    assert torch.equal(pe.weight, before)  # no storage shared
    same = pe.resample((4, 4))  # align_corners=False at scale 1 samples the grid itself
    assert_close(same.weight, pe.weight, rtol=0, atol=1e-7)


# --------------------------------------------------------------------------- float64 reference


def _cubic(t: float, a: float = -0.75) -> list[float]:
    """Keys' cubic convolution weights of the 4 taps at offsets -1, 0, 1, 2 from floor(src)."""

    def near(x: float) -> float:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: float) -> float:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _bicubic_matrix(n_in: int, n_out: int, scale: float) -> torch.Tensor:
    """``(n_out, n_in)`` float64 weights of align_corners=False bicubic resampling, sampling
    output ``i`` at ``(i + 0.5) * scale - 0.5`` with border taps clamped, as PyTorch does."""
    m = torch.zeros(n_out, n_in, dtype=torch.float64)
    for i in range(n_out):
        src = (i + 0.5) * scale - 0.5
        base = math.floor(src)
        for tap, weight in zip(range(base - 1, base + 3), _cubic(src - base), strict=True):
            m[i, min(max(tap, 0), n_in - 1)] += weight
    return m


@pytest.mark.parametrize("legacy", [False, True])
def test_bicubic_equals_the_formula_in_float64(legacy: bool) -> None:
    torch.manual_seed(0)
    h, w, h2, w2 = 4, 5, 7, 3
    pe = LearnedPositionalEncoding2D(DIM, (h, w), cls_tokens=1, dtype=torch.float64)
    got = pe.resample((h2, w2), legacy_scale_factor=legacy).weight.detach()
    rows = _bicubic_matrix(h, h2, h / (h2 + 0.1) if legacy else h / h2)
    cols = _bicubic_matrix(w, w2, w / (w2 + 0.1) if legacy else w / w2)
    grid = pe.weight.detach()[1:].reshape(h, w, DIM)
    want = torch.einsum("ia,jb,abd->ijd", rows, cols, grid).reshape(h2 * w2, DIM)
    assert_close(got[1:], want, rtol=0, atol=1e-12)
    assert torch.equal(got[:1], pe.weight.detach()[:1])


def test_legacy_form_differs_from_size_form() -> None:
    pe = LearnedPositionalEncoding2D(DIM, (4, 4))
    a = pe.resample((6, 6)).weight
    b = pe.resample((6, 6), legacy_scale_factor=True).weight
    assert (a - b).abs().max() > 1e-3


def test_half_table_is_resampled_in_float32() -> None:
    pe = LearnedPositionalEncoding2D(DIM, (4, 4), dtype=torch.bfloat16)
    got = pe.resample((5, 3)).weight
    ref = LearnedPositionalEncoding2D(DIM, (4, 4))
    with torch.no_grad():
        ref.weight.copy_(pe.weight.float())
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, ref.resample((5, 3)).weight.to(torch.bfloat16))


# --------------------------------------------------------------------------- transformers


@dataclass(frozen=True)
class Family:
    """One transformers family's embeddings module and how its resampling is asked for."""

    module: str  # transformers.models.<module>
    cls: str
    table: str  # attribute holding the table (a Parameter or an nn.Embedding)
    cls_tokens: int
    resample: dict[str, Any] = field(default_factory=dict)  # posenc's resample() arguments
    config: dict[str, Any] = field(default_factory=dict)
    #: interpolate_pos_encoding takes patch counts and returns only the patch rows (HunYuan)
    patch_counts: bool = False
    #: the config class, where the module's constructor does not annotate it
    config_cls: str | None = None


_VIT = {"hidden_size": DIM, "num_attention_heads": 2, "intermediate_size": 16}
_AA = {"antialias": True}
FAMILIES = [
    Family("vit.modeling_vit", "ViTEmbeddings", "position_embeddings", 1, config=_VIT),
    Family("deit.modeling_deit", "DeiTEmbeddings", "position_embeddings", 2, config=_VIT),
    Family("vit_mae.modeling_vit_mae", "ViTMAEEmbeddings", "position_embeddings", 1, config=_VIT),
    Family("vit_msn.modeling_vit_msn", "ViTMSNEmbeddings", "position_embeddings", 1, config=_VIT),
    Family("ijepa.modeling_ijepa", "IJepaEmbeddings", "position_embeddings", 0, config=_VIT),
    Family("dinov2.modeling_dinov2", "Dinov2Embeddings", "position_embeddings", 1, config=_VIT),
    Family(
        "dinov2_with_registers.modeling_dinov2_with_registers",
        "Dinov2WithRegistersEmbeddings",
        "position_embeddings",
        1,
        _AA,
        _VIT,
    ),
    Family(
        "rf_detr.modeling_rf_detr", "RfDetrDinov2Embeddings", "position_embeddings", 1, _AA, _VIT
    ),
    Family("pixio.modeling_pixio", "PixioEmbeddings", "position_embeddings", 8, config=_VIT),
    Family(
        "beit.modeling_beit",
        "BeitEmbeddings",
        "position_embeddings",
        1,
        config={**_VIT, "use_absolute_position_embeddings": True},
    ),
    Family(
        "swin.modeling_swin",
        "SwinEmbeddings",
        "position_embeddings",
        0,
        config={"embed_dim": DIM, "use_absolute_embeddings": True, "depths": [1], "num_heads": [2]},
        config_cls="SwinConfig",
    ),
    Family("flava.modeling_flava", "FlavaImageEmbeddings", "position_embeddings", 1, config=_VIT),
    Family("clip.modeling_clip", "CLIPVisionEmbeddings", "position_embedding", 1, config=_VIT),
    Family(
        "siglip.modeling_siglip", "SiglipVisionEmbeddings", "position_embedding", 0, config=_VIT
    ),
    Family("blip.modeling_blip", "BlipVisionEmbeddings", "position_embedding", 1, config=_VIT),
    Family(
        "kosmos2.modeling_kosmos2", "Kosmos2VisionEmbeddings", "position_embedding", 1, config=_VIT
    ),
    Family(
        "owlvit.modeling_owlvit", "OwlViTVisionEmbeddings", "position_embedding", 1, config=_VIT
    ),
    Family(
        "internvl.modeling_internvl",
        "InternVLVisionEmbeddings",
        "position_embeddings",
        1,
        config=_VIT,
    ),
    Family("janus.modeling_janus", "JanusVisionEmbeddings", "position_embedding", 0, config=_VIT),
    Family(
        "step3p7.modeling_step3p7",
        "Step3p7VisionEmbeddings",
        "position_embedding",
        0,
        {"mode": "bilinear"},
        _VIT,
    ),
    Family(
        "tipsv2.modeling_tipsv2",
        "Tipsv2VisionEmbeddings",
        "position_embeddings",
        1,
        {"mode": "bilinear", "antialias": True},
        _VIT,
    ),
    Family(
        "hunyuan_vl.modeling_hunyuan_vl",
        "HunYuanVLVisionPatchEmbed",
        "position_embedding",
        1,
        {"mode": "bilinear"},
        {**_VIT, "max_image_size": 12},
        patch_counts=True,
    ),
    Family(
        "hy_v4_vl.modeling_hy_v4_vl",
        "HYV4VLVisionPatchEmbed",
        "position_embedding",
        1,
        {"mode": "bilinear", "legacy_scale_factor": True},
        {**_VIT, "max_image_size": 12},
        patch_counts=True,
    ),
    Family(
        "hy_v4_vl.modeling_hy_v4_vl",
        "HYV4VLVisionPatchEmbed",
        "position_embedding",
        1,
        {"mode": "bicubic", "legacy_scale_factor": True},
        {**_VIT, "max_image_size": 12, "interpolate_mode": "bicubic"},
        patch_counts=True,
    ),
]
#: Families whose embeddings module is one of the above under another name: (module, class,
#: table attribute, class tokens, resample arguments).
FAMILIES += [
    Family(module, cls, table, cls_tokens, resample, _VIT)
    for module, cls, table, cls_tokens, resample in [
        ("altclip.modeling_altclip", "AltCLIPVisionEmbeddings", "position_embedding", 1, {}),
        ("blip_2.modeling_blip_2", "Blip2VisionEmbeddings", "position_embedding", 1, {}),
        (
            "bridgetower.modeling_bridgetower",
            "BridgeTowerVisionEmbeddings",
            "position_embedding",
            1,
            {},
        ),
        (
            "chinese_clip.modeling_chinese_clip",
            "ChineseCLIPVisionEmbeddings",
            "position_embedding",
            1,
            {},
        ),
        ("clipseg.modeling_clipseg", "CLIPSegVisionEmbeddings", "position_embedding", 1, {}),
        ("git.modeling_git", "GitVisionEmbeddings", "position_embedding", 1, {}),
        (
            "granite_docling.modeling_granite_docling",
            "GraniteDoclingVisionEmbeddings",
            "position_embedding",
            0,
            {},
        ),
        ("groupvit.modeling_groupvit", "GroupViTVisionEmbeddings", "position_embeddings", 0, {}),
        (
            "instructblip.modeling_instructblip",
            "InstructBlipVisionEmbeddings",
            "position_embedding",
            1,
            {},
        ),
        (
            "instructblipvideo.modeling_instructblipvideo",
            "InstructBlipVideoVisionEmbeddings",
            "position_embedding",
            1,
            {},
        ),
        (
            "metaclip_2.modeling_metaclip_2",
            "MetaClip2VisionEmbeddings",
            "position_embedding",
            1,
            {},
        ),
        ("owlv2.modeling_owlv2", "Owlv2VisionEmbeddings", "position_embedding", 1, {}),
        (
            "phi4_multimodal.modeling_phi4_multimodal",
            "Phi4MultimodalVisionEmbeddings",
            "position_embedding",
            0,
            {},
        ),
        (
            "qianfan_ocr.modeling_qianfan_ocr",
            "QianfanOCRVisionEmbeddings",
            "position_embeddings",
            1,
            {},
        ),
        (
            "unlimited_ocr.modeling_unlimited_ocr",
            "UnlimitedOcrVisionEmbeddings",
            "position_embedding",
            1,
            _AA,
        ),
        ("x_clip.modeling_x_clip", "XCLIPVisionEmbeddings", "position_embedding", 1, {}),
    ]
]
_SWIN = {"embed_dim": DIM, "use_absolute_embeddings": True, "depths": [1], "num_heads": [2]}
FAMILIES += [
    Family(
        "data2vec.modeling_data2vec_vision",
        "Data2VecVisionEmbeddings",
        "position_embeddings",
        1,
        config={**_VIT, "use_absolute_position_embeddings": True},
    ),
    Family(
        "donut.modeling_donut_swin",
        "DonutSwinEmbeddings",
        "position_embeddings",
        1,  # a leading row with no class token beside it: the table is (1 + h*w, d)
        config=_SWIN,
        config_cls="DonutSwinConfig",
    ),
    Family(
        "maskformer.modeling_maskformer_swin",
        "MaskFormerSwinEmbeddings",
        "position_embeddings",
        1,  # a leading row with no class token beside it: the table is (1 + h*w, d)
        config=_SWIN,
        config_cls="MaskFormerSwinConfig",
    ),
]
GRID, PATCH = 6, 2  # the tables are 6 x 6 patches of 2 x 2 pixels


def _build(family: Family) -> torch.nn.Module:
    module = importlib.import_module(f"transformers.models.{family.module}")
    cls = getattr(module, family.cls)
    annotation = family.config_cls or cls.__init__.__annotations__["config"]
    config_name = annotation if isinstance(annotation, str) else annotation.__name__
    config_cls = getattr(transformers, config_name.split("|")[0].strip())
    config = config_cls(image_size=GRID * PATCH, patch_size=PATCH, num_channels=3, **family.config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(config)


@pytest.mark.parametrize(
    "family", FAMILIES, ids=[f"{f.cls}-{f.resample.get('mode', 'bicubic')}" for f in FAMILIES]
)
@pytest.mark.parametrize("grid", [(3, 4), (7, 9)], ids=["shrink", "grow"])
def test_resample_equals_transformers(family: Family, grid: tuple[int, int]) -> None:
    torch.manual_seed(0)
    embeddings = _build(family)
    table = getattr(embeddings, family.table)
    table = table.weight if isinstance(table, torch.nn.Embedding) else table
    with torch.no_grad():
        table.copy_(torch.randn_like(table))
    assert table.reshape(-1, DIM).shape[0] == family.cls_tokens + GRID * GRID
    pe = LearnedPositionalEncoding2D(DIM, (GRID, GRID), cls_tokens=family.cls_tokens)
    with torch.no_grad():
        pe.weight.copy_(table.reshape(-1, DIM))
    h2, w2 = grid
    x = torch.randn(2, family.cls_tokens + h2 * w2, DIM)
    new = pe.resample(grid, **family.resample)
    with torch.no_grad():
        if family.patch_counts:  # HunYuan: the patch rows alone, from patch counts
            theirs = embeddings.interpolate_pos_encoding(x, h2, w2).reshape(-1, DIM)
            ours = new.weight[family.cls_tokens :]
        else:  # the whole table, from pixel sizes
            theirs = embeddings.interpolate_pos_encoding(x, h2 * PATCH, w2 * PATCH)
            theirs = x + theirs.reshape(1, -1, DIM)
            ours = new(x)
    assert ours.shape == theirs.shape
    assert ((ours - theirs).abs().max() / theirs.abs().max()).item() <= 2e-5


# --------------------------------------------------------------------------- misuse


L2 = LearnedPositionalEncoding2D
MISUSE = [
    Misuse("dim 0", lambda: L2(0, (2, 2)), PosencValueError, "dim", 0),
    Misuse("grid int", lambda: L2(4, 2), PosencTypeError, "grid", 2),  # type: ignore[arg-type]
    Misuse("grid 0", lambda: L2(4, (2, 0)), PosencValueError, "grid[1]", 0),
    Misuse("cls -1", lambda: L2(4, (2, 2), cls_tokens=-1), PosencValueError, "cls_tokens", -1),
    Misuse("cls float", lambda: L2(4, (2, 2), cls_tokens=1.0), PosencTypeError, "cls_tokens", 1.0),  # type: ignore[arg-type]
    Misuse("init", lambda: L2(4, (2, 2), init="zeros"), PosencValueError, "init", "zeros"),  # type: ignore[arg-type]
    Misuse(
        "mode",
        lambda: L2(4, (2, 2)).resample((3, 3), mode="nearest"),
        PosencValueError,
        "mode",
        "nearest",
    ),  # type: ignore[arg-type]
    Misuse(
        "antialias str",
        lambda: L2(4, (2, 2)).resample((3, 3), antialias="yes"),
        PosencTypeError,
        "antialias",
        "yes",
    ),  # type: ignore[arg-type]
    Misuse("new grid", lambda: L2(4, (2, 2)).resample((3, -1)), PosencValueError, "grid[1]", -1),
    Misuse("x width", lambda: L2(4, (2, 2))(torch.zeros(1, 5, 3)), PosencValueError, "dim", 4),
]


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse(case: Misuse) -> None:
    check(case)
