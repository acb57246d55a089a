"""The transformers ``model_type``s whose rotary embedding :mod:`~.config` reads exactly,
and the facts of each family that no config field states (the sets below
:data:`KNOWN_MODEL_TYPES`: interleaved, clockwise, de-interleaved, multimodal-RoPE, ...,
which :mod:`~.config` reads).

No config field says whether a family turns half-split or interleaved pairs, in which sense,
or which fields its rotary code reads: this list of checked ``model_type``s is what
:func:`~.config.rotary_arguments_from_hf_config` trusts. Any other
``model_type`` is read from the generic fields with a warning (or refused with ``strict=True``).

How it was made, against transformers 5.24.0, by a script not kept here: every
``transformers/models/*/modeling_*.py`` defining a ``*RotaryEmbedding`` class was taken (199
folders), and every config class of its folder was instantiated with its defaults (GLM-4-MoE
with ``head_dim=128``, ESM with ``position_embedding_type="rotary"``, as their checkpoints set
them) and read by ``rotary_arguments_from_hf_config``, once per layer type where the RoPE
parameters are nested. posenc's rotated ``q, k`` at positions 100..115 and 0..15 were compared
with the folder's own rotary module and ``apply_rotary_pos_emb`` (or
``apply_rotary_pos_emb_interleave`` / ``apply_rotary_emb``, where its attention uses those).
Then the attention code's calls to them and the config fields each rotary module reads were
checked by hand. A type is listed where the two agree to float32 rounding (~2e-5) and where
the rotary module is built from that config class (a composite config is read through its
``text_config``). Later additions, each with a test in ``tests/hf/test_config.py``:
HunYuan's NTK-alpha and PhiMoE's ``short_mscale``/``long_mscale`` (read as their code reads
them), Ministral 3 and Mistral 4 (``llama_4_scaling_beta``: a query scale beside the rotation,
:data:`QUERY_SCALE_MODEL_TYPES`), the Gemma 4 family (``head_dim`` per layer type, read with
``layer_type=``) and the latent-attention families that rotate a ``qk_rope_head_dim`` slice of
a larger head (DeepSeek-V4, Mistral 4, dots3). ``tests/hf/test_config.py`` checks
the list against the installed transformers' source when its version is this one.

Left out although posenc reads their default configs, because a field it does not read
changes the rotation: ``granite_swa``, ``granitemoe_swa``, ``muse_glimmer_text``,
``muse_spark_text`` (``layer_rope_theta``: a 0 leaves a layer unrotated, which
``posenc.hf.schedule`` reads; the other values are only tested for zero, every rotating layer
turns by the global θ); ``molmo2_text`` (unscaled RoPE
on the layers outside ``rope_scaling_layers``); ``zamba2`` (RoPE only with
``use_mem_rope=True``); ``granitemoehybrid`` (no RoPE unless ``position_embedding_type`` is
``"rope"``); ``qwen2_5_omni_dit`` (RoPE on the first head only). Also left out: vision, video
and audio towers with RoPE over patch or frame coordinates and the multimodal-RoPE text models
(:data:`MROPE_MODEL_TYPES`, read with their own checks by :mod:`~.mrope_layouts`).
"""

from __future__ import annotations

__all__ = ["CHECKED_TRANSFORMERS_VERSION", "KNOWN_MODEL_TYPES"]

#: The transformers release :data:`KNOWN_MODEL_TYPES` was checked against.
CHECKED_TRANSFORMERS_VERSION = "5.24.0"

