"""The suites of ``posenc bench``: each times one operation of posenc against the same
operation in the libraries people use instead, and against the memory-bandwidth floor.

=========  ====================================================================================
suite      what is timed
=========  ====================================================================================
table      sinusoidal table generation: posenc vs the usual float32 NumPy and torch versions
           and ``positional_encodings``' ``PositionalEncoding1D``; max error vs float64
add        adding an absolute encoding to embeddings, vs ``x + table`` and the copy floor
rope       RoPE on q and k, both layouts, fp32 and bf16, in place and not, eager and
           compiled, vs transformers, rotary-embedding-torch, x-transformers and the copy
           floor; the first call in a fresh process; a decode step vs transformers
bias       ALiBi attention per posenc backend vs ``torch.nn.MultiheadAttention`` given the
           materialised bias: time and peak memory against n
encoder    a whole ``posenc.Encoder``, forward and forward+backward, train and eval mode, vs
           ``torch.nn.TransformerEncoder`` of the same shape with the same encoding added
schemes    that encoder's forward with every registered sequence encoding (:mod:`..schemes`)
scaling    RoPE and bias attention as n doubles from 512 to 16k, with the fitted exponent
decode     greedy generation with a KV cache vs recomputing the prefix and vs transformers'
           ``LlamaForCausalLM`` with its ``DynamicCache``; one new token's time as the cache
           grows, vs the copy floor of the bytes it reads
host       the host's Python per eager rotary call (decode and prefill shapes): the Triton
           path with the launch faked (posenc's part, Triton's part), the C kernel, and
           transformers' rotary step
hf         a transformers ``LlamaForCausalLM`` with and without :func:`posenc.hf.patch`: prefill
           and greedy generation, the rotary code's share, peak memory (CPU or ``--device
           cuda``)
=========  ====================================================================================

Every suite returns a :class:`~posenc.bench.harness.Section`; ``posenc bench`` prints them
and writes them as markdown. The ``bias`` and ``scaling`` suites measure in a subprocess
(:mod:`posenc.bench.worker`, driven by :mod:`.sweeps`), the others in this process.

One file per family of suites: :mod:`.absolute` (``table``, ``add``), :mod:`.rotary`
(``rope``), :mod:`.attention` (``bias``, ``scaling``), :mod:`.encoder`, :mod:`.decode`,
:mod:`.host`, :mod:`.hf`; their sizes are in :mod:`.settings`. This module runs them by name.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ...errors import PosencValueError
from ..harness import Section
from ..schemes import suite_schemes
from .absolute import suite_add, suite_table
from .attention import suite_bias, suite_scaling
from .decode import suite_decode
from .encoder import suite_encoder
from .hf import suite_hf
from .host import suite_host
from .rotary import suite_rope
from .settings import Settings

SUITES = ("table", "add", "rope", "bias", "encoder", "schemes", "scaling", "decode", "host", "hf")

RUNNERS: dict[str, Callable[[Settings], Section]] = {
    "table": suite_table,
    "add": suite_add,
    "rope": suite_rope,
    "bias": suite_bias,
    "encoder": suite_encoder,
    "schemes": lambda s: suite_schemes(s.encoder, warmup=s.warmup, repeats=s.repeats),
    "scaling": suite_scaling,
    "decode": suite_decode,
    "host": suite_host,
    "hf": suite_hf,
}


def run_suites(names: list[str], settings: Settings) -> list[Section]:
    """Run the named suites in order, timing each; unknown names raise ``ValueError``."""
    for name in names:
        if name not in RUNNERS:
            raise PosencValueError(f"unknown bench suite {name!r}; known: {', '.join(SUITES)}")
    sections = []
    for name in names:
        start = time.perf_counter()
        section = RUNNERS[name](settings)
        section.seconds = time.perf_counter() - start
        sections.append(section)
    return sections


__all__ = ["RUNNERS", "SUITES", "run_suites"]
