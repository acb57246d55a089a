"""Generation with a KV cache: :meth:`posenc.TransformerModel.generate`, and the sampling step.

The prompt goes through the model once, filling a :class:`~posenc.KVCache`; each new token
then goes through alone, reading every cached key. A left-padded batch keeps its padding in
the cache and positions each row's real tokens from 0 (:func:`~posenc.positions_from_padding`),
so every row generates what it would generate alone.

With a :class:`~posenc.StreamingCache` (``cache=``) the prompt goes through in one call as far
as ``sink_tokens + window`` real tokens of every row, then one token per call (a call must
not evict part-way, see :mod:`posenc.sequence.streaming`); the cache places each row's tokens
itself, counting from its first real token.

Dimension legend: ``b`` batch, ``n`` prompt length, ``V`` vocabulary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor

from ..errors import PosencTypeError, PosencValueError, check_bytes
from ..sequence.cache import KVCache
from ..sequence.masks import check_key_padding_mask
from ..sequence.positions import positions_from_padding
from ..sequence.streaming import StreamingCache
from .sampling import SamplingConfig, sample_next

__all__ = ["check_tokens", "generate"]


#: Set within :func:`ids_checked`: the caller checked the token ids' range on the host.
_IDS_CHECKED: ContextVar[bool] = ContextVar("posenc_ids_checked", default=False)


@contextlib.contextmanager
def ids_checked() -> Iterator[None]:
    """Within it :func:`check_tokens` leaves out the range of the ids, which the caller has
    checked on the host before copying them to the device (a training loop whose windows
    come from a corpus of the model's vocabulary): on a GPU reading that range makes the
    host wait for the device at every forward."""
    token = _IDS_CHECKED.set(True)
    try:
        yield
    finally:
        _IDS_CHECKED.reset(token)


def check_tokens(tokens: object, vocab_size: int, name: str = "tokens") -> None:
    """``tokens`` checked to be ``(batch, seq)`` int64/int32 ids in ``[0, vocab_size)`` (the
    range not within :func:`ids_checked`)."""
    if not isinstance(tokens, Tensor) or tokens.dtype not in (torch.long, torch.int32):
        got = tokens.dtype if isinstance(tokens, Tensor) else type(tokens).__name__
        raise PosencTypeError(f"{name} must be an int64 or int32 tensor of token ids, got {got}")
    if tokens.dim() != 2:
        raise PosencValueError(f"{name} must have shape (batch, seq), got {tuple(tokens.shape)}")
    if not torch.compiler.is_compiling() and tokens.numel() and not _IDS_CHECKED.get():
        low, high = torch.stack(torch.aminmax(tokens)).tolist()  # one transfer
        if low < 0 or high >= vocab_size:
            raise PosencValueError(
                f"token ids must be in [0, {vocab_size}), got range [{low}, {high}]"
            )


def _check_generate(
    model: Any,
    prompt: object,
    max_new_tokens: object,
    sampling: SamplingConfig,
    generator: object,
    key_padding_mask: object,
    cache: object = None,
) -> None:
    """Every argument of :func:`generate`, checked before any work (``sampling`` checked
    itself when made)."""
    if cache is not None:
        if not isinstance(cache, (KVCache, StreamingCache)):
            raise PosencTypeError(
                "cache must be a posenc.KVCache, a posenc.StreamingCache or None, got "
                f"{type(cache).__name__}"
            )
        if len(cache):
            raise PosencValueError(
                f"generate needs an empty cache (it fills it with the prompt); this "
                f"{type(cache).__name__} holds {len(cache)} tokens (call cache.reset())"
            )
    check_tokens(prompt, model.vocab_size, "prompt")
    assert isinstance(prompt, Tensor)
    if prompt.shape[1] == 0 or prompt.shape[0] == 0:
        raise PosencValueError(
            f"prompt must have shape (batch, seq) with at least one token, got "
            f"{tuple(prompt.shape)}"
        )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise PosencTypeError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
    if max_new_tokens < 0:
        raise PosencValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    outputs = model.head.out_features
    eos_token_id = sampling.eos_token_id
    if eos_token_id is not None and eos_token_id >= model.vocab_size:
        raise PosencValueError(
            f"eos_token_id must be in [0, {model.vocab_size}), got {eos_token_id}"
        )
    if generator is not None and not isinstance(generator, torch.Generator):
        raise PosencTypeError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}"
        )
    if outputs != model.vocab_size:
        raise PosencValueError(
            f"generate needs logits over the vocabulary: this model has {outputs} outputs "
            f"for a vocabulary of {model.vocab_size}"
        )
    if not model.encoder.causal:
        raise PosencValueError(
            "generate needs a causal model (causal=True): a bidirectional model's earlier "
            "tokens would read the later ones, which decoding cannot give them"
        )
    mask = check_key_padding_mask(key_padding_mask, *prompt.shape, read_values=True)
    if mask is not None and bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        rows = (mask[:, 1:] & ~mask[:, :-1]).any(dim=1).nonzero().flatten().tolist()
        raise PosencValueError(
            f"generate needs left padding (the new tokens follow each row's last real token): "
            f"row(s) {rows[:8]} of key_padding_mask have padding after a real token"
        )


def generate(
    model: Any,
    prompt: Tensor,
    max_new_tokens: int,
    *,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | None = None,
    generator: torch.Generator | None = None,
    key_padding_mask: Tensor | None = None,
    cache: KVCache | StreamingCache | None = None,
    sampling: SamplingConfig | None = None,
) -> Tensor:
    """``prompt`` ``(b, n)`` followed by up to ``max_new_tokens`` tokens of ``model`` (a
    causal :class:`~posenc.TransformerModel`): ``(b, n + steps)``. The sampling options come
    as keywords or as one :class:`~posenc.SamplingConfig` (``sampling=``), not both. See
    :meth:`posenc.TransformerModel.generate`."""
    sampling = SamplingConfig.resolve(
        sampling, temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos_token_id
    )
    _check_generate(model, prompt, max_new_tokens, sampling, generator, key_padding_mask, cache)
    b, n = prompt.shape
    encoder = model.encoder
    itemsize = next(model.parameters()).element_size()
    held = n + max_new_tokens
    if isinstance(cache, StreamingCache):
        held = min(max(n, cache.capacity), held)  # its widest call, or S + W
    check_bytes(
        "prompt + max_new_tokens",
        f"{b} x {held} tokens cached in {encoder.depth} layers",
        # keys and values of every layer, with the doubling's headroom
        4 * b * held * encoder.depth * encoder.dim * itemsize,
        device=prompt.device,
    )
    longest = n - 1 + max_new_tokens - 1  # the last position fed (the last token is not)
    for pe in encoder.distinct_pes():
        limit = getattr(pe, "max_len", None)  # a learned table's rows
        if isinstance(limit, int) and max_new_tokens and longest >= limit:
            raise PosencValueError(
                f"max_new_tokens={max_new_tokens} after a prompt of {n} tokens reaches position "
                f"{longest}, past the learned table (max_len={limit})"
            )
    if max_new_tokens == 0:
        return prompt.clone()
    # inference mode: no autograd bookkeeping at all (a step is mostly fixed costs); the
    # tokens leave it through one concatenation, as ordinary tensors
    with torch.inference_mode():
        new = _new_tokens(
            model,
            prompt,
            max_new_tokens,
            sampling,
            generator,
            key_padding_mask,
            KVCache() if cache is None else cache,
        )
    return torch.cat([prompt, torch.stack(new, dim=1)], dim=1)


def _new_tokens(
    model: Any,
    prompt: Tensor,
    max_new_tokens: int,
    sampling: SamplingConfig,
    generator: torch.Generator | None,
    key_padding_mask: Tensor | None,
    cache: KVCache | StreamingCache,
) -> list[Tensor]:
    """The new tokens of :func:`generate`, one ``(b,)`` tensor per step."""
    b = prompt.shape[0]
    if isinstance(cache, StreamingCache):
        logits = _stream_prompt(model, prompt, key_padding_mask, cache)
    else:
        positions = None if key_padding_mask is None else positions_from_padding(key_padding_mask)
        logits = model(
            prompt,
            cache=cache,
            positions=positions,
            key_padding_mask=key_padding_mask,
            logits_to_keep=1,  # the prompt's other logits are never read
        )
    finished = torch.zeros(b, dtype=torch.bool, device=prompt.device)
    new: list[Tensor] = []
    eos_token_id = sampling.eos_token_id
    for step in range(max_new_tokens):
        token = sample_next(
            logits[:, -1],
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            generator=generator,
        )
        if eos_token_id is not None:
            token = torch.where(finished, torch.full_like(token, eos_token_id), token)
            finished = finished | (token == eos_token_id)
        new.append(token.to(prompt.dtype))
        if step + 1 == max_new_tokens or (eos_token_id is not None and bool(finished.all())):
            break
        logits = model(new[-1][:, None], cache=cache)
    return new


def _stream_prompt(
    model: Any, prompt: Tensor, key_padding_mask: Tensor | None, cache: StreamingCache
) -> Tensor:
    """The prompt through a :class:`~posenc.StreamingCache`: its first columns in one call, as
    far as ``sink_tokens + window`` real tokens of every row, then one column per call (a
    call must not evict part-way); the logits of the last column ``(b, 1, V)``."""
    n = prompt.shape[1]
    fewest = 0 if key_padding_mask is None else int(key_padding_mask.sum(dim=1).min())
    first = min(n, cache.capacity + fewest)  # no row has more real tokens than S + W here

    def part(start: int, end: int) -> Tensor:
        mask = None if key_padding_mask is None else key_padding_mask[:, start:end]
        return model(prompt[:, start:end], cache=cache, key_padding_mask=mask, logits_to_keep=1)

    logits = part(0, first)
    for column in range(first, n):
        logits = part(column, column + 1)
    return logits