#: Every ``model_type`` (transformers 5.24.0) whose rotary embedding
#: ``rotary_arguments_from_hf_config`` reads exactly: head and rotary dimensions, base, scaling,
#: pair layout and sense of rotation as the family's own code uses them.
KNOWN_MODEL_TYPES: frozenset[str] = frozenset(
    {
        "afmoe",
        "apertus",
        "apertus1p5_text",
        "arcee",
        "aria_text",
        "axk1",
        "axk2",
        "bailing_hybrid",
        "bamba",
        "beam",
        "bitnet",
        "blt_global_transformer",
        "blt_local_decoder",
        "blt_local_encoder",
        "blt_patcher",
        "chameleon",
        "codegen",
        "cohere",
        "cohere2",
        "cohere2_moe",
        "csm",
        "csm_depth_decoder_model",
        "cwm",
        "dbrx",
        "deepseek_ocr2_encoder",
        "deepseek_ocr2_text",
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "deepseek_v4",
        "dia_decoder",
        "dia_encoder",
        "diffllama",
        "diffusion_gemma_text",
        "doge",
        "dory",
        "dots1",
        "dots3_note_audio_encoder",
        "dots3_note_text",
        "embedding_gemma2_text",
        "emu3_text_model",
        "ernie4_5",
        "ernie4_5_moe",
        "esm",
        "esmc",
        "eurobert",
        "evolla",
        "exaone4",
        "exaone_moe",
        "falcon",
        "falcon_h1",
        "flex_olmo",
        "flint",
        "gemma",
        "gemma2",
        "gemma3_text",
        "gemma3n_text",
        "gemma4_text",
        "gemma4_unified_text",
        "glm",
        "glm4",
        "glm4_moe",
        "glm4_moe_lite",
        "glm_moe_dsa",
        "glmasr_encoder",
        "gpt_neox",
        "gpt_neox_japanese",
        "gpt_oss",
        "gptj",
        "gradium_phonon_tts",
        "granite",
        "granite4_vision_text",
        "granite_docling_text",
        "granitemoe",
        "granitemoeshared",
        "gte",
        "helium",
        "higgs_audio_v2",
        "hrm_text",
        "hunyuan_v1_dense",
        "hunyuan_v1_moe",
        "hy_v3",
        "hy_v4",
        "hyperclovax",
        "idefics",
        "jais2",
        "jetmoe",
        "jina_embeddings_v3",
        "kolibri1",
        "kyutai_speech_to_text",
        "laguna",
        "lara_mini",
        "lasr_encoder",
        "lfm2",
        "lfm2_moe",
        "lfm3",
        "llama",
        "llama4_text",
        "longcat_flash",
        "mellum",
        "mimi",
        "mimi_decoder",
        "mimi_encoder",
        "mimo_v2_flash",
        "minicpm3",
        "minimax",
        "minimax_m2",
        "minimax_m3_vl_text",
        "ministral",
        "ministral3",
        "mistral",
        "mistral4",
        "mistral_large4_text",
        "mixtral",
        "mllama_text_model",
        "modernbert",
        "modernbert-decoder",
        "moonshine",
        "moonshine_streaming",
        "moshi",
        "muse_glimmer_assistant",
        "nanochat",
        "nemotron",
        "nemotron3_5_transcribe_asr_audio",
        "nemotron3_5_transcribe_word_timestamp",
        "nemotron3_diarization_audio",
        "nomic_bert",
        "olmo",
        "olmo2",
        "olmo3",
        "olmo_hybrid",
        "olmoe",
        "openai_privacy_filter",
        "pe_audio_encoder",
        "pe_audio_video_encoder",
        "pe_video_encoder",
        "persimmon",
        "phi",
        "phi3",
        "phi4_multimodal",
        "phimoe",
        "pocket_tts",
        "pocket_tts_audio_tokenizer",
        "pocket_tts_audio_tokenizer_decoder",
        "pocket_tts_audio_tokenizer_encoder",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "qwen3_next",
        "qwen3_omni_moe_talker_code_predictor",
        "recurrent_gemma",
        "seed_oss",
        "smollm3",
        "solar_open",
        "stablelm",
        "starcoder2",
        "step3p5",
        "t5_gemma_module",
        "t5gemma2_decoder",
        "t5gemma2_text",
        "timesfm2_5",
        "ultrabert",
        "unlimited_ocr_text",
        "vaultgemma",
        "voxtral_realtime_encoder",
        "voxtral_realtime_text",
        "youtu",
        "zaya",
    }
)


# --------------------------------------------------------------------------- per-family facts

