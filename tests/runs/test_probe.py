"""``posenc.runs.probe``: the untrained model runs once, without gradients, in eval mode
(the mode is restored), under the run's precision, on its own device; an encoding that
cannot reach the length fails with the caller's words and the cause."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import posenc
from posenc.errors import PosencValueError
from posenc.runs.probe import probe


class Recorder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.calls: list[dict] = []

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> None:
        self.calls.append(
            {
                "training": self.training,
                "grad": torch.is_grad_enabled(),
                "autocast": torch.is_autocast_enabled("cpu"),
                "device": tokens.device,
                "positions": None if positions is None else positions.tolist(),
            }
        )


@pytest.mark.parametrize("training", [True, False])
def test_the_probe_runs_once_quietly_and_restores_the_mode(training: bool) -> None:
    model = Recorder().train(training)
    probe(model, torch.zeros(1, 4, dtype=torch.long), positions=torch.arange(3, 7)[None],
          failure="x")  # fmt: skip
    probe(model, torch.zeros(1, 4, dtype=torch.long), precision="bf16", failure="x")
    assert model.training is training
    first, second = model.calls
    assert first == {"training": False, "grad": False, "autocast": False,
                     "device": torch.device("cpu"), "positions": [[3, 4, 5, 6]]}  # fmt: skip
    assert second["autocast"] and second["positions"] is None


def test_a_length_the_encoding_cannot_reach_fails_with_the_callers_words() -> None:
    model = posenc.TransformerModel(11, 16, 1, 2, pe="learned", pe_kwargs={"max_len": 8})
    probe(model, torch.zeros(1, 8, dtype=torch.long), failure="fits")
    with pytest.raises(PosencValueError, match=r"^encoding 'learned' cannot reach 9: .*8") as info:
        probe(
            model, torch.zeros(1, 9, dtype=torch.long), failure="encoding 'learned' cannot reach 9"
        )
    assert isinstance(info.value.__cause__, (ValueError, IndexError, RuntimeError))
    assert model.training  # restored after the failure too
