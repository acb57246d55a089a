"""The GPU attention benchmark (``posenc bench bias encoder --device cuda``) runs its code on
the CPU at smoke sizes, so a GPU run does not meet its first bug there; and the CLI refuses
``--device cuda`` where there is no GPU, or for a suite that has no GPU version."""

from __future__ import annotations

import pytest
import torch

from posenc.bench import attention_cuda
from posenc.bench.attention_cuda import cuda_bias, cuda_encoder, fused_schemes
from tests.commands import assert_one_line_exit_2, run_main


@pytest.mark.slow
def test_bias_section_fills_every_row_on_the_cpu() -> None:
    section = cuda_bias(quick=True, device="cpu", repeats=1)
    (table,) = section.tables
    names = {row[0] for row in table.rows}
    assert set(fused_schemes()) | set(attention_cuda.UNFUSED) | {"-"} == names
    assert {"alibi", "t5", "kerple", "dpb", "fire", "shaw"} <= set(fused_schemes())
    for row in table.rows:
        assert row[3].endswith(" ms"), row  # a failure would name its exception here


@pytest.mark.slow
def test_encoder_section_times_every_scheme_and_torch() -> None:
    section = cuda_encoder(quick=True, device="cpu", repeats=1)
    (table,) = section.tables
    assert table.rows[0][0] == "torch.nn.TransformerEncoder"
    assert len(table.rows) == 1 + 2 + len(fused_schemes()) + 3
    for row in table.rows:
        assert row[1].endswith(" ms") and row[2].endswith("x"), row


def test_device_is_checked_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    line = assert_one_line_exit_2(*run_main(["bench", "bias", "--device", "tpu"], capsys))
    assert "--device must be cpu or cuda" in line and "'tpu'" in line
    line = assert_one_line_exit_2(*run_main(["bench", "table", "--device", "cuda"], capsys))
    assert "runs the suites rope, hf, bias, encoder only, got table" in line
    if not torch.cuda.is_available():
        line = assert_one_line_exit_2(*run_main(["bench", "bias", "--device", "cuda"], capsys))
        assert "no CUDA device" in line
