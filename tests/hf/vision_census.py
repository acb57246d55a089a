"""The vision RoPE census: every transformers vision tower that rotates queries and keys over
patch, frame or keypoint coordinates, rotated by its own rotary module and apply function and
by :func:`posenc.vision.rotary_from_hf_config` on the same grid.

What is swept is found from transformers' source by call site (:func:`vision_sites`): every
call, inside a class of a ``modeling_*.py`` whose name holds ``Attention``, of a function
whose name holds ``rot`` or ``rope``, where the class is a vision one (its name says
``Vision``, ``ViT``, ``Video``, ``Image``, ``Sam``, ``Memory``, ``Patch`` or ``Rope``) or its
folder has no ``class *RotaryEmbedding(`` of sequence tables (every one is transformers'
axial kind, ``compute_axial_rope_parameters``), or all its model types are on the text
census's not-a-sequence list (``tests/hf/test_rope_census.py``). Every such site must be run
by a :class:`Family` below, refused by name, or listed in :data:`SEQUENCE_SITES` with the
reason it does not rotate over image coordinates; a new site fails the census.

For each family (:data:`FAMILIES`; the runs are in ``tests/hf/vision_runs.py``): its config
class with tiny sizes (head dims 16 to 64), the family's own coordinates for a grid, made the
way its tower makes them (with transformers' ``vision_utils`` helpers or the family's own
static methods; each family names the source lines it reproduces, and they must still be in
the modeling file), its own rotary module's cos and sin, its own apply function on random q
and k in the layout its attention uses; then ``rotary_from_hf_config(config)`` and
``positions_from_hf_config(config, grid)`` on the same q and k.
``max|posenc - family| / max|family| <= 2e-5`` over the whole q and k is exact.
"""

from __future__ import annotations

import ast
import functools
import inspect
import math
import re
from pathlib import Path
from typing import Any

import torch

from posenc.errors import PosencTypeError, PosencValueError
from posenc.vision import rotary_from_hf_config
from tests.hf.vision_runs import (
    CRASHED,
    EXACT,
    QWEN_IDS,
    REFUSED,
    WINDOW,
    WRONG,
    Family,
    Result,
    config_of,
    error_of,
    modeling,
    run_dinov3,
    run_edgetam,
    run_gemma4,
    run_inkling,
    run_lightglue,
    run_llama4,
    run_loftr,
    run_packed,
    run_pixtral,
    run_qwen,
    run_sam3_vit,
    run_sam_memory,
)

TOLERANCE = 2e-5

_MARK = re.compile(r"Vision|ViT|Video|Image|Sam|Memory|Patch|Rope|RoPE")
_APPLY = re.compile(r"rot|rope", re.I)
_TEXT_ROTARY = re.compile(r"^class (\w+RotaryEmbedding)\(", re.M)


def models_dir() -> Path:
    import transformers.models

    return Path(transformers.models.__file__).parent


_TOP_CLASS = re.compile(r"^class (\w*Attention\w*)\b", re.M)
_TOP_LEVEL = re.compile(r"^[^\s#)\]}]", re.M)


def _sequence_rotaries(source: str) -> list[str]:
    """The ``class *RotaryEmbedding(`` of a modeling file that build sequence tables: not
    transformers' axial ones (``compute_axial_rope_parameters``, ``rope_type="axial"``)."""
    found = []
    for match in _TEXT_ROTARY.finditer(source):
        end = _TOP_LEVEL.search(source, match.end())
        body = source[match.start() : end.start() if end else len(source)]
        if "compute_axial_rope_parameters" not in body:
            found.append(match.group(1))
    return found


def _attention_classes(source: str) -> list[tuple[str, ast.ClassDef]]:
    """The top-level classes whose name holds ``Attention``, each parsed on its own (parsing
    only them keeps the sweep of ~290 modeling files to about a second)."""
    found = []
    for match in _TOP_CLASS.finditer(source):
        end = _TOP_LEVEL.search(source, match.end())
        text = source[match.start() : end.start() if end else len(source)]
        node = ast.parse(text).body[0]
        assert isinstance(node, ast.ClassDef)
        found.append((match.group(1), node))
    return found


@functools.cache
def _not_sequence_folders() -> frozenset[str]:
    """Folders all of whose model types the text census lists as not a sequence
    (``NOT_SEQUENCE`` of ``tests/hf/test_rope_census.py``): their rotary classes, whatever
    their names, are left to this census."""
    from transformers.models.auto.configuration_auto import (
        CONFIG_MAPPING_NAMES,
        model_type_to_module_name,
    )

    from tests.hf.test_rope_census import NOT_SEQUENCE

    types: dict[str, set[str]] = {}
    for model_type in CONFIG_MAPPING_NAMES:
        types.setdefault(model_type_to_module_name(model_type), set()).add(model_type)
    return frozenset(folder for folder, found in types.items() if found <= set(NOT_SEQUENCE))


