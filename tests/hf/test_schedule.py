"""Whole position schedules read from transformers configs, checked at the attention level.

posenc's layers use LayerNorm and a plain feed-forward, so whole models cannot match. Instead a
tiny transformers model of each family runs with hooks that capture, in every layer, the
queries, keys and values before the rotation (after the family's q/k norms) and the attention
output before ``o_proj``. posenc's attention, built with the schedule
``Encoder.from_hf_config`` reads (encoding, window, chunk, NoPE, temperature, grouped heads),
must turn those q, k, v into the same output, layer by layer.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.hf.schedule import read_schedule

transformers = pytest.importorskip("transformers")

N = 13  # longer than the windows and chunks below
TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 64,
    "pad_token_id": 0,
}


def _configs() -> dict[str, object]:
    t = transformers
    return {
        "gemma3": t.Gemma3TextConfig(
            **TINY,
            num_hidden_layers=6,
            sliding_window=4,
            query_pre_attn_scalar=12,  # a softmax scale of 12 ** -0.5, not 1/sqrt(head_dim)
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            },
        ),
        "smollm3": t.SmolLM3Config(
            **TINY,
            num_hidden_layers=4,
            no_rope_layers=[1, 1, 1, 0],
            use_sliding_window=True,
            sliding_window=5,
            layer_types=["sliding_attention", "full_attention"] * 2,
        ),
        "cohere2": t.Cohere2Config(**TINY, num_hidden_layers=4, sliding_window=4),
        "llama4": t.Llama4TextConfig(
            **TINY,
            intermediate_size_mlp=64,
            num_hidden_layers=4,
            no_rope_layers=[1, 1, 1, 0],
            attention_chunk_size=4,
            attn_temperature_tuning=True,
            floor_scale=3,
            attn_scale=0.5,
            use_qk_norm=False,  # a norm of q and k, not a position: posenc has none
        ),
        "ministral3": t.Ministral3Config(  # YaRN, and queries scaled by position on every layer
            **TINY,
            num_hidden_layers=2,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1e6,
                "factor": 2.0,
                "original_max_position_embeddings": 4,  # the scale steps every 4 positions
                "max_position_embeddings": 64,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "llama_4_scaling_beta": 0.5,
            },
        ),
        "exaone4": t.Exaone4Config(  # full layers without RoPE (it has a window)
            **TINY, num_hidden_layers=4, sliding_window=4, sliding_window_pattern=4
        ),
        "olmo3": t.Olmo3Config(
            **TINY,
            num_hidden_layers=4,
            sliding_window=4,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 5e5},
                "full_attention": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 8,
                    "rope_theta": 5e5,
                },
            },
        ),
    }


def _capture(model) -> tuple[list[dict[str, torch.Tensor]], list]:
    """Hooks on every layer's attention: q and k where they leave the family's norms (else
    the projections), v, and the input of ``o_proj``."""
    layers = model.model.layers
    seen: list[dict[str, torch.Tensor]] = [{} for _ in layers]
    handles = []
    for i, layer in enumerate(layers):
        attn = layer.self_attn

        def keep(name, i=i):
            def hook(module, args, output):
                seen[i][name] = output

            return hook

        for name in ("q", "k"):
            source = getattr(attn, f"{name}_norm", None) or getattr(attn, f"{name}_proj")
            handles.append(source.register_forward_hook(keep(name)))
        handles.append(attn.v_proj.register_forward_hook(keep("v")))
        handles.append(
            attn.o_proj.register_forward_pre_hook(
                lambda module, args, i=i: seen[i].__setitem__("out", args[0])
            )
        )
    return seen, handles


def _heads(t: torch.Tensor, n: int, heads: int, d: int) -> torch.Tensor:
    """A captured tensor as ``(b, n, heads·d)`` (norms see ``(b, h, n, d)`` in some families)."""
    if t.dim() == 4:
        t = t.transpose(1, 2) if t.shape[1] == heads and t.shape[2] == n else t
        return t.reshape(t.shape[0], n, heads * d)
    return t


def _identity_attention(attn: posenc.MultiHeadAttention, pe) -> posenc.MultiHeadAttention:
    """posenc attention with ``attn``'s schedule whose input is q, k and v side by side."""
    h, g, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    width = (h + 2 * g) * d
    core = posenc.MultiHeadAttention(
        width,
        h,
        num_kv_heads=g,
        head_dim=d,
        pe=None if isinstance(pe, posenc.NoPE) else pe,
        causal=attn.causal,
        bias=False,
        window=attn.window,
        chunk=attn.chunk,
        query_scale=attn.query_scale,
        softcap=attn.softcap,
        softmax_scale=attn.softmax_scale,
    ).eval()
    with torch.no_grad():
        core.qkv.weight.copy_(torch.eye(width))
        core.out.weight.copy_(torch.eye(width, h * d))
    return core


