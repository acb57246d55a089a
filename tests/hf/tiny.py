"""Tiny transformers models of the RoPE census's families, for :mod:`tests.hf.test_patch`.

Each family's config class is built with its defaults shrunk (:data:`SIZES`, where the class
has the field; per-layer lists cut to :data:`LAYERS` layers, keeping a layer of each kind where
the first ones are all alike), its model is the family's causal LM (else its base model), with
random weights. A family that does not build this way is named with the error.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

LAYERS = 2
VOCAB = 100
#: The sizes every tiny model takes where its config class has the field.
SIZES: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": LAYERS,
    "num_layers": LAYERS,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_heads": 4,
    "head_dim": 16,
    "vocab_size": VOCAB,
    "max_position_embeddings": 256,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "sliding_window": 8,
    "n_embd": 64,
    "n_layer": LAYERS,
    "n_head": 4,
    "n_positions": 256,
    "n_inner": 64,
    "rotary_dim": 8,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

#: Fields a family takes at tiny sizes, over :data:`SIZES`: the M-RoPE sections of families
#: whose default sections would need a head too wide for a tiny model (Qwen3.5's [11, 11, 10]
#: of a quarter of the head: 256 channels); an attention layer among the two where the
#: defaults have none (Bamba, Granite MoE hybrid, RecurrentGemma); a head whose rotated
#: fraction is even (MiMo-V2-Flash's 0.334 of 48, as of its 192); and the families whose
#: defaults do not build or are not tiny through the generic fields (each commented).
FIXES: dict[str, dict[str, Any]] = {
    "BambaConfig": {"attn_layer_indices": [1]},
    "GraniteMoeHybridConfig": {
        "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "attention"],
    },
    "MiMoV2FlashConfig": {"head_dim": 48},
    "ZayaConfig": {"num_experts_per_tok": 1},  # the only top-k its experts take
    # DBRX names its sizes d_model/n_heads/n_layers/max_seq_len, and keeps kv heads, the RoPE
    # base and the q/k/v clip (its clamp needs one) in attn_config, the experts in ffn_config
    "DbrxConfig": {
        "d_model": 64,
        "n_heads": 4,
        "n_layers": LAYERS,
        "max_seq_len": 256,
        "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
        "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2},
    },
    # its router reads num_local_experts and n_group (the generic sizes reach neither: 512, 8)
    "BailingHybridConfig": {
        "n_group": 1,
        "topk_group": 1,
        "num_experts_per_tok": 2,
        "num_experts": 4,
    },
    # the image token's id (its vocabulary map is empty by default) and a small VQ image model
    "ChameleonConfig": {
        "vocabulary_map": {"<image>": VOCAB - 1},
        "vq_config": {
            "embed_dim": 32,
            "num_embeddings": 16,
            "base_channels": 32,
            "channel_multiplier": [1, 1],
            "latent_channels": 32,
            "num_res_blocks": 1,
            "attn_resolutions": [],
        },
    },
    # its decoder layers index mlp_layer_types, which the class leaves unset
    "DeepseekOcr2TextConfig": {"num_hidden_layers": LAYERS, "mlp_layer_types": ["dense", "sparse"]},
    # its router's top-k and experts, which the class leaves unset
    "DiffusionGemmaTextConfig": {"top_k_experts": 2, "num_experts": 4, "moe_intermediate_size": 32},
    "Dots1Config": {"n_shared_experts": 1},  # its MoE multiplies by it; default None
    # the shared expert, the sliding layers' own sizes (kept per layer from the defaults) and
    # the indexer (whose head must hold the default's rotated channels)
    "Dots3NoteTextConfig": {
        "shared_experts_intermediate_size": 32,
        "swa_num_attention_heads": 4,
        "swa_num_key_value_heads": 4,
        "swa_q_lora_rank": 16,
        "swa_kv_lora_rank": 16,
        "swa_head_dim": 16,
        "swa_qk_nope_head_dim": 8,
        "swa_v_head_dim": 16,
        "index_n_heads": 2,
        "index_head_dim": 64,
        "index_topk": 8,
    },
    # the MoE widths per expert group as the class requires a list
    "Ernie4_5_VLMoeTextConfig": {"moe_intermediate_size": [32, 32]},
    "EsmcConfig": {"num_attention_heads": 4, "num_key_value_heads": 4},  # no GQA in ESM C
    # the per-layer embeddings' table: 262,144 x 256 per layer at the defaults
    "Gemma4TextConfig": {"vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": 16},
    # no layer shares another's cache among two (the default shares the last 15 of 35), and
    # the per-layer embeddings' table small, as Gemma 4's
    "Gemma3nTextConfig": {
        "num_kv_shared_layers": 0,
        "vocab_size_per_layer_input": VOCAB,
        "hidden_size_per_layer_input": 16,
        "laurel_rank": 8,
    },
    # latent attention whose M-RoPE sections must sum to half the rope slice, checked at once
    "HYV4VLTextConfig": {
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 1, 1],
        },
    },
    "Lfm2MoeConfig": {"num_hidden_layers": LAYERS, "layer_types": ["conv", "full_attention"]},
    # the dense and expert widths and the zero experts, 12288 / 2048 / 256 at the defaults
    "LongcatFlashConfig": {
        "ffn_hidden_size": 64,
        "expert_ffn_hidden_size": 32,
        "moe_topk": 2,
        "zero_expert_num": 2,
    },
    # the tiny head is the rope slice alone (latent attention above), so all of it turns
    "Mistral4Config": {
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 128.0,
            "original_max_position_embeddings": 8192,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale_all_dim": 1.0,
            "mscale": 1.0,
            "llama_4_scaling_beta": 0.1,
            "partial_rotary_factor": 1.0,
        }
    },
    # an indexed attention layer (the default's is the 4th) and its indexer, which the class
    # leaves unset (its index head holds the default 256-wide head's rotated channels)
    "Qwen4ExpTextConfig": {
        "num_hidden_layers": LAYERS,
        "layer_types": ["linear_attention", "indexed_attention"],
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 256,
        "indexer_budget": 8,
        "indexer_compress_ratio": 4,
    },
    "RecurrentGemmaConfig": {"block_types": ["recurrent", "attention"]},
    **{
        name: {
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [3, 3, 2],
            }
        }
        for name in ("Qwen3_5TextConfig", "Qwen3_5MoeTextConfig")
    },
}


def _cut(values: list[Any], layers: int) -> list[Any]:
    """``layers`` entries of a per-layer list: the first, then the first of another kind."""
    chosen = [0]
    for i, v in enumerate(values):
        if len(chosen) < layers and v != values[chosen[0]] and i not in chosen:
            chosen.append(i)
    chosen += [i for i in range(len(values)) if i not in chosen][: layers - len(chosen)]
    return [values[i] for i in sorted(chosen)]


def _mrope_section(parameters: Any) -> list[int] | None:
    if not isinstance(parameters, dict):
        return None
    if "mrope_section" in parameters:
        return parameters["mrope_section"]
    nested = [_mrope_section(v) for v in parameters.values() if isinstance(v, dict)]
    return next((n for n in nested if n), None)


def _default_section(config_class: type) -> tuple[int, ...] | None:
    """The sections an M-RoPE family's code assumes where its config names none (the table
    of :mod:`posenc.hf.mrope_layouts`, for sizing only: the sweep checks the tables)."""
    from posenc.hf.mrope_layouts import MROPE_LAYOUTS

    family = MROPE_LAYOUTS.get(getattr(config_class, "model_type", ""))
    return family.default(SIZES["head_dim"]) if family and family.default else None


def _rotated_fraction(fields: dict[str, Any]) -> float:
    """The ``partial_rotary_factor`` of a config's fields (the first one nested by layer type
    where there is none at the top), else 1."""
    parameters = fields.get("rope_parameters") or {}
    found = [parameters.get("partial_rotary_factor")]
    found += [v.get("partial_rotary_factor") for v in parameters.values() if isinstance(v, dict)]
    found.append(fields.get("partial_rotary_factor"))
    return next((f for f in found if f), 1.0)


def tiny_config(config_class: type, fixes: dict[str, Any] | None = None) -> Any:
    """``config_class`` with :data:`SIZES` where it has the fields (and ``fixes``)."""
    fixes = {**(fixes or {}), **FIXES.get(config_class.__name__, {})}
    default = config_class(**fixes)
    fields = default.to_dict()
    sizes = {k: v for k, v in SIZES.items() if k in fields}
    depth = fields.get("num_hidden_layers") or fields.get("num_layers")
    for key, value in fields.items():
        if isinstance(value, list) and depth and len(value) == depth and depth != LAYERS:
            sizes[key] = _cut(value, LAYERS)
    if "qk_rope_head_dim" in fields:  # multi-head latent attention: head_dim is the rope slice
        sizes["head_dim"] = SIZES["qk_rope_head_dim"]
        sizes["num_key_value_heads"] = SIZES["num_attention_heads"]
    section = _mrope_section(fields.get("rope_parameters")) or _default_section(config_class)
    if section:  # multimodal RoPE: a head whose rotated part holds its sections' pairs
        fraction = _rotated_fraction(fields)
        sizes["head_dim"] = round(2 * sum(section) / fraction)
        sizes["hidden_size"] = SIZES["num_attention_heads"] * sizes["head_dim"]
    if isinstance(fields.get("eos_token_id"), list):
        sizes.pop("eos_token_id", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return config_class(**{**fixes, **sizes, **FIXES.get(config_class.__name__, {})})


def model_class(config: Any, module: Any = None) -> type:
    """The family's causal LM class, else its base model class (from the auto mappings, else
    the classes of the modeling ``module`` built from this config class)."""
    import transformers

    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
        try:
            return auto._model_mapping[type(config)]
        except KeyError:
            continue
    own = [
        c
        for c in vars(module or {}).values()
        if isinstance(c, type)
        and issubclass(c, transformers.PreTrainedModel)
        and getattr(c, "config_class", None) is type(config)
    ]
    for suffix in ("ForCausalLM", "TextModel", "Model"):
        for c in own:
            if c.__name__.endswith(suffix):
                return c
    raise LookupError(f"no causal LM or base model for {type(config).__name__}")


#: The most parameters a model built by :func:`tiny_model` may hold (64 MiB of float32).
MAX_PARAMETERS = 1 << 24


def tiny_model(
    config_class: type, fixes: dict[str, Any] | None = None, module: Any = None
) -> torch.nn.Module:
    """A tiny random model of ``config_class`` in eval mode, float32, on the CPU. Built on the
    ``meta`` device first: a family whose model keeps more than :data:`MAX_PARAMETERS` at
    these sizes (an audio or vision tower the generic fields do not reach) is refused, so the
    sweep's memory stays that of tiny models."""
    torch.manual_seed(0)
    config = tiny_config(config_class, fixes)
    config._attn_implementation = "eager"
    cls = model_class(config, module)
    with torch.device("meta"):
        count = sum(p.numel() for p in cls(config).parameters())
    if count > MAX_PARAMETERS:
        raise ValueError(f"not tiny: {count:,} parameters at the generic sizes")
    torch.manual_seed(0)
    model = cls(config).eval()
    _fill_zeros(model)
    return model


def _fill_zeros(model: torch.nn.Module) -> None:
    """Random values in the parameters a family initialises to zero (output projections,
    per-head gates, key temperatures): with them zero, attention adds nothing to the logits
    and a patched rotation could not change them, so the sweep's comparison would prove
    nothing for that family."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.is_floating_point() and not parameter.any():
                parameter.copy_(0.02 * torch.randn(parameter.shape, generator=generator))