@functools.cache
def vision_sites() -> frozenset[tuple[str, str, str]]:
    """``(folder, attention class, function)`` of every vision call site (module docstring)."""
    sites = set()
    for path in sorted(models_dir().glob("*/modeling_*.py")):
        source = path.read_text()
        if not _APPLY.search(source):
            continue
        folder = path.parent.name
        sequence_rotary = folder not in _not_sequence_folders() and bool(_sequence_rotaries(source))
        for name, node in _attention_classes(source):
            if not (_MARK.search(name) or not sequence_rotary):
                continue
            for call in ast.walk(node):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
                    continue
                function = call.func.id
                if _APPLY.search(function) and function[:1].islower():
                    sites.add((folder, name, function))
    return frozenset(sites)


# --------------------------------------------------------------------------- the families

_Q = {"hidden_size": 64, "num_heads": 4}  # head 16
_QA = {"hidden_size": 64, "num_attention_heads": 4}
WINDOWED = ((1, 6, 10), (2, 4, 4))


def _qwen(model_type: str, folder: str, site: str, tiny: dict, *lines: str, **kw: Any) -> Family:
    """A Qwen2-VL-style tower; ``lines`` the position lines it reproduces (default: Qwen2-VL's
    ``get_vision_position_ids`` call)."""
    return Family(model_type, folder, (site,), run_qwen, tiny, lines or (QWEN_IDS,), **kw)


