"""Sinks, soft-capping and softmax scales read from transformers configs, checked against each
family's own attention function (issue #41).

For every family whose attention has sinks, soft-capping or a scale of its own
(``posenc.hf.scores``) and that posenc builds, a tiny config of the family (its
fields set away from their defaults where they are numbers) gives, per layer type:

* the family's attention module (transformers 5.24, built from the config) and its
  ``eager_attention_forward``, called as the module's forward calls it: the keyword arguments
  its source passes (``scaling=``, ``softcap=``, ``s_aux=``, ``sliding_window=``) evaluated on
  the module, q and k multiplied first where the forward multiplies them (OpenAI's privacy
  filter, MuseGlimmer), the mask transformers' masking functions make from the config's window
  (causal or both ways) and a padded row;
* posenc's layer from ``Encoder.from_hf_config(config)``: its window, sinks, soft-cap and scale
  with identity projections (q, k, v side by side in, the heads' output out), the same sink
  values copied in.

Rotation is checked elsewhere (the RoPE census): the same q and k, already rotated, go to both.
The outputs agree to ``max|posenc - family| / max|family| <= 2e-5`` (fp32) on every unpadded
query, over the whole sequence and decoded through posenc's cache one token at a time.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
import torch

import posenc
from posenc.hf import scores

transformers = pytest.importorskip("transformers")

from transformers import CONFIG_MAPPING  # noqa: E402
from transformers import masking_utils as masks  # noqa: E402

from tests.hf.schedules import quiet_config  # noqa: E402
from tests.hf.test_attention_fields import attention_classes  # noqa: E402

N, B = 11, 2  # longer than the window
TINY = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 64,
    "vocab_size": 64,
    "num_hidden_layers": 4,
}
#: The attention fields set away from their defaults (where the family reads them).
FIELDS = {
    "sliding_window": 4,
    "query_pre_attn_scalar": 12,
    "attn_logit_softcapping": 5.0,
    "attention_multiplier": 0.3,
    "qk_scale_factor": 2.0,
}
TOLERANCE = 2e-5

FAMILIES = sorted(
    set(scores.SINK_MODEL_TYPES)
    | scores.SOFTCAP_MODEL_TYPES
    | set(scores.SCALE_FIELDS)
    | set(scores.FIXED_SCALES)
)


def _config(model_type: str) -> Any:
    cls = CONFIG_MAPPING[model_type]
    defaults = quiet_config(cls)
    fields = {k: v for k, v in FIELDS.items() if hasattr(defaults, k)}
    config = quiet_config(cls, **TINY, **fields)
    config._attn_implementation = "eager"
    return config


def _evaluate(expression: str, module: Any) -> Any:
    return eval(expression, {}, {"self": module})  # (the modeling source's own expression)


def _family_call(cls: type, body: str, module: Any) -> tuple[dict[str, Any], list[float]]:
    """The keyword arguments the module's forward passes to its attention function, and the
    factors q and k are multiplied by before it."""
    call = body[body.index("attention_interface(") :]
    kwargs = {}
    for name in ("scaling", "softcap", "sliding_window", "s_aux"):
        found = re.search(rf"\b{name}=([^,\n]+),", call)
        if found:
            kwargs[name] = _evaluate(found.group(1), module)
    factors = [1.0, 1.0]
    for i, states in enumerate(("query_states", "key_states")):
        own = rf"^\s*{states} = (?:{states}|self\.\w+\({states}\)) \* self\.(\w+)\s*$"
        for name in re.findall(own, body, re.M):
            factors[i] *= float(getattr(module, name))
    return kwargs, factors


def _mask(config: Any, kind: str, causal: bool, padding: torch.Tensor) -> torch.Tensor:
    """transformers' 4-D float mask for this layer type (its masking functions, the config's
    window on sliding layers, or on every layer of a config without layer types: OpenAI's
    privacy filter), with ``padding`` (True = attend)."""
    every = getattr(config, "layer_types", None) is None  # (a window on every layer)
    window = getattr(config, "sliding_window", None)
    window = window if kind == "sliding_attention" or every else None
    if causal:
        rule = (
            masks.causal_mask_function
            if window is None
            else masks.sliding_window_causal_mask_function(window)
        )
    else:
        rule = (
            masks.bidirectional_mask_function
            if window is None
            else masks.sliding_window_bidirectional_mask_function(window)
        )
    return masks.eager_mask(B, N, N, mask_function=rule, attention_mask=padding)


def _posenc_core(attn: posenc.MultiHeadAttention, sinks: torch.Tensor | None) -> Any:
    """posenc's attention of this layer, no rotation, identity projections: q, k, v side by
    side in, the heads' output out."""
    h, g, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    width = (h + 2 * g) * d
    core = posenc.MultiHeadAttention(
        width,
        h,
        num_kv_heads=g,
        head_dim=d,
        causal=attn.causal,
        bias=False,
        window=attn.window,
        chunk=attn.chunk,
        sinks=attn.sinks is not None,
        softcap=attn.softcap,
        softmax_scale=attn.softmax_scale,
    ).eval()
    with torch.no_grad():
        core.qkv.weight.copy_(torch.eye(width))
        core.out.weight.copy_(torch.eye(width, h * d))
        if sinks is not None:
            core.sinks.copy_(sinks)
    return core


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.mark.filterwarnings("ignore:config model_type .* is not one of the model types")
@pytest.mark.parametrize("model_type", FAMILIES)
def test_each_layer_attends_as_the_familys_attention_function(model_type: str) -> None:
    config = _config(model_type)
    try:
        encoder = posenc.Encoder.from_hf_config(config)
    except posenc.PosencValueError as error:  # a family posenc refuses: by name
        pytest.fail(f"{model_type} refused: {error}")
    classes = [(c, b) for c, b in attention_classes(type(config)) if "attention_interface(" in b]
    assert classes, f"{model_type}: no attention class found"
    cls, body = classes[0]
    modeling = __import__(cls.__module__, fromlist=["eager_attention_forward"])
    gen = torch.Generator().manual_seed(0)
    h, g, d = encoder.num_heads, encoder.num_kv_heads, encoder.head_dim
    padding = torch.ones(B, N, dtype=torch.bool)
    padding[1, -3:] = False  # row 1: its last three tokens are padding
    seen = set()
    for i, layer in enumerate(encoder.layers):
        kind = encoder.layer_types[i]
        if kind in seen:
            continue
        seen.add(kind)
        module = cls(config, i) if "layer_idx" in inspect.signature(cls).parameters else cls(config)
        kwargs, (q_factor, k_factor) = _family_call(cls, body, module)
        q = 3 * torch.randn(B, h, N, d, generator=gen)  # logits large enough to be capped
        k, v = torch.randn(B, g, N, d, generator=gen), torch.randn(B, g, N, d, generator=gen)
        sinks = None
        if getattr(module, "sinks", None) is not None:
            sinks = torch.randn(h, generator=gen)
            with torch.no_grad():
                module.sinks.copy_(sinks)
            kwargs["s_aux"] = module.sinks
        mask = _mask(config, kind, encoder.layers[i].attn.causal, padding)
        with torch.no_grad():
            want, _ = modeling.eager_attention_forward(
                module, q * q_factor, k * k_factor, v, mask, dropout=0.0, **kwargs
            )  # (b, n, h, d)
        want = want.reshape(B, N, h * d)
        core = _posenc_core(layer.attn, sinks)
        x = torch.cat([t.transpose(1, 2).reshape(B, N, -1) for t in (q, k, v)], dim=-1)
        with torch.no_grad():
            got = core(x, key_padding_mask=~padding)[..., : h * d]
        real = padding.unsqueeze(-1).expand_as(want)  # unpadded queries
        where = f"{model_type} layer {i} ({kind})"
        error = _relative(got[real], want[real])
        assert error <= TOLERANCE, f"{where}: {error:.2e}"
        if core.causal:  # and one token at a time through posenc's cache (row 0)
            cache = posenc.KVCache()
            with torch.no_grad():
                steps = [core(x[:1, :5], cache=cache)]
                steps += [core(x[:1, t : t + 1], cache=cache) for t in range(5, N)]
            decoded = torch.cat(steps, dim=1)[..., : h * d]
            error = _relative(decoded, want[:1])
            assert error <= TOLERANCE, f"{where}, decoded: {error:.2e}"


def test_the_fields_change_the_numbers() -> None:
    """The comparison can fail: Gemma 2 read without its soft-cap, or gpt-oss without its
    sinks, is far from the family."""
    config = _config("gemma2")
    encoder = posenc.Encoder.from_hf_config(config)
    attn = encoder.layers[1].attn
    assert attn.softcap == 5.0 and attn.softmax_scale == pytest.approx(12**-0.5)
    gen = torch.Generator().manual_seed(0)
    x = 3 * torch.randn(1, N, attn.num_heads * 8 + 2 * attn.num_kv_heads * 8, generator=gen)
    capped = _posenc_core(attn, None)
    plain = _posenc_core(attn, None)
    plain.softcap = None
    with torch.no_grad():
        assert _relative(plain(x), capped(x)) > 1e-2
    gpt = posenc.Encoder.from_hf_config(_config("gpt_oss"))
    assert all(layer.attn.sinks is not None for layer in gpt.layers)
