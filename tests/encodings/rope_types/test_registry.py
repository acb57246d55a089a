"""RoPE scaling: every rope_type against transformers' modeling_rope_utils (inverse frequencies,
attention factor, and the rotated q, k of LlamaRotaryEmbedding + apply_rotary_pos_emb)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch
from torch.testing import assert_close

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from posenc import (  # noqa: E402
    ROPE_TYPES,
    Encoder,
    PosencTypeError,
    PosencValueError,
    RopeType,
    RotaryEmbedding,
    register_rope_type,
    rope_parameters,
    validate_rope_scaling,
)
from posenc.encodings.rope_types import registry as rope_scaling  # noqa: E402
from posenc.encodings.rope_types.builtin import default_inv_freq  # noqa: E402
from posenc.encodings.rope_types.registry import rope_type_keys  # noqa: E402
from tests.misuse import MISSING, Misuse, cases, check  # noqa: E402

transformers.logging.set_verbosity_error()


def _longrope(n: int, **extra: Any) -> dict[str, Any]:
    return {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.05 * i for i in range(n)],
        "long_factor": [1.5 + 0.7 * i for i in range(n)],
        "original_max_position_embeddings": 32,
        **extra,
    }


# (head_dim, base, max_position_embeddings, rope_parameters without rope_theta)
CASES: list[tuple[int, float, int, dict[str, Any]]] = [
    (16, 10000.0, 64, {"rope_type": "default"}),
    # p-RoPE: the first int(p * d / 2) frequencies of the whole head, the rest 0
    (64, 1e6, 512, {"rope_type": "proportional", "partial_rotary_factor": 0.25, "factor": 2.0}),
    (128, 10000.0, 512, {"rope_type": "proportional", "partial_rotary_factor": 0.5}),
    (32, 10000.0, 64, {"rope_type": "proportional", "partial_rotary_factor": 0.3}),
    (64, 500000.0, 128, {"rope_type": "default"}),
    (16, 10000.0, 64, {"rope_type": "linear", "factor": 4.0}),
    (32, 1000.0, 64, {"rope_type": "linear", "factor": 0.5}),
    (16, 10000.0, 32, {"rope_type": "dynamic", "factor": 2.0}),
    (64, 500000.0, 48, {"rope_type": "dynamic", "factor": 8.0}),
    (
        16,
        10000.0,
        128,
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    ),
    (
        64,
        10000.0,
        256,
        {
            "rope_type": "yarn",
            "factor": 16.0,
            "original_max_position_embeddings": 16,
            "beta_fast": 16,
            "beta_slow": 2,
            "truncate": False,
        },
    ),
    (
        32,
        10000.0,
        256,
        {
            "rope_type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 64,
            "mscale": 1.0,
            "mscale_all_dim": 0.8,
        },
    ),
    (
        16,
        10000.0,
        256,
        {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 64},
    ),
    (
        16,
        10000.0,
        256,
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 32,
            "attention_factor": 1.3,
        },
    ),
    (16, 10000.0, 128, _longrope(8, factor=4.0)),
    (16, 10000.0, 128, _longrope(8)),
    (32, 10000.0, 128, _longrope(16, attention_factor=1.2)),
    (
        16,
        10000.0,
        128,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ),
    (
        128,
        500000.0,
        131072,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    (  # Llama 4 Scout's config.json: no blended band (low == high), a step at 8192
        128,
        500000.0,
        131072,
        {
            "rope_type": "llama3",
            "factor": 16.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
        },
    ),
]
IDS = [f"{c[3]['rope_type']}-{i}" for i, c in enumerate(CASES)]


def _config(head_dim: int, base: float, max_len: int, params: dict[str, Any]) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_len,
        rope_parameters={**params, "rope_theta": base},
    )


def _hf_init(config: LlamaConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)


@pytest.mark.parametrize(("head_dim", "base", "max_len", "params"), CASES, ids=IDS)
@pytest.mark.parametrize("seq_len", [None, 40, 300])
def test_inverse_frequencies_and_attention_factor_match_transformers(
    head_dim: int, base: float, max_len: int, params: dict[str, Any], seq_len: int | None
) -> None:
    config = _config(head_dim, base, max_len, params)
    expected, expected_factor = _hf_init(config, seq_len)
    inv_freq, factor = rope_parameters(
        {**params, "rope_theta": base}, head_dim, base, max_position_embeddings=max_len,
        seq_len=seq_len,
    )  # fmt: skip
    assert inv_freq.dtype == torch.float64
    # transformers works in float32; ours is float64, so they agree to float32 rounding
    assert_close(inv_freq, expected.double(), rtol=2e-6, atol=0.0)
    assert factor == pytest.approx(float(expected_factor), rel=1e-12)


def test_every_hf_rope_type_we_claim_is_covered() -> None:
    """Every built-in type is in CASES, but ``ntk`` (posenc's own) and ``ntk_alpha``
    (HunYuan's rotary module's own function, checked below)."""
    covered = {params["rope_type"] for *_, params in CASES}
    assert covered == set(ROPE_TYPES) - {"ntk", "ntk_alpha"}
    assert covered - {"default"} <= set(ROPE_INIT_FUNCTIONS)


@pytest.mark.parametrize(
    ("head_dim", "theta", "alpha"), [(128, 10000.0, 1000.0), (16, 10000.0, 2.0), (64, 5e5, 0.5)]
)
def test_ntk_alpha_matches_hunyuans_own_function(head_dim: int, theta: float, alpha: float) -> None:
    """``ntk_alpha`` against HunYuan's ``compute_ntk_alpha_rope_parameters`` (transformers'
    only NTK-alpha), at every length: the base is fixed."""
    from transformers import HunYuanDenseV1Config
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import (
        HunYuanDenseV1RotaryEmbedding,
    )

    config = HunYuanDenseV1Config(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        head_dim=head_dim,
        rope_theta=theta,
        rope_scaling={"type": "dynamic", "alpha": alpha, "factor": 1.0},  # as checkpoints do
    )
    expected, expected_factor = HunYuanDenseV1RotaryEmbedding.compute_ntk_alpha_rope_parameters(
        config
    )
    for seq_len in (None, 40, 100000):
        inv_freq, factor = rope_parameters(
            {"rope_type": "ntk_alpha", "alpha": alpha}, head_dim, theta, seq_len=seq_len
        )
        assert_close(inv_freq, expected.double(), rtol=2e-6, atol=0.0)
        assert factor == expected_factor == 1.0
    scaled = theta * alpha ** (head_dim / (head_dim - 2))  # the closed form, float64
    assert_close(inv_freq, scaled ** (-torch.arange(0, head_dim, 2).double() / head_dim))


@pytest.mark.parametrize("spelling", ["rope_type", "type"])
def test_vllms_dynamic_with_alpha_is_ntk_alpha(spelling: str) -> None:
    """vLLM's (and HunYuan's checkpoints') ``{"rope_type": "dynamic", "alpha": a}`` given to
    ``RotaryEmbedding(scaling=...)`` is NTK-alpha (vLLM's ``DynamicNTKAlphaRotaryEmbedding``
    reads ``alpha`` alone): the same frequencies as ``ntk_alpha`` and the closed form, at any
    length; ``alpha=0`` is plain dynamic NTK."""
    import posenc

    given = posenc.RotaryEmbedding(64, scaling={spelling: "dynamic", "alpha": 1000.0})
    named = posenc.RotaryEmbedding(64, scaling={"rope_type": "ntk_alpha", "alpha": 1000.0})
    assert given.scaling == named.scaling == {"rope_type": "ntk_alpha", "alpha": 1000.0}
    scaled = 1e4 * 1000.0 ** (64 / 62)  # base * alpha^(d/(d-2)), float64
    want = scaled ** (-torch.arange(0, 64, 2).double() / 64)
    for seq_len in (None, 100000):
        inv_freq, factor = rope_parameters(given.scaling, 64, 1e4, seq_len=seq_len)
        assert_close(inv_freq, want, rtol=1e-12, atol=0.0)
        assert factor == 1.0
    plain = {
        spelling: "dynamic",
        "alpha": 0.0,
        "factor": 2.0,
        "original_max_position_embeddings": 8,
    }
    zero = posenc.RotaryEmbedding(64, scaling=plain)
    assert zero.scaling["rope_type"] == "dynamic" and "alpha" not in zero.scaling


def test_longrope_mscales_are_the_attention_factor_on_each_side_of_the_original_context() -> None:
    """PhiMoE's LongRoPE: ``short_mscale`` up to the original context (seq_len <= 32),
    ``long_mscale`` past it, in place of sqrt(1 + ln f / ln L0); the frequencies are
    LongRoPE's."""
    params = _longrope(8, factor=4.0)
    with_mscales = {**params, "short_mscale": 1.1, "long_mscale": 1.3}
    for seq_len, mscale in ((None, 1.1), (32, 1.1), (33, 1.3), (300, 1.3)):
        inv_freq, factor = rope_parameters(with_mscales, 16, 1e4, seq_len=seq_len)
        plain, plain_factor = rope_parameters(params, 16, 1e4, seq_len=seq_len)
        assert torch.equal(inv_freq, plain) and factor == mscale
        assert plain_factor == pytest.approx(math.sqrt(1 + math.log(4.0) / math.log(32)))


