"""How generation picks each next token: :class:`SamplingConfig`, the record of
:meth:`posenc.TransformerModel.generate`'s sampling options, and :func:`sample_next`, the step
that reads it.

Dimension legend: ``b`` batch, ``V`` vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import PosencTypeError, PosencValueError

__all__ = ["SamplingConfig", "sample_next"]


@dataclass(frozen=True)
class SamplingConfig:
    """The sampling options of :meth:`posenc.TransformerModel.generate`, checked once, when
    made (the same keywords ``generate`` takes, with the same defaults and meanings).

    The random generator is not a field: it is state that every draw advances, passed to
    ``generate`` beside the record.

    >>> SamplingConfig(temperature=0.8, top_p=0.9)
    SamplingConfig(temperature=0.8, top_k=None, top_p=0.9, eos_token_id=None)
    """

    temperature: float = 0.0  #: 0 is greedy; otherwise logits are divided by it
    top_k: int | None = None  #: keep the ``top_k`` largest logits (``None``: all)
    top_p: float | None = None  #: then the smallest set whose probability reaches it
    eos_token_id: int | None = None  #: a row that emits it is finished

    def __post_init__(self) -> None:
        temperature, top_k, top_p = self.temperature, self.top_k, self.top_p
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise PosencTypeError(f"temperature must be a number, got {temperature!r}")
        if not math.isfinite(temperature) or temperature < 0:
            raise PosencValueError(f"temperature must be a finite number >= 0, got {temperature}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
            raise PosencTypeError(f"top_k must be an int or None, got {top_k!r}")
        if top_k is not None and top_k < 1:
            raise PosencValueError(f"top_k must be >= 1, got {top_k}")
        if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))):
            raise PosencTypeError(f"top_p must be a number or None, got {top_p!r}")
        if top_p is not None and not 0.0 < top_p <= 1.0:
            raise PosencValueError(f"top_p must be in (0, 1], got {top_p}")
        eos = self.eos_token_id
        if eos is not None and (isinstance(eos, bool) or not isinstance(eos, int)):
            raise PosencTypeError(f"eos_token_id must be an int or None, got {eos!r}")
        if eos is not None and eos < 0:
            raise PosencValueError(f"eos_token_id must be >= 0, got {eos}")

    @classmethod
    def resolve(
        cls,
        sampling: object,
        *,
        temperature: float | None,
        top_k: int | None,
        top_p: float | None,
        eos_token_id: int | None,
    ) -> SamplingConfig:
        """The record of a ``generate`` call: ``sampling`` when given (then none of the
        keywords may be), else one made from the keywords (``temperature=None``: 0)."""
        given = {
            name: value
            for name, value in (
                ("temperature", temperature),
                ("top_k", top_k),
                ("top_p", top_p),
                ("eos_token_id", eos_token_id),
            )
            if value is not None
        }
        if sampling is None:
            return cls(**given)
        if not isinstance(sampling, SamplingConfig):
            raise PosencTypeError(
                f"sampling must be a posenc.SamplingConfig or None, got {type(sampling).__name__}"
            )
        if given:
            names = ", ".join(f"{name}={value!r}" for name, value in given.items())
            raise PosencValueError(
                f"give the sampling options either as sampling= or as keywords, not both: "
                f"got sampling={sampling!r} and {names}"
            )
        return sampling


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """The next token of each row from its logits ``(b, V)`` -> ``(b,)`` int64.

    ``temperature == 0`` is greedy (the first largest logit). Otherwise the logits are divided
    by the temperature, cut to the ``top_k`` largest and then to the smallest set whose
    probability reaches ``top_p`` (nucleus sampling; the most likely token always stays), and
    one token is drawn with ``generator``. Computed in float32 at least.
    """
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    work = logits.to(torch.promote_types(logits.dtype, torch.float32))
    # shift first: the largest logit becomes 0, so a tiny temperature gives -inf, never NaN
    work = (work - work.amax(dim=-1, keepdim=True)) / temperature
    # the cut logits are filled with a Python -inf: a tensor made from a host number would
    # be a copy to the device, which on CUDA waits for the stream at every token
    if top_k is not None and top_k < work.shape[-1]:
        kth = work.topk(top_k, dim=-1).values[:, -1:]  # (b, 1)
        work = work.masked_fill(work < kth, -math.inf)
    if top_p is not None and top_p < 1.0:
        ordered, order = work.sort(dim=-1, descending=True)
        probs = ordered.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # the mass of the more likely tokens
        cut = ordered.masked_fill(before >= top_p, -math.inf)
        work = torch.empty_like(work).scatter_(-1, order, cut)
    probs = work.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
