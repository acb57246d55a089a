"""The rotary figures (``posenc.plots.rotary``): the long-term decay bound against a direct
transcription, and the scaling spectrum against ``rope_parameters``."""

from __future__ import annotations

import cmath

import numpy as np
import pytest
from matplotlib.figure import Figure

from posenc.encodings.rope_types.registry import ROPE_TYPES, rope_parameters
from posenc.plots.rotary import (
    default_scalings,
    relative_upper_bound,
    rope_long_term_decay,
    rope_scaling_spectrum,
)


def test_relative_upper_bound_matches_a_direct_transcription() -> None:
    d, base = 16, 10000.0
    theta = [base ** (-2 * k / d) for k in range(d // 2)]
    distances = np.array([0, 1, 5, 37, 250])
    want = []
    for m in distances:
        partial = [
            sum(cmath.exp(1j * m * theta[k]) for k in range(j)) for j in range(1, d // 2 + 1)
        ]
        want.append(sum(abs(s) for s in partial) / (d // 2))
    np.testing.assert_allclose(relative_upper_bound(d, distances), want, rtol=1e-12, atol=0)
    assert relative_upper_bound(d, np.array([0]))[0] == pytest.approx((d // 2 + 1) / 2)


def test_long_term_decay_decays() -> None:
    bound = relative_upper_bound(128, np.arange(0, 257))
    assert bound[0] > 2 * bound[200] and bound[0] == bound.max()
    fig = rope_long_term_decay(64, bases=(500000.0,))
    assert isinstance(fig, Figure) and len(fig.axes[0].lines) == 2


def test_spectrum_plots_each_method_against_the_original() -> None:
    fig = rope_scaling_spectrum(64, factor=4.0, original_max_position_embeddings=1024)
    assert isinstance(fig, Figure)
    left, right = fig.axes
    assert left.get_yscale() == "log" and right.get_yscale() == "log"
    methods = default_scalings(4.0, 1024, 64)  # every rope_type with parameters
    assert list(methods) == [t for t in ROPE_TYPES if t != "default"]
    assert len(left.lines) == 1 + len(methods) + 1  # original, the methods, the context marker
    reference, _ = rope_parameters(None, 64, 10000.0)
    linear, _ = rope_parameters({"rope_type": "linear", "factor": 4.0}, 64, 10000.0)
    np.testing.assert_allclose(right.lines[0].get_ydata(), (linear / reference).numpy())
    custom = rope_scaling_spectrum(
        16, scalings={"mine": {"rope_type": "linear", "factor": 2.0}}, factor=2.0
    )
    assert len(custom.axes[1].lines) == 1 + 1  # the method and the 1/factor marker
