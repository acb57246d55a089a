"""The registry is the only list of schemes: two toy schemes, each a minimal subclass that
implements only what the extension contract (``docs/architecture.md``) asks, registered here
and nowhere else, appear in ``posenc list``, build with ``Encoder(pe=...)``, plot, analyze,
are timed by ``posenc bench`` and appear in the report, with the values their formulas give.

The toys are registered for one test at a time and removed after it, so the registry-driven
parametrisation of other tests never sees them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from torch import Tensor

import posenc
from posenc import (
    AdditiveEncoding,
    BiasEncoding,
    Encoder,
    MultiHeadAttention,
    available,
    build,
    build_for_model,
    entry,
    register,
)
from posenc.analysis import analyze
from posenc.app.cli import main
from posenc.bench.schemes import suite_schemes
from posenc.encodings.registry import _unregister
from posenc.plots import KINDS, build_for_plot, kinds_for, plot_encoding
from posenc.plots.bias import bias_against_distance, bias_gallery, bias_matrices

ADDITIVE, BIAS = "toy-additive", "toy-bias"


class ToyAdditive(AdditiveEncoding):
    """``pe[p, i] = sin(p (i + 1) / dim)``: the contract's additive subclass, nothing more."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> ToyAdditive:
        return cls(dim, **kwargs)

    def encode(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        rates = torch.arange(1, self.dim + 1, dtype=dtype) / self.dim  # (d,)
        return torch.sin(positions.to(dtype)[..., None] * rates)  # (..., n, d)


class ToyBias(BiasEncoding):
    """``bias[h, i, j] = -|i - j| / (h + 1)``: the contract's bias subclass, nothing more."""

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> ToyBias:
        return cls(num_heads, **kwargs)

    def bias(self, q_positions: Tensor, k_positions: Tensor, **kw: Any) -> Tensor:
        distance = (q_positions[..., :, None] - k_positions[..., None, :]).abs()  # (..., nq, nk)
        slopes = 1.0 / torch.arange(1, self.num_heads + 1)  # (h,)
        return -slopes[:, None, None] * distance.unsqueeze(-3).to(slopes.dtype)  # (..., h, nq, nk)


def toy_table(positions: list[int], dim: int) -> Tensor:
    """The additive toy's formula, float64, one row per position."""
    rows = [[math.sin(p * (i + 1) / dim) for i in range(dim)] for p in positions]
    return torch.tensor(rows, dtype=torch.float64)


def toy_bias(num_heads: int, n: int) -> Tensor:
    """The bias toy's formula, float64, ``(h, n, n)``."""
    values = [
        [[-abs(i - j) / (h + 1) for j in range(n)] for i in range(n)] for h in range(num_heads)
    ]
    return torch.tensor(values, dtype=torch.float64)


@contextmanager
def toys_registered() -> Iterator[None]:
    register(ADDITIVE, "a toy additive scheme (tests)")(ToyAdditive)
    register(BIAS, "a toy bias scheme (tests)")(ToyBias)
    try:
        yield
    finally:
        _unregister(ADDITIVE)
        _unregister(BIAS)


@pytest.fixture
def toys() -> Iterator[None]:
    with toys_registered():
        yield


def test_unregistering_restores_the_registry() -> None:
    before = available()
    with toys_registered():
        assert {ADDITIVE, BIAS} <= set(available())
        assert available("additive") == sorted([*before_family(before, "additive"), ADDITIVE])
        assert entry(BIAS).family == "bias" and entry(BIAS).cls is ToyBias
    assert available() == before
    with pytest.raises(ValueError, match="toy-bias"):
        entry(BIAS)


def before_family(names: list[str], family: str) -> list[str]:
    return [name for name in names if entry(name).family == family]


def test_available_by_family_names_an_unknown_family() -> None:
    assert available("none") == ["none"]
    assert set(available()) == {n for f in posenc.FAMILIES for n in available(f)}
    with pytest.raises(ValueError, match="'additiv'"):
        available("additiv")


# --------------------------------------------------------------------------- list


@pytest.mark.usefixtures("toys")
def test_list_shows_the_toys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(available())
    (additive,) = [line for line in lines if line.startswith(ADDITIVE + " ")]
    assert "additive" in additive and "a toy additive scheme (tests)" in additive
    assert main(["list", "--family", "bias"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == available("bias") and BIAS in names and ADDITIVE not in names


# --------------------------------------------------------------------------- build and run


@pytest.mark.usefixtures("toys")
def test_additive_toy_adds_its_formula_without_dropout() -> None:
    pe = build(ADDITIVE, dim=6)
    assert pe.dropout is None  # never set by the toy: the base class adds nothing
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 3, 0, 9, 2]])
    want = x + torch.stack([toy_table(row, 6) for row in positions.tolist()])
    torch.testing.assert_close(pe.train()(x, positions), want, rtol=0, atol=1e-15)
    half = pe(x.to(torch.bfloat16), positions)  # summed in float32, rounded once
    assert half.dtype == torch.bfloat16
    assert torch.equal(half, (x.to(torch.bfloat16).float() + want.sub(x).float()).bfloat16())


