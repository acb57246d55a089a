"""Sizes and repetitions of every ``posenc bench`` suite: :data:`DEFAULT`, :data:`QUICK` (the
``--quick`` run) and :func:`settings_for`; and the sentences the suites share."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Settings:
    """Sizes and repetitions of every suite; :data:`DEFAULT` and :data:`QUICK` below."""

    warmup: int = 2  # untimed calls per case before timing
    repeats: int = 10  # timed calls per case (round-robin)
    table: tuple[int, int] = (8192, 512)  # positions, width
    add: tuple[int, int, int] = (8, 1024, 512)  # batch, n, width
    # RoPE: the shapes of q and k (batch, heads, n, head dim), one table each
    rope: tuple[tuple[int, int, int, int], ...] = ((4, 16, 2048, 128), (1, 32, 4096, 128))
    rope_compile: bool = True  # RoPE: also time a module the user compiles (inductor)
    # RoPE with --device cuda: the shapes of q and k on the GPU
    rope_cuda: tuple[tuple[int, int, int, int], ...] = ((4, 32, 4096, 128), (1, 32, 16384, 128))
    # RoPE with --device cuda: the training step's width, depth, heads, batch and tokens
    rope_train: tuple[int, int, int, int, int] = (512, 8, 8, 32, 256)
    device: str = "cpu"  # where the suites that take --device run (rope)
    attn_dim: int = 128  # bias attention: width ...
    attn_heads: int = 2  # ... and heads (head dim 64)
    bias_sizes: tuple[int, ...] = (512, 1024, 2048)
    # encoder: width, depth, heads, ffn width, batch, n
    encoder: tuple[int, int, int, int, int, int] = (256, 2, 4, 1024, 4, 128)
    encoder_repeats: int = 21
    scaling_sizes: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
    rope_scaling_heads: int = 16  # RoPE scaling: q, k of shape (1, heads, n, 64)
    max_call_s: float = 3.0  # scaling/bias: skip a size predicted slower than this per call
    size_budget_s: float = 4.0  # scaling/bias: time spent on the timed rounds of one size
    compile_flex: bool = True  # False runs flex_attention eagerly (no compilation)
    # decode: vocabulary, width, depth, heads of the causal RoPE TransformerModel
    decode: tuple[int, int, int, int] = (256, 256, 4, 4)
    decode_tokens: tuple[int, int] = (128, 128)  # prompt length, new tokens
    decode_lengths: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096)  # cache lengths
    decode_repeats: int = 9  # decode: timed generations per case
    # decode, streaming: vocabulary, width, depth, heads of a smaller causal RoPE model ...
    decode_stream: tuple[int, int, int, int] = (256, 128, 2, 4)
    # ... and prompt length, new tokens, StreamingCache's sink_tokens and window
    decode_stream_tokens: tuple[int, int, int, int] = (16, 4096, 4, 252)
    decode_stream_repeats: int = 2  # timed generations per cache (alternating)
    # hf: a transformers Llama patched and not: width, depth, heads, key/value heads, prompt,
    # new tokens; its vocabulary; timed generations per case
    hf: tuple[int, int, int, int, int, int] = (512, 8, 8, 4, 512, 128)
    hf_vocab: int = 8192
    hf_repeats: int = 5
    threads: int = 0  # 0: torch's default
    host_calls: int = 2000  # host: calls per timed round (the rounds: repeats, at least 3)


DEFAULT = Settings()
QUICK = Settings(
    warmup=1,
    repeats=2,
    table=(128, 32),
    add=(2, 32, 32),
    rope=((1, 2, 16, 8),),
    rope_compile=False,
    rope_cuda=((1, 2, 16, 8),),
    rope_train=(32, 1, 2, 2, 16),
    attn_dim=32,
    attn_heads=2,
    bias_sizes=(32, 64),
    encoder=(32, 1, 2, 64, 2, 16),
    encoder_repeats=2,
    scaling_sizes=(32, 64),
    rope_scaling_heads=2,
    max_call_s=1.0,
    size_budget_s=0.2,
    compile_flex=False,
    decode=(32, 32, 1, 2),
    decode_tokens=(8, 8),
    decode_lengths=(4, 8, 16, 32, 64, 128),
    decode_repeats=2,
    host_calls=20,
    decode_stream=(32, 16, 1, 2),
    decode_stream_tokens=(4, 16, 2, 4),
    decode_stream_repeats=1,
    hf=(32, 1, 2, 1, 8, 4),
    hf_vocab=64,
    hf_repeats=2,
)


def timing_line(s: Settings) -> str:
    return (
        f"Medians over {s.repeats} timed calls per case, taken round-robin (one call of each "
        f"case per round) after {s.warmup} untimed warm-up call(s) of each; `range` is the "
        "fastest and slowest call. Ratios compare medians from this one run."
    )


def missing_peer(dist: str, what: str) -> str:
    return f"{what}: skipped, `{dist}` is not installed (`pip install posenc[bench]`)"


def settings_for(quick: bool, **overrides: Any) -> Settings:
    """:data:`QUICK` or :data:`DEFAULT`, with the given fields replaced (``None`` skipped)."""
    base = QUICK if quick else DEFAULT
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
