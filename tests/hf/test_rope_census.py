"""The RoPE census as a test: every rotary embedding of the installed transformers, rotated by
its own code and by ``RotaryEmbedding.from_hf_config`` (``tests/hf/census.py`` finds the
families from transformers' source, rotates, compares and classifies).

Every family must be exact (``max|posenc - family| / max|family| <= 2e-5`` on the whole rotated
q and k, at positions 100..131 and 0..31), refused as :data:`REFUSED` expects, or on the
:data:`NOT_SEQUENCE` list; none may crash, and none may be read wrong except the few
:data:`WRONG_NOW` names until ``hf/config.py`` is fixed. The expectations below are data: when a
pin move or a change of ``hf/config.py`` changes a family's class, the assertion message names
it, under the counts by class and the transformers version (``python -m
tests.hf.census`` prints the whole table).

The census imports every modeling module that defines a rotary embedding (~200; about 6 s of
the ~10 s of CPU it takes on one thread, ~0.5 GiB).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

transformers = pytest.importorskip("transformers")

from posenc import RotaryEmbedding  # noqa: E402
from posenc.hf.config import rotary_arguments_from_hf_config  # noqa: E402
from posenc.hf.model_types import KNOWN_MODEL_TYPES  # noqa: E402
from tests.hf import census as rope_census  # noqa: E402

# --------------------------------------------------------------------------- expectations

_VISION = "vision tower: RoPE over patch coordinates (rows and columns), not one sequence"
_VIDEO = "video memory attention: 2-D RoPE over feature-map coordinates"

#: Model types whose rotary positions are not one sequence of tokens (model type -> why);
#: the census does not compare them (a config without a model type is named by its class).
NOT_SEQUENCE: dict[str, str] = {
    **dict.fromkeys(
        (
            "cohere_compass_vision",
            "dots3_note_vision_encoder",
            "ernie4_5_vl_moe_vision",
            "exaone4_5_vision",
            "gemma4_vision",
            "glm4v_moe_vision",
            "glm4v_vision",
            "glm5_next_vision",
            "glm_ocr_vision",
            "inkling2_vision",
            "kimi_k25_vision",
            "lfm3_vl_vision",
            "llama4_vision_model",
            "minimax_m3_vl_vision",
            "mlcd_vision_model",
            "muse_glimmer_vision",
            "muse_spark_vision",
            "paddleocr_vl_vision",
            "pixtral",
            "qwen2_5_omni_vision_encoder",
            "qwen2_5_vl_vision",
            "qwen2_vl_vision",
            "qwen3_5_moe_vision",
            "qwen3_5_vision",
            "qwen3_omni_moe_vision_encoder",
            "qwen3_vl_moe_vision",
            "qwen3_vl_vision",
            "qwen4_exp_vision",
            "sam3_vit_model",
            "step3p5_vision",
            "video_llama_3_vision",
        ),
        _VISION,
    ),
    **dict.fromkeys(("edgetam_video", "sam2_video", "sam3_tracker_video"), _VIDEO),
    "eomt_dinov3": "DINOv3 segmentation: 2-D RoPE over patch coordinates",
    "efficientloftr": "image matching: 2-D RoPE over feature-map coordinates",
    "musicflamingo": "audio windows: axial RoPE over the window index and the time within it",
    "EsmFold2AtomEncoderConfig": "atom encoder: RoPE over 3-D atom coordinates and residue ids",
    # position_ids = arange(num_attention_heads): each head turns by its index
    "xcodec2": "RoPE over the head index (position_ids = arange(heads)), not over tokens",
    "neucodec": "RoPE over the head index (position_ids = arange(heads)), not over tokens",
}

#: Families posenc refuses (family as the census names it: model type, ``/layer type`` where
#: the RoPE parameters are nested, ``+variant`` for ``census.CONFIG_VARIANTS``) -> why it
#: cannot be expressed. Every entry must still be refused: a family that starts being read
#: is noticed, and its entry removed.
REFUSED: dict[str, str] = {
    "glm4_moe": "the default head size 4096 / 96 = 42 makes an odd rotary dimension 21, which "
    "transformers rounds up with frequencies of the odd dimension (GLM-4.5's head_dim=128 is "
    "read: glm4_moe+head_dim_128)",
    "qwen3_omni_moe_talker_text": "the default head size 1024 / 16 = 64 has 32 rotated pairs, "
    "fewer than its mrope_section [24, 20, 20] names; transformers' interleaved slices stop at "
    "pair 32 without a word (h gets 11 pairs, w 10, not 20); the checkpoints' head_dim=128 is "
    "read (qwen3_omni_moe_talker_text+head_dim_128)",
    "qwen2_5_omni_dit": "the DiT rotates the first attention head only, its channels "
    "de-interleaved first; posenc's RotaryEmbedding turns every head",
}

#: Configs whose attention does not rotate, which posenc refuses as describing no rotary
#: embedding (family -> the field that says so); each family's rotating variant is exact.
NO_ROTATION: dict[str, str] = {
    "esm": "position_embedding_type='absolute' by default (esm+rotary is exact)",
    "granitemoehybrid": "position_embedding_type=None by default: the attention does not "
    "rotate (granitemoehybrid+rope is exact)",
    "zamba2": "use_mem_rope=False by default: the attention does not rotate "
    "(zamba2+mem_rope is exact)",
}

#: Families posenc reads wrong today (family -> what differs), kept only until
#: ``hf/config.py`` refuses or reads them; every entry must still be wrong. Empty: a wrong
#: reading fails the suite.
WRONG_NOW: dict[str, str] = {}

# --------------------------------------------------------------------------- the census


@pytest.fixture(scope="module")
def census() -> rope_census.Census:
    return rope_census.run_census(NOT_SEQUENCE)


def _expected_list(
    census: rope_census.Census, kind: str, expected: dict[str, str], name: str
) -> list[str]:
    """Problems: families of ``kind`` missing from ``expected``, and entries of ``expected``
    whose family is no longer of ``kind``."""
    found = {r.family: r for r in census.of_kind(kind)}
    now = {r.family: r.kind for r in census.results}
    problems = [
        f"{kind} but not in {name}: {family} ({r.rotary}): {r.detail}"
        for family, r in found.items()
        if family not in expected
    ]
    problems += [
        f"{name} lists {family}, which is now {now.get(family, 'not found')}: remove it"
        for family in expected
        if family not in found
    ]
    return problems


def test_every_transformers_rope_family_is_exact_refused_or_not_a_sequence(
    census: rope_census.Census,
) -> None:
    """The whole census: no crash (posenc's or the harness's), no wrong reading beyond
    :data:`WRONG_NOW`, the refusals exactly :data:`REFUSED`, every :data:`NOT_SEQUENCE` entry
    and every model type posenc lists as checked (``KNOWN_MODEL_TYPES``) a model type found,
    every rotary class of every modeling file swept; the rest is exact."""
    problems = [
        f"crashed ({r.side}): {r.family} ({r.rotary}): {r.detail}"
        for r in census.of_kind(rope_census.CRASHED)
    ]
    problems += _expected_list(census, rope_census.WRONG, WRONG_NOW, "WRONG_NOW")
    problems += _expected_list(census, rope_census.REFUSED, REFUSED, "REFUSED")
    problems += _expected_list(census, rope_census.NO_ROPE, NO_ROTATION, "NO_ROTATION")
    assert len(REFUSED) <= 3, "issue #28: at most three families refused"
    found_types = {r.model_type for r in census.results}
    problems += [
        f"NOT_SEQUENCE names {name}, which the census does not find: remove it"
        for name in NOT_SEQUENCE
        if name not in found_types
    ]
    problems += [
        f"KNOWN_MODEL_TYPES names {name}, which builds no rotary module in this transformers"
        for name in sorted(KNOWN_MODEL_TYPES - found_types)
    ]
    swept = {r.rotary for r in census.results}
    every = {
        name
        for path in rope_census.modeling_files()
        for name in rope_census.ROTARY_CLASS.findall(path.read_text())
    }
    problems += [f"rotary class not swept: {name}" for name in sorted(every - swept)]
    assert not problems, census.summary() + "\n" + "\n".join(problems)


# --------------------------------------------------------------------------- the harness


def _site(folder: str, rotary: str) -> rope_census.Site:
    path = next(p for p in rope_census.modeling_files() if p.parent.name == folder)
    return next(s for s in rope_census.discover([path]) if s.rotary == rotary)


def _plain(**changes: object) -> Callable[..., RotaryEmbedding]:
    """posenc's reading with ``changes`` (a misreading on purpose), as a plain module."""

    def read(config: object, *, layer_type: str | None = None) -> RotaryEmbedding:
        arguments = rotary_arguments_from_hf_config(config, layer_type=layer_type)
        arguments.update(changes)
        return RotaryEmbedding(arguments.pop("head_dim"), **arguments)

    return read


