"""The RoPE benchmark script (``posenc.bench.rope``), smoke-run on a tiny shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from posenc.bench import rope as rope_bench


@pytest.mark.slow  # starts a process per dtype and layout (the first call)
def test_benchmark_runs_and_writes_a_table(tmp_path: Path) -> None:
    out = tmp_path / "rope.md"
    args = ["--shape", "1", "2", "16", "8", "--repeats", "1", "--no-compile", "--out", str(out)]
    rope_bench.main(args)
    text = out.read_text()
    assert "| copy floor |" in text and "posenc RotaryEmbedding" in text
    assert "| copy into existing buffers |" in text
    assert "| posenc RotaryEmbedding, in place | half |" in text
    assert "transformers" in text and "rotary-embedding-torch" in text
