"""The language model around the encoder: token embedding, an :class:`~posenc.Encoder` and a
linear head, with generation (:mod:`posenc.model.generation`).

Dimension legend: ``b`` batch, ``n`` sequence, ``D`` model width, ``V`` vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.names import padding_from_attention_mask, positions_or_ids
from ..encodings.base import PositionalEncoding
from ..encodings.checks import check_positive_int
from ..errors import PosencTypeError, PosencValueError, check_bytes
from ..sequence.cache import KVCache
from ..sequence.streaming import StreamingCache
from .encoder import Encoder, sharing_copy
from .generation import check_tokens, generate
from .sampling import SamplingConfig

__all__ = ["TransformerModel"]


class TransformerModel(nn.Module):
    """Token embedding (scaled by ``sqrt(dim)`` as in the paper, §3.4), a positional scheme,
    an :class:`Encoder` and a linear head: ``(b, n)`` token ids -> ``(b, n, num_outputs)``.

    >>> model = TransformerModel(100, 32, 2, 4, pe="sinusoidal")
    >>> model(torch.randint(0, 100, (2, 7))).shape
    torch.Size([2, 7, 100])
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        depth: int,
        num_heads: int,
        *,
        num_outputs: int | None = None,
        pe: str | PositionalEncoding | None = "sinusoidal",
        padding_idx: int | None = None,
        **encoder_kwargs: Any,
    ) -> None:
        super().__init__()
        check_positive_int("vocab_size", vocab_size)
        check_positive_int("dim", dim)
        if num_outputs is not None:
            check_positive_int("num_outputs", num_outputs)
        if padding_idx is not None:
            if isinstance(padding_idx, bool) or not isinstance(padding_idx, int):
                raise PosencTypeError(f"padding_idx must be an int or None, got {padding_idx!r}")
            if not -vocab_size <= padding_idx < vocab_size:
                raise PosencValueError(
                    f"padding_idx must be in [-{vocab_size}, {vocab_size}), got {padding_idx}"
                )
        outputs = num_outputs or vocab_size
        check_bytes(
            "vocab_size x dim",
            f"{vocab_size} x {dim}" + (f" (and {outputs} outputs)" if num_outputs else ""),
            (vocab_size + outputs) * dim * torch.get_default_dtype().itemsize,
        )
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=padding_idx)
        # N(0, 1/dim) so that the sqrt(dim) scale gives unit-variance inputs (fairseq's
        # Transformer does the same); torch's N(0, 1) default would make them 8x too large
        # at dim 64 and drown every sublayer's update in the residual stream.
        nn.init.normal_(self.embed.weight, std=dim**-0.5)
        if padding_idx is not None:
            nn.init.zeros_(self.embed.weight[padding_idx])
        self.encoder = Encoder(dim, depth, num_heads, pe=pe, **encoder_kwargs)
        self.head = nn.Linear(dim, num_outputs or vocab_size)
        self.scale = math.sqrt(dim)

    def forward(
        self,
        tokens: Tensor,
        *,
        positions: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        cache: KVCache | StreamingCache | None = None,
        document_ids: Tensor | None = None,
        logits_to_keep: int = 0,
        position_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Shapes: tokens ``(b, n)`` integer -> logits ``(b, n, num_outputs)``. ``cache``,
        ``document_ids``, ``position_ids`` and ``attention_mask`` (1 = attend) as for
        :meth:`Encoder.forward`: with a cache, ``tokens`` are the new ones and the logits are
        theirs. ``logits_to_keep=k > 0`` returns the logits of the last ``k`` tokens only,
        ``(b, k, num_outputs)`` (generation needs the last)."""
        if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int):
            raise PosencTypeError(f"logits_to_keep must be an int, got {logits_to_keep!r}")
        if logits_to_keep < 0:
            raise PosencValueError(f"logits_to_keep must be >= 0, got {logits_to_keep}")
        check_tokens(tokens, self.vocab_size)
        positions = positions_or_ids(positions, position_ids)
        key_padding_mask = padding_from_attention_mask(
            attention_mask, key_padding_mask, *tokens.shape
        )
        x = self.embed(tokens) * self.scale  # (b, n, D)
        x = self.encoder(
            x,
            positions=positions,
            key_padding_mask=key_padding_mask,
            cache=cache,
            document_ids=document_ids,
        )
        return self.head(x if logits_to_keep == 0 else x[:, -logits_to_keep:])

    def generate(
        self,
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
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """``prompt`` ``(b, n)`` followed by up to ``max_new_tokens`` new tokens:
        ``(b, n + steps)``. Needs a causal model; runs without autograd, in the model's
        current mode (call ``eval()`` first, as for any inference).

        The prompt fills a :class:`~posenc.KVCache` in one call; each new token then costs
        one call over that token alone. ``temperature == 0`` (the default) is greedy, equal to
        taking the argmax of a full forward over the sequence so far at every step; otherwise
        tokens are sampled from ``softmax(logits / temperature)`` cut to the ``top_k`` most
        likely and to the ``top_p`` nucleus, drawn with ``generator`` (seed it to reproduce).
        Once a row emits ``eos_token_id`` its later places hold ``eos_token_id``;
        generation stops when every row has, or after ``max_new_tokens``. The four
        sampling options may come as one :class:`~posenc.SamplingConfig` instead
        (``sampling=``; giving both is an error).
        ``key_padding_mask`` ``(b, n)`` (True = padding) marks a left-padded prompt: each row
        then generates what it would alone; ``attention_mask`` (1 = attend, the tokenizer's)
        marks it instead.

        ``cache``: an empty cache to fill (default: a new :class:`~posenc.KVCache`). A
        :class:`~posenc.StreamingCache` keeps only each row's first ``sink_tokens`` and last
        ``window`` tokens, at positions inside the cache (StreamingLLM): memory stays flat
        however long the generation; a prompt longer than ``sink_tokens + window`` goes
        through that many tokens at once, then one token per call.

        >>> model = TransformerModel(20, 16, 1, 2, pe="alibi", causal=True).eval()
        >>> model.generate(torch.tensor([[1, 2, 3]]), 4).shape
        torch.Size([1, 7])
        """
        if attention_mask is not None:
            check_tokens(prompt, self.vocab_size, "prompt")
            rows = prompt.shape
            key_padding_mask = padding_from_attention_mask(attention_mask, key_padding_mask, *rows)
        return generate(
            self,
            prompt,
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            eos_token_id=eos_token_id,
            generator=generator,
            key_padding_mask=key_padding_mask,
            cache=cache,
            sampling=sampling,
        )

    @classmethod
    def from_hf_config(
        cls, config: Any, *, device: Any = None, **overrides: Any
    ) -> TransformerModel:
        """A model with the vocabulary and schedule of the model ``config`` describes, random
        weights (see :meth:`Encoder.from_hf_config`, whose arguments it takes)."""
        from ..hf.schedule import build_from_hf_config  # the one call up to posenc.hf

        return build_from_hf_config(cls, config, device=device, overrides=overrides, vocab=True)

    @property
    def trained_length(self) -> int | None:
        """The sequence length the model was trained at, if known
        (:attr:`Encoder.trained_length`)."""
        return self.encoder.trained_length

    @trained_length.setter
    def trained_length(self, value: int | None) -> None:
        self.encoder.trained_length = value

    def with_rope_scaling(
        self, scaling: Mapping[str, Any] | None, *, layer_types: Iterable[str] | None = None
    ) -> TransformerModel:
        """This model with its rotary embeddings' scaling replaced, sharing every weight with
        it (see :meth:`Encoder.with_rope_scaling`, whose ``layer_types`` it passes on).

        >>> model = TransformerModel(50, 16, 1, 2, pe="rope", causal=True)
        >>> model.trained_length = 64
        >>> stretched = model.with_rope_scaling({"rope_type": "linear", "factor": 4.0})
        >>> stretched.embed is model.embed, stretched.encoder.pe is model.encoder.pe
        (True, False)
        """
        new = sharing_copy(self)
        new.encoder = self.encoder.with_rope_scaling(scaling, layer_types=layer_types)
        return new
