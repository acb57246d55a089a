"""The transformers ``model_type``s whose rotary embedding :mod:`.hf_config` reads exactly.

No config field says whether a family turns half-split or interleaved pairs, in which sense,
or which fields its rotary code reads: this list of checked ``model_type``s is what
:func:`~posenc.encodings.hf_config.rotary_arguments_from_hf_config` trusts. Any other
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
checked by hand. A type is listed where the two agree to float32 rounding (~2e-5), or where
posenc refuses the configs it would misread (Hunyuan's ``alpha``, PhiMoE's ``long_mscale``),
and where the rotary module is built from that config class (a composite config is read
through its ``text_config``). ``tests/encodings/test_hf_config.py`` checks the list against the
installed transformers' source when its version is this one.

Left out although posenc reads their default configs, because a field it does not read
changes the rotation: ``granite_swa``, ``granitemoe_swa``, ``muse_glimmer_text``,
``muse_spark_text`` (a per-layer base, ``layer_rope_theta``); ``molmo2_text`` (unscaled RoPE
on the layers outside ``rope_scaling_layers``); ``zamba2`` (RoPE only with
``use_mem_rope=True``); ``granitemoehybrid`` (no RoPE unless ``position_embedding_type`` is
``"rope"``); ``qwen2_5_omni_dit`` (RoPE on the first head only). Also left out: vision, video
and audio towers with RoPE over patch or frame coordinates, the multimodal-RoPE text models
(:data:`~posenc.encodings.hf_config.MROPE_MODEL_TYPES`, refused) and the types whose configs
posenc always refuses.
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
        "dia_decoder",
        "dia_encoder",
        "diffllama",
        "doge",
        "dory",
        "dots1",
        "dots3_note_audio_encoder",
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
        "mistral",
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
        "neucodec",
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
        "xcodec2",
        "youtu",
        "zaya",
    }
)
