"""Length generalization: train tiny models per positional encoding on synthetic tasks and
measure accuracy on inputs longer than any seen in training (``posenc lengthgen``).

- :mod:`~posenc.lengthgen.tasks`: the :class:`Task` protocol, the registry, the eight
  shipped tasks and loading a user's task from ``path/to/file.py:ClassName``;
- :mod:`~posenc.lengthgen.data`: special tokens, batching, randomized positions;
- :mod:`~posenc.lengthgen.train`: training one run and a sweep of runs, on any device, in
  fp32 or bf16; its settings are :class:`TrainConfig` (:mod:`~posenc.lengthgen.config`).
  The resumable, DDP-ready training kit it runs on is :mod:`posenc.runs`, shared with
  ``posenc extrapolate``;
- :mod:`~posenc.lengthgen.evaluate`: exact match / per-token accuracy per length, validity,
  mean and spread over seeds, tables;
- :mod:`~posenc.lengthgen.plots`: accuracy against length.
"""

from .data import Vocab, random_positions
from .evaluate import aggregate, markdown_report, markdown_table, read_jsonl, wide_table
from .plots import plot_accuracy_vs_length
from .tasks import Task, available_tasks, get_task, load_task_from_file, register_task
from .train import TrainConfig, build_model, run_sweep

__all__ = [
    "Task",
    "TrainConfig",
    "Vocab",
    "aggregate",
    "available_tasks",
    "build_model",
    "get_task",
    "load_task_from_file",
    "markdown_report",
    "markdown_table",
    "plot_accuracy_vs_length",
    "random_positions",
    "read_jsonl",
    "register_task",
    "run_sweep",
    "wide_table",
]
