"""The training kit under both experiments (``posenc lengthgen`` on synthetic tasks,
``posenc extrapolate`` on real text): what a run needs that is not the experiment itself.

- :mod:`~posenc.runs.trainer`: :class:`~posenc.runs.trainer.Trainer` (resumable, DDP-ready
  training of one run, checkpoints by step count and wall time, the step's numbers read
  in bulk, ``torch.compile`` if asked), AdamW with warm-up and decay, seeding;
- :mod:`~posenc.runs.step`: the tail of every training step (cross-entropy of the scored
  tokens in the run's precision, the optimiser step on the global mean);
- :mod:`~posenc.runs.probe`: the untrained model run once at the longest length;
- :mod:`~posenc.runs.device`: ``--device`` and ``--precision`` (any device, bf16 autocast);
- :mod:`~posenc.runs.checkpoint`: atomic checkpoints, random states, resuming;
- :mod:`~posenc.runs.distributed`: ``torchrun`` (NCCL on GPUs, gloo on CPUs), threads;
- :mod:`~posenc.runs.sweep` and :mod:`~posenc.runs.pool`: many runs, in worker processes
  if asked;
- :mod:`~posenc.runs.progress`: the progress bar;
- :mod:`~posenc.runs.config`: the checks every run config shares, the model it describes;
- :mod:`~posenc.runs.cli`: the command-line flags both commands share;
- :mod:`~posenc.runs.schedules`: per-layer schedules as ``--pe`` writes them
  (``rope/rope/rope/none``, ``none:temp``), and the model keywords they give;
- :mod:`~posenc.runs.moved`: the deprecation shims of the names that moved here.

Nothing here knows either experiment; neither experiment imports the other.
"""
