"""Moved to :mod:`posenc.runs.trainer` (the training loop both experiments share); the names
stay importable from here, with a ``DeprecationWarning``, until 0.3."""

from ..runs import trainer
from ..runs.moved import all_of, moved

__getattr__ = moved(
    __name__,
    all_of(
        trainer,
        (
            "DECAYS",
            "PeriodicFunction",
            "StepFunction",
            "Trainer",
            "lr_multiplier",
            "make_optimizer",
            "optimizer_for",
            "optimizer_step",
            "seed_everything",
        ),
    ),
)
