"""Train short, test long on real text (``posenc extrapolate``; Press et al. 2022, Fig. 1).

- the data, four steps and a module each: :mod:`~posenc.extrapolate.text` (the documents of
  a UTF-8 file, a folder or, by default, the running Python's standard library),
  :mod:`~posenc.extrapolate.split` (the train/validation split, by document and by chunk),
  :mod:`~posenc.extrapolate.tokens` (bytes, or a byte-level BPE from ``tokenizers``),
  :mod:`~posenc.extrapolate.corpus` (the two token arrays prepared once into memory-mapped
  files in a cache), and :mod:`~posenc.extrapolate.windows` (training batches, and evaluation
  windows that score the same tokens at every length);
- :mod:`~posenc.extrapolate.config`: :class:`ExtrapolateConfig` (one model),
  :class:`EvalSettings` (every evaluation) and the ``press`` preset;
- :mod:`~posenc.extrapolate.train`: the causal model and its training and fine-tuning with
  the resumable, DDP-ready :class:`~posenc.runs.trainer.Trainer` of :mod:`posenc.runs` (on
  any device, in fp32 or bf16);
- :mod:`~posenc.extrapolate.evaluate`: bits per byte at every length, by position, with
  sliding windows, and with zero-shot RoPE scalings;
- :mod:`~posenc.extrapolate.sweep`: every (encoding, seed), in parallel processes if asked;
- :mod:`~posenc.extrapolate.results` and :mod:`~posenc.extrapolate.plots`: ``results.json``,
  ``results.md``, the checks against the papers, and the figure.

Each name is imported from its module; this package re-exports nothing (``posenc`` is the one
facade).
"""
