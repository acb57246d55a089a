"""Moved to :mod:`posenc.runs.trainer` (the training loop both experiments share); the names
stay importable from here, with a ``DeprecationWarning``, until 0.3."""

from ..runs import checkpoint, distributed, progress, trainer
from ..runs.moved import all_of, moved

__getattr__ = moved(
    __name__,
    {
        # what it re-exported from the modules it imported
        **all_of(
            checkpoint,
            (
                "CHECKPOINT_VERSION",
                "check_resumable",
                "load_checkpoint",
                "rng_state",
                "save_checkpoint",
                "set_rng_state",
            ),
        ),
        "barrier": distributed,
        "Bar": progress,
        **all_of(
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
    },
)
