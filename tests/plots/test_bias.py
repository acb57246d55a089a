"""The bias figures (``posenc.plots.bias``): they draw what the schemes compute, every
registered bias scheme appears in the gallery, and the module drawn is left untouched."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from torch.testing import assert_close

import posenc
from posenc.encodings.bias.alibi import ALiBi
from posenc.encodings.bias.cope import CoPE
from posenc.plots.bias import bias_against_distance, bias_gallery, bias_matrices, bias_values
from tests.misuse import Misuse, cases, check
from tests.schemes import BIAS


def test_bias_matrices_show_each_head() -> None:
    pe = ALiBi(6)
    fig = bias_matrices(pe, positions=10)
    assert isinstance(fig, Figure)
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 6
    for h, image in enumerate(images):
        want = pe.bias(torch.arange(10), torch.arange(10))[h].double().numpy()
        np.testing.assert_allclose(np.asarray(image.get_array()), want, rtol=1e-6, atol=1e-9)
    plt.close(fig)


def test_bias_against_distance_is_minus_slope_times_distance() -> None:
    pe = ALiBi(3)
    fig = bias_against_distance(pe, max_distance=5)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 3
    for h, line in enumerate(lines):
        x, y = line.get_data()
        np.testing.assert_array_equal(x, np.arange(5, -6, -1))
        np.testing.assert_allclose(y, -pe.slopes[h].item() * np.abs(x), rtol=1e-12)
    plt.close(fig)


def test_bias_values_leave_the_module_alone() -> None:
    """CoPE reads q and k: the values are its float64 bias for the seeded q, k the docstring
    promises, computed on a copy."""
    pe = CoPE(2, 4)
    before = pe.embeddings.detach().clone()
    values = bias_values(pe, torch.arange(5), torch.arange(5), seed=3)
    assert values.dtype == torch.float64
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 5, 4, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 2, 5, 4, generator=gen).double()
    reference = CoPE(2, 4).double()
    reference.load_state_dict(pe.state_dict())
    with torch.no_grad():
        want = reference.bias(torch.arange(5), torch.arange(5), q=q, k=k)[0]
    assert_close(values, want, rtol=0, atol=0)
    assert pe.embeddings.dtype == torch.float32
    assert_close(pe.embeddings.detach(), before, rtol=0, atol=0)


def test_gallery_has_every_scheme() -> None:
    fig = bias_gallery(positions=8, max_distance=8)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    for name in BIAS:
        assert f"{name}: head 0" in titles
        assert f"{name}: bias against distance" in titles
    plt.close(fig)


MISUSE = [
    Misuse("not-a-bias-encoding", lambda: bias_matrices(posenc.build("sinusoidal", dim=8)),
           TypeError, "pe", "SinusoidalPositionalEncoding"),
    Misuse("positions-zero", lambda: bias_matrices(ALiBi(2), positions=0), ValueError,
           "positions", 0),
    Misuse("max-distance-zero", lambda: bias_against_distance(ALiBi(2), max_distance=0),
           ValueError, "max_distance", 0),
    Misuse("gallery-empty", lambda: bias_gallery(()), ValueError, "names", ()),
]  # fmt: skip


@pytest.mark.parametrize("case", cases(MISUSE))
def test_misuse_names_the_argument_and_the_value(case: Misuse) -> None:
    check(case)