def test_partial_rotary_frequencies_match_transformers() -> None:
    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    config = _config(32, 10000.0, 128, {**params, "partial_rotary_factor": 0.5})
    expected, expected_factor = ROPE_INIT_FUNCTIONS["yarn"](config, None)
    inv_freq, factor = rope_parameters(params, 16, 10000.0, max_position_embeddings=128)
    assert_close(inv_freq, expected.double(), rtol=2e-6, atol=0.0)
    assert factor == pytest.approx(expected_factor)


def test_ntk_matches_the_base_rescaling_of_peers() -> None:
    rotary_embedding_torch = pytest.importorskip("rotary_embedding_torch")
    peer = rotary_embedding_torch.RotaryEmbedding(16, theta_rescale_factor=4.0)
    inv_freq, factor = rope_parameters({"rope_type": "ntk", "factor": 4.0}, 16, 10000.0)
    assert_close(inv_freq, peer.freqs.detach().double(), rtol=2e-6, atol=0.0)
    assert factor == 1.0


def test_linear_equals_float64_position_interpolation() -> None:
    rope = RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": 4.0})
    plain = RotaryEmbedding(8)
    q, k = (
        torch.randn(2, 1, 12, 8, dtype=torch.float64),
        torch.randn(2, 1, 12, 8, dtype=torch.float64),
    )
    positions = torch.arange(12)
    got = rope(q, k, positions)
    want = plain(q, k, positions.double() / 4.0)
    assert_close(got[0], want[0], rtol=1e-12, atol=1e-12)
    assert_close(got[1], want[1], rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- rotated q, k


def _hf_rotate(
    hf: LlamaRotaryEmbedding, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = hf(q, positions.expand(q.shape[0], -1))
    return apply_rotary_pos_emb(q, k, cos, sin)


@pytest.mark.parametrize(("head_dim", "base", "max_len", "params"), CASES, ids=IDS)
def test_rotated_qk_match_transformers_over_a_generation(
    head_dim: int, base: float, max_len: int, params: dict[str, Any]
) -> None:
    """Prefill, decode past the original context (dynamic NTK grows, LongRoPE switches to the
    long factors), then start a new short sequence (dynamic NTK resets): every step's rotated
    q, k equal transformers'."""
    config = _config(head_dim, base, max_len, params)
    hf = LlamaRotaryEmbedding(config)
    ours = RotaryEmbedding.from_hf_config(config)
    original = params.get("original_max_position_embeddings", max_len)
    long = min(max(2 * original, max_len + 8), 400)
    steps = [
        torch.arange(20)[None],  # prefill inside the window
        torch.arange(long - 3, long)[None],  # decode far past it
        torch.arange(long, long + 2)[None],  # and further
        torch.arange(10)[None],  # a new short prompt
    ]
    for positions in steps:
        n = positions.shape[-1]
        q, k = torch.randn(2, 2, n, head_dim), torch.randn(2, 1, n, head_dim)  # GQA
        want_q, want_k = _hf_rotate(hf, q, k, positions)
        got_q, got_k = ours(q, k, positions)
        # float32 angles in transformers vs float64 here: ~ position * 1e-7
        assert_close(got_q, want_q, rtol=1e-4, atol=1e-4)
        assert_close(got_k, want_k, rtol=1e-4, atol=1e-4)


def test_from_hf_config_reads_theta_partial_rotary_and_phi3_original_length() -> None:
    from transformers import GPTNeoXConfig, Phi3Config

    neox = GPTNeoXConfig(
        hidden_size=64,
        num_attention_heads=4,
        rotary_pct=0.25,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    )
    rope = RotaryEmbedding.from_hf_config(neox)
    assert (rope.head_dim, rope.rotary_dim, rope.base) == (16, 4, 500.0)

    phi3 = Phi3Config(
        hidden_size=64,
        num_attention_heads=4,
        max_position_embeddings=256,
        original_max_position_embeddings=64,
        rope_parameters=_longrope(8, rope_theta=10000.0),
    )
    rope = RotaryEmbedding.from_hf_config(phi3)
    assert rope.scaling["original_max_position_embeddings"] == 64
    expected, factor = ROPE_INIT_FUNCTIONS["longrope"](phi3, None, seq_len=100)
    rope(torch.zeros(1, 1, 100, 16), torch.zeros(1, 1, 100, 16))  # past 64: long factors
    assert_close(rope.inv_freq, expected.double(), rtol=2e-6, atol=0.0)
    assert rope.attention_factor == pytest.approx(factor)


# --------------------------------------------------------------------------- validation


NAN = float("nan")


def _validate(scaling: object, **kwargs: object) -> object:
    return validate_rope_scaling(scaling, rotary_dim=16, **kwargs)  # type: ignore[arg-type]


def _yarn(**extra: Any) -> dict[str, Any]:
    return {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, **extra}


LLAMA3_ORDER = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                "high_freq_factor": 1.0, "original_max_position_embeddings": 32}  # fmt: skip

MISUSE = [
    Misuse("unknown-rope-type", lambda: _validate({"rope_type": "yarnn", "factor": 2.0}),
           ValueError, "rope_type", "yarnn"),
    Misuse("factor-zero", lambda: _validate({"rope_type": "linear", "factor": 0.0}), ValueError,
           "'factor'", 0.0),
    Misuse("factor-negative", lambda: _validate({"rope_type": "linear", "factor": -2.0}),
           ValueError, "'factor'", -2.0),
    Misuse("factor-nan", lambda: RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": NAN}),
           ValueError, "'factor'", NAN),
    Misuse("factor-str", lambda: _validate({"rope_type": "linear", "factor": "2"}), TypeError,
           "'factor'", "2"),
    Misuse("factor-missing", lambda: _validate({"rope_type": "linear"}), ValueError, "'factor'",
           MISSING),
    Misuse("unknown-key", lambda: _validate({"rope_type": "linear", "factr": 2.0}), ValueError,
           "unknown key", "factr"),
    Misuse("dynamic-without-max-position",
           lambda: _validate({"rope_type": "dynamic", "factor": 2.0}), ValueError,
           "max_position_embeddings", MISSING),
    Misuse("yarn-without-original",
           lambda: RotaryEmbedding(8, scaling={"rope_type": "yarn", "factor": 2}), ValueError,
           "original_max_position_embeddings", MISSING),
    Misuse("yarn-original-float",
           lambda: RotaryEmbedding(8, scaling=_yarn(original_max_position_embeddings=16.0)),
           ValueError, "original_max_position_embeddings", 16.0),
    Misuse("yarn-beta-order", lambda: _validate(_yarn(beta_fast=1, beta_slow=32)), ValueError,
           "beta_fast", 1),
    Misuse("yarn-beta-nan", lambda: _validate(_yarn(beta_fast=NAN)), ValueError, "'beta_fast'",
           NAN),
    Misuse("yarn-attention-factor", lambda: _validate(_yarn(attention_factor=-1.0)),
           ValueError, "'attention_factor'", -1.0),
    Misuse("yarn-truncate", lambda: _validate(_yarn(truncate=1), max_position_embeddings=64),
           TypeError, "'truncate'", 1),
    Misuse("llama3-order", lambda: _validate(LLAMA3_ORDER), ValueError, "high_freq_factor", 1.0),
    Misuse("longrope-length", lambda: _validate(_longrope(3, factor=4.0)), ValueError,
           "'short_factor'", [1.0, 1.05, 1.1]),
    Misuse("longrope-entry",
           lambda: _validate({**_longrope(8, factor=4.0), "long_factor": [1.0] * 7 + [0.0]}),
           ValueError, "'long_factor[7]'", 0.0),
    Misuse("type-conflict", lambda: _validate({"type": "linear", "rope_type": "yarn"}),
           ValueError, "rope_type", "yarn"),
    Misuse("not-a-dict", lambda: _validate([("rope_type", "linear")]), TypeError, "scaling",
           "list"),
    Misuse("ntk-alpha-missing", lambda: _validate({"rope_type": "ntk_alpha"}), ValueError,
           "'alpha'", MISSING),
    Misuse("ntk-alpha-zero", lambda: _validate({"rope_type": "ntk_alpha", "alpha": 0.0}),
           ValueError, "'alpha'", 0.0),
    Misuse("ntk-alpha-str",
           lambda: RotaryEmbedding(8, scaling={"rope_type": "ntk_alpha", "alpha": "1000"}),
           TypeError, "'alpha'", "1000"),
    Misuse("ntk-alpha-two-channels",
           lambda: validate_rope_scaling({"rope_type": "ntk_alpha", "alpha": 2.0}, rotary_dim=2),
           ValueError, "rotary_dim", 2),
    Misuse("longrope-one-mscale",
           lambda: _validate({**_longrope(8, factor=4.0), "short_mscale": 1.2}), ValueError,
           "short_mscale", 1.2),
    Misuse("longrope-mscale-negative",
           lambda: _validate({**_longrope(8, factor=4.0), "short_mscale": 1.2,
                              "long_mscale": -1.0}), ValueError, "'long_mscale'", -1.0),
    Misuse("longrope-mscales-and-attention-factor",
           lambda: _validate({**_longrope(8, factor=4.0), "short_mscale": 1.2,
                              "long_mscale": 1.2, "attention_factor": 1.5}), ValueError,
           "attention_factor", 1.5),
    Misuse("parameters-dim-zero", lambda: rope_parameters(None, 0, 10000.0), ValueError, "dim",
           0),
    Misuse("parameters-dim-odd", lambda: rope_parameters(None, 7, 10000.0), ValueError, "dim",
           7),
    Misuse("parameters-base-nan", lambda: rope_parameters(None, 8, NAN), ValueError, "base",
           NAN),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse_names_the_argument_and_the_value(case: Misuse) -> None:
    check(case)


def test_an_unknown_rope_type_lists_every_known_one() -> None:
    with pytest.raises(ValueError, match="ntk-by-parts") as info:
        _validate({"rope_type": "ntk-by-parts"})
    for rope_type in ROPE_TYPES:
        assert rope_type in str(info.value)


def test_legacy_type_key_and_filled_original_length() -> None:
    params = validate_rope_scaling(
        {"type": "yarn", "factor": 2.0}, rotary_dim=16, max_position_embeddings=64
    )
    assert params == {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64}


def test_yarn_attention_factor_is_the_papers_temperature() -> None:
    # Peng et al. 2023, eq. 22: sqrt(1/t) = 0.1 ln(s) + 1
    _, factor = rope_parameters(
        {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 64}, 16, 1e4
    )
    assert factor == pytest.approx(0.1 * math.log(16.0) + 1.0, rel=1e-15)


# --------------------------------------------------------------------------- public tables


@pytest.mark.parametrize(("head_dim", "base", "max_len", "params"), CASES, ids=IDS)
def test_public_tables_match_transformers_over_a_generation(
    head_dim: int, base: float, max_len: int, params: dict[str, Any]
) -> None:
    """``cos_sin`` asked before any forward, then over a generation, gives transformers' cos
    and sin (dynamic NTK and LongRoPE pick their frequencies from the positions asked for),
    leaves the module as the forward would, and is what the forward rotates by."""
    config = _config(head_dim, base, max_len, params)
    hf = LlamaRotaryEmbedding(config)
    tables = RotaryEmbedding.from_hf_config(config)
    rotates = RotaryEmbedding.from_hf_config(config)
    original = params.get("original_max_position_embeddings", max_len)
    long = min(max(2 * original, max_len + 8), 400)
    half = head_dim // 2
    for positions in (torch.arange(long), torch.arange(long - 3, long), torch.arange(10)):
        n = positions.shape[0]
        want_cos, want_sin = hf(torch.zeros(1, n, head_dim), positions[None])  # (1, n, d)
        cos, sin = tables.cos_sin(positions, n, dtype=torch.float32)  # (n, d/2)
        assert_close(cos, want_cos[0, :, :half], rtol=1e-4, atol=1e-4)
        assert_close(sin, want_sin[0, :, :half], rtol=1e-4, atol=1e-4)
        q, k = torch.randn(1, 2, n, head_dim), torch.randn(1, 2, n, head_dim)
        rotates(q, k, positions)
        assert tables._seq_len == rotates._seq_len
        assert torch.equal(tables.inv_freq, rotates.inv_freq)
        # the forward's rotation is by exactly these tables
        by_tables = torch.cat((q[..., :half] * cos - q[..., half:] * sin,
                               q[..., half:] * cos + q[..., :half] * sin), dim=-1)  # fmt: skip
        assert_close(rotates(q, k, positions)[0], by_tables, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("factor", [2.0, 8.0])
def test_ntk_tables_equal_the_float64_formula(factor: float) -> None:
    """posenc's own ``ntk`` (NTK-aware base scaling, not a transformers type): cos and sin at
    p of ``θ' = θ · factor^(r/(r-2))``, frequencies ``θ'^(-2i/r)``, in float64."""
    r, base = 16, 10000.0
    rope = RotaryEmbedding(r, scaling={"rope_type": "ntk", "factor": factor})
    positions = torch.tensor([0, 1, 7, 100, 4095, 5000, 123456])
    scaled = base * factor ** (r / (r - 2))
    inv_freq = scaled ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    angles = positions.double()[:, None] * inv_freq
    cos, sin = rope.cos_sin(positions, len(positions), dtype=torch.float64)
    assert_close(cos, angles.cos(), rtol=0.0, atol=1e-12)
    assert_close(sin, angles.sin(), rtol=0.0, atol=1e-12)
    cos32, sin32 = rope.cos_sin(positions, len(positions), dtype=torch.float32)
    assert_close(cos32, angles.cos().float(), rtol=0.0, atol=2e-7)
    assert_close(sin32, angles.sin().float(), rtol=0.0, atol=2e-7)


# --------------------------------------------------------------------------- registering a type


def _halved(
    dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    max_position_embeddings: int | None = None,
    seq_len: float | None = None,
) -> tuple[torch.Tensor, float]:
    """A toy type: every frequency from the pair ``start`` on is halved."""
    inv_freq = default_inv_freq(dim, base)
    inv_freq[params["start"] :] /= 2
    return inv_freq, params.get("attention_factor") or 1.0


def _check_start(
    params: Mapping[str, Any], *, rotary_dim: int, max_position_embeddings: int | None
) -> None:
    start = params["start"]
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < rotary_dim // 2:
        raise PosencValueError(
            f"rope scaling 'start' must be a pair index below {rotary_dim // 2}, got {start!r}"
        )


def _stretched(
    dim: int,
    base: float,
    params: Mapping[str, Any],
    *,
    max_position_embeddings: int | None = None,
    seq_len: float | None = None,
) -> tuple[torch.Tensor, float]:
    """A toy type that uses the length: positions squeezed into the original context."""
    original = params["original_max_position_embeddings"]
    stretch = 1.0 if seq_len is None else max(1.0, seq_len / original)
    return default_inv_freq(dim, base) / stretch, 1.0


@pytest.fixture
def rope_registry() -> Iterator[None]:
    """Restore the built-in rope types after a test that registers its own."""
    saved = dict(rope_scaling._TYPES)
    yield
    rope_scaling._TYPES.clear()
    rope_scaling._TYPES.update(saved)


@pytest.fixture
def halved(rope_registry: None) -> RopeType:
    return register_rope_type(
        "halved", _halved, keys=("start",), optional=("attention_factor",), validate=_check_start
    )


def _halved_rotation(
    x: torch.Tensor, positions: torch.Tensor, base: float, start: int, attention: float
) -> torch.Tensor:
    """The half-layout rotation of ``x`` ``(b, h, n, r)`` by the toy type's frequencies, in
    float64, straight from the definition."""
    r = x.shape[-1]
    inv_freq = base ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)  # (r/2,)
    inv_freq[start:] = inv_freq[start:] / 2
    angles = positions.double()[:, None] * inv_freq  # (n, r/2)
    cos, sin = angles.cos() * attention, angles.sin() * attention
    x1, x2 = x[..., : r // 2].double(), x[..., r // 2 :].double()
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def test_the_built_in_registry() -> None:
    """Nine types, in order, with the records the rest of posenc asks (a test that registers
    a type of its own leaves this registry as it found it)."""
    assert list(ROPE_TYPES) == ["default", "linear", "ntk", "dynamic", "yarn", "longrope",
                                "llama3", "proportional", "ntk_alpha"]  # fmt: skip
    assert [t for t, spec in ROPE_TYPES.items() if spec.uses_length] == ["dynamic", "longrope"]
    assert [t for t, spec in ROPE_TYPES.items() if spec.needs_original] == [
        "dynamic", "yarn", "longrope", "llama3"]  # fmt: skip
    assert [t for t, spec in ROPE_TYPES.items() if not spec.caches_table] == ["dynamic"]
    assert ROPE_TYPES["llama3"].keys == {"factor", "low_freq_factor", "high_freq_factor",
                                         "original_max_position_embeddings"}  # fmt: skip
    with pytest.raises(TypeError):
        ROPE_TYPES["halved"] = ROPE_TYPES["linear"]  # type: ignore[index]


def test_a_registered_type_rotates_by_its_frequencies(halved: RopeType) -> None:
    base, start, attention = 10000.0, 3, 1.5
    scaling = {"rope_type": "halved", "start": start, "attention_factor": attention}
    rope = RotaryEmbedding(16, scaling=scaling)
    assert "halved" in ROPE_TYPES and rope.rope_spec is halved
    positions = torch.tensor([0, 1, 2, 5, 8, 13, 100, 4096, 70000])
    q = torch.randn(2, 3, 9, 16, dtype=torch.float64)
    k = torch.randn(2, 1, 9, 16, dtype=torch.float64)
    got_q, got_k = rope(q, k, positions)
    assert_close(got_q, _halved_rotation(q, positions, base, start, attention), rtol=0, atol=1e-12)
    assert_close(got_k, _halved_rotation(k, positions, base, start, attention), rtol=0, atol=1e-12)
    # float32 work reads the cached table, built by the same frequencies
    q32, k32 = q[..., :5, :].float(), k[..., :5, :].float()
    got_q, got_k = rope(q32, k32)
    want_q = _halved_rotation(q32, torch.arange(5), base, start, attention)
    assert_close(got_q, want_q.float(), rtol=0, atol=1e-5)


def test_a_registered_type_from_a_hf_config(halved: RopeType) -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 128,
        "rope_parameters": {"rope_type": "halved", "start": 0, "rope_theta": 500.0},
    }
    rope = RotaryEmbedding.from_hf_config(config)
    assert (rope.head_dim, rope.base, rope.rope_type) == (16, 500.0, "halved")
    assert rope.scaling == {"rope_type": "halved", "start": 0}
    positions = torch.arange(7)
    q, k = torch.randn(1, 4, 7, 16, dtype=torch.float64), torch.randn(1, 4, 7, 16).double()
    got_q, got_k = rope(q, k, positions)
    assert_close(got_q, _halved_rotation(q, positions, 500.0, 0, 1.0), rtol=0, atol=1e-12)
    assert_close(got_k, _halved_rotation(k, positions, 500.0, 0, 1.0), rtol=0, atol=1e-12)
    # halving every frequency is position interpolation by 2 ("linear", factor 2)
    linear = RotaryEmbedding(16, base=500.0, scaling={"rope_type": "linear", "factor": 2.0})
    assert torch.equal(rope.inv_freq, linear.inv_freq)


def test_encoder_with_a_registered_type(halved: RopeType) -> None:
    torch.manual_seed(0)
    enc = Encoder(16, 1, 2, pe="rope").eval()
    halved_enc = enc.with_rope_scaling({"rope_type": "halved", "start": 0})
    assert halved_enc.pe.rope_type == "halved"
    x = torch.randn(2, 10, 16)
    # every frequency halved: the encoder at half the positions
    want = enc(x, positions=torch.arange(10) / 2)
    assert_close(halved_enc(x), want, rtol=1e-5, atol=1e-5)


def test_a_registered_type_that_uses_the_length(rope_registry: None) -> None:
    """``uses_length`` and ``needs_original``: the original context comes from the encoder's
    training length, and the frequencies follow each call's length past it, then return."""
    spec = register_rope_type("stretched", _stretched, uses_length=True, needs_original=True)
    assert spec.optional == {"original_max_position_embeddings"} and not spec.caches_table
    enc = Encoder(16, 1, 2, pe="rope")
    enc.trained_length = 8
    rope = enc.with_rope_scaling({"rope_type": "stretched"}).pe
    assert rope.scaling == {"rope_type": "stretched", "original_max_position_embeddings": 8}
    plain = RotaryEmbedding(8)  # (the encoder's head_dim: 16 / 2 heads)
    q, k = torch.randn(1, 2, 32, 8).double(), torch.randn(1, 2, 32, 8).double()
    for n, stretch in ((32, 4.0), (20, 4.0), (4, 1.0)):  # grows, stays, back within 8
        got_q, _ = rope(q[:, :, :n], k[:, :, :n])
        want_q, _ = plain(q[:, :, :n], k[:, :, :n], torch.arange(n) / stretch)
        assert_close(got_q, want_q, rtol=0, atol=1e-12)


def test_validating_a_registered_type(halved: RopeType) -> None:
    assert rope_type_keys("halved") == ({"start"}, {"attention_factor"})
    params = validate_rope_scaling(
        {"type": "halved", "start": 2, "attention_factor": None}, rotary_dim=16
    )
    assert params == {"rope_type": "halved", "start": 2, "attention_factor": None}


HALVED_MISUSE = [
    Misuse("missing-key", lambda: _validate({"rope_type": "halved"}), ValueError, "'start'",
           MISSING),
    Misuse("unknown-key", lambda: _validate({"rope_type": "halved", "start": 1, "stop": 4}),
           ValueError, "unknown key", "stop"),
    Misuse("its-validate-refuses", lambda: _validate({"rope_type": "halved", "start": 8}),
           ValueError, "'start'", 8),
    Misuse("its-validate-refuses-a-str",
           lambda: RotaryEmbedding(16, scaling={"rope_type": "halved", "start": "1"}),
           ValueError, "'start'", "1"),
    Misuse("common-check", lambda: _validate(
        {"rope_type": "halved", "start": 1, "attention_factor": -1.0}), ValueError,
        "'attention_factor'", -1.0),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(HALVED_MISUSE))
def test_a_registered_type_is_validated(halved: RopeType, case: Misuse) -> None:
    check(case)


def _register(name: Any = "toy", init: Any = _halved, **kwargs: Any) -> object:
    return register_rope_type(name, init, **kwargs)


REGISTER_MISUSE = [
    Misuse("init-not-callable", lambda: _register(init=3.0), TypeError, "init", 3.0),
    Misuse("duplicate-name", lambda: _register("yarn"), ValueError, "rope_type", "yarn"),
    Misuse("name-not-str", lambda: _register(7), TypeError, "name", 7),
    Misuse("name-blank", lambda: _register(" "), ValueError, "name", " "),
    Misuse("keys-one-str", lambda: _register(keys="start"), TypeError, "keys", "start"),
    Misuse("keys-not-str", lambda: _register(keys=("start", 3)), TypeError, "keys", 3),
    Misuse("keys-common", lambda: _register(keys=("rope_theta",)), ValueError, "keys",
           "rope_theta"),
    Misuse("keys-also-optional", lambda: _register(keys=("start",), optional=("start",)),
           ValueError, "optional", ["start"]),
    Misuse("validate-not-callable", lambda: _register(validate="no"), TypeError, "validate",
           "no"),
    Misuse("flag-not-bool", lambda: _register(uses_length=1), TypeError, "uses_length", 1),
    Misuse("length-without-original", lambda: _register(uses_length=True), ValueError,
           "uses_length", True),
    Misuse("switch-without-length",
           lambda: _register(needs_original=True, switches_at_original=True), ValueError,
           "switches_at_original", True),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(REGISTER_MISUSE))
def test_register_rope_type_misuse(rope_registry: None, case: Misuse) -> None:
    before = dict(ROPE_TYPES)
    check(case)
    assert dict(ROPE_TYPES) == before  # nothing half-registered


def test_proportional_rope_rotates_as_transformers_llama_does() -> None:
    """p-RoPE read from a transformers config: the whole head's pairs, the lowest frequencies
    not turned (unlike partial RoPE over the same fraction), equal to LlamaRotaryEmbedding
    with apply_rotary_pos_emb."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from posenc import RotaryEmbedding

    params = {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25}
    config = LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=64,
                         rope_parameters={**params, "factor": 2.0})  # fmt: skip
    ours = RotaryEmbedding.from_hf_config(config)
    assert ours.rotary_dim == 64 and ours.scaling["partial_rotary_factor"] == 0.25
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 4, 16, 64, generator=gen) for _ in range(2))
    positions = torch.arange(100, 116)
    cos, sin = LlamaRotaryEmbedding(config)(q, positions[None])
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    q_rot, k_rot = ours(q, k, positions)
    assert_close(q_rot, q_ref, atol=1e-5, rtol=2e-5)
    assert_close(k_rot, k_ref, atol=1e-5, rtol=2e-5)
    # the last 3/4 of the pairs are not turned: those dims pass through, in both halves
    untouched = torch.cat([torch.arange(8, 32), torch.arange(40, 64)])
    assert torch.equal(q_rot[..., untouched], q[..., untouched])
    partial = RotaryEmbedding(64, base=1e6, rotary_dim=16)  # partial RoPE: other frequencies
    assert not torch.allclose(partial(q, k, positions)[0], q_rot, atol=1e-3)
    with pytest.raises(ValueError, match=r"partial_rotary_factor in \(0, 1\]"):
        RotaryEmbedding(64, scaling={"rope_type": "proportional", "partial_rotary_factor": 1.5})


@pytest.mark.parametrize("config", [None, "config.json", b"{}", 3, 2.5, True, [1, 2], ("a",)])
def test_from_hf_config_refuses_what_is_not_a_config_by_its_type(config: object) -> None:
    """A path, a JSON string or a list is a TypeError naming what was given, as
    ``Encoder.from_hf_config`` says, not "describes no rotary embedding"."""
    with pytest.raises(
        PosencTypeError,
        match=rf"config must be a transformers config or a config\.json dict, got "
        rf"{type(config).__name__}",
    ):
        RotaryEmbedding.from_hf_config(config)
