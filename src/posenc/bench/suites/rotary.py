"""The ``rope`` suite of ``posenc bench``: RoPE on queries and keys, both layouts, fp32 and
bf16, in place and not, eager and compiled, against transformers, rotary-embedding-torch,
x-transformers and the copy floor; the first call in a fresh process; a decode step (the
suite itself is :func:`posenc.bench.rope.suite`)."""

from __future__ import annotations

from ..harness import Section
from .settings import Settings


def suite_rope(s: Settings) -> Section:
    from ..rope import suite

    return suite(s)