@pytest.mark.parametrize(
    "family", ["gemma3", "smollm3", "cohere2", "llama4", "olmo3", "exaone4", "ministral3"]
)
def test_every_layer_attends_as_the_family_does(family: str) -> None:
    config = _configs()[family]
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    seen, handles = _capture(model)
    tokens = torch.randint(0, 64, (2, N), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(tokens)
    for handle in handles:
        handle.remove()
    encoder = posenc.Encoder.from_hf_config(config)
    h, g, d = encoder.num_heads, encoder.num_kv_heads, encoder.head_dim
    for i, (layer, pe) in enumerate(zip(encoder.layers, encoder.pes, strict=True)):
        q = _heads(seen[i]["q"], N, h, d)
        k, v = _heads(seen[i]["k"], N, g, d), seen[i]["v"]
        core = _identity_attention(layer.attn, pe)
        with torch.no_grad():
            ours = core(torch.cat([q, k, v], dim=-1))[..., : h * d]
            assert_close(
                ours,
                seen[i]["out"],
                atol=2e-5,
                rtol=1e-4,
                msg=lambda m, i=i: f"{family} layer {i} ({encoder.layer_types[i]}): {m}",
            )
            cache = posenc.KVCache()  # and decoding through posenc's cache
            x = torch.cat([q, k, v], dim=-1)
            steps = [core(x[:, :5], cache=cache)] + [
                core(x[:, t : t + 1], cache=cache) for t in range(5, N)
            ]
            assert_close(
                torch.cat(steps, dim=1)[..., : h * d], seen[i]["out"], atol=2e-5, rtol=1e-4
            )


def test_modernbert_attends_both_ways_as_its_model_does() -> None:
    """ModernBERT (an encoder: bidirectional masks, a sliding window of ``local_attention // 2``
    keys either side, inclusive) from a config.json in its published spelling
    (``global_attn_every_n_layers``, ``local_attention``, ``global_rope_theta`` and
    ``local_rope_theta``): every layer's attention turns the q, k, v of its fused projection
    into the output its model gives."""
    raw = {"model_type": "modernbert", "hidden_size": 32, "num_attention_heads": 4,
           "num_hidden_layers": 3, "intermediate_size": 64, "vocab_size": 64, "pad_token_id": 0,
           "global_attn_every_n_layers": 3, "local_attention": 6, "global_rope_theta": 1e5,
           "local_rope_theta": 1e3}  # fmt: skip
    config = transformers.ModernBertConfig(**raw)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config).eval()
    seen: list[dict[str, torch.Tensor]] = [{} for _ in model.layers]
    handles = []
    for i, layer in enumerate(model.layers):
        handles.append(layer.attn.Wqkv.register_forward_hook(
            lambda module, args, out, i=i: seen[i].__setitem__("qkv", out)))  # fmt: skip
        handles.append(layer.attn.Wo.register_forward_pre_hook(
            lambda module, args, i=i: seen[i].__setitem__("out", args[0])))  # fmt: skip
    tokens = torch.randint(1, 64, (2, N), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(tokens)
    for handle in handles:
        handle.remove()
    encoder = posenc.Encoder.from_hf_config(raw)
    assert [layer.attn.window for layer in encoder.layers] == [None, 4, 4]  # |i - j| <= 3
    for i, (layer, pe) in enumerate(zip(encoder.layers, encoder.pes, strict=True)):
        assert layer.attn.causal is False
        core = _identity_attention(layer.attn, pe)
        with torch.no_grad():
            ours = core(seen[i]["qkv"])[..., :32]
        assert_close(ours, seen[i]["out"], atol=2e-5, rtol=1e-4, msg=lambda m, i=i: f"{i}: {m}")


def test_the_schedules_read_for_each_family() -> None:
    configs = _configs()
    gemma = read_schedule(configs["gemma3"])
    assert [layer.window for layer in gemma.layers] == [4, 4, 4, 4, 4, None]
    assert gemma.layers[5].pe.scaling["factor"] == 8.0 and gemma.layers[0].pe.base == 10000.0
    assert gemma.layers[0].pe is gemma.layers[1].pe  # one module per layer type
    smol = read_schedule(configs["smollm3"])
    assert [layer.pe is None for layer in smol.layers] == [False, False, False, True]
    assert [layer.window for layer in smol.layers] == [5, None, 5, None]
    cohere = read_schedule(configs["cohere2"])
    assert [layer.pe is None for layer in cohere.layers] == [False, False, False, True]
    llama4 = read_schedule(configs["llama4"])
    assert [layer.chunk for layer in llama4.layers] == [4, 4, 4, None]
    assert [layer.query_scale is not None for layer in llama4.layers] == [False] * 3 + [True]
    olmo = read_schedule(configs["olmo3"])
    assert olmo.layers[3].pe.scaling["rope_type"] == "yarn"  # YaRN on the full layers only
    assert olmo.layers[0].pe.scaling.get("rope_type", "default") == "default"
    ministral = read_schedule(configs["ministral3"])
    scale = posenc.QueryScale.ministral3(beta=0.5, original_max_position_embeddings=4)
    assert [layer.query_scale for layer in ministral.layers] == [scale, scale]
    assert ministral.layers[0].pe.scaling["rope_type"] == "yarn"


def test_overrides_and_the_meta_device_keep_a_big_schedule_cheap() -> None:
    config = transformers.Gemma3TextConfig()  # the flagship's 26 layers of 2304
    model = posenc.TransformerModel.from_hf_config(config, device="meta")
    assert len(model.encoder.layers) == 26 and model.embed.weight.is_meta
    assert model.encoder.layers[0].attn.qkv.weight.shape == ((8 + 2 * 4) * 256, 2304)
    small = posenc.Encoder.from_hf_config(config, num_layers=6, hidden_size=64, head_dim=16)
    assert small.layer_types[5] == "full_attention" and small.layers[0].attn.window == 4096
    assert small(torch.randn(1, 5, 64)).shape == (1, 5, 64)
    with pytest.raises(TypeError, match="unknown override num_experts="):
        posenc.Encoder.from_hf_config(config, num_experts=2)
    with pytest.raises(TypeError, match="config must be a transformers config"):
        posenc.Encoder.from_hf_config(42)


def test_families_that_rotate_some_layers_by_their_own_rule() -> None:
    t = transformers
    exaone = read_schedule(t.Exaone4Config(**TINY, num_hidden_layers=4, sliding_window_pattern=4))
    assert [layer.pe is None for layer in exaone.layers] == [False, False, False, True]
    unwindowed = t.Exaone4Config(**TINY, num_hidden_layers=4, sliding_window_pattern=4).to_dict()
    unwindowed["sliding_window"] = None  # no window: every layer rotates
    assert all(layer.pe is not None for layer in read_schedule(unwindowed).layers)
    cohere = t.Cohere2Config(**TINY, num_hidden_layers=4, sliding_window=None)
    assert all(layer.pe is None for layer in read_schedule(cohere).layers)  # as its code does


def _latent_and_per_layer_configs() -> dict[str, object]:
    t = transformers
    latent = {"qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "kv_lora_rank": 8, "q_lora_rank": 8}
    return {
        "deepseek_v3": t.DeepseekV3Config(
            **TINY, **latent, num_hidden_layers=2, n_routed_experts=4
        ),
        "mistral4": t.Mistral4Config(**TINY, **latent, num_hidden_layers=2, n_routed_experts=4),
        "deepseek_v4": t.DeepseekV4Config(**TINY, qk_rope_head_dim=4, num_hidden_layers=2),
        "gemma4": t.Gemma4TextConfig(**TINY, global_head_dim=16, num_hidden_layers=6),
        "embedding_gemma2": t.EmbeddingGemma2TextConfig(**TINY, num_hidden_layers=6),
    }


@pytest.mark.parametrize(
    ("family", "match"),
    [
        ("deepseek_v3", "has qk_rope_head_dim, kv_lora_rank: multi-head latent attention"),
        ("mistral4", "has qk_rope_head_dim, kv_lora_rank: multi-head latent attention"),
        ("deepseek_v4", "has qk_rope_head_dim: multi-head latent attention"),
        ("gemma4", r"sets \['head_dim'\] per layer"),
        ("embedding_gemma2", r"sets \['head_dim', 'num_key_value_heads'\] per layer"),
    ],
)
def test_latent_attention_and_per_layer_sizes_are_refused_by_name(family: str, match: str) -> None:
    """posenc's attention has no latent projections and one head size for every layer: these
    schedules are refused, naming the model type and the fields (their rotations are read by
    RotaryEmbedding.from_hf_config: tests/hf/test_config.py)."""
    config = _latent_and_per_layer_configs()[family]
    with pytest.raises(posenc.PosencValueError, match=match) as info:
        posenc.Encoder.from_hf_config(config, device="meta")
    assert repr(config.model_type) in str(info.value)
    with pytest.raises(posenc.PosencValueError, match=match):  # its config.json alike
        posenc.Encoder.from_hf_config(config.to_dict(), device="meta")


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"model_type": "granite_swa"}, "decided by its model's forward"),
        ({"model_type": "gemma3_text", "use_bidirectional_attention": True}, "bidirectional"),
        ({"layer_types": ["linear_attention", "full_attention"]}, r"layer_types holds \['linear"),
        ({"layer_types": ["chunked_attention"] * 2}, "no attention_chunk_size"),
        ({"sliding_window": "x"}, "config sliding_window must be a positive int"),
        ({"intermediate_size": [64, 64]}, "config intermediate_size must be a positive int"),
    ],
)
def test_configs_posenc_cannot_read_exactly_are_refused(config: dict, match: str) -> None:
    base = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "rope_theta": 1e4}
    with pytest.raises(ValueError, match=match):
        posenc.Encoder.from_hf_config({**base, **config})