#: ``model_type``s whose transformers code rotates interleaved pairs ``(x[2i], x[2i+1])``
#: (``rotate_every_two``, a ``0::2``/``1::2`` ``rotate_half``, or a complex view of the pairs).
INTERLEAVED_MODEL_TYPES = frozenset(
    {
        # models/blt/modeling_blt.py: rotate_half pairs x[0::2], x[1::2] (BltRotaryEmbedding
        # is built from each of the four sub-configs of BLT's transformers)
        "blt_global_transformer",
        "blt_local_decoder",
        "blt_local_encoder",
        "blt_patcher",
        "codegen",
        # models/cohere/modeling_cohere.py: rotate_half pairs x[0::2], x[1::2]
        "cohere",
        # models/cohere2/modeling_cohere2.py: rotate_half pairs x[0::2], x[1::2]
        "cohere2",
        # models/cohere2_moe/modeling_cohere2_moe.py: rotate_half pairs x[0::2], x[1::2]
        "cohere2_moe",
        "deepseek_v2",
        # models/deepseek_v4/modeling_deepseek_v4.py: rotate_half pairs x[0::2], x[1::2] of
        # the trailing qk_rope_head_dim channels and writes them back in place
        "deepseek_v4",
        "ernie4_5",
        "ernie4_5_moe",
        "glm",
        "glm4",
        "gptj",
        "helium",
        "llama4_text",
        "moonshine",
        "moonshine_streaming",
        # models/openai_privacy_filter/modeling_openai_privacy_filter.py: _apply_rotary_emb
        # turns x[::2], x[1::2] and stacks them back as pairs
        "openai_privacy_filter",
        # models/pe_audio/modeling_pe_audio.py: apply_rotary_pos_emb turns each pair
        # (x[2i], x[2i+1]) by a 2x2 matrix (stack_freqs)
        "pe_audio_encoder",
        # models/pe_audio_video/modeling_pe_audio_video.py: the same pairwise 2x2 matrices
        "pe_audio_video_encoder",
        # models/pe_video/modeling_pe_video.py: the same pairwise 2x2 matrices
        "pe_video_encoder",
    }
)

#: ``model_type``s whose transformers code turns each pair by ``-angle``
#: (``RotaryEmbedding(clockwise=True)``).
CLOCKWISE_MODEL_TYPES = frozenset(
    {
        "nanochat",  # models/nanochat/modeling_nanochat.py: rotate_half returns cat(x2, -x1)
    }
)

#: ``model_type``s whose config has a ``rotary_dim`` field that the rotary code never reads:
#: the rotated part comes from ``rope_parameters["partial_rotary_factor"]`` alone (default 1).
ROTARY_DIM_IGNORED_MODEL_TYPES = frozenset(
    {
        # models/minimax_m3_vl/modeling_minimax_m3_vl.py: MiniMaxM3VLRotaryEmbedding reads
        # only rope_parameters["partial_rotary_factor"]; rotary_dim (default 64) goes unused
        "minimax_m3_vl_text",
    }
)

#: ``model_type``s whose attention rotates interleaved pairs but writes the result
#: de-interleaved (``apply_rotary_pos_emb_interleave``), as ``rope_interleave=True`` does in
#: the DeepSeek-V3 family: posenc's interleaved rotation is the same up to that channel order.
DEINTERLEAVED_MODEL_TYPES = frozenset(
    {
        "axk2",
        "bailing_hybrid",
        "deepseek_v32",
        "dots3_note_text",
        "glm_moe_dsa",
        "longcat_flash",
        "mistral_large4_text",
    }
)

#: ``model_type``s whose text rotary embedding is multimodal RoPE (M-RoPE: one position per
#: axis, frequency bands split by an ``mrope_section`` that defaults in the modeling code):
#: read by :func:`~.mrope_layouts.read_multimodal` into a
#: :class:`~posenc.MultimodalRotaryEmbedding`, with each family's layout, default sections and
#: channel pairs from :data:`~.mrope_layouts.MROPE_LAYOUTS` (checked against transformers in
#: ``tests/encodings/rotary/test_multimodal.py``), or refused there naming why.
MROPE_MODEL_TYPES = frozenset(
    {
        "cohere_compass_text",
        "cosmos3_edge_text",
        "ernie4_5_vl_moe_text",
        "glm4v_moe_text",
        "glm4v_text",
        "glm_image_text",
        "glm_ocr_text",
        "hunyuan_vl_text",
        "hy_v4_vl_text",
        "neomme",
        "paddleocr_vl_text",
        "qwen2_5_omni_talker",
        "qwen2_5_omni_text",
        "qwen2_5_omni_thinker",
        "qwen2_5_vl_text",
        "qwen2_vl_text",
        "qwen3_5_moe_text",
        "qwen3_5_text",
        "qwen3_omni_moe_talker_text",
        "qwen3_omni_moe_text",
        "qwen3_omni_moe_thinker",
        "qwen3_vl_moe_text",
        "qwen3_vl_text",
        "qwen4_exp_text",
    }
)

