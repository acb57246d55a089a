"""Real text for ``posenc extrapolate``: find it, split it, tokenize it once, serve windows.

"Train short, test long" (Press et al. 2022, Fig. 1) trains a small causal language model on
windows of length ``L`` and scores bits per byte on windows of ``2L, 4L, ... 16L``. The data
path is four steps, one module each; this module gathers their public names:

- :mod:`~posenc.extrapolate.text`: the documents of a UTF-8 file, a folder or (by default)
  the running Python's standard library (:data:`STDLIB_FILTER`), and the files skipped;
- :mod:`~posenc.extrapolate.split`: the train/validation split, by document and by chunk;
- :mod:`~posenc.extrapolate.tokens`: bytes, or a byte-level BPE from ``tokenizers``;
- :mod:`~posenc.extrapolate.corpus`: :func:`prepare_corpus` writes the two token arrays
  once into a cache entry of memory-mapped files (:func:`cache_dir`) and opens it at once
  the next time;
- :mod:`~posenc.extrapolate.windows`: :meth:`Corpus.batch` draws training windows from the
  step number; :func:`eval_windows` cuts the validation tokens so that every evaluation
  length scores the same tokens; :func:`bits_per_byte`.
"""

from __future__ import annotations

from .corpus import DEFAULT_VALID_FRACTION, Corpus, cache_dir, open_corpus, prepare_corpus
from .split import chunk_size, plan_split, read_units, unit_score
from .text import (
    STDLIB_EXCLUDED_DIRS,
    STDLIB_FILTER,
    Document,
    TextScan,
    is_stdlib_source,
    scan_text,
    stdlib_root,
)
from .tokens import byte_level_alphabet, parse_tokenizer
from .windows import bits_per_byte, check_lengths, eval_budget, eval_windows, train_batch

__all__ = [
    "DEFAULT_VALID_FRACTION",
    "STDLIB_EXCLUDED_DIRS",
    "STDLIB_FILTER",
    "Corpus",
    "Document",
    "TextScan",
    "bits_per_byte",
    "byte_level_alphabet",
    "cache_dir",
    "check_lengths",
    "chunk_size",
    "eval_budget",
    "eval_windows",
    "is_stdlib_source",
    "open_corpus",
    "parse_tokenizer",
    "plan_split",
    "prepare_corpus",
    "read_units",
    "scan_text",
    "stdlib_root",
    "train_batch",
    "unit_score",
]
