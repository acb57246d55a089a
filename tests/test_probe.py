"""posenc.probe: the ridge fit against the normal equations written out in float64 and numpy's
lstsq, the window cross-validation against refits done by hand, the targets against a loop,
probes that must read a position written linearly into a hidden state (R² ≈ 1) and must not
read one that was shuffled away (R² ≈ 0), the hidden states against the model's own forward,
and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from posenc import TransformerModel
from posenc.errors import PosencTypeError, PosencValueError
from posenc.probe import (
    cv_errors,
    format_probe,
    held_out_r2,
    hidden_states,
    probe_depths,
    probe_targets,
    ridge,
)


def _problem(t: int = 40, d: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(t, d)) * rng.uniform(0.1, 10.0, size=d) + rng.normal(size=d)
    y = x @ rng.normal(size=d) + 3.0 + rng.normal(size=t)
    return x, y


def _ridge_reference(x: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
    """``[c, w]`` from the normal equations of the augmented design ``[1, X]`` with the
    penalty ``diag(0, lam, ..., lam)`` (the intercept unpenalised), in float64."""
    a = np.hstack([np.ones((len(x), 1)), x])
    penalty = lam * np.eye(a.shape[1])
    penalty[0, 0] = 0.0
    return np.linalg.solve(a.T @ a + penalty, a.T @ y)


@pytest.mark.parametrize("lam", [0.0, 0.3, 25.0])
def test_ridge_matches_the_normal_equations(lam: float) -> None:
    x, y = _problem()
    weights, bias = ridge(torch.from_numpy(x), torch.from_numpy(y), lam)
    expected = _ridge_reference(x, y, lam)
    np.testing.assert_allclose(bias.item(), expected[0], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(weights.numpy(), expected[1:], rtol=1e-10, atol=1e-10)


def test_ridge_without_penalty_is_least_squares() -> None:
    x, y = _problem(t=30, d=4, seed=1)
    weights, bias = ridge(torch.from_numpy(x).float(), torch.from_numpy(y).float(), 0.0)
    solution, *_ = np.linalg.lstsq(np.hstack([np.ones((30, 1)), x.astype(np.float32)]), y)
    np.testing.assert_allclose(bias.item(), solution[0], rtol=1e-5)
    np.testing.assert_allclose(weights.numpy(), solution[1:], rtol=1e-5)
    assert weights.dtype == torch.float64  # fitted in float64 whatever the features' dtype


def test_cross_validation_equals_refits_by_hand() -> None:
    x, y = _problem(t=60, d=3, seed=2)
    groups = np.repeat(np.arange(10), 6)  # 10 windows of 6 tokens: 5 folds of 2 windows
    lambdas = [0.01, 1.0, 100.0]
    got = cv_errors(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(groups), lambdas)
    for i, lam in enumerate(lambdas):
        total = 0.0
        for fold in range(5):
            held = np.isin(groups, [2 * fold, 2 * fold + 1])
            coef = _ridge_reference(x[~held], y[~held], lam)
            total += float(((y[held] - coef[0] - x[held] @ coef[1:]) ** 2).sum())
        assert got[i].item() == pytest.approx(total / len(y), rel=1e-10)


def test_held_out_r2_is_one_minus_the_share_of_variance_left() -> None:
    y = torch.tensor([1.0, 2.0, 4.0, 7.0])
    assert held_out_r2(y, y) == 1.0
    assert held_out_r2(torch.full((4,), y.mean().item()), y) == pytest.approx(0.0)
    p = torch.tensor([1.5, 2.0, 3.0, 8.0])
    expected = 1 - (0.25 + 0 + 1 + 1) / ((y - 3.5) ** 2).sum().item()
    assert held_out_r2(p, y) == pytest.approx(expected, rel=1e-12)
    assert math.isnan(held_out_r2(p, torch.ones(4)))


def test_targets_are_positions_and_log_distances_to_the_last_repeat() -> None:
    tokens = torch.randint(0, 5, (3, 17), generator=torch.Generator().manual_seed(0))
    positions, distance = probe_targets(tokens)
    assert torch.equal(positions, torch.arange(17.0, dtype=torch.float64).expand(3, 17))
    for b in range(3):
        seen: dict[int, int] = {}
        for i, token in enumerate(tokens[b].tolist()):
            if token in seen:
                assert distance[b, i].item() == math.log2(i - seen[token])
            else:
                assert math.isnan(distance[b, i].item())
            seen[token] = i


class _Stack(nn.Module):
    """Random token vectors, then blocks that each do one known thing to the hidden state."""

    def __init__(self, blocks: list[nn.Module], vocab: int = 50, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(blocks)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return x


class _WritePosition(nn.Module):
    """Writes the position into the last feature (the others keep the token vector)."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat(
            [x[..., :-1], torch.arange(x.shape[1], dtype=x.dtype).expand(*x.shape[:2])[..., None]],
            dim=-1,
        )


class _ShufflePositions(nn.Module):
    """Permutes the tokens of every window at random: the hidden state at index ``i`` comes
    from a random position, so nothing linear in it tells ``i``."""

    def forward(self, x: Tensor) -> Tensor:
        g = torch.Generator().manual_seed(1)
        order = torch.stack([torch.randperm(x.shape[1], generator=g) for _ in range(x.shape[0])])
        return torch.gather(x, 1, order[:, :, None].expand_as(x))


