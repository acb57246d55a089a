"""Moved to :mod:`posenc.runs.progress`; ``Bar`` stays importable from here, with a
``DeprecationWarning``, until 0.3."""

from ..runs import progress
from ..runs.moved import all_of, moved

__getattr__ = moved(__name__, all_of(progress, ("Bar",)))