# --------------------------------------------------------------------------- issue #41, item 5

FALCON_7B = {  # Falcon-7B's config.json (the fields that size its attention)
    "model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
    "num_hidden_layers": 32, "multi_query": True, "new_decoder_architecture": False,
    "alibi": False, "parallel_attn": True, "bias": False, "vocab_size": 65024,
}  # fmt: skip


@pytest.mark.parametrize("route", ["1", "0"])
@pytest.mark.parametrize(
    "change",
    [
        {},  # Falcon-7B: multi-query, one key/value head
        {"multi_query": False},  # every head its own keys
        # Falcon-40B's grouped heads
        {
            "new_decoder_architecture": True,
            "num_kv_heads": 8,
            "num_attention_heads": 128,
            "hidden_size": 8192,
        },
        {"new_decoder_architecture": True},  # num_kv_heads defaults to the query heads
    ],
)
def test_falcon_key_value_heads_are_those_its_attention_takes(change, route, monkeypatch) -> None:
    """FalconAttention takes ``num_kv_heads`` with ``new_decoder_architecture``, else one head
    with ``multi_query``, else one per query head; posenc reads the same, with the transformers
    route and with its own rules (71 heads, not 71 key/value heads, for Falcon-7B; the own
    rules know no default θ, so the file states it there)."""
    from transformers.models.falcon.modeling_falcon import FalconAttention

    monkeypatch.setenv("POSENC_HF_CONFIG_CLASS", route)
    raw = {**FALCON_7B, **change, **({"rope_theta": 10000.0} if route == "0" else {})}
    with torch.device("meta"):
        want = FalconAttention(transformers.FalconConfig(**raw)).num_kv_heads
    assert read_schedule(raw).num_kv_heads == want
    assert posenc.Encoder.from_hf_config(raw, device="meta").num_kv_heads == want
    assert read_schedule(transformers.FalconConfig(**raw)).num_kv_heads == want


