"""Moved to :mod:`posenc.runs.distributed`; the names stay importable from here, with a
``DeprecationWarning``, until 0.3."""

from ..runs import distributed
from ..runs.moved import all_of, moved

__getattr__ = moved(
    __name__,
    all_of(
        distributed,
        (
            "all_reduce_sum",
            "barrier",
            "check_divisible",
            "close_distributed",
            "global_mean",
            "init_distributed",
            "torch_threads",
            "world",
        ),
    ),
)
