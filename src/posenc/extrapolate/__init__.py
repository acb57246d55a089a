"""Train short, test long on real text (``posenc extrapolate``; Press et al. 2022, Fig. 1).

- :mod:`~posenc.extrapolate.data`: the text (a file, a folder or the standard library), the
  document-level train/validation split, bytes or BPE tokens cached in memory-mapped files,
  training batches and evaluation windows that score the same tokens at every length.
"""

from .data import (
    Corpus,
    bits_per_byte,
    cache_dir,
    check_lengths,
    eval_budget,
    eval_windows,
    prepare_corpus,
    train_batch,
)

__all__ = [
    "Corpus",
    "bits_per_byte",
    "cache_dir",
    "check_lengths",
    "eval_budget",
    "eval_windows",
    "prepare_corpus",
    "train_batch",
]
