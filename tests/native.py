"""The mark for tests that force posenc's C rotary kernel: they skip where it is not built
(without a C compiler RoPE runs the torch path, and ``setup.py`` builds nothing)."""

from __future__ import annotations

import pytest

from posenc.encodings.rotary.kernels import native

NEEDS_KERNEL = pytest.mark.skipif(native._native is None, reason="the C kernel is not built")

#: The C kernel forced as a ``backend`` parameter, where it is built.
NATIVE = pytest.param("native", marks=NEEDS_KERNEL)
