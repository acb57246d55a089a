"""Moved to :mod:`posenc.runs.pool`; the names stay importable from here, with a
``DeprecationWarning``, until 0.3."""

from ..runs import pool
from ..runs.moved import all_of, moved

__getattr__ = moved(
    __name__,
    all_of(pool, ("exit_with_parent", "run_all", "run_in_processes", "slug", "threads_per_job")),
)
