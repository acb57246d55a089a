"""Doctest collection of ``src/`` (pytest's ``--doctest-modules``): the Triton kernel's module
imports triton, which ships Linux x86-64 wheels only; where it is not installed the module is
left out (it holds no doctests; its tests are ``tests/encodings/rotary/kernels``)."""

from __future__ import annotations

import importlib.util

collect_ignore_glob = (
    [] if importlib.util.find_spec("triton") else ["posenc/encodings/rotary/kernels/triton_*.py"]
)
