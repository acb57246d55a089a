"""Where position lives by depth: linear probes of every layer's hidden states (Haviv et al.
2022, "Transformer Language Models without Positional Encodings Still Learn Positional
Information", §5, probed absolute position the same way).

For a trained model and a batch of windows, :func:`probe_depths` reads the hidden states at
every depth (:func:`hidden_states`: depth 0 is what enters the first block, the token
embedding with an additive encoding added; depth ``k`` is the output of block ``k``) and fits,
per depth, a ridge regression from the hidden state of each token to two targets
(:func:`probe_targets`):

- its absolute position in the window, ``0 .. n - 1``;
- the distance to the previous occurrence of the same token in the window, as ``log2``
  (distances run from 1 to ``n - 1`` and a few are long: on the log scale the rare long ones
  do not rule the fit). Tokens with no earlier occurrence in their window are left out of
  this probe.

The probe is fitted on the first windows (``fit``, half by default) and scored on the others,
whole windows held out, by the coefficient of determination ``R² = 1 - SSE / SST`` of the
held-out tokens (SST about the held-out mean): 1 when a linear map reads the target exactly, 0
(or below) when it reads nothing. Ridge's λ is chosen on the fit split alone, among
:data:`RIDGE_ALPHAS` times the mean eigenvalue of the centred Gram matrix (so the grid follows
the features' scale), by 5-fold cross-validation over whole windows (:func:`cv_errors`):
leaving single tokens out would not do, since the other tokens of a window let a probe learn
which tokens sit where in it, which no held-out window shares. Every fit is in float64.

Dimension legend: ``b`` windows, ``n`` tokens per window, ``D`` model width, ``t`` tokens
of a split (``b * n`` or fewer), ``d`` features.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .errors import PosencTypeError, PosencValueError, check_bytes

__all__ = [
    "RIDGE_ALPHAS",
    "ProbeResult",
    "ProbeRow",
    "cv_errors",
    "format_probe",
    "held_out_r2",
    "hidden_states",
    "probe_depths",
    "probe_targets",
    "ridge",
    "stack_of",
]

#: The ridge penalties tried, as multiples of the mean eigenvalue of the fit split's centred
#: Gram matrix: from almost none to a penalty that flattens every direction.
RIDGE_ALPHAS: tuple[float, ...] = tuple(10.0**k for k in range(-6, 4))


@dataclass(frozen=True)
class ProbeRow:
    """The held-out R² of both probes at one depth, and the λ each chose."""

    depth: int  # 0: the input of the first block; k: the output of block k
    position_r2: float
    distance_r2: float  # nan when too few tokens recur in a split
    position_lambda: float
    distance_lambda: float


@dataclass(frozen=True)
class ProbeResult:
    """One model's probe: a row per depth, and the tokens each probe was fitted and scored on."""

    rows: list[ProbeRow]
    fit_windows: int
    held_windows: int
    length: int  # n, tokens per window
    distance_fit_tokens: int  # tokens with an earlier occurrence in their window
    distance_held_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)  # what the caller records with it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stack_of(model: nn.Module) -> nn.ModuleList:
    """The blocks of ``model``: ``model.encoder.layers`` (a :class:`~posenc.TransformerModel`)
    or ``model.layers`` (an :class:`~posenc.Encoder`, or any module that keeps its blocks
    there as an ``nn.ModuleList``)."""
    for owner in (getattr(model, "encoder", None), model):
        layers = getattr(owner, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers):
            return layers
    raise PosencTypeError(
        f"model must keep its blocks in .layers or .encoder.layers (an nn.ModuleList), got "
        f"{type(model).__name__}"
    )