def test_the_census_tells_a_misread_layout_from_the_familys_own() -> None:
    """Cohere rotates interleaved pairs: posenc's reading is exact, the half layout is wrong
    by more than the rotated values' own size."""
    site = _site("cohere", "CohereRotaryEmbedding")
    config = transformers.CohereConfig()
    assert rope_census.classify(site, config).kind == rope_census.EXACT
    wrong = rope_census.classify(site, config, read=_plain(interleaved=False))
    assert wrong.kind == rope_census.WRONG and wrong.error > 0.1


def test_the_census_feeds_multimodal_rope_distinct_rows() -> None:
    """Qwen2-VL's text rotary module takes (3, b, n) position ids with distinct rows: a 1-D
    module with the same frequencies cannot take them, and the census says so (wrong)."""
    site = _site("qwen2_vl", "Qwen2VLRotaryEmbedding")
    config = transformers.Qwen2VLTextConfig()
    rows = rope_census.multimodal_positions(3)
    assert len({tuple(row.flatten().tolist()) for row in rows}) == 3
    head_dim = config.hidden_size // config.num_attention_heads

    def one_dimensional(config: object, *, layer_type: str | None = None) -> RotaryEmbedding:
        return RotaryEmbedding(head_dim, base=config.rope_parameters["rope_theta"])

    result = rope_census.classify(site, config, read=one_dimensional)
    assert result.kind == rope_census.WRONG and "does not take" in result.detail


