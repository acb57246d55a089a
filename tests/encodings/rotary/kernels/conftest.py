"""``interpreted_triton.py`` and ``interpreted_modules.py`` run where the Triton kernel can: in
the subprocess that ``test_triton_kernel.py`` starts with ``TRITON_INTERPRET=1``, or on a CUDA
machine. Elsewhere the suite's own run (``--doctest-modules`` imports every file) leaves them
out."""

from __future__ import annotations

import os

import torch

collect_ignore = (
    []
    if os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()
    else ["interpreted_triton.py", "interpreted_modules.py"]
)