def hidden_states(model: nn.Module, inputs: Tensor, **forward_kwargs: Any) -> list[Tensor]:
    """Run ``model(inputs, **forward_kwargs)`` once in eval mode without gradients (its mode is
    restored) and return the hidden state at every depth, ``depth + 1`` tensors ``(b, n, D)``
    in float32 on the CPU: what enters the first block of :func:`stack_of`, then each block's
    output. Read with hooks: the model's own forward runs unchanged."""
    layers = stack_of(model)
    entered: list[Tensor] = []
    left: list[Tensor] = []

    def before(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs["x"]
        b, n, width = x.shape
        check_bytes(
            "windows x length x dim x depths",
            f"{b} x {n} x {width} x {len(layers) + 1}",
            4 * b * n * width * (len(layers) + 1),
        )  # the hidden states kept, before the blocks run
        entered.append(x.detach().float().cpu())

    def after(_: nn.Module, __: Any, output: Any) -> None:
        x = output[0] if isinstance(output, tuple) else output
        left.append(x.detach().float().cpu())

    handles = [layers[0].register_forward_pre_hook(before, with_kwargs=True)]
    handles += [layer.register_forward_hook(after) for layer in layers]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(inputs, **forward_kwargs)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    if len(entered) != 1 or len(left) != len(layers):
        raise PosencValueError(
            f"a probe needs each of the model's {len(layers)} blocks run once per forward; "
            f"the first ran {len(entered)} time(s), all of them {len(left)}"
        )
    return entered + left


def probe_targets(tokens: Tensor) -> tuple[Tensor, Tensor]:
    """For token ids ``(b, n)``: every token's position ``(b, n)`` (``0 .. n - 1``) and the
    ``log2`` of the distance to the previous occurrence of the same token in its window
    ``(b, n)`` (NaN where it has none), both float64."""
    if tokens.dim() != 2 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise PosencValueError(
            f"tokens must be integer ids of shape (windows, length), got {tuple(tokens.shape)} "
            f"{tokens.dtype}"
        )
    b, n = tokens.shape
    index = torch.arange(n)
    positions = index.to(torch.float64).expand(b, n).clone()
    earlier = index[None, :] < index[:, None]  # (n, n): j < i
    distance = torch.full((b, n), math.nan, dtype=torch.float64)
    for row in range(b):  # one (n, n) comparison at a time
        same = (tokens[row, :, None] == tokens[row, None, :]) & earlier  # (n, n)
        last = torch.where(same, index[None, :], -1).amax(dim=1)  # (n,): latest j, or -1
        found = last >= 0
        distance[row, found] = torch.log2((index[found] - last[found]).to(torch.float64))
    return positions, distance


def _centred(features: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    x, y = features.to(torch.float64), targets.to(torch.float64)
    mean_x, mean_y = x.mean(dim=0), y.mean()
    return x - mean_x, y - mean_y, mean_x, mean_y


def ridge(features: Tensor, targets: Tensor, lam: float) -> tuple[Tensor, Tensor]:
    """The ridge regression ``argmin_{w, c} Σ_i (y_i - x_i·w - c)² + lam ‖w‖²`` (the intercept
    ``c`` unpenalised) of ``targets`` ``(t,)`` on ``features`` ``(t, d)``, in float64, in
    closed form: ``w = (Xcᵀ Xc + lam I)⁻¹ Xcᵀ yc`` on centred data, ``c = ȳ - x̄·w``.
    ``lam = 0`` is least squares and needs ``Xc`` of full column rank. Returns ``(w, c)``."""
    if not (lam >= 0 and math.isfinite(lam)):
        raise PosencValueError(f"lam must be a finite number >= 0, got {lam}")
    xc, yc, mean_x, mean_y = _centred(features, targets)
    gram = xc.T @ xc + lam * torch.eye(xc.shape[1], dtype=torch.float64)  # (d, d)
    weights = torch.linalg.solve(gram, xc.T @ yc)  # (d,)
    return weights, mean_y - mean_x @ weights


def cv_errors(
    features: Tensor, targets: Tensor, groups: Tensor, lambdas: Sequence[float], folds: int = 5
) -> Tensor:
    """The mean squared error of :func:`ridge` at each of ``lambdas``, each fold of
    ``folds`` consecutive runs of groups (``groups`` ``(t,)``: the window of each token, so
    that whole windows are held out, as the probe's score holds them out) predicted by the fit
    on the others. Fewer groups than ``folds``: one fold per group. Returns
    ``(len(lambdas),)`` float64."""
    names = groups.unique()  # sorted
    count = min(folds, len(names))
    fold_of = torch.bucketize(groups, names) * count // len(names)  # (t,) in [0, count)
    errors = torch.zeros(len(lambdas), dtype=torch.float64)
    x, y = features.to(torch.float64), targets.to(torch.float64)
    for fold in range(count):
        held = fold_of == fold
        xc, yc, mean_x, mean_y = _centred(x[~held], y[~held])
        gram, moment = xc.T @ xc, xc.T @ yc  # (d, d), (d,)
        eye = torch.eye(gram.shape[0], dtype=torch.float64)
        for i, lam in enumerate(lambdas):
            weights = torch.linalg.solve(gram + lam * eye, moment)
            predicted = (x[held] - mean_x) @ weights + mean_y
            errors[i] += ((y[held] - predicted) ** 2).sum()
    return errors / len(y)


def held_out_r2(predicted: Tensor, targets: Tensor) -> float:
    """``1 - Σ (y - ŷ)² / Σ (y - ȳ)²`` over the held-out tokens (``ȳ`` their own mean); NaN
    when the targets do not vary."""
    y, p = targets.to(torch.float64), predicted.to(torch.float64)
    total = ((y - y.mean()) ** 2).sum()
    if total == 0:
        return math.nan
    return float(1.0 - ((y - p) ** 2).sum() / total)


def _fit_and_score(
    fit_x: Tensor,
    fit_y: Tensor,
    fit_groups: Tensor,
    held_x: Tensor,
    held_y: Tensor,
    alphas: Sequence[float],
) -> tuple[float, float]:
    """Choose λ on the fit split (cross-validated by windows), refit there, score the held-out
    split: ``(R², λ)``; NaNs when a split has fewer than two tokens or the fit split one
    window."""
    if fit_y.numel() < 2 or held_y.numel() < 2 or len(fit_groups.unique()) < 2:
        return math.nan, math.nan
    xc = fit_x.to(torch.float64) - fit_x.to(torch.float64).mean(dim=0)
    scale = float(xc.square().sum()) / xc.shape[1]  # mean eigenvalue of Xcᵀ Xc
    lambdas = [alpha * max(scale, 1e-12) for alpha in alphas]
    lam = lambdas[int(cv_errors(fit_x, fit_y, fit_groups, lambdas).argmin())]
    weights, bias = ridge(fit_x, fit_y, lam)
    return held_out_r2(held_x.to(torch.float64) @ weights + bias, held_y), lam


def probe_depths(
    model: nn.Module,
    inputs: Tensor,
    *,
    tokens: Tensor | None = None,
    fit: float = 0.5,
    alphas: Sequence[float] = RIDGE_ALPHAS,
    **forward_kwargs: Any,
) -> ProbeResult:
    """Probe position and recurrence distance at every depth of ``model`` run on ``inputs``.

    Args:
        model: a :class:`~posenc.TransformerModel`, an :class:`~posenc.Encoder`, or any module
            whose blocks :func:`stack_of` finds; it runs once, in eval mode, on its device.
        inputs: ``(b, n)`` token ids (or ``(b, n, D)`` vectors for an encoder), the windows;
            moved to the device of the model's first parameter.
        tokens: ``(b, n)`` token ids for the distance target; default ``inputs`` when they
            are ids (vectors without ``tokens``: an error).
        fit: the share of windows the probes are fitted on (the first ones); the rest are
            held out and scored. The fit split gets at least two windows (λ is
            cross-validated over them), the held-out one at least one.
        alphas: the ridge penalties tried (:data:`RIDGE_ALPHAS`), each ``> 0``.
        forward_kwargs: passed to ``model`` (``positions=``, ``key_padding_mask=`` ...); the
            position probed is the index in the window whatever ``positions=`` says.
    """
    if not isinstance(inputs, Tensor) or inputs.dim() not in (2, 3):
        raise PosencValueError(
            f"inputs must be a tensor (windows, length) of ids or (windows, length, dim), got "
            f"{getattr(inputs, 'shape', type(inputs).__name__)}"
        )
    if tokens is None:
        if inputs.dim() != 2:
            raise PosencValueError("inputs are vectors: pass their token ids as tokens=")
        tokens = inputs
    if tuple(tokens.shape) != tuple(inputs.shape[:2]):
        raise PosencValueError(
            f"tokens must be (windows, length) = {tuple(inputs.shape[:2])}, got "
            f"{tuple(tokens.shape)}"
        )
    if isinstance(fit, bool) or not isinstance(fit, (int, float)) or not 0.0 < fit < 1.0:
        raise PosencValueError(f"fit must be a share in (0, 1), got {fit!r}")
    windows, length = tokens.shape
    if windows < 3 or length < 2:
        raise PosencValueError(
            f"a probe needs at least 3 windows of at least 2 tokens, got {windows} x {length}"
        )
    if not alphas or not all(a > 0 and math.isfinite(a) for a in alphas):
        raise PosencValueError(f"alphas must be finite numbers > 0, got {list(alphas)}")
    positions, distance = probe_targets(tokens.cpu())
    first = min(max(2, round(fit * windows)), windows - 1)  # windows [0, first) fit the probe
    weight = next(model.parameters(), None)
    if weight is not None:
        inputs = inputs.to(weight.device)
    states = hidden_states(model, inputs, **forward_kwargs)
    recurs = ~distance.isnan()  # (b, n)
    window = torch.arange(windows)[:, None].expand(windows, length)  # (b, n): its window
    rows = []
    for depth, state in enumerate(states):
        fit_x, held_x = state[:first], state[first:]  # (b', n, D)
        pos = _fit_and_score(
            fit_x.flatten(0, 1),
            positions[:first].flatten(),
            window[:first].flatten(),
            held_x.flatten(0, 1),
            positions[first:].flatten(),
            alphas,
        )
        dist = _fit_and_score(
            fit_x[recurs[:first]],
            distance[:first][recurs[:first]],
            window[:first][recurs[:first]],
            held_x[recurs[first:]],
            distance[first:][recurs[first:]],
            alphas,
        )
        rows.append(ProbeRow(depth, pos[0], dist[0], pos[1], dist[1]))
    return ProbeResult(
        rows=rows,
        fit_windows=first,
        held_windows=windows - first,
        length=length,
        distance_fit_tokens=int(recurs[:first].sum()),
        distance_held_tokens=int(recurs[first:].sum()),
    )


def format_probe(result: ProbeResult, title: str) -> str:
    """A Markdown table of ``result``: one line per depth, both R² to three decimals."""
    lines = [
        f"{title}: {result.fit_windows} windows fit, {result.held_windows} held out, "
        f"{result.length} tokens each",
        "",
        "| depth | position R² | log₂ distance to previous occurrence R² |",
        "| ---: | ---: | ---: |",
    ]
    for row in result.rows:
        where = "embedding" if row.depth == 0 else f"block {row.depth}"
        lines.append(f"| {row.depth} ({where}) | {row.position_r2:.3f} | {row.distance_r2:.3f} |")
    return "\n".join(lines)
