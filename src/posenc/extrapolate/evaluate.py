"""Scoring a causal language model at every evaluation length on the same validation tokens.

For each length ``n`` the first ``T`` validation targets (``T`` from
:func:`~posenc.extrapolate.windows.eval_budget`, a multiple of every length) are cut into
``T / n`` non-overlapping windows (:func:`~posenc.extrapolate.windows.eval_windows`); every
target is scored once, with the context its window gives it. So lengths differ only in the
context each token sees, never in which tokens are scored.

- ``bpb``: the summed loss in nats over the ``T`` targets, divided by ``ln 2`` and by the
  bytes they stand for (:meth:`~posenc.extrapolate.corpus.Corpus.count_bytes`): bits per
  byte for any tokenizer.
- ``by_position``: the same, per bucket of positions within the window,
  ``"0-L", "L-2L", "2L-4L", ...`` (the last bucket ends at ``n``). A bucket past ``L`` that
  is worse than ``0-L`` means "worse past the training length"; a better one, "more context
  helps".
- sliding windows (Press et al. 2022, §4.1's "sliding window evaluation"), with stride
  ``S``: windows of ``n`` tokens start every ``S`` tokens; the first scores all its
  targets, each later one only its last ``S``, so every target is scored once with at least
  ``n - S`` tokens of context.

Zero-shot RoPE scaling (:func:`scaled_variants`) evaluates a trained RoPE model with a
context extension at each length: linear position interpolation (Chen et al. 2023) and YaRN
(Peng et al. 2023, §3.4) with ``factor = n / L``; dynamic NTK (emozilla 2023; Peng et al.
2023, §3.3) with Hugging Face's ``factor`` 1.0, which makes the NTK scale ``n / L`` at
length ``n`` by itself.

Dimension legend: ``b`` windows in a batch, ``n`` window length, ``w`` windows, ``V``
vocabulary.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..encodings.rope_types.registry import ROPE_TYPES
from ..errors import PosencValueError, check_bytes
from ..runs.device import model_device
from .corpus import Corpus
from .windows import check_int

LN2 = math.log(2.0)


def position_buckets(length: int, train_len: int) -> list[tuple[int, int]]:
    """``[(0, L), (L, 2L), (2L, 4L), ...]`` cut at ``length``.

    >>> position_buckets(256, 64)
    [(0, 64), (64, 128), (128, 256)]
    >>> position_buckets(100, 64)
    [(0, 64), (64, 100)]
    """
    edges, edge = [0], train_len
    while edge < length:
        edges.append(edge)
        edge *= 2
    edges.append(length)
    return list(itertools.pairwise(edges))


def bucket_name(start: int, end: int) -> str:
    return f"{start}-{end}"


def token_losses(
    model: nn.Module, windows: np.ndarray, *, batch_tokens: int, vocab_size: int
) -> np.ndarray:
    """The loss in nats of every target of ``windows`` ``(w, n + 1)`` (inputs ``[:, :-1]``,
    targets ``[:, 1:]``), as float64 ``(w, n)``; ``batch_tokens // n`` windows per forward."""
    n = windows.shape[1] - 1
    return tail_scores(model, windows, n, batch_tokens=batch_tokens, vocab_size=vocab_size)[0]


