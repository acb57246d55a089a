"""Length generalization: train tiny models per positional encoding on synthetic tasks and
measure accuracy on inputs longer than any seen in training (``posenc lengthgen``).

- :mod:`~posenc.lengthgen.tasks`: the :class:`Task` protocol, the registry, the nine
  shipped tasks (``add``: McLeish et al.'s reversed-digit addition) and loading a user's task
  from ``path/to/file.py:ClassName``;
- :mod:`~posenc.lengthgen.abacus`: Abacus digit positions beside any scheme (``NAME+abacus``);
- :mod:`~posenc.lengthgen.data`: special tokens, batching, randomized positions;
- :mod:`~posenc.lengthgen.train`: training one run and a sweep of runs, on any device, in
  fp32 or bf16; its settings are :class:`TrainConfig` (:mod:`~posenc.lengthgen.config`).
  The resumable, DDP-ready training kit it runs on is :mod:`posenc.runs`, shared with
  ``posenc extrapolate``;
- :mod:`~posenc.lengthgen.evaluate`: exact match / per-token accuracy per length, validity,
  mean and spread over seeds, tables;
- :mod:`~posenc.lengthgen.plots`: accuracy against length.

Each name is imported from its module; this package re-exports nothing (``posenc`` is the one
facade).
"""
