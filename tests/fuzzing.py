"""How many examples a hypothesis test draws: its usual count, or twenty times that in a
fuzzing session (``HYPOTHESIS_PROFILE=fuzz``; see ``conftest.py``)."""

from __future__ import annotations

import os

FACTOR = 20 if os.environ.get("HYPOTHESIS_PROFILE") == "fuzz" else 1


def examples(count: int) -> int:
    """``count`` examples in the default profile, ``20 * count`` when fuzzing."""
    return count * FACTOR
