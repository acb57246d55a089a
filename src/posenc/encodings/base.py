"""The family protocol: the base class of every encoding and one class per family.

Every positional scheme acts on attention in one of three places (``docs/architecture.md``),
or, for a conditional one, on the hidden states between two blocks:

===========  ==================================================  ==========================
family       hook                                                acts on
===========  ==================================================  ==========================
additive     ``forward(x, positions) -> x + pe(positions)``      token embeddings
rotary       ``forward(q, k, positions) -> (q, k)``              queries and keys
bias         ``bias(q_positions, k_positions, q=, k=) -> bias``  attention logits
conditional  ``generate(x, prepare(x, positions))``              hidden states after a block
none         nothing                                             nothing
===========  ==================================================  ==========================

Attention and the model only ever call these hooks; a new scheme is a new subclass
registered under a name (:mod:`.registry`), and nothing else changes.

The validation helpers (:mod:`.checks`), the registry (:mod:`.registry`) and the
half-precision row tiles (:mod:`.tiles`) live in their own modules, and their names are
imported from there (or from :mod:`posenc`); this module re-exports none of them.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence (``nq``/``nk`` query/key),
``d`` model or head dim.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from ..errors import PosencValueError
from .checks import (
    PositionBound,
    check_input,
    compute_dtype,
    resolve_positions,
    take_position_ids,
)
from .registry import (
    _REGISTRY,
    register,
)
from .state import BiasState, ModuleRotation, PositionState, RotaryState
from .tiles import add_encoding

Family = Literal["additive", "rotary", "bias", "conditional", "none"]
FAMILIES: tuple[Family, ...] = ("additive", "rotary", "bias", "conditional", "none")


# --------------------------------------------------------------------------- display

#: Draws an encoding for a notebook: ``draw(pe, name) -> HTML`` (an ``<img>``). Encodings
#: import nothing that draws; :mod:`posenc.notebook`, which ``import posenc`` loads, installs
#: the picture with :func:`set_html_figure`.
_html_figure: Callable[[PositionalEncoding, str], str] | None = None


def set_html_figure(draw: Callable[[PositionalEncoding, str], str] | None) -> None:
    """Install the picture that :meth:`PositionalEncoding._repr_html_` shows (``None``: none)."""
    global _html_figure
    _html_figure = draw


# --------------------------------------------------------------------------- families


class PositionalEncoding(nn.Module):
    """Base of every encoding. Subclasses set ``family`` and implement that family's hook."""

    family: ClassVar[Family]
    #: Short citation shown by ``posenc list``.
    paper: ClassVar[str] = ""
    #: Coordinates per position: 1 for sequences; 2 or 3 for grids (positions then carry a
    #: trailing axis of that size, e.g. ``(n, 2)`` for image patches).
    axes: ClassVar[int] = 1
    #: Constructor arguments a causal (decoder-only) model uses unless given: T5's decoder
    #: buckets, for instance, see only one direction.
    causal_defaults: ClassVar[dict[str, Any]] = {}

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> PositionalEncoding:
        """Build this encoding for a model of width ``dim`` with ``num_heads`` heads."""
        raise NotImplementedError

    def position_state(self, positions: Tensor | None, x: Tensor) -> PositionState | None:
        """What every attention layer of one forward over ``x`` ``(b, n, D)`` needs, computed
        once (see :mod:`posenc.encodings.state`); ``None`` for families that act outside
        attention. Arithmetic is in ``x``'s work dtype (float32 for half-precision inputs)."""
        return None

    def context_state(
        self,
        positions: Tensor,
        key_positions: Tensor,
        x: Tensor,
        memo: dict[str, Any],
        *,
        bound: PositionBound | None = None,
    ) -> PositionState | None:
        """:meth:`position_state` for a cached or packed forward (:mod:`posenc.sequence.context`):
        ``positions`` ``(b, n)`` are the new tokens' (queries and new keys), validated by the
        context, ``key_positions`` ``(b, nk)`` every key's, the cached ones first. ``memo`` is
        kept for this encoding across the calls of one :class:`~posenc.KVCache` (xPos keeps
        its centre there). ``bound``: what the host knows of the largest position without
        reading the device (:class:`~posenc.RotaryEmbedding` sizes its tables from it).

        The default serves every encoding that acts on the new tokens alone (rotary schemes
        rotate new queries and keys at their positions; cached keys were rotated when
        cached); :class:`BiasEncoding` pairs the queries with every key."""
        return self.position_state(positions, x)

    def registry_name(self) -> str | None:
        """The name this class is registered under, if any."""
        return next((e.name for e in _REGISTRY.values() if e.cls is type(self)), None)

    def _repr_html_(self) -> str:
        """Jupyter: the family, the paper and the logit contribution against distance (the
        picture that :func:`set_html_figure` installed, if any)."""
        name = self.registry_name() or type(self).__name__
        figure = "" if _html_figure is None else _html_figure(self, name)
        return (
            f"<div><b>{html.escape(name)}</b> ({self.family}) — {html.escape(self.paper)}"
            f"<br><code>{html.escape(repr(self))}</code>{figure}</div>"
        )


