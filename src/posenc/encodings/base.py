"""The family protocol and the registry.

Every positional scheme acts on attention in one of three places (see DESIGN.md):

==========  ==================================================  =====================
family      hook                                                acts on
==========  ==================================================  =====================
additive    ``forward(x, positions) -> x + pe(positions)``      token embeddings
rotary      ``forward(q, k, positions) -> (q, k)``              queries and keys
bias        ``bias(q_positions, k_positions, q=, k=) -> bias``  attention logits
none        nothing                                             nothing
==========  ==================================================  =====================

Attention and the model only ever call these hooks; a new scheme is a new subclass
registered under a name, and nothing else changes.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence (``nq``/``nk`` query/key),
``d`` model or head dim.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from ..errors import PosencTypeError, PosencValueError
from .state import BiasState, PositionState, RotaryState

Family = Literal["additive", "rotary", "bias", "none"]
FAMILIES: tuple[Family, ...] = ("additive", "rotary", "bias", "none")


# --------------------------------------------------------------------------- validation


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` if it is a positive ``int``; raise naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise PosencTypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < 1:
        raise PosencValueError(f"{name} must be >= 1, got {value}")
    return value


def check_positive_float(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a finite number > 0; raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PosencTypeError(f"{name} must be a number, got {type(value).__name__} ({value!r})")
    value = float(value)
    if not value > 0 or value == float("inf"):
        raise PosencValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def check_probability(name: str, value: object) -> float:
    """Return ``value`` if it is a number in [0, 1); raise naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PosencTypeError(f"{name} must be a number, got {type(value).__name__} ({value!r})")
    if not 0.0 <= float(value) < 1.0:
        raise PosencValueError(f"{name} must be in [0, 1), got {value}")
    return float(value)


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a ``bool``; raise naming ``name`` otherwise (``bool("no")`` is
    True, so strings and numbers are refused rather than converted)."""
    if not isinstance(value, bool):
        raise PosencTypeError(f"{name} must be a bool, got {type(value).__name__} ({value!r})")
    return value


def check_float_dtype(name: str, value: object) -> torch.dtype:
    """Return ``value`` if it is a floating-point ``torch.dtype``; raise naming ``name``."""
    if not isinstance(value, torch.dtype):
        raise PosencTypeError(
            f"{name} must be a torch.dtype, got {type(value).__name__} ({value!r})"
        )
    if not value.is_floating_point:
        raise PosencTypeError(f"{name} must be a floating-point dtype, got {value}")
    return value


def check_finite(name: str, values: Tensor) -> Tensor:
    """Raise naming ``name`` if a floating ``values`` holds NaN or ±inf (skipped where values
    cannot be read: meta tensors, inside ``torch.compile``/export)."""
    readable = _eager() and values.device.type != "meta"
    if readable and values.is_floating_point() and not bool(torch.isfinite(values).all()):
        bad = values[~torch.isfinite(values)].flatten()[0].item()
        raise PosencValueError(f"{name} must be finite, got {bad}")
    return values


def _eager() -> bool:
    """True outside ``torch.compile`` / export tracing, where data-dependent checks are free."""
    return not torch.compiler.is_compiling()


def resolve_positions(
    positions: Tensor | None,
    seq_len: int,
    *,
    batch: int | None = None,
    device: torch.device | None = None,
    integer: bool = False,
    name: str = "positions",
) -> Tensor:
    """Validate ``positions`` for a sequence of ``seq_len`` tokens, or make ``arange(seq_len)``.

    Accepted shapes are ``(n,)`` and ``(b, n)`` (with ``b`` equal to ``batch`` when given).
    Positions must be non-negative; with ``integer=True`` they must also be whole numbers.
    """
    if positions is None:
        return torch.arange(seq_len, device=device)
    if not isinstance(positions, Tensor):
        raise PosencTypeError(f"{name} must be a torch.Tensor, got {type(positions).__name__}")
    if positions.dtype == torch.bool or positions.is_complex():
        raise PosencTypeError(
            f"{name} must be an integer or float tensor, got dtype {positions.dtype}"
        )
    if positions.dim() not in (1, 2) or positions.shape[-1] != seq_len:
        raise PosencValueError(
            f"{name} must have shape (seq,) or (batch, seq) with seq={seq_len}, "
            f"got {tuple(positions.shape)}"
        )
    if positions.dim() == 2 and batch is not None and positions.shape[0] not in (1, batch):
        raise PosencValueError(
            f"{name} has batch size {positions.shape[0]} but the input has batch size {batch}"
        )
    check_finite(name, positions)
    checkable = _eager() and positions.device.type != "meta"
    needs_whole_check = integer and checkable and positions.is_floating_point()
    if needs_whole_check and not torch.equal(positions, positions.round()):
        raise PosencValueError(f"{name} must hold whole numbers for this encoding")
    if checkable and positions.numel():
        smallest = positions.min()
        if smallest < 0:
            raise PosencValueError(f"{name} must be >= 0, got a minimum of {smallest.item()}")
    return positions


def check_input(x: object, dim: int, *, name: str = "x", rank: int = 3) -> Tensor:
    """Check that ``x`` is a floating tensor of rank ``rank`` whose last dimension is ``dim``."""
    if not isinstance(x, Tensor):
        raise PosencTypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise PosencTypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() != rank:
        raise PosencValueError(f"{name} must have {rank} dimensions, got shape {tuple(x.shape)}")
    if x.shape[-1] != dim:
        raise PosencValueError(f"{name} has last dimension {x.shape[-1]}, expected dim={dim}")
    return x


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype arithmetic is done in: fp32 for half types, the input's own otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


#: Work-dtype elements per block of the half-precision kernels (:func:`row_blocks`):
#: 2**20 float32 values are 4 MiB, which stays in the last-level cache while a block is
#: worked on, and is large enough that per-operation overhead stays small.
BLOCK_ELEMENTS = 1 << 20


def block_rows(n: int, d: int) -> int:
    """Rows of ``d`` elements per block: as many as fit in :data:`BLOCK_ELEMENTS`, at least
    one, at most ``n``."""
    return max(1, min(n, BLOCK_ELEMENTS // max(d, 1)))


def row_blocks(shape: torch.Size, rows: int) -> list[tuple[tuple[int, ...], slice]]:
    """Cover a ``(..., n, d)`` tensor with blocks of ``rows`` whole rows (the last one shorter):
    ``(index, span)`` pairs, where ``t[index][span]`` is an ``(m, d)`` block, ``m <= rows``.

    >>> [(index, span.start, span.stop) for index, span in row_blocks(torch.Size([2, 5, 4]), 3)]
    [((0,), 0, 3), ((0,), 3, 5), ((1,), 0, 3), ((1,), 3, 5)]
    """
    n = shape[-2]
    indices: list[tuple[int, ...]] = [()]
    for size in shape[:-2]:
        indices = [(*prefix, i) for prefix in indices for i in range(size)]
    return [
        (index, slice(start, min(start + rows, n)))
        for index in indices
        for start in range(0, n, rows)
    ]


def add_encoding(x: Tensor, pe: Tensor, dropout: nn.Module) -> Tensor:
    """``dropout(x + pe)`` computed in ``pe``'s dtype (the work dtype) and cast to ``x``'s once.

    For a half-precision ``x`` outside autograd and without active dropout, each cache-sized
    block of rows is converted into one reused float32 buffer, the encoding added there and
    the sum rounded into the output: bit-identical to ``(x.float() + pe).to(x.dtype)``, with
    memory seeing ``x`` read once and the output written once instead of two full-size
    float32 temporaries. (A mixed-dtype ``torch.add(x, pe, out=...)`` would be one pass too,
    but ATen runs it through a scalar casting loop, several times slower.)
    """
    dropping = dropout.training and getattr(dropout, "p", 0.0) > 0
    if x.dtype == pe.dtype or dropping or torch.is_grad_enabled() or x.dim() < 2:
        return dropout(x.to(pe.dtype) + pe).to(x.dtype)
    shape = torch.broadcast_shapes(x.shape, pe.shape)
    x, pe = x.expand(shape), pe.expand(shape)  # views
    out = torch.empty(shape, dtype=x.dtype, device=x.device)
    rows = block_rows(shape[-2], shape[-1])
    buf = torch.empty(rows, shape[-1], dtype=pe.dtype, device=x.device)  # (rows, d)
    for index, span in row_blocks(shape, rows):
        block = buf[: span.stop - span.start]
        block.copy_(x[index][span])  # converts to float32
        block.add_(pe[index][span])
        out[index][span].copy_(block)  # rounds once
    return out


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

    def position_state(
        self,
        positions: Tensor | None,
        *,
        seq_len: int,
        batch: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> PositionState | None:
        """What every attention layer of one forward needs, computed once (see
        :mod:`posenc.encodings.state`): ``None`` for families that act outside attention.
        ``dtype`` is the work dtype (float32 for half-precision models)."""
        return None

    def registry_name(self) -> str | None:
        """The name this class is registered under, if any."""
        return next((e.name for e in _REGISTRY.values() if e.cls is type(self)), None)

    def _repr_html_(self) -> str:
        """Jupyter: the family, the paper and the logit contribution against distance."""
        import html

        from ..plots.diagnostics import distance
        from ..report import figure_to_data_uri

        name = self.registry_name() or type(self).__name__
        try:
            figure = f"<img src='{figure_to_data_uri(distance(self, name, 48))}' width='480'>"
        except (ValueError, TypeError, RuntimeError) as exc:  # e.g. meta device
            figure = f"<p>(no picture: {html.escape(str(exc))})</p>"
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
    dropout: nn.Module
    #: Whether ``encode`` needs whole-number positions (a lookup table does).
    integer_positions: ClassVar[bool] = False

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> AdditiveEncoding:
        return cls(dim, **kwargs)

    def encode(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        """Return the encoding of ``positions`` (shape ``(n,)`` or ``(b, n)``) as ``(..., d)``."""
        raise NotImplementedError

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Add the encoding.

        Shapes:
            x: ``(b, n, d)``; positions: ``(n,)`` or ``(b, n)``; returns ``(b, n, d)``.
        """
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

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> RotaryEncoding:
        return cls(dim // num_heads, **kwargs)

    def position_state(
        self,
        positions: Tensor | None,
        *,
        seq_len: int,
        batch: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> PositionState | None:
        """A rotation for every layer. This default calls :meth:`forward` in each layer;
        schemes with a table (:class:`~posenc.RotaryEmbedding`) compute cos/sin here once."""
        return RotaryState(lambda q, k: self(q, k, positions))

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

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> BiasEncoding:
        return cls(num_heads, **kwargs)

    def position_state(
        self,
        positions: Tensor | None,
        *,
        seq_len: int,
        batch: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> PositionState | None:
        """The positions, validated once; the bias is made at the first layer's request."""
        return BiasState(self, resolve_positions(positions, seq_len, batch=batch, device=device))

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
        when the scheme cannot express itself that way (attention then materialises ``bias``).
        ``q``/``k`` arrive as for :meth:`bias`; schemes that do not need them ignore them."""
        return None

    #: True when attention must also add :meth:`value_term` to its output (Shaw et al. 2018's
    #: value-side term); attention then computes the weights explicitly. May be set per instance.
    has_value_term: bool = False

    def value_term(self, weights: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """``sum_j weights[..., i, j] * a_ij`` for a per-pair value vector ``a_ij``, added to the
        attention output: weights ``(b, h, nq, nk)`` -> ``(b, h, nq, d)``."""
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

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        return x


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Entry:
    """One registered scheme."""

    name: str
    cls: type[PositionalEncoding]
    summary: str

    @property
    def family(self) -> Family:
        return self.cls.family

    @property
    def paper(self) -> str:
        return self.cls.paper


_REGISTRY: dict[str, Entry] = {}


def register(name: str, summary: str) -> Callable[[type[PositionalEncoding]], Any]:
    """Class decorator: make ``cls`` available as ``build(name, ...)``."""

    def wrap(cls: type[PositionalEncoding]) -> type[PositionalEncoding]:
        if name in _REGISTRY and _REGISTRY[name].cls is not cls:
            raise PosencValueError(f"encoding name {name!r} is already registered")
        _REGISTRY[name] = Entry(name, cls, summary)
        return cls

    return wrap


def available() -> list[str]:
    """Names of every registered encoding, sorted."""
    return sorted(_REGISTRY)


def entry(name: str) -> Entry:
    """The registry entry for ``name``; an unknown name lists the known ones."""
    if not isinstance(name, str):
        raise PosencTypeError(f"encoding name must be a str, got {type(name).__name__}")
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PosencValueError(
            f"unknown positional encoding {name!r}; known: {', '.join(available())}"
        ) from None


def build(name: str, **kwargs: Any) -> PositionalEncoding:
    """Construct the encoding registered as ``name`` with its own constructor's arguments.

    >>> build("sinusoidal", dim=8)(torch.zeros(1, 3, 8)).shape
    torch.Size([1, 3, 8])
    """
    cls = entry(name).cls
    _check_arguments(name, cls, kwargs, partial=False)
    return cls(**kwargs)


def _check_arguments(name: str, cls: type, kwargs: dict[str, Any], *, partial: bool) -> None:
    """Raise naming the encoding when its constructor cannot take ``kwargs`` (an unknown
    keyword; with ``partial=False`` also a missing argument), before anything is built."""
    signature = inspect.signature(cls)
    try:
        signature.bind_partial(**kwargs) if partial else signature.bind(**kwargs)
    except TypeError as exc:
        raise PosencTypeError(f"encoding {name!r}: {exc}") from None


def build_for_model(name: str, dim: int, num_heads: int, **kwargs: Any) -> PositionalEncoding:
    """Construct ``name`` sized for a model: additive gets ``dim``, rotary ``dim // num_heads``,
    bias ``num_heads``. Rotary and bias encodings need ``num_heads`` to divide ``dim``."""
    cls = entry(name).cls
    check_positive_int("dim", dim)
    check_positive_int("num_heads", num_heads)
    if cls.family in ("rotary", "bias") and dim % num_heads:
        raise PosencValueError(
            f"num_heads ({num_heads}) must divide dim ({dim}) for {cls.family} encoding {name!r}"
        )
    _check_arguments(name, cls, kwargs, partial=True)
    return cls.for_model(dim, num_heads, **kwargs)


register("none", "no positional information (NoPE)")(NoPE)
