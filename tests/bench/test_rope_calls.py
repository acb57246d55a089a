"""The first call and the decode step of ``posenc bench rope`` (``posenc.bench.rope_calls``):
the cases timed for a decode step compute one rotation (posenc out of place and in place, and
transformers' Llama rotary code, each against RoPE written out in float64, at a far position
with grouped-query heads), the first-call script runs and reports its four times, and the
tables show the numbers they are given."""

from __future__ import annotations

import json

import pytest
import torch
from torch.testing import assert_close

from posenc.bench import rope_calls
from posenc.bench.harness import Case
from posenc.bench.timing import Timing


def rotate_half_float64(x: torch.Tensor, position: int) -> torch.Tensor:
    """RoPE written out in float64, half layout, base 10000 (the Llama default)."""
    d = x.shape[-1]
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angles = torch.cat([position * inv_freq] * 2)  # (d,)
    x = x.double()
    rotated = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1)
    return x * angles.cos() + rotated * angles.sin()


def test_the_decode_cases_compute_the_same_rotation() -> None:
    pytest.importorskip("transformers")
    cases = {case.name: case.fn for case in rope_calls.decode_cases()}
    peer = "transformers LlamaRotaryEmbedding + apply_rotary_pos_emb"
    assert list(cases) == ["q.clone(); k.clone()", rope_calls.FORWARD, rope_calls.IN_PLACE, peer]
    q, k = (t.clone() for t in cases["q.clone(); k.clone()"]())  # the inputs, copied
    want = [rotate_half_float64(t, rope_calls.DECODE_POSITION) for t in (q, k)]
    ours = cases[rope_calls.FORWARD]()
    theirs = cases[peer]()
    assert ours[0].shape == rope_calls.DECODE_Q and ours[1].shape == rope_calls.DECODE_K
    for got, exact in zip(ours, want, strict=True):
        assert_close(got.double(), exact, rtol=0, atol=1e-5)
    # transformers forms the angle 4095·θ in float32: its error grows with the position.
    for got, exact in zip(theirs, want, strict=True):
        assert_close(got.double(), exact, rtol=0, atol=2e-3)
    in_place = cases[rope_calls.IN_PLACE]()  # rotates the cases' own q and k
    for got, out_of_place in zip(in_place, ours, strict=True):
        assert torch.equal(got, out_of_place)


def test_the_first_call_script_reports_four_times(capsys: pytest.CaptureFixture[str]) -> None:
    script = rope_calls._FIRST_CALL.format(
        threads=torch.get_num_threads(), dtype="bfloat16", interleaved=True,
        shape=(1, 2, 8, 16), head_dim=16, n=8,
    )  # fmt: skip
    exec(compile(script, "first_call", "exec"), {})
    times = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(times) == {"table", "first", "second", "inplace"}
    assert all(isinstance(v, float) and v >= 0 for v in times.values())


def test_first_call_table_shows_times_and_errors() -> None:
    rows = [
        {"dtype": "float32", "layout": "half", "table": 0.01, "first": 0.5, "second": 0.001,
         "inplace": 0.0123},
        {"dtype": "bfloat16", "layout": "interleaved", "error": "RuntimeError: boom"},
    ]  # fmt: skip
    table = rope_calls.first_call_table(rows, (1, 2, 8, 16))
    assert table.rows == [
        ["float32", "half", "0.010", "0.500", "0.001", "0.012"],
        ["bfloat16", "interleaved", "RuntimeError: boom", "", "", ""],
    ]
    assert "q and k of shape (1, 2, 8, 16)" in table.caption


def test_decode_table_compares_with_the_floor_and_posenc() -> None:
    names = ["q.clone(); k.clone()", rope_calls.FORWARD, rope_calls.IN_PLACE, "peer"]
    cases = [Case(name, lambda: None) for name in names]
    timings = [
        Timing(name, m, m / 2, 2 * m, 5)
        for name, m in zip(names, [1e-6, 4e-6, 2e-6, 8e-6], strict=True)
    ]
    table = rope_calls.decode_table(cases, timings)
    assert [row[0] for row in table.rows] == names
    assert [row[1] for row in table.rows] == ["1.0", "4.0", "2.0", "8.0"]
    assert [row[3] for row in table.rows] == ["1.00", "4.00", "2.00", "8.00"]  # x clone
    assert [row[4] for row in table.rows] == ["-", "1.00", "0.50", "2.00"]  # x posenc
    assert table.rows[3][2] == "4–16"
