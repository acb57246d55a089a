"""The ``table`` and ``add`` suites of ``posenc bench`` (``posenc.bench.suites.absolute``): the
reference tables the ``table`` suite times against follow the formula.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from posenc.bench.suites.absolute import float64_table, numpy_table_fp32, torch_table_fp32


@pytest.mark.parametrize(("n", "d"), [(50, 16), (7, 9)])
def test_reference_tables_are_the_formula(n: int, d: int) -> None:
    """The float32 versions the table suite times follow the formula (to float32 angle
    rounding), and the float64 reference is the formula entry by entry."""
    exact = np.array(
        [
            [
                (math.sin if c % 2 == 0 else math.cos)(p / 10000.0 ** ((c - c % 2) / d))
                for c in range(d)
            ]
            for p in range(n)
        ]
    )
    np.testing.assert_allclose(float64_table(n, d), exact, rtol=0, atol=1e-15)
    np.testing.assert_allclose(numpy_table_fp32(n, d), exact, rtol=0, atol=2e-5)
    torch.testing.assert_close(
        torch_table_fp32(n, d), torch.from_numpy(exact).float(), rtol=0, atol=2e-5
    )