def test_the_census_compares_a_de_interleaving_family_in_its_channel_order() -> None:
    """DeepSeek-V3 with rope_interleave writes interleaved pairs de-interleaved: compared in that
    order posenc is exact; without the reordering the same rotation is far off."""
    site = _site("deepseek_v3", "DeepseekV3RotaryEmbedding")
    config = transformers.DeepseekV3Config()
    assert config.rope_interleave
    assert rope_census.classify(site, config).kind == rope_census.EXACT
    mla = rope_census.ADAPTERS[site.rotary]
    blind = rope_census.Adapter(mla.name, mla.call, mla.rotate, head_dim=mla.head_dim)
    result = rope_census.classify(site, config, adapter=blind)
    assert result.kind == rope_census.WRONG and result.error > 0.1


def test_an_adapter_whose_call_is_not_in_the_modeling_source_is_a_harness_crash() -> None:
    """Phi slices the rotated channels before its call: its adapter finds that call, the
    whole-head one does not, and the family is then a crash of the harness, not a result."""
    site = _site("phi", "PhiRotaryEmbedding")
    config = transformers.PhiConfig()
    assert rope_census.classify(site, config).kind == rope_census.EXACT
    result = rope_census.classify(site, config, adapter=rope_census.WHOLE)
    assert (result.kind, result.side) == (rope_census.CRASHED, "harness")
    assert "not in the modeling source" in result.detail
