"""Moved to :mod:`posenc.runs.checkpoint` (``check_sweep_start`` to :mod:`posenc.runs.sweep`);
the names stay importable from here, with a ``DeprecationWarning``, until 0.3."""

from ..runs import checkpoint, distributed, sweep
from ..runs.moved import all_of, moved

__getattr__ = moved(
    __name__,
    {
        **all_of(
            checkpoint,
            (
                "CHECKPOINT",
                "CHECKPOINT_VERSION",
                "RESULT",
                "check_resumable",
                "load_checkpoint",
                "prepare_run_dir",
                "rng_state",
                "save_checkpoint",
                "set_rng_state",
                "write_json",
            ),
        ),
        "check_sweep_start": sweep,
        "world": distributed,
    },
)