def test_a_position_written_linearly_is_read_and_a_shuffled_one_is_not() -> None:
    torch.manual_seed(0)
    model = _Stack([_WritePosition(), _ShufflePositions()])
    tokens = torch.randint(0, 50, (40, 32))
    result = probe_depths(model, tokens)
    depth0, written, shuffled = (row.position_r2 for row in result.rows)
    assert abs(depth0) < 0.05  # random token vectors: no position
    assert written > 0.999
    assert abs(shuffled) < 0.05
    assert (result.fit_windows, result.held_windows, result.length) == (20, 20, 32)
    assert [row.depth for row in result.rows] == [0, 1, 2]


def test_a_distance_written_linearly_is_read() -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, 8, (40, 24))
    _, distance = probe_targets(tokens)

    class WriteDistance(nn.Module):  # into the last feature
        def forward(self, x: Tensor) -> Tensor:
            written = distance.nan_to_num(0.0).float()[:, :, None]
            return torch.cat([x[..., :-1], written], dim=-1)

    result = probe_depths(_Stack([WriteDistance()], vocab=8), tokens)
    # the token vector alone says little of the distance; the written one says all of it
    assert result.rows[0].distance_r2 < 0.3
    assert result.rows[1].distance_r2 > 0.999
    assert result.distance_fit_tokens == int((~distance[:20].isnan()).sum())


def test_hidden_states_are_the_models_own() -> None:
    torch.manual_seed(0)
    model = TransformerModel(30, 16, 2, 2, pe="sinusoidal", causal=True).train()
    tokens = torch.randint(0, 30, (3, 9))
    states = hidden_states(model, tokens)
    assert model.training  # the mode is restored
    assert len(states) == 3 and all(s.shape == (3, 9, 16) for s in states)
    with torch.no_grad():
        model.eval()
        embedded = model.encoder.pe(model.embed(tokens) * model.scale)
        logits = model(tokens)
    torch.testing.assert_close(states[0], embedded, rtol=0, atol=0)
    torch.testing.assert_close(model.head(model.encoder.norm(states[-1])), logits)


def test_a_trained_length_model_gives_a_table() -> None:
    torch.manual_seed(0)
    model = TransformerModel(20, 16, 2, 2, pe="rope", causal=True)
    result = probe_depths(model, torch.randint(0, 20, (8, 12)), fit=0.25)
    assert (result.fit_windows, result.held_windows) == (2, 6)
    assert len(result.rows) == 3
    assert all(math.isfinite(r.position_r2) and r.position_lambda > 0 for r in result.rows)
    text = format_probe(result, "rope")
    assert "| 0 (embedding) |" in text and "| 2 (block 2) |" in text
    assert result.to_dict()["rows"][1]["depth"] == 1


def test_bad_input_is_refused_naming_it() -> None:
    model = TransformerModel(20, 16, 1, 2, pe="none")
    tokens = torch.randint(0, 20, (4, 6))
    with pytest.raises(PosencValueError, match="fit"):
        probe_depths(model, tokens, fit=1.0)
    with pytest.raises(PosencValueError, match="3 windows"):
        probe_depths(model, tokens[:2])
    with pytest.raises(PosencValueError, match="tokens="):
        probe_depths(model.encoder, torch.randn(4, 6, 16))
    with pytest.raises(PosencValueError, match="tokens must be"):
        probe_depths(model.encoder, torch.randn(4, 6, 16), tokens=tokens[:, :5])
    with pytest.raises(PosencValueError, match="alphas"):
        probe_depths(model, tokens, alphas=[0.0])
    with pytest.raises(PosencTypeError, match="Linear"):
        probe_depths(nn.Linear(3, 3), tokens)
    with pytest.raises(PosencValueError, match="lam"):
        ridge(torch.randn(5, 2), torch.randn(5), -1.0)
    with pytest.raises(PosencValueError, match="integer ids"):
        probe_targets(torch.randn(2, 3))


def test_an_encoder_is_probed_on_vectors_with_their_tokens() -> None:
    torch.manual_seed(0)
    model = TransformerModel(20, 16, 2, 2, pe="alibi", causal=True)
    tokens = torch.randint(0, 20, (6, 10))
    x = model.embed(tokens).detach() * model.scale
    direct = probe_depths(model.encoder, x, tokens=tokens)
    whole = probe_depths(model, tokens)
    assert direct.rows == whole.rows  # the same hidden states, the same fits


def test_the_score_is_on_windows_the_probe_never_saw() -> None:
    """Position written into the fit windows only: a probe scored where it was fitted would
    read it perfectly; on the held-out windows it reads nothing."""

    class WriteInFitWindows(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            written = torch.arange(x.shape[1], dtype=x.dtype).expand(*x.shape[:2]).clone()
            written[20:] = 0.0  # the held-out windows (fit = 0.5 of 40)
            return torch.cat([x[..., :-1], written[..., None]], dim=-1)

    torch.manual_seed(0)
    result = probe_depths(_Stack([WriteInFitWindows()]), torch.randint(0, 50, (40, 16)))
    assert result.rows[1].position_r2 < 0.1


def test_a_stack_run_twice_per_forward_is_refused() -> None:
    class Twice(_Stack):
        def forward(self, tokens: Tensor) -> Tensor:
            return super().forward(tokens) + super().forward(tokens)

    with pytest.raises(PosencValueError, match="once per forward"):
        hidden_states(Twice([_WritePosition()]), torch.randint(0, 50, (3, 4)))
