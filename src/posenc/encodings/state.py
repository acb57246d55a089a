"""What the attention layers of one forward need from a rotary or bias encoding, computed once.

An :class:`~posenc.Encoder` of depth ``L`` used to ask its encoding for the same cos/sin, or
the same bias, ``L`` times, and to validate the same positions ``L`` times (a host sync
each). Instead it calls the encoding's ``position_state(positions, ...)`` once per forward
and hands the result to every layer, as Hugging Face's Llama hands its ``(cos, sin)`` to each
decoder layer. A layer only *applies* the state:

* :class:`RotaryState`: ``state(q, k) -> (q, k)``, the rotation with its cos/sin ready;
* :class:`BiasState`: ``state.bias(q, k)`` / ``state.score_mod(q, k)``, computed at the
  first layer's call and reused by the others, unless the scheme reads ``q`` or ``k``
  (Transformer-XL, Shaw with values, CoPE) or the layer's input ``x`` (FoX, Inkling), which
  is then asked again in each layer.

Nothing here validates: the encoding did that when it made the state.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

#: ``rotate(q, k, inplace) -> (q, k)`` for ``(b, h, n, d)`` queries and keys.
Rotate = Callable[[Tensor, Tensor, bool], tuple[Tensor, Tensor]]


class PositionState:
    """The per-forward state of one encoding: made once, applied by every layer."""


class RotaryState(PositionState):
    """Rotates each layer's queries and keys with angles computed once.

    A scheme's state is a subclass holding what it computed (its tables) and implementing
    :meth:`rotate`; ``RotaryState(function)`` wraps a plain ``(q, k, inplace) -> (q, k)``
    function instead.

    Args:
        function: the rotation, for a state that is not a subclass; ``inplace`` is a request
            that a scheme may ignore (then it returns new tensors).
    """

    def __init__(self, function: Rotate | None = None) -> None:
        self.function = function

    def rotate(self, q: Tensor, k: Tensor, inplace: bool) -> tuple[Tensor, Tensor]:
        """Rotate ``q`` and ``k`` (see :meth:`__call__`)."""
        if self.function is None:
            raise NotImplementedError(f"{type(self).__name__} must implement rotate")
        return self.function(q, k, inplace)

    def __call__(self, q: Tensor, k: Tensor, *, inplace: bool = False) -> tuple[Tensor, Tensor]:
        """Shapes: q ``(b, hq, n, d)``, k ``(b, hk, n, d)``; returns both rotated (with
        ``inplace=True``, where the scheme can, ``q`` and ``k`` themselves)."""
        return self.rotate(q, k, inplace)


class ModuleRotation(RotaryState):
    """A rotary encoding's own forward at positions fixed for every layer (for schemes that
    compute nothing ahead)."""

    def __init__(self, pe: Any, positions: Tensor | None) -> None:  # pe: a RotaryEncoding
        super().__init__()
        self.pe, self.positions = pe, positions

    def rotate(self, q: Tensor, k: Tensor, inplace: bool) -> tuple[Tensor, Tensor]:
        return self.pe(q, k, self.positions)


class BiasState(PositionState):
    """A bias encoding with its positions resolved; the bias (or ``score_mod``) is made at
    the first layer's request and reused by the rest, unless the scheme reads ``q``/``k``.

    Args:
        pe: the bias encoding.
        positions: resolved positions of the queries, ``(n,)`` or ``(b, n)``.
        key_positions: those of the keys, ``(nk,)`` or ``(b, nk)`` (default: ``positions``;
            a cached forward's keys are the cached tokens followed by the new ones).
        distance_bound: a host number that no ``|q_pos - k_pos|`` of one batch row exceeds,
            known without reading the device (default positions count tokens: ``n - 1``
            in a plain forward, the tokens seen minus one in a cached or packed one), or
            ``None``. A scheme that sizes a table by distance
            (``reads_distance_bound``) receives it in :meth:`score_mod`, one whose
            materialised bias does (``bias_reads_distance_bound``: Transformer-XL) in
            :meth:`bias`, and then reads nothing from the positions.
    """

    def __init__(
        self,
        pe: Any,
        positions: Tensor,
        key_positions: Tensor | None = None,
        *,
        distance_bound: int | None = None,
    ) -> None:  # pe: a BiasEncoding
        self.pe, self.positions = pe, positions
        self.key_positions = positions if key_positions is None else key_positions
        self.distance_bound = distance_bound
        self._kept: list[tuple[tuple[Any, ...], Any]] = []  # see keep()
        #: The layer input a data-dependent bias reads, and the layer (set by :meth:`reading`).
        self.x: Tensor | None = None
        self.layer: nn.Module | None = None

    @property
    def needs_qk(self) -> bool:
        return self.pe.needs_qk

    @property
    def per_layer(self) -> bool:
        """Whether the bias is made anew in every layer (it reads ``q``, ``k``, ``x`` or the
        layer)."""
        pe = self.pe
        return pe.needs_qk or getattr(pe, "needs_x", False) or getattr(pe, "needs_layer", False)

    def reading(self, x: Tensor, layer: nn.Module, *, streaming: bool = False) -> BiasState:
        """This state for one attention ``layer`` whose input is ``x`` ``(b, n, D)``, the new
        tokens: a copy that hands ``x`` and the layer to a scheme that reads them (``needs_x``,
        ``needs_layer``). ``streaming``: the forward joins a :class:`~posenc.StreamingCache`
        (a scheme whose bias reads what such a cache evicts refuses here)."""
        state = copy.copy(self)
        state.x, state.layer, state._kept = x, layer, []
        return state

    @property
    def has_value_term(self) -> bool:
        return self.pe.has_value_term

    def bias(self, q: Tensor, k: Tensor) -> Tensor:
        """The logit bias ``(h, n, nk)`` or ``(b, h, n, nk)`` for this layer's ``q``, ``k``."""
        return self._ask("bias", self.pe.bias, q, k)

    def score_mod(self, q: Tensor, k: Tensor) -> Callable[..., Tensor] | None:
        """The scheme's flex_attention ``score_mod``, or ``None`` when it has none."""
        return self._ask("score_mod", self.pe.score_mod, q, k)

    def _ask(self, name: str, hook: Callable[..., Any], q: Tensor, k: Tensor) -> Any:
        """The encoding's ``hook`` (its method ``name``) at these positions: asked again for
        every layer when it reads ``q``/``k``, else once and kept."""
        q_pos, k_pos = self.positions, self.last_keys(k.shape[-2])
        reads: dict[str, Any] = {"q": q, "k": k} if self.pe.needs_qk else {}
        if getattr(self.pe, "needs_x", False):
            reads["x"] = self.x
        if getattr(self.pe, "needs_layer", False):
            reads["layer"] = self.layer
        if name == "score_mod" and getattr(self.pe, "reads_distance_bound", False):
            reads["distance_bound"] = self.distance_bound
        if name == "bias" and getattr(self.pe, "bias_reads_distance_bound", False):
            reads["distance_bound"] = self.distance_bound
        return self.keep((name, k.shape[-2]), lambda: hook(q_pos, k_pos, **reads))

    def last_keys(self, nk: int) -> Tensor:
        """The positions of the last ``nk`` keys (a windowed layer of a cached forward holds
        only the last keys; every other layer holds them all)."""
        if nk == self.key_positions.shape[-1]:
            return self.key_positions
        return self.key_positions[..., -nk:] if nk else self.key_positions[..., :0]

    def keep(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """``make()`` (the bias, its ``score_mod``, or a tensor derived from the bias such as
        the bias with a layer's mask), made once per forward: kept under ``key`` when the
        scheme reads no ``q``/``k``/``x``, made anew in every layer otherwise. ``key`` lists
        what it depends on (a hook's name, a mask, a flag, a dtype, a key count); its items
        are compared by identity, ints by value."""
        if self.per_layer:
            return make()
        for stored, value in self._kept:
            if len(stored) == len(key) and all(map(_same, stored, key)):
                return value
        value = make()
        self._kept.append((key, value))
        return value

    def value_term(self, weights: Tensor) -> Tensor:
        """Shaw et al.'s value-side term: weights ``(b, h, n, nk)`` -> ``(b, h, n, d)``."""
        return self.pe.value_term(weights, self.positions, self.last_keys(weights.shape[-1]))


def _same(a: Any, b: Any) -> bool:
    """One item of a memo key: the same object, or equal ints (key counts)."""
    return a is b or (type(a) is int and type(b) is int and a == b)