FAMILIES: tuple[Family, ...] = (
    _qwen("qwen2_vl_vision", "qwen2_vl", "VisionAttention", {"embed_dim": 64, "num_heads": 4}),
    _qwen(
        "qwen2_5_vl_vision",
        "qwen2_5_vl",
        "Qwen2_5_VLVisionAttention",
        {**_QA, "window_size": 56},
        WINDOW,
        QWEN_IDS,
        grid=WINDOWED,
    ),
    _qwen(
        "qwen2_5_omni_vision_encoder",
        "qwen2_5_omni",
        "Qwen2_5OmniVisionAttention",
        {**_QA, "window_size": 56},
        WINDOW,
        QWEN_IDS,
        grid=WINDOWED,
    ),
    _qwen(
        "exaone4_5_vision",
        "exaone4_5",
        "Exaone4_5_VisionAttention",
        {**_Q, "window_size": 56},
        WINDOW,
        QWEN_IDS,
        grid=WINDOWED,
    ),
    _qwen("qwen3_vl_vision", "qwen3_vl", "Qwen3VLVisionAttention", _QA),
    _qwen("qwen3_vl_moe_vision", "qwen3_vl_moe", "Qwen3VLMoeVisionAttention", _QA),
    _qwen("qwen3_5_vision", "qwen3_5", "Qwen3_5VisionAttention", _QA),
    _qwen("qwen3_5_moe_vision", "qwen3_5_moe", "Qwen3_5MoeVisionAttention", _QA),
    _qwen("qwen3_omni_moe_vision_encoder", "qwen3_omni_moe", "Qwen3OmniMoeVisionAttention", _QA),
    _qwen("qwen4_exp_vision", "qwen4_exp", "Qwen4ExpVisionAttention", _QA),
    _qwen("glm4v_vision", "glm4v", "Glm4vVisionAttention", _QA),
    _qwen("glm4v_moe_vision", "glm4v_moe", "Glm4vMoeVisionAttention", _QA),
    _qwen("glm_ocr_vision", "glm_ocr", "GlmOcrVisionAttention", _QA),
    _qwen("glm5_next_vision", "glm5_next", "Glm5NextVisionAttention", _QA),
    _qwen("cohere_compass_vision", "cohere_compass", "CohereCompassVisionAttention", _Q),
    _qwen(
        "dots3_note_vision_encoder",
        "dots3_note",
        "Dots3NoteVisionAttention",
        {**_QA, "adapter_in_dim": 64},
    ),
    _qwen("ernie4_5_vl_moe_vision", "ernie4_5_vl_moe", "Ernie4_5_VLMoeVisionAttention", _QA),
    _qwen("lfm3_vl_vision", "lfm3_vl", "Lfm3VlVisionAttention", _QA),
    _qwen(
        "paddleocr_vl_vision",
        "paddleocr_vl",
        "PaddleOCRVisionAttention",
        _QA,
        "get_vision_position_ids(grid_thw, 1, kwargs=kwargs)",
    ),
    _qwen(
        "video_llama_3_vision",
        "video_llama_3",
        "VideoLlama3VisionAttention",
        _QA,
        "get_vision_position_ids(grid_thw, merge_sizes, kwargs=kwargs)",
    ),
    _qwen(
        "muse_glimmer_vision",
        "muse_glimmer",
        "MuseGlimmerVisionAttention",
        {**_QA, "pos_emb_height": 4},
        "position_ids = position_ids.flip(-1) + 1",
        WINDOW,
        grid=WINDOWED,
    ),
    _qwen(
        "muse_spark_vision",
        "muse_spark",
        "MuseSparkVisionAttention",
        {**_QA, "pos_emb_height": 4},
        "position_ids = position_ids.flip(-1) + 1",
        WINDOW,
        grid=WINDOWED,
    ),
    Family(
        "kimi_k25_vision",
        "kimi_k25",
        ("Kimi_K25VisionAttention",),
        run_packed,
        _QA,
        ("get_vision_position_ids(grid_thw, spatial_merge_size=1",),
        ((1, 3, 4), (2, 2, 3)),
    ),
    Family(
        "minimax_m3_vl_vision",
        "minimax_m3_vl",
        ("MiniMaxM3VLVisionAttention",),
        run_packed,
        {"hidden_size": 80, "num_attention_heads": 4},
        ("include_temporal=self.include_temporal",),
        rotary="MiniMaxM3VLVisionRotaryEmbedding",
    ),
    Family(
        "step3p5_vision",
        "step3p7",
        ("Step3p7VisionAttention",),
        run_packed,
        _QA,
        ("get_vision_position_ids(grid_thw, spatial_merge_size=1)",),
    ),
    Family(
        "inkling2_vision",
        "inkling2",
        ("Inkling2VisionAttention",),
        run_inkling,
        _QA,
        (
            "position_ids.new_zeros(hidden_states.shape[0], 2).index_copy(0, patch_index, "
            "position_ids + 1)",
        ),
        ((1, 4, 4), (1, 2, 6)),
    ),
    Family(
        "pixtral",
        "pixtral",
        ("PixtralAttention",),
        run_pixtral,
        {"hidden_size": 64, "num_attention_heads": 4, "head_dim": 16},
        ("position_ids.append(torch.stack([hpos_ids.flatten(), wpos_ids.flatten()], dim=-1))",),
        ((1, 3, 5), (1, 4, 2)),
    ),
    Family(
        "gemma4_vision",
        "gemma4",
        ("Gemma4VisionAttention",),
        run_gemma4,
        {"hidden_size": 64, "num_attention_heads": 4, "head_dim": 16},
        ("position_embeddings = self.rotary_emb(hidden_states, pixel_position_ids)",),
        ((1, 3, 5),),
    ),
    Family(
        "llama4_vision_model",
        "llama4",
        ("Llama4VisionAttention",),
        run_llama4,
        {"hidden_size": 64, "num_attention_heads": 4, "image_size": 56, "patch_size": 14},
        ("img_idx[-1, -1] = -2",),
    ),
    *(
        Family(
            model_type,
            model_type,
            (attention,),
            run_sam_memory,
            {
                "memory_attention_hidden_size": 64,
                "memory_attention_num_attention_heads": 2,
                "memory_attention_rope_feat_sizes": [5, 3],
            },
            ("position_ids = torch.stack([wpos_ids.flatten(), hpos_ids.flatten()], dim=-1)",),
        )
        for model_type, attention in (
            ("sam2_video", "Sam2VideoRoPEAttention"),
            ("sam3_tracker_video", "Sam3TrackerVideoRoPEAttention"),
        )
    ),
    Family(
        "edgetam_video",
        "edgetam_video",
        ("EdgeTamVideoRoPESelfAttention", "EdgeTamVideoRoPECrossAttention"),
        run_edgetam,
        {
            "memory_attention_hidden_size": 64,
            "memory_attention_num_attention_heads": 2,
            "memory_attention_rope_feat_sizes": [5, 3],
            "memory_attention_rope_k_sizes": [2, 4],
        },
        ("position_ids = torch.stack([wpos_ids.flatten(), hpos_ids.flatten()], dim=-1)",),
    ),
    Family(
        "sam3_vit_model",
        "sam3",
        ("Sam3ViTRoPEAttention",),
        run_sam3_vit,
        {
            "hidden_size": 64,
            "num_attention_heads": 4,
            "image_size": 84,
            "patch_size": 14,
            "window_size": 4,
        },
        ("position_ids = position_ids * (config.window_size / hw_grid[1])",),
    ),
    *(
        Family(
            model_type,
            folder,
            (attention,),
            run_dinov3,
            {
                "hidden_size": 64,
                "num_attention_heads": 4,
                "patch_size": 4,
                "num_register_tokens": 2,
            },
            ("coords = 2.0 * coords - 1.0",),
        )
        for model_type, folder, attention in (
            ("dinov3_vit", "dinov3_vit", "DINOv3ViTAttention"),
            ("sapiens2", "sapiens2", "Sapiens2Attention"),
            ("eomt_dinov3", "eomt_dinov3", "EomtDinov3Attention"),
        )
    ),
    Family(
        "efficientloftr",
        "efficientloftr",
        ("EfficientLoFTRAttention",),
        run_loftr,
        {"hidden_size": 64, "num_attention_heads": 8, "out_features": [16, 16, 32, 64]},
        ("i_indices = i_indices.cumsum(0).unsqueeze(-1)",),
    ),
    Family(
        "lightglue",
        "lightglue",
        ("LightGlueAttention",),
        run_lightglue,
        {"descriptor_dim": 64, "num_attention_heads": 4},
        ("projected_keypoints = self.projector(keypoints)",),
    ),
    Family("vjepa2", "vjepa2", ("VJEPA2RopeAttention",), None, {}),
    Family("mlcd_vision_model", "mlcd", ("MLCDAttention",), None, {}),
)