@pytest.mark.usefixtures("toys")
def test_encoder_with_the_additive_toy_adds_it_before_the_first_layer() -> None:
    torch.manual_seed(0)
    enc = Encoder(8, 2, 2, pe=ADDITIVE).double().eval()
    assert isinstance(enc.pe, ToyAdditive) and enc.pe.dim == 8
    plain = Encoder(8, 2, 2, pe=None).double().eval()
    plain.load_state_dict(enc.state_dict())  # the same layers, no positions
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    positions = torch.tensor([3, 1, 4, 1, 5, 9])
    with torch.no_grad():
        got = enc(x, positions=positions)
        want = plain(x + toy_table(positions.tolist(), 8))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.usefixtures("toys")
def test_attention_adds_the_bias_toy_to_its_logits() -> None:
    """With explicit weights, log w(pe=toy) - log w(no pe) is the toy's bias plus a constant
    per query row (softmax's normaliser)."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(12, 3).double().eval()
    toy = build_for_model(BIAS, 12, 3)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    with torch.no_grad():
        _, plain = attn(x, need_weights=True)
        _, biased = attn(x, need_weights=True, pe=toy)
    diff = biased.log() - plain.log()  # (b, h, n, n)
    want = toy_bias(3, 5).expand_as(diff)
    centred = diff - diff.mean(-1, keepdim=True)
    torch.testing.assert_close(centred, want - want.mean(-1, keepdim=True), rtol=0, atol=1e-6)


@pytest.mark.usefixtures("toys")
def test_encoder_with_the_bias_toy_is_shift_invariant() -> None:
    """The toy's bias depends on i - j alone: shifted positions give the same output, and the
    output differs from the same layers without positions."""
    torch.manual_seed(0)
    enc = Encoder(12, 2, 3, pe=BIAS).eval()
    assert isinstance(enc.pe, ToyBias) and enc.pe.num_heads == 3
    plain = Encoder(12, 2, 3, pe=None).eval()
    plain.load_state_dict(enc.state_dict())
    x = torch.randn(2, 7, 12)
    with torch.no_grad():
        out = enc(x)
        shifted = enc(x, positions=torch.arange(7) + 100)
        none = plain(x)
    torch.testing.assert_close(shifted, out, rtol=1e-5, atol=1e-5)
    assert (out - none).abs().max() > 1e-3


# --------------------------------------------------------------------------- plots


@pytest.mark.usefixtures("toys")
def test_every_kind_for_their_family_plots_the_toys(tmp_path: Path) -> None:
    additive = build_for_plot(ADDITIVE)
    assert kinds_for(additive) == [
        k.name for k in KINDS.values() if "additive" in k.families and not k.grid_only
    ]
    assert kinds_for(build_for_plot(BIAS)) == [
        k.name for k in KINDS.values() if "bias" in k.families and not k.grid_only
    ]
    for name in (ADDITIVE, BIAS):
        for kind in kinds_for(build_for_plot(name)):
            assert isinstance(plot_encoding(name, kind=kind, positions=12), Figure)
        target = tmp_path / f"{name}.png"
        assert main(["plot", name, "--positions", "12", "-o", str(target)]) == 0
        assert target.stat().st_size > 1000
    assert isinstance(plot_encoding([ADDITIVE, BIAS, "sinusoidal"], positions=12), Figure)


@pytest.mark.usefixtures("toys")
def test_the_pictures_show_the_toys_values() -> None:
    heat = plot_encoding(ADDITIVE, kind="heatmap", positions=10)  # dim 64 for pictures
    drawn = np.asarray(heat.axes[0].collections[0].get_array()).reshape(10, 64)
    np.testing.assert_allclose(drawn, toy_table(list(range(10)), 64).numpy(), rtol=0, atol=1e-12)
    heads = plot_encoding(BIAS, kind="heads", positions=9)  # 4 heads for pictures
    want = toy_bias(4, 9).numpy()
    for h in range(4):
        np.testing.assert_allclose(heads.axes[h].images[0].get_array(), want[h], atol=1e-6)


@pytest.mark.usefixtures("toys")
def test_bias_figures_and_the_gallery_take_the_bias_toy() -> None:
    toy = build_for_model(BIAS, 8, 2)
    matrices = bias_matrices(toy, positions=6)
    np.testing.assert_allclose(
        matrices.axes[0].images[0].get_array(), toy_bias(2, 6)[0].numpy(), atol=1e-6
    )
    curves = bias_against_distance(toy, max_distance=4)
    line = curves.axes[0].lines[1]  # head 1: -|i - j| / 2 against i - j
    np.testing.assert_allclose(line.get_ydata(), -np.abs(line.get_xdata()) / 2, atol=1e-6)
    gallery = bias_gallery(positions=4, max_distance=4)  # default: every registered bias scheme
    titles = [ax.get_title() for ax in gallery.axes]
    assert f"{BIAS}: head 0" in titles
    on_sequences = [name for name in available("bias") if posenc.entry(name).cls.axes == 1]
    assert len(gallery.axes) >= 2 * len(on_sequences)


# --------------------------------------------------------------------------- analyze


@pytest.mark.usefixtures("toys")
def test_analyze_measures_the_toys(capsys: pytest.CaptureFixture[str]) -> None:
    bias = analyze(BIAS, length=16)
    assert bias.family == "bias"
    assert bias.translation_residual < 1e-7  # a function of i - j alone
    assert bias.decay_fraction == 1.0  # -|i - j| / (h + 1) falls with distance
    assert bias.beyond_exists and bias.beyond_drift is not None and bias.beyond_drift < 1e-7
    additive = analyze(ADDITIVE, length=16)
    assert additive.family == "additive" and additive.uniqueness > 0
    table = toy_table(list(range(16)), 96)  # analyze's default width
    distances = torch.cdist(table, table) + torch.eye(16) * 1e9
    assert additive.uniqueness == pytest.approx(float(distances.min()), rel=1e-9)
    assert main(["analyze", ADDITIVE, BIAS, "--length", "16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["family"]) for r in rows] == [(ADDITIVE, "additive"), (BIAS, "bias")]


# --------------------------------------------------------------------------- report, bench


@pytest.mark.usefixtures("toys")
def test_the_report_shows_the_toys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc.app import report

    monkeypatch.setattr(report, "_tour_section", lambda: "")  # the tour has no toy in it
    page = report.build_report([ADDITIVE, BIAS], results=tmp_path)
    for name, kind in ((ADDITIVE, "heatmap"), (BIAS, "heads")):
        assert f"{name} (no paper): {kind}" in page  # the picture's caption
        assert f"<td>{name}</td>" in page  # the analysis table
    assert page.count("data:image/png;base64,") == 2 + 2  # a comparison per family + each


@pytest.mark.usefixtures("toys")
def test_the_default_report_takes_every_registered_scheme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from posenc.app import report

    shown: dict[str, list[str]] = {}
    monkeypatch.setattr(report, "_tour_section", lambda: "")
    monkeypatch.setattr(report, "_encodings_section", lambda n: shown.setdefault("pics", n) and "")
    monkeypatch.setattr(report, "_analysis_section", lambda n: shown.setdefault("table", n) and "")
    report.build_report(results=tmp_path)
    assert shown["pics"] == shown["table"] == available()
    assert {ADDITIVE, BIAS} <= set(shown["pics"])


@pytest.mark.usefixtures("toys")
def test_bench_times_the_toys() -> None:
    section = suite_schemes((8, 1, 2, 16, 1, 4), warmup=0, repeats=1)
    (table,) = section.tables
    rows = {row[0]: row for row in table.rows}
    assert rows[ADDITIVE][1] == "additive" and rows[BIAS][1] == "bias"
    assert rows["none"][-1] == "1.00"
    assert set(rows) == {n for n in available() if entry(n).cls.axes == 1}