#: ``model_type``s whose modeling code hard-codes base 10000 and reads no RoPE dictionary.
FIXED_BASE_MODEL_TYPES = frozenset({"codegen", "gptj"})

#: ``model_type``s whose config class (or, for MiMo-V2-Flash, whose rotary code: a fraction of
#: 0.334 where the dictionary names none) defaults to partial rotation: a config of one of them
#: that names no fraction is refused rather than read as full rotation.
PARTIAL_MODEL_TYPES = frozenset(
    {"glm", "glm4", "gpt_neox", "mimo_v2_flash", "persimmon", "phi", "stablelm"}
)

#: ``model_type``s whose config class defaults ``rope_interleave`` to true (a ``config.json``
#: without the field rotates as DeepSeek-V3's checkpoints do: interleaved, written
#: de-interleaved).
ROPE_INTERLEAVE_DEFAULT_MODEL_TYPES = frozenset(
    {"axk1", "deepseek_v3", "glm4_moe_lite", "mistral4", "youtu"}
)

#: ``model_type``s whose rotary module reads ``rope_type="dynamic"`` with a (non-zero)
#: ``alpha`` as NTK-alpha, a fixed base ``theta * alpha^(d/(d-2))`` over the whole head
#: (models/hunyuan_v1_dense/modeling_hunyuan_v1_dense.py: ``compute_ntk_alpha_rope_parameters``
#: reads ``head_dim``, ``rope_theta`` and ``alpha`` only). Their apply rotates the whole head, and
#: their default and NTK-alpha functions ignore ``partial_rotary_factor``.
NTK_ALPHA_MODEL_TYPES = frozenset({"hunyuan_v1_dense", "hunyuan_v1_moe"})

#: ``model_type``s whose rotary module multiplies cos and sin by ``short_mscale`` up to the
#: original context and ``long_mscale`` past it (any ``rope_type`` but default) and recomputes
#: its frequencies on every call without the length: LongRoPE's short factors at every length
#: (models/phimoe/modeling_phimoe.py: ``PhimoeRotaryEmbedding.forward``, transformers 5.24).
LONGROPE_MSCALE_MODEL_TYPES = frozenset({"phimoe"})

#: ``model_type``s whose attention multiplies the queries by ``1 + beta * log(1 + floor(p /
#: original_max_position_embeddings))`` with ``beta = rope_parameters["llama_4_scaling_beta"]``
#: (``get_llama_4_attn_scale``): not a rotation. Their RoPE dictionary also carries a
#: ``max_position_embeddings`` no rotary function reads (``ignore_keys_at_rope_validation``).
QUERY_SCALE_MODEL_TYPES = frozenset({"ministral3", "mistral4"})

#: Old ``rope_type`` names a family's config class renames on load.
ROPE_TYPE_ALIASES: dict[str, dict[str, str]] = {
    "phi3": {"su": "longrope", "yarn": "longrope"},
    "phi4_multimodal": {"su": "longrope", "yarn": "longrope"},
}

#: ``model_type``s whose attention rotates only when a field says so (field, the value that
#: turns it on): with any other value the config describes no rotation, and is refused.
ROTATES_ONLY_WITH = {
    "granitemoehybrid": ("position_embedding_type", "rope"),
    "zamba2": ("use_mem_rope", True),
}

#: ``model_type``s of :data:`KNOWN_MODEL_TYPES` whose modeling code reads
#: ``position_embedding_type`` (ESM and Evolla rotate only with ``"rotary"``). The other
#: families ignore the field, which some checkpoints carry from older code (ModernBERT's
#: ``"absolute"``, Cohere 2's ``"rope_gptj"``): for them it says nothing.
POSITION_TYPE_MODEL_TYPES = frozenset({"esm", "evolla"})

#: ``model_type``s whose rotary module turns something other than every head of a token
#: sequence, which :class:`~posenc.RotaryEmbedding` does not represent (-> why; refused).
NOT_TOKEN_ROTATION_MODEL_TYPES = {
    "qwen2_5_omni_dit": "its DiT rotates the first attention head only, after "
    "de-interleaving its channels",
    "xcodec2": "it rotates each head by its index (position_ids = arange(heads)), not each "
    "token by its position",
    "neucodec": "it rotates each head by its index (position_ids = arange(heads)), not each "
    "token by its position",
}
