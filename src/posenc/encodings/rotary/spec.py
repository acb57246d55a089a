"""What a :class:`~posenc.RotaryEmbedding` is, as one frozen record: :class:`RotarySpec`.

The settings of a RoPE module arrive in several shapes: constructor arguments, a Hugging
Face ``rope_scaling`` / ``rope_parameters`` dictionary (which may carry ``rope_theta``,
``partial_rotary_factor`` or the legacy ``"type"`` key), a transformers config
(:mod:`~posenc.hf.config`), or a trained model's context
(``Encoder.with_rope_scaling``). They are
normalised here, once, by :meth:`RotarySpec.build`; the module, ``from_hf_config`` and
``with_scaling`` all go through it, and the module keeps the record it returns.

Dimension legend: ``d`` head dim, ``r`` rotary dim.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from ...errors import PosencTypeError, PosencValueError
from ..checks import check_bool, check_positive_float, check_positive_int
from ..rope_types.builtin import ORIGINAL
from ..rope_types.registry import ROPE_TYPES, RopeType, validate_rope_scaling
from .common import check_base, check_rotary_dim

__all__ = ["RotarySpec"]


class ReadOnlyMapping(Mapping[str, Any]):
    """A read-only copy of a dictionary that, unlike ``MappingProxyType``, pickles and
    deep-copies (a module holding it can be saved and copied); equal to an equal ``dict``."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return repr(self._data)