class AdditiveEncoding(PositionalEncoding):
    """Adds a vector per position to the token embeddings: ``x + pe(positions)``.

    Subclasses implement :meth:`encode`. ``forward`` handles checks and dtypes: half-precision
    inputs are summed in fp32 and cast once.
    """

    family: ClassVar[Family] = "additive"
    dim: int
    dropout: nn.Module | None
    #: Whether ``encode`` needs whole-number positions (a lookup table does).
    integer_positions: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        # No dropout unless the subclass sets one (``self.dropout = nn.Dropout(p)``).
        self.dropout: nn.Module | None = None

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> AdditiveEncoding:
        return cls(dim, **kwargs)

    def encode(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        """Return the encoding of ``positions`` (shape ``(n,)`` or ``(b, n)``) as ``(..., d)``."""
        raise NotImplementedError

    def forward(
        self, x: Tensor, positions: Tensor | None = None, *, position_ids: Tensor | None = None
    ) -> Tensor:
        """Add the encoding.

        Shapes:
            x: ``(b, n, d)``; positions: ``(n,)`` or ``(b, n)``; returns ``(b, n, d)``.
        """
        positions = take_position_ids(positions, position_ids)
        check_input(x, self.dim)
        positions = resolve_positions(
            positions, x.shape[1], batch=x.shape[0], device=x.device, integer=self.integer_positions
        )
        work = compute_dtype(x.dtype)
        pe = self.encode(positions, work)  # (n, d) or (b, n, d)
        return add_encoding(x, pe, self.dropout)


class RotaryEncoding(PositionalEncoding):
    """Rotates queries and keys by position: ``q, k = rotate(q, k, positions)``."""

    family: ClassVar[Family] = "rotary"
    #: How many times wider the rotated q and k come out than they went in (PoPE: 2, its
    #: magnitudes and phases as a real dot product of twice the width); rotations keep it 1.
    width_factor: ClassVar[int] = 1

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> RotaryEncoding:
        return cls(dim // num_heads, **kwargs)

    def position_state(self, positions: Tensor | None, x: Tensor) -> PositionState | None:
        """A rotation for every layer. This default calls :meth:`forward` in each layer;
        schemes with a table (:class:`~posenc.RotaryEmbedding`) compute cos/sin here once."""
        return ModuleRotation(self, positions)

    def read_state(
        self,
        key_positions: Tensor | None,
        x: Tensor,
        memo: dict[str, Any],
        *,
        queries: int,
        keys: int,
        bound: PositionBound | None = None,
    ) -> RotaryState:
        """The rotation of a forward whose cache holds keys **before** rotation (a
        :class:`~posenc.StreamingCache`): every key read, cached or new, at ``key_positions``
        ``(b, keys)`` (``None``: ``arange(keys)``), and the ``queries`` new queries at the
        positions of the last ``queries`` keys (their own). ``memo`` and ``bound`` as for
        :meth:`context_state`. A scheme that cannot rotate keys apart from queries refuses
        here, by name (this default)."""
        name = self.registry_name() or type(self).__name__
        raise PosencValueError(
            f"{name} cannot rotate cached keys when they are read, which a StreamingCache "
            "needs (its keys take positions inside the cache); use a posenc.KVCache"
        )

    def forward(
        self, q: Tensor, k: Tensor, positions: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


#: ``score_mod(score, b, h, q_idx, kv_idx) -> score`` as flex_attention takes it.
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


class BiasEncoding(PositionalEncoding):
    """Adds ``bias(q_positions, k_positions)`` to the attention logits, per head.

    ``bias`` returns ``(h, nq, nk)`` for 1-D positions and ``(b, h, nq, nk)`` for batched
    positions or when it reads ``q``/``k`` (which arrive as ``(b, h, n, d)``). Schemes that do
    not need ``q``/``k`` ignore them.
    """

    family: ClassVar[Family] = "bias"
    num_heads: int
    #: True when ``bias`` reads the queries or keys (Transformer-XL, Shaw, CoPE).
    needs_qk: ClassVar[bool] = False
    #: True when ``bias`` and ``score_mod`` read the attention layer's input ``x`` ``(b, n, D)``
    #: of the new tokens, as ``x=`` (data-dependent biases: FoX, Inkling); attention hands it
    #: over through :meth:`~posenc.encodings.state.BiasState.reading`.
    needs_x: ClassVar[bool] = False
    #: True when ``bias`` and ``score_mod`` read the attention layer itself, as ``layer=``
    #: (DeBERTa's ``share_att_key``: the layer's query and key projections); may be set per
    #: instance.
    needs_layer: bool = False

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> BiasEncoding:
        return cls(num_heads, **kwargs)

    def position_state(self, positions: Tensor | None, x: Tensor) -> PositionState | None:
        """The positions, validated once (their values where the host reads them:
        :func:`~posenc.encodings.checks.reads_values`); the bias is made at the first layer's
        request. Default positions, ``arange(n)``, bound every distance by ``n - 1`` without
        a read."""
        b, n = x.shape[0], x.shape[1]
        bound = n - 1 if positions is None and self.axes == 1 else None
        resolved = resolve_positions(positions, n, batch=b, device=x.device)
        return BiasState(self, resolved, distance_bound=bound)

    def context_state(
        self,
        positions: Tensor,
        key_positions: Tensor,
        x: Tensor,
        memo: dict[str, Any],
        *,
        bound: PositionBound | None = None,
    ) -> PositionState | None:
        """The bias of the new queries at ``positions`` against every key at
        ``key_positions`` (cached keys first)."""
        return BiasState(self, positions, key_positions)

    def bias(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> Tensor:
        raise NotImplementedError

    def score_mod(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> ScoreMod | None:
        """A flex_attention ``score_mod`` adding the bias without materialising it, or ``None``
        when the scheme cannot express itself that way (exactly where :meth:`fused_at` is
        false). ``q``/``k`` arrive as for :meth:`bias`; schemes that do not need them ignore
        them."""
        return None

    #: Whether the scheme has a fused form: a :meth:`score_mod` that adds the bias inside
    #: flex_attention's kernel. Attention chooses its backend from this declaration (and
    #: :meth:`fused_at`), before any bias or score_mod is made; a scheme that implements
    #: :meth:`score_mod` sets it to True.
    has_score_mod: ClassVar[bool] = False

    def fused_at(self, q_positions: Tensor, k_positions: Tensor) -> bool:
        """Whether :meth:`score_mod` returns a fused form at these positions: by default
        :attr:`has_score_mod` with at least one query and one key. A scheme whose fused form
        needs more (a table by distance needs whole-number positions) narrows it; positions
        it refuses altogether count as fused (its :meth:`score_mod` raises as :meth:`bias`
        does)."""
        return self.has_score_mod and q_positions.numel() > 0 and k_positions.numel() > 0

    #: True when attention must also add :meth:`value_term` to its output (Shaw et al. 2018's
    #: value-side term); attention then computes the weights explicitly. May be set per instance.
    has_value_term: bool = False

    def value_term(self, weights: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """``sum_j weights[..., i, j] * a_ij`` for a per-pair value vector ``a_ij``, added to the
        attention output: weights ``(b, h, nq, nk)`` -> ``(b, h, nq, d)``."""
        raise NotImplementedError


class ConditionalEncoding(PositionalEncoding):
    """Acts on the hidden states inside the stack, conditioned on them (CPVT's position
    encoding generator): the :class:`~posenc.Encoder` checks the forward's arguments with
    :meth:`prepare` before any work, then after block :attr:`after_block` replaces the hidden
    states ``x`` by :meth:`generate` of them. Attention never sees it.
    """

    family: ClassVar[Family] = "conditional"
    dim: int
    #: The Encoder applies the encoding after this many blocks (0: to the input).
    after_block: int

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> ConditionalEncoding:
        return cls(dim, **kwargs)

    def prepare(
        self, x: Tensor, positions: Tensor | None, *, key_padding_mask: Tensor | None = None
    ) -> Any:
        """Check a forward over ``x`` ``(b, n, D)`` at ``positions`` (with the stack's
        ``key_padding_mask``), raising naming the argument; return what :meth:`generate`
        needs."""
        raise NotImplementedError

    def generate(self, x: Tensor, prepared: Any) -> Tensor:
        """The hidden states ``x`` ``(b, n, D)`` with the encoding applied."""
        raise NotImplementedError


class NoPE(PositionalEncoding):
    """No positional encoding at all (Kazemnejad et al. 2023, "The Impact of Positional
    Encoding on Length Generalization in Transformers"). Causal attention can still infer
    position; bidirectional attention is then blind to order."""

    family: ClassVar[Family] = "none"
    paper: ClassVar[str] = "Kazemnejad et al. 2023, arXiv:2305.19466"

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> NoPE:
        return cls(**kwargs)

    def forward(
        self, x: Tensor, positions: Tensor | None = None, *, position_ids: Tensor | None = None
    ) -> Tensor:
        positions = take_position_ids(positions, position_ids)
        return x


register("none", "no positional information (NoPE)")(NoPE)

__all__ = [
    "FAMILIES",
    "AdditiveEncoding",
    "BiasEncoding",
    "ConditionalEncoding",
    "Family",
    "NoPE",
    "PositionalEncoding",
    "RotaryEncoding",
    "ScoreMod",
    "set_html_figure",
]
