"""The GPU RoPE suite (``posenc.bench.rope_cuda``), checked on the CPU: its cases run and agree
with each other, and its rows and goal lines are built from the timings (the timings
themselves need a GPU: ``benchmarks/gpu_run.sh``)."""

from __future__ import annotations

import os

import torch

from posenc.bench import rope_cuda
from posenc.bench.harness import Case, Table
from posenc.bench.rope_calls import FORWARD, IN_PLACE
from posenc.bench.timing import Timing


def test_the_cases_run_and_agree() -> None:
    q, k = torch.randn(1, 2, 6, 8), torch.randn(1, 1, 6, 8)
    before = os.environ.get("POSENC_ROTARY_KERNEL")
    triples = rope_cuda.cuda_cases(q, k, [], compile=False)
    names = [(name, layout) for name, layout, _ in triples]
    assert names == [
        (rope_cuda.FLOOR, "-"),
        (FORWARD, "half"),
        (IN_PLACE, "half"),
        (rope_cuda.TORCH_KERNEL, "half"),
        (FORWARD, "interleaved"),
        (IN_PLACE, "interleaved"),
        (rope_cuda.PEER, "half"),
    ]
    # out of place first: the in-place rows turn q and k on every call
    calls = dict(zip(names, (fn for _, _, fn in triples), strict=True))
    ours, peer = calls[(FORWARD, "half")](), calls[(rope_cuda.PEER, "half")]()
    torch.testing.assert_close(ours, peer, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(calls[(rope_cuda.TORCH_KERNEL, "half")](), ours)
    assert os.environ.get("POSENC_ROTARY_KERNEL") == before  # the override is undone
    turned = calls[(IN_PLACE, "half")]()
    torch.testing.assert_close(turned, ours)
    assert turned[0] is q and turned[1] is k


def test_rows_and_goals_come_from_the_timings() -> None:
    def timing(name: str, ms: float) -> Timing:
        return Timing(name, ms / 1e3, ms / 1e3, ms / 1e3, 1)

    triples = [(rope_cuda.FLOOR, "-", None), (FORWARD, "half", None), (IN_PLACE, "half", None)]
    timings = [timing("f", 1.0), timing("o", 1.1), timing("i", 0.9)]
    table, spans = Table(["a"] * 6), {}
    rope_cuda._add_rows(table, "bfloat16", triples, timings, spans)  # type: ignore[arg-type]
    assert table.rows[1][:3] == ["bfloat16", FORWARD, "half"] and table.rows[1][5] == "1.10"
    decode = [Case(FORWARD, print), Case(IN_PLACE, print), Case("transformers x", print)]
    lines = rope_cuda._summary(spans, decode, [timing("", 1), timing("", 0.5), timing("", 4)])
    assert lines[0].startswith(f"`{FORWARD}` (half layout): 1.10–1.10x") and "1.2x" in lines[0]
    assert "0.90–0.90x" in lines[1] and "at most 1.0x" in lines[1]
    assert "transformers takes 4.00x" in lines[2] and "in place: 8.00x" in lines[2]


def test_the_training_step_runs_with_and_without_rope() -> None:
    """The training step cases (timed on a GPU) run here on the CPU: the RoPE model's loss
    falls over two steps, and the table puts each against the step with no positions."""
    cases = rope_cuda.train_cases("cpu", (16, 1, 2, 2, 8))
    assert [case.name for case in cases] == [rope_cuda.TRAIN_ROPE, rope_cuda.TRAIN_NONE]
    first, second = (float(cases[0].fn()) for _ in range(2))  # type: ignore[arg-type]
    assert second < first
    timings = [Timing(case.name, 2e-3, 1e-3, 3e-3, 1) for case in cases]
    table = rope_cuda._train_table(timings, (16, 1, 2, 2, 8))
    assert table.rows[0][0] == rope_cuda.TRAIN_ROPE and table.rows[0][3] == "1.00"
    assert "width 16, 1 layers, 2 heads, 2 x 8 tokens" in table.caption