@dataclass(frozen=True)
class RotarySpec:
    """The settings of one RoPE module, checked and normalised.

    Attributes:
        head_dim: channels per head ``d``.
        rotary_dim: channels rotated, ``r <= d``, even.
        base: the wavelength base θ (``rope_theta``).
        interleaved: pairs ``(x[2i], x[2i+1])`` instead of ``(x[i], x[i + r/2])``.
        clockwise: each pair turns by ``-angle``.
        record: the :class:`~posenc.RopeType` of the context extension.
        scaling: its validated parameters, ``rope_type`` included (read-only).
        max_position_embeddings: the model's context length, or ``None``.
    """

    head_dim: int
    rotary_dim: int
    base: float
    interleaved: bool
    clockwise: bool
    record: RopeType
    scaling: Mapping[str, Any]
    max_position_embeddings: int | None = None

    @property
    def rope_type(self) -> str:
        """The name of the context extension (``"default"`` for plain RoPE)."""
        return self.scaling["rope_type"]

    @classmethod
    def build(
        cls,
        head_dim: int,
        *,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        clockwise: bool = False,
        scaling: Mapping[str, Any] | None = None,
        max_position_embeddings: int | None = None,
    ) -> RotarySpec:
        """Check the arguments of :class:`~posenc.RotaryEmbedding` and normalise ``scaling``:
        a ``rope_theta`` or ``partial_rotary_factor`` in it sets ``base`` / ``rotary_dim``
        (and must agree with them where both are given), the rest is
        :func:`~posenc.validate_rope_scaling`'s (the legacy ``"type"`` key, the original
        context filled from ``max_position_embeddings``). Raises naming the argument."""
        check_positive_int("head_dim", head_dim)
        if max_position_embeddings is not None:
            check_positive_int("max_position_embeddings", max_position_embeddings)
        if scaling is not None and not isinstance(scaling, Mapping):
            raise PosencTypeError(f"scaling must be a dict or None, got {type(scaling).__name__}")
        params = dict(scaling or {})
        base = check_base(base)
        theta = params.pop("rope_theta", None)
        if theta is not None:
            theta = check_base(theta)
            if base not in (10000.0, theta):
                raise PosencValueError(f"base={base} conflicts with scaling['rope_theta']={theta}")
            base = theta
        kind = ROPE_TYPES.get(str(params.get("rope_type", params.get("type", "default"))))
        # proportional RoPE reads the factor itself and rotates the whole head
        spans_head = kind is not None and kind.spans_head
        factor = None if spans_head else params.pop("partial_rotary_factor", None)
        if factor is not None:
            factor = check_positive_float("scaling['partial_rotary_factor']", factor)
            implied = int(head_dim * factor)
            if rotary_dim not in (None, implied):
                raise PosencValueError(
                    f"rotary_dim={rotary_dim} conflicts with partial_rotary_factor={factor} "
                    f"(head_dim * factor = {implied})"
                )
            rotary_dim = implied
        rotary_dim = check_rotary_dim(head_dim, rotary_dim)
        clockwise = check_bool("clockwise", clockwise)
        params = validate_rope_scaling(
            params or None, rotary_dim=rotary_dim, max_position_embeddings=max_position_embeddings
        )
        return cls(
            head_dim=head_dim,
            rotary_dim=rotary_dim,
            base=base,
            interleaved=bool(interleaved),
            clockwise=clockwise,
            record=ROPE_TYPES[params["rope_type"]],
            scaling=ReadOnlyMapping(params),
            max_position_embeddings=max_position_embeddings,
        )

    def with_scaling(
        self, scaling: Mapping[str, Any] | None, *, original: int | None = None
    ) -> RotarySpec:
        """This spec with ``scaling`` in place of its own (``None``: plain RoPE). ``original``:
        the context a model was trained at, the ``original_max_position_embeddings`` of a
        type that needs one and lacks it (``Encoder.with_rope_scaling``'s trained length)."""
        params = dict(scaling) if scaling else None
        if params and original is not None:
            name = params.get("rope_type", params.get("type"))  # ("type": the legacy key)
            # (an unknown name is left to validate_rope_scaling, which names it)
            record = ROPE_TYPES.get(name) if isinstance(name, str) else None
            if record is not None and record.needs_original:
                params.setdefault(ORIGINAL, original)
        return RotarySpec.build(
            self.head_dim,
            base=self.base,
            rotary_dim=self.rotary_dim,
            interleaved=self.interleaved,
            clockwise=self.clockwise,
            scaling=params,
            max_position_embeddings=self.max_position_embeddings,
        )

    def summary(self) -> str:
        """The settings as a module's ``extra_repr`` shows them."""
        text = f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base:g}"
        if self.interleaved:
            text += ", interleaved=True"
        if self.clockwise:
            text += ", clockwise=True"
        if self.rope_type != "default":
            text += f", scaling={dict(self.scaling)}"
        return text

    def arguments(self) -> dict[str, Any]:
        """The :class:`~posenc.RotaryEmbedding` arguments that build this spec again."""
        return {
            "head_dim": self.head_dim,
            "base": self.base,
            "rotary_dim": self.rotary_dim,
            "interleaved": self.interleaved,
            "clockwise": self.clockwise,
            "scaling": self.scaling,
            "max_position_embeddings": self.max_position_embeddings,
        }

    def frequencies(self, seq_len: float | None) -> tuple[Tensor, float]:
        """``(inv_freq float64 (r/2,), attention_factor)`` at the length ``seq_len`` (``None``:
        the initial state; only types with ``uses_length`` read it)."""
        return self.record.init(
            self.rotary_dim,
            self.base,
            self.scaling,
            max_position_embeddings=self.max_position_embeddings,
            seq_len=seq_len,
        )

    def next_length(self, current: float | None, seq_len: float) -> float | None:
        """The length the frequencies of a ``uses_length`` type follow after a call of length
        ``seq_len`` (largest position + 1), from ``current`` (``None``: the initial state), as
        Hugging Face's ``dynamic_rope_update``: LongRoPE only tells which side of the original
        context the call lies on; dynamic NTK grows to the longest length seen past it and
        returns to the initial state when a call fits in it again."""
        original = self.scaling[ORIGINAL]
        if self.record.switches_at_original:
            return float(original + 1) if seq_len > original else None
        new = current
        now = original if current is None else current
        if seq_len > now:  # grow
            new = seq_len
        if seq_len < original and now > original:  # back within the window: reset
            new = None
        return new
