"""The ``decode`` suite of ``posenc bench`` (``posenc.bench.suites.decode``), run end to end
at tiny sizes: its three tables and their rows, the token checks it makes before timing
(cached generation, recomputation and each library's hand-written loop agree, and a
disagreement stops the suite), and the bytes the copy floor copies. No timing is asserted."""

from __future__ import annotations

import pytest
import torch

from posenc.bench.suites import SUITES, run_suites
from posenc.bench.suites import decode as suite
from posenc.bench.suites.settings import settings_for

TINY = settings_for(
    True,
    warmup=1,
    repeats=2,
    decode=(16, 16, 1, 2),
    decode_tokens=(5, 4),
    decode_lengths=(4, 8, 16),
    decode_repeats=1,
)


def test_the_suite_runs_end_to_end_and_fills_its_tables() -> None:
    pytest.importorskip("transformers")
    assert "decode" in SUITES
    (section,) = run_suites(["decode"], TINY)
    assert section.name == "decode" and section.seconds > 0
    assert section.data["tokens_agree"] is True
    cached, peer, growth, streaming = section.tables
    assert [row[0] for row in streaming.rows] == ["KVCache", "StreamingCache(2, 4)"]
    kv, stream = section.data["streaming"]
    assert kv["tokens_held"] == 4 + 16 - 1 and stream["tokens_held"] == 2 + 4
    assert stream["bytes_held"] == stream["bytes_allocated"] < kv["bytes_held"]
    assert kv["bytes_held"] <= kv["bytes_allocated"]
    assert [row[0] for row in cached.rows] == [
        "posenc `model.generate` (KV cache)",
        "recompute the whole prefix each step",
    ]
    assert [row[:2] for row in peer.rows] == [
        ["generate()", "posenc TransformerModel"],
        ["generate()", "transformers LlamaForCausalLM"],
        ["manual loop", "posenc TransformerModel"],
        ["manual loop", "transformers LlamaForCausalLM"],
    ]
    assert [row[0] for row in growth.rows] == ["4", "8", "16"]
    for table in (cached, peer, growth, streaming):
        assert all(len(row) == len(table.headers) for row in table.rows)
    for row in section.data["cached"] + section.data["peer"]:
        assert {"case", "implementation", "median_s", "low_s", "high_s", "tokens_per_s"} <= set(row)
        assert 0 < row["low_s"] <= row["median_s"] <= row["high_s"]
        assert row["tokens_per_s"] == pytest.approx(4 / row["median_s"])
    assert [r["loop"] for r in section.data["peer"]] == ["generate()"] * 2 + ["manual loop"] * 2
    for r in section.data["growth"]:
        assert set(r) == {"length", "median_s", "low_s", "high_s", "bytes", "floor_s",
                          "into_s", "x_first", "x_floor", "x_into"}  # fmt: skip
        assert r["x_floor"] == pytest.approx(r["median_s"] / r["floor_s"])
        assert r["x_into"] == pytest.approx(r["median_s"] / r["into_s"])
    assert section.data["growth"][0]["x_first"] == 1.0
    text = section.markdown()
    assert text.startswith("## Incremental decoding with a KV cache")
    assert "as fast as transformers" in text and "x floor" in text and "growth:" in text


def test_cached_generation_recomputation_and_the_loop_give_the_same_tokens() -> None:
    model = suite.posenc_model(TINY)
    prompt = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cached = model.generate(prompt, 6)
        assert cached.shape == (2, 11) and torch.equal(cached[:, :5], prompt)
        assert torch.equal(suite.recompute(model, prompt, 6), cached)
        assert torch.equal(suite.posenc_loop(model, prompt, 6), cached)
        assert torch.equal(suite.posenc_loop(model, prompt, 1), cached[:, :6])


def test_transformers_loop_gives_generates_tokens() -> None:
    pytest.importorskip("transformers")
    model = suite.llama_model(TINY)
    prompt = torch.randint(0, 16, (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        made = suite.llama_generate(model, prompt, 6)
        assert made.shape == (1, 11)
        assert torch.equal(suite.llama_loop(model, prompt, 6), made)


def test_different_tokens_stop_the_suite_before_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    def off_by_one(model: torch.nn.Module, prompt: torch.Tensor, new: int) -> torch.Tensor:
        out = model.generate(prompt, new)  # type: ignore[operator]
        out[:, -1] = (out[:, -1] + 1) % 16
        return out

    monkeypatch.setattr(suite, "recompute", off_by_one)
    timed: list[object] = []
    monkeypatch.setattr(suite, "round_robin", lambda *a, **k: timed.append(a))
    with pytest.raises(AssertionError, match=r"different tokens .*column 8"):
        suite.suite_decode(TINY)
    assert timed == []


def test_step_bytes_are_the_weights_and_the_cached_keys_and_values() -> None:
    model = suite.posenc_model(TINY)  # width 16, 1 layer, fp32
    weights = 4 * sum(p.numel() for p in model.parameters())
    assert suite.step_bytes(model, 0) == weights
    assert suite.step_bytes(model, 100) == weights + 2 * 1 * 100 * 16 * 4
