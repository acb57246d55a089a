"""Train short, test long on real text (``posenc extrapolate``; Press et al. 2022, Fig. 1).

- :mod:`~posenc.extrapolate.data`: the text (a file, a folder or the standard library), the
  document-level train/validation split, bytes or BPE tokens cached in memory-mapped files,
  training batches and evaluation windows that score the same tokens at every length.
"""

from .data import *  # noqa: F403  (re-exported below through __all__)
from .data import __all__ as _data_all

__all__ = list(_data_all)
