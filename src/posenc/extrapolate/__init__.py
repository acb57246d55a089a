"""Train short, test long on real text (``posenc extrapolate``; Press et al. 2022, Fig. 1).

- :mod:`~posenc.extrapolate.data`: the text (a file, a folder or the standard library), the
  document-level train/validation split, bytes or BPE tokens cached in memory-mapped files,
  training batches and evaluation windows that score the same tokens at every length
  (gathered from ``text``, ``split``, ``tokens``, ``corpus`` and ``windows``);
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
"""

from .config import PRESETS, EvalSettings, ExtrapolateConfig
from .data import *  # noqa: F403  (re-exported below through __all__)
from .data import __all__ as _data_all
from .evaluate import evaluate_length, evaluate_model
from .plots import plot_extrapolation
from .results import check_results, press_checks, read_results, write_results
from .sweep import run_one, run_sweep
from .train import build_model, finetune, train_model

__all__ = [
    *_data_all,
    "PRESETS",
    "EvalSettings",
    "ExtrapolateConfig",
    "build_model",
    "check_results",
    "evaluate_length",
    "evaluate_model",
    "finetune",
    "plot_extrapolation",
    "press_checks",
    "read_results",
    "run_one",
    "run_sweep",
    "train_model",
    "write_results",
]