#: Call sites the scan finds that do not rotate over image coordinates (folder, class) -> why.
SEQUENCE_SITES: dict[tuple[str, str], str] = {
    ("xcodec2", "Xcodec2Attention"): "audio codec: RoPE over the head index (position_ids = "
    "arange(heads)); the text census lists it",
    ("neucodec", "NeuCodecAttention"): "audio codec: RoPE over the head index (position_ids = "
    "arange(heads)); the text census lists it",
    ("clvp", "ClvpSelfAttention"): "CLVP's text and speech encoders: RoPE over token index",
    ("deepseek_ocr2", "DeepseekOcr2VisionAttention"): "DeepSeek-OCR 2's vision encoder is a "
    "Qwen2 decoder over its token sequence: 1-D RoPE (the text census sweeps "
    "DeepseekOcr2VisionRotaryEmbedding)",
    ("exaone4_5", "Exaone4_5_Attention"): "EXAONE 4.5's text attention: 1-D RoPE over tokens "
    "(its language model is AutoModel of its text config, EXAONE 4, in the text census)",
    ("glm_image", "GlmImageTextAttention"): "GLM-Image's text model (text census)",
    ("granite4_vision", "Granite4VisionTextAttention"): "Granite 4 Vision's text model "
    "(text census)",
    ("pe_video", "PeVideoEncoderAttention"): "Perception Encoder video: 1-D RoPE over frame "
    "embeddings (text census)",
    ("pe_audio_video", "PeAudioVideoEncoderAttention"): "Perception Encoder audio-video: 1-D "
    "RoPE over its token sequence (text census)",
}


# --------------------------------------------------------------------------- the census


def run_family(family: Family) -> Result:
    module = modeling(family.folder)
    source = inspect.getsource(module)
    missing = [line for line in family.reproduces if line not in source]
    if missing:
        return Result(family, CRASHED, detail=f"the source no longer says {missing}")
    if family.run is None:
        try:
            rotary_from_hf_config({"model_type": family.model_type})
        except (PosencValueError, PosencTypeError) as error:
            return Result(family, REFUSED, detail=str(error))
        return Result(family, WRONG, detail="posenc built a module for a refused family")
    try:
        config = config_of(family)
        ours, theirs = family.run(family, module, config)
        error = error_of(ours, theirs)
    except (PosencValueError, PosencTypeError) as error:
        return Result(family, REFUSED, detail=f"{type(error).__name__}: {error}")
    except Exception as error:  # (the census reports it; the test fails)
        return Result(family, CRASHED, detail=f"{type(error).__name__}: {error}")
    kind = EXACT if error <= TOLERANCE and math.isfinite(error) else WRONG
    return Result(family, kind, error, "" if kind == EXACT else f"max rel. error {error:.3g}")


def run_census() -> list[Result]:
    with torch.no_grad():
        return [run_family(family) for family in FAMILIES]


def uncovered_sites() -> list[tuple[str, str, str]]:
    """Vision call sites no family runs or refuses and :data:`SEQUENCE_SITES` does not list."""
    covered = {(f.folder, site) for f in FAMILIES for site in f.sites} | set(SEQUENCE_SITES)
    return sorted(s for s in vision_sites() if (s[0], s[1]) not in covered)


def table(results: list[Result]) -> str:
    rows = ["| model type | attention | result | max rel. error |", "| --- | --- | --- | --- |"]
    for r in results:
        error = "" if r.error is None else f"{r.error:.1e}"
        rows.append(f"| {r.family.model_type} | {', '.join(r.family.sites)} | {r.kind} | {error} |")
    return "\n".join(rows)


if __name__ == "__main__":
    results = run_census()
    print(table(results))
    for r in results:
        if r.kind != EXACT:
            print(r.family.model_type, r.kind, r.detail)
    print("uncovered:", uncovered_sites())