DEEPSEEK_V2_LITE = {  # DeepSeek-V2-Lite's config.json (attention and rotation)
    "model_type": "deepseek_v2", "hidden_size": 2048, "num_attention_heads": 16,
    "num_key_value_heads": 16, "num_hidden_layers": 27, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "kv_lora_rank": 512, "q_lora_rank": None,
    "max_position_embeddings": 163840, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
}  # fmt: skip


@pytest.mark.parametrize("route", ["1", "0"])
def test_deepseek_yarn_softmax_scale_is_its_attentions(route, monkeypatch) -> None:
    """DeepSeek-V2's attention multiplies its softmax scale by ``yarn_get_mscale(40, 0.707) **
    2`` (1.59 for V2-Lite): RotaryEmbedding.from_hf_config gives that scale, equal to the
    attention module's own ``scaling``; a family whose rotation leaves it alone gives None;
    the latent attention itself stays refused."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention

    monkeypatch.setenv("POSENC_HF_CONFIG_CLASS", route)
    with torch.device("meta"):
        want = DeepseekV2Attention(transformers.DeepseekV2Config(**DEEPSEEK_V2_LITE), 0).scaling
    rope = posenc.RotaryEmbedding.from_hf_config(DEEPSEEK_V2_LITE)
    assert rope.softmax_scale == pytest.approx(want, rel=1e-12)
    assert rope.softmax_scale * 192**0.5 == pytest.approx(1.5896, abs=1e-4)
    plain = {**DEEPSEEK_V2_LITE, "rope_scaling": None}
    assert posenc.RotaryEmbedding.from_hf_config(plain).softmax_scale is None
    assert posenc.RotaryEmbedding.from_hf_config(transformers.LlamaConfig()).softmax_scale is None
    with pytest.raises(posenc.PosencValueError, match="multi-head latent attention"):
        posenc.Encoder.from_hf_config(DEEPSEEK_V2_LITE, device="meta")


def test_a_refusal_keeps_the_reason_transformers_gives_on_its_later_lines(tmp_path, capsys) -> None:
    """Llama 4 Scout's text config with a three-entry no_rope_layers: transformers' class
    refuses it with its validator's name on one line and the reason on the next; posenc's
    refusal, and ``posenc hf``'s one-line error, carry the reason whole."""
    import json
    from pathlib import Path

    from posenc.app import cli

    fixture = Path(__file__).parent / "configs" / "llama-4-scout-17b-16e-instruct.json"
    text = {**json.loads(fixture.read_text())["text_config"], "no_rope_layers": [1, 1, 1]}
    reason = "`num_hidden_layers` (48) must be equal to the number of `layer_types` (3)"
    with pytest.raises(posenc.PosencValueError) as info:
        posenc.Encoder.from_hf_config(text, device="meta")
    assert reason in str(info.value)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(text))
    assert cli.main(["hf", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and reason in err


@pytest.mark.parametrize("route", ["1", "0"])
def test_own_rules_read_the_attention_fields_as_the_config_classes_fill_them(
    route, monkeypatch
) -> None:
    """Without transformers' class (route 0) posenc's own rules fill the attention fields as
    the class does: Gemma 2's published file caps at 50 (its class default, the file states
    it too), a Granite without attention_multiplier scales by 1.0, a VaultGemma without its
    fields caps at 50 with query_pre_attn_scalar 256."""
    import json
    from pathlib import Path

    monkeypatch.setenv("POSENC_HF_CONFIG_CLASS", route)
    fixture = Path(__file__).parent / "configs" / "gemma-2-9b.json"
    gemma = read_schedule(json.loads(fixture.read_text()))
    assert {(x.softcap, x.softmax_scale, x.sinks) for x in gemma.layers} == {(50.0, None, False)}
    sizes = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "rope_theta": 1e4}  # fmt: skip
    granite = read_schedule({"model_type": "granite", **sizes})
    assert [x.softmax_scale for x in granite.layers] == [1.0, 1.0]
    vault = read_schedule(
        {"model_type": "vaultgemma", **sizes, "layer_types": ["full_attention"] * 2}
    )
    assert [(x.softcap, x.softmax_scale) for x in vault.layers] == [(50.0, 256**-0.5)] * 2