@torch.no_grad()
def tail_scores(
    model: nn.Module, windows: np.ndarray, tail: int, *, batch_tokens: int, vocab_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """The last ``tail`` targets of every row of ``windows`` ``(w, n + 1)`` (inputs
    ``[:, :-1]``, targets ``[:, 1:]``), scored in one forward of the whole row: their loss
    in nats (float64 ``(w, tail)``) and whether the greedy prediction (the argmax of the
    logits, the lowest id on a tie) is the target (bool ``(w, tail)``). ``batch_tokens // n``
    windows go in a forward, on the model's device
    (:func:`~posenc.runs.device.model_device`); the model is in eval mode meanwhile."""
    w, n = windows.shape[0], windows.shape[1] - 1
    if not 1 <= tail <= n:
        raise PosencValueError(f"tail must be in [1, {n}] for windows of {n}, got {tail}")
    rows = max(1, batch_tokens // n)
    device = model_device(model)
    losses = np.empty((w, tail), dtype=np.float64)
    hits = np.empty((w, tail), dtype=bool)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, w, rows):
            chunk = torch.from_numpy(np.asarray(windows[start : start + rows], dtype=np.int64))
            chunk = chunk.to(device)  # (b, n + 1)
            logits = model(chunk[:, :-1])[:, n - tail :]  # (b, tail, V)
            flat = logits.reshape(-1, vocab_size).float()  # (b * tail, V)
            targets = chunk[:, n + 1 - tail :].reshape(-1)  # (b * tail,)
            loss = F.cross_entropy(flat, targets, reduction="none")
            done = slice(start, start + len(chunk))
            losses[done] = loss.view(len(chunk), tail).double().cpu().numpy()
            hits[done] = (flat.argmax(-1) == targets).view(len(chunk), tail).cpu().numpy()
    finally:
        model.train(was_training)
    return losses, hits


def sliding_losses(
    model: nn.Module,
    tokens: np.ndarray,
    length: int,
    num_tokens: int,
    stride: int,
    *,
    batch_tokens: int,
    vocab_size: int,
) -> np.ndarray:
    """The loss of targets ``tokens[1 : num_tokens + 1]`` (float64 ``(num_tokens,)``), each
    scored once by windows of ``length`` starting every ``stride`` tokens: the first window
    scores all its targets, every later one its last ``stride``."""
    if length % stride or num_tokens % length:
        raise PosencValueError(
            f"stride ({stride}) must divide length ({length}), which must divide num_tokens "
            f"({num_tokens})"
        )
    every = np.lib.stride_tricks.sliding_window_view(tokens[: num_tokens + 1], length + 1)
    windows = every[::stride]  # (1 + (T - n) / S, n + 1), starts 0, S, 2S, ..., T - n
    losses = token_losses(model, windows, batch_tokens=batch_tokens, vocab_size=vocab_size)
    return np.concatenate([losses[0], losses[1:, length - stride :].reshape(-1)])


def evaluate_length(
    model: nn.Module,
    corpus: Corpus,
    length: int,
    num_tokens: int,
    *,
    train_len: int,
    batch_tokens: int = 4096,
    sliding: int = 0,
) -> dict[str, Any]:
    """``{"length", "bpb", "by_position"}`` (and ``"sliding_bpb"`` with a stride) of
    ``model`` on the first ``num_tokens`` validation targets in windows of ``length``."""
    length = check_int("length", length, 1)
    check_int("train_len", train_len, 1)
    check_int("batch_tokens", batch_tokens, 1)
    check_forward_bytes("eval length", length, model, corpus.vocab_size, batch_tokens, length)
    windows = corpus.eval_windows(length, num_tokens)  # (w, n + 1)
    losses = token_losses(model, windows, batch_tokens=batch_tokens, vocab_size=corpus.vocab_size)
    nbytes = corpus.token_bytes[np.asarray(windows[:, 1:])]  # (w, n) bytes of each target
    by_position = {
        bucket_name(a, b): _bpb(losses[:, a:b], nbytes[:, a:b])
        for a, b in position_buckets(length, train_len)
    }
    row: dict[str, Any] = {
        "length": length,
        "bpb": _bpb(losses, nbytes),
        "by_position": by_position,
    }
    if sliding:
        slid = sliding_losses(
            model,
            corpus.valid,
            length,
            num_tokens,
            sliding,
            batch_tokens=batch_tokens,
            vocab_size=corpus.vocab_size,
        )
        row["sliding_bpb"] = _bpb(
            slid, corpus.token_bytes[np.asarray(corpus.valid[1 : num_tokens + 1])]
        )
    return row


def _bpb(losses: np.ndarray, nbytes: np.ndarray) -> float:
    return float(losses.sum() / LN2 / nbytes.sum())


def check_forward_bytes(
    name: str, value: Any, model: nn.Module, vocab_size: int, batch_tokens: int, length: int
) -> None:
    """Raise before a forward of ``batch_tokens // length`` windows of ``length`` whose
    logits (float32 and their float copy) and attention scores (per head: weights, their
    softmax and a mask) would pass the memory budget (:func:`~posenc.errors.check_bytes`)."""
    rows = max(1, batch_tokens // length)
    heads = int(getattr(getattr(model, "encoder", None), "num_heads", 1))
    check_bytes(name, value, rows * length * (vocab_size * 8 + length * heads * 12))


def evaluate_model(
    model: nn.Module,
    corpus: Corpus,
    lengths: Sequence[int],
    num_tokens: int,
    *,
    train_len: int,
    batch_tokens: int = 4096,
    sliding: int = 0,
    scaling: dict[str, Any] | None = None,
    factor: float | None = None,
) -> list[dict[str, Any]]:
    """One :func:`evaluate_length` row per length, each with its ``"factor"``.

    Args:
        scaling: a zero-shot RoPE context extension applied at each length (``rope_type``
            and, for YaRN and dynamic NTK, ``original_max_position_embeddings``), see
            :func:`scaled_variants`; ``None``: the model as it is.
        factor: the factor recorded for a model evaluated as it is (a fine-tuned model's
            scaling factor); ``None`` for a model without scaling.
    """
    rows = []
    for length in lengths:
        scored, used = model_at(model, scaling, length, train_len)
        if scaling is None:
            used = factor
        row = evaluate_length(
            scored,
            corpus,
            length,
            num_tokens,
            train_len=train_len,
            batch_tokens=batch_tokens,
            sliding=sliding,
        )
        rows.append({"length": row.pop("length"), "factor": used, **row})
    return rows


def model_at(
    model: nn.Module, scaling: dict[str, Any] | None, length: int, train_len: int
) -> tuple[nn.Module, float | None]:
    """The model that scores windows of ``length``: ``model`` itself when ``scaling`` is
    ``None`` (factor ``None``), else ``model`` with the zero-shot ``scaling`` at that length
    (:func:`scaling_at`) and its factor."""
    if scaling is None:
        return model, None
    params, factor = scaling_at(scaling, length, train_len)
    return model.with_rope_scaling(params), factor  # type: ignore[operator]


def scaling_at(
    scaling: dict[str, Any], length: int, train_len: int
) -> tuple[dict[str, Any], float]:
    """The scaling dictionary a zero-shot ``scaling`` uses at ``length``, and the factor it
    stretches the context by, ``length / train_len`` (at least 1).

    >>> scaling_at({"rope_type": "linear"}, 256, 64)
    ({'rope_type': 'linear', 'factor': 4.0}, 4.0)
    >>> scaling_at({"rope_type": "dynamic", "factor": 1.0,
    ...             "original_max_position_embeddings": 64}, 256, 64)[1]
    4.0
    """
    factor = max(1.0, length / train_len)
    params = dict(scaling)
    if not ROPE_TYPES[params["rope_type"]].uses_length:  # (dynamic NTK: found from the length)
        params["factor"] = factor
    return params, factor


def scaled_variants(names: Sequence[str], train_len: int) -> list[dict[str, Any]]:
    """The zero-shot scalings ``names`` (``linear``, ``dynamic``, ``yarn``) as recorded in a
    run: without the per-length factor, except the constant 1.0 of a type whose frequencies
    follow the length (dynamic NTK), and with the training length as the original context
    where the type needs one.

    >>> scaled_variants(["linear", "dynamic"], 64)
    [{'rope_type': 'linear'}, {'rope_type': 'dynamic', 'factor': 1.0, \
'original_max_position_embeddings': 64}]
    """
    out = []
    for name in names:
        spec = ROPE_TYPES[name]
        variant: dict[str, Any] = {"rope_type": name}
        if spec.uses_length:
            variant["factor"] = 1.0
        if spec.needs_original:
            variant["original_max_position_embeddings"] = train_len
        out.append(variant)
    return out


def rope_scalable(model: nn.Module) -> bool:
    """Whether ``model`` holds a rotary embedding whose scaling can be replaced."""
    try:
        model.with_rope_scaling(None)  # type: ignore[operator]
    except (AttributeError, TypeError, ValueError):
        return False
    return True
