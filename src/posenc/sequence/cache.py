"""The key/value cache for incremental decoding: what every attention layer has already seen.

One :class:`KVCache`, made without arguments, serves a whole model. The first cached call
(``model(prompt, cache=cache)``) fills it; each later one (``model(next_tokens,
cache=cache)``) appends its tokens and lets them attend to everything cached. It holds:

* per token (shared by every layer): its position, its padding flag, its document id and the
  number of the document run it belongs to (see :mod:`posenc.sequence.context`);
* per attention layer (an entry made on the layer's first use): the keys and values, keys
  **after** rotation, as transformers caches them. A rotated key never changes again, so a
  rotary scheme whose frequencies depend on the sequence length (dynamic NTK, LongRoPE) keeps
  each key at the frequencies in force when it was computed: decoding past the original
  context then differs from one full forward over the same tokens (which rotates every key at
  the final frequencies), exactly as it does in transformers;
* per encoding, a small memo (xPos keeps the centre of its scale there, so every later query
  and key shares the first call's).

Storage grows by doubling, so ``N`` single-token steps copy ``O(N)`` elements in all, not
``O(N²)``; under autograd the tensors are concatenated instead (in-place writes would break
the backward of earlier steps). A step in a cache without padding or documents writes only
its positions; the other token records are filled in when read. A model with windowed or
chunked layers scans the token records after each call to find the keys they can drop
(``O(N)`` per call, 8 bytes a token). The host keeps a bound on each row's next position
(:meth:`KVCache.position_bound`), which sizes the rotary tables of the next call without
reading the device (no synchronisation on CUDA).

**Reading and writing.** :class:`KVCache` is what users read (length, positions, masks,
documents, each layer's keys and values, ``reset``). A forward writes through a
:class:`CacheWrite` (:meth:`KVCache.write`), held by its
:class:`~posenc.sequence.context.SequenceContext`: every write is staged past what the cache
counts, and only :meth:`CacheWrite.commit` makes it the cache's. A forward that fails
half-way (rolled back, or never committed) leaves the cache as it was before it.

Dimension legend: ``b`` batch, ``h`` key/value heads, ``N`` cached tokens, ``n`` new tokens,
``d`` head dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..encodings.checks import PositionBound, reads_values
from ..errors import PosencValueError
from .growing import Growing

__all__ = ["CacheWrite", "KVCache"]


class LayerKV:
    """One attention layer's cached keys and values, ``(b, h, N, d)`` each."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module  # kept so that a reused id() is never mistaken for this layer
        self.keys = Growing(2, follow_dtype=True)
        self.values = Growing(2, follow_dtype=True)
        #: The layer's sliding window and chunk: what it may drop after each call.
        self.window: int | None = getattr(module, "window", None)
        self.chunk: int | None = getattr(module, "chunk", None)

    @property
    def length(self) -> int:
        """Tokens held (committed)."""
        return self.keys.length

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return self.keys.append(k), self.values.append(v)

    def drop_before(self, index: int) -> None:
        for part in (self.keys, self.values):
            part.drop_before(index)

    def commit(self, length: int) -> None:
        for part in (self.keys, self.values):
            part.commit(length)

    def rollback(self) -> None:
        for part in (self.keys, self.values):
            part.rollback()


def claim_layer(
    cache: Any, module: nn.Module, staged: dict[int, Any], make: Callable[[nn.Module], Any]
) -> Any:
    """The entry ``cache`` keeps for attention layer ``module`` (``make(module)``, joining the
    cache on commit, where it has none and holds no tokens yet), checked for this forward: a
    layer runs once per cached call (``staged``: the layers this forward has run), a cache
    serves the model that filled it, and no layer skipped an earlier call (its entry's
    ``length`` is the cache's)."""
    name, kind = type(module).__name__, type(cache).__name__
    if id(module) in staged:
        raise PosencValueError(
            f"{name} ran twice in one cached call: one {kind} entry serves one attention "
            "layer per call (give each use its own module)"
        )
    entry = cache._layers.get(id(module))
    if entry is None or entry.module is not module:
        if len(cache):
            raise PosencValueError(
                f"{name} has no entry in this {kind}, which already holds {len(cache)} tokens "
                "of other layers: a cache serves the model that filled it"
            )
        entry = make(module)
    if entry.length != len(cache):
        raise PosencValueError(
            f"{name} skipped an earlier cached call: its entry holds {entry.length} tokens, "
            f"the cache {len(cache)}"
        )
    return entry


def encoding_memo(
    kept: dict[int, tuple[nn.Module, dict[str, Any]]],
    memos: dict[int, tuple[nn.Module, dict[str, Any]]],
    pe: nn.Module,
) -> dict[str, Any]:
    """Encoding ``pe``'s memo for one forward, kept in ``memos``: a copy of the one the cache
    keeps in ``kept`` (which it replaces on commit), or a new one."""
    held = memos.get(id(pe))
    if held is None or held[0] is not pe:
        old = kept.get(id(pe))
        held = memos[id(pe)] = (pe, dict(old[1]) if old is not None and old[0] is pe else {})
    return held[1]


class CacheWrite:
    """The write side of one forward into a :class:`KVCache`, held by the forward's
    :class:`~posenc.sequence.context.SequenceContext`: the new tokens' records and every
    layer's new keys and values are staged past what the cache counts, the encodings' memos
    are copies, and nothing a reader sees changes until :meth:`commit`. :meth:`rollback` (or
    a forward that never commits) leaves the cache as it was.

    Made by :meth:`KVCache.write` for ``batch`` rows (checked against the cache's)."""

    def __init__(self, cache: KVCache, batch: int) -> None:
        if cache.batch_size is not None and batch != cache.batch_size:
            raise PosencValueError(
                f"this KVCache holds {cache.batch_size} row(s), got a batch of {batch}; "
                "use one cache per batch (or cache.reset())"
            )
        self.cache = cache
        #: The new tokens' records ``(positions, padding, documents, runs, padded)``.
        self._tokens: tuple[Any, ...] | None = None
        self._layers: dict[int, LayerKV] = {}  # appended in this forward, in order
        self._memos: dict[int, tuple[nn.Module, dict[str, Any]]] = {}
        #: Whether the keys hold more than one document (the cache then masks documents).
        self.documents = False
        #: Whether this forward's positions were given (not counted by default).
        self.given = False
        self.closed = False

    def __len__(self) -> int:
        """Tokens the cache counts before this forward."""
        return len(self.cache)

    def stage(
        self,
        positions: Tensor,
        padding: Tensor | None = None,
        documents: Tensor | None = None,
        runs: Tensor | None = None,
        *,
        padded: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Stage the new tokens' records ``(b, n)``; return every key's positions, padding
        flags and runs ``(b, N + n)`` (``padded``: the call passed a padding mask).

        Without ``padding``, ``documents`` and ``runs`` (a decoding step: real tokens that
        continue each row's last document) only the positions are written; the rest is
        filled in when read, so a step writes one record, not four."""
        cache = self.cache
        self._tokens = (positions, padding, documents, runs, padded)
        key_positions = cache._positions.append(positions)
        if padding is None or documents is None or runs is None:
            return key_positions, None, None
        cache._catch_up()
        cache._documents.append(documents)
        return key_positions, cache._padding.append(padding), cache._runs.append(runs)

    def append_kv(self, module: nn.Module, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Stage one layer's new keys and values ``(b, h, n, d)``; return all ``(b, h, N + n,
        d)``: the cached ones first."""
        entry = claim_layer(self.cache, module, self._layers, LayerKV)
        self._layers[id(module)] = entry
        return entry.append(k, v)

    def memo(self, pe: nn.Module) -> dict[str, Any]:
        """Encoding ``pe``'s memo for this forward: a copy of the cache's, which replaces it
        on commit."""
        return encoding_memo(self.cache._memos, self._memos, pe)

    def commit(self, *, bound: PositionBound | None = None, keeps: bool = False) -> None:
        """End the forward: the cache counts the staged tokens and keys (``bound`` and
        ``keeps`` as for :meth:`KVCache._commit`)."""
        if self.closed:
            return
        self.closed = True
        cache = self.cache
        cache._memos.update(self._memos)
        for key, entry in self._layers.items():
            cache._layers.setdefault(key, entry)
        if self.documents:
            cache.has_documents = True
        if self.given:
            cache.counted = False
        if self._tokens is not None:
            cache._commit(
                *self._tokens, layers=list(self._layers.values()), bound=bound, keeps=keeps
            )

    def rollback(self) -> None:
        """Drop everything staged: the cache stays as it was before the forward."""
        if self.closed:
            return
        self.closed = True
        for entry in self._layers.values():
            entry.rollback()
        cache = self.cache
        for part in (cache._positions, cache._padding, cache._documents, cache._runs):
            part.rollback()


class KVCache:
    """Keys, values and token records of every attention layer of one model, for decoding
    one call at a time.

    >>> import posenc
    >>> model = posenc.TransformerModel(50, 16, 2, 2, pe="rope", causal=True).eval()
    >>> cache = posenc.KVCache()
    >>> model(torch.tensor([[1, 2, 3]]), cache=cache).shape  # the prompt
    torch.Size([1, 3, 50])
    >>> model(torch.tensor([[4]]), cache=cache).shape  # one more token, at position 3
    torch.Size([1, 1, 50])
    >>> len(cache), cache.positions.tolist()
    (4, [[0, 1, 2, 3]])

    A call's ``key_padding_mask`` covers the tokens it passes; the cache keeps the earlier
    ones. Positions continue where the cache stands (each row's largest cached position of
    its current document, plus one) unless given. The batch size is fixed by the first call.
    """

    def __init__(self) -> None:
        self._layers: dict[int, LayerKV] = {}
        self._memos: dict[int, tuple[nn.Module, dict[str, Any]]] = {}
        self._positions, self._padding = Growing(1), Growing(1)
        self._documents, self._runs = Growing(1), Growing(1)
        self.batch_size: int | None = None
        #: Each row's next position ``(b, 1)`` (its last document's largest real position + 1).
        self.next_position: Tensor | None = None
        #: A host number that no row's next position exceeds, and whether one row's equals
        #: it (``None``: unknown, after a call whose positions were not read, e.g. float
        #: ones): the next call's rotary tables are sized from it without reading the device
        #: (see :meth:`position_bound`).
        self._bound: PositionBound | None = PositionBound(0, True)
        self._last_id: Tensor | None = None
        self._last_run: Tensor | None = None
        #: Whether any call passed a ``key_padding_mask`` (the mask is built only then).
        self.has_padding = False
        #: Whether any call passed ``document_ids`` (the document mask is built only then).
        self.has_documents = False
        #: Whether every position held was counted by default (from 0 where a document
        #: opens, on from its last where it goes on), none given: then none exceeds the
        #: tokens before it, so ``len(cache) - 1`` bounds every distance between them.
        self.counted = True
        self._length = 0

    def __len__(self) -> int:
        """Tokens cached per row (padding included)."""
        return self._length

    def __repr__(self) -> str:
        layers = len(self._layers)
        return f"KVCache(batch_size={self.batch_size}, length={self._length}, layers={layers})"

    @property
    def positions(self) -> Tensor | None:
        """The cached tokens' positions, ``(b, N)``, or ``None`` when empty."""
        return self._positions.view()

    @property
    def key_padding_mask(self) -> Tensor | None:
        """The cached tokens' padding flags (True = padding), ``(b, N)``, or ``None``."""
        self._catch_up()
        return self._padding.view()

    @property
    def document_ids(self) -> Tensor | None:
        """The cached tokens' document ids, ``(b, N)``, or ``None`` when empty."""
        self._catch_up()
        return self._documents.view()

    @property
    def document_runs(self) -> Tensor | None:
        """The cached tokens' document run numbers (0, 1, ... per row), ``(b, N)``."""
        self._catch_up()
        return self._runs.view()

    @property
    def last_document(self) -> tuple[Tensor | None, Tensor | None]:
        """Each row's last document id and run number ``(b, 1)`` (``None`` when empty)."""
        return self._last_id, self._last_run

    def position_bound(self) -> PositionBound | None:
        """A number the host knows that no row's next position exceeds (0 when empty), and
        whether some row's equals it: the largest position of a call continuing the cache
        with ``n`` default positions is at most ``largest + n - 1`` (exactly that where
        ``exact``). Kept up by :meth:`commit` from the bounds of each call's positions, so it
        costs no read; where one was unknown (float positions, or positions a GPU holds
        given explicitly), it is read here once where the values are read
        (:func:`~posenc.encodings.checks.reads_values`), else ``None`` (a captured graph, a
        GPU's positions: the rotary tables are then sized ahead)."""
        following = self.next_position
        if self._bound is None and following is not None:
            if not reads_values(following):
                return None
            top = float(following.max())
            self._bound = PositionBound(math.ceil(top), math.ceil(top) == top)
        return self._bound

    def layers(self) -> list[nn.Module]:
        """The attention modules with an entry, in order of first use."""
        return [entry.module for entry in self._layers.values()]

    def keys_values(self, module: nn.Module) -> tuple[Tensor, Tensor] | None:
        """``module``'s cached keys and values ``(b, h, N, d)`` (keys after rotation); a
        windowed or chunked layer holds only the last ones, those it can still read."""
        entry = self._layers.get(id(module))
        if entry is None or entry.module is not module:
            return None
        keys, values = entry.keys.view(), entry.values.view()
        assert keys is not None and values is not None
        return keys, values

    def reset(self) -> None:
        """Forget everything: the next call fills the cache anew."""
        self.__init__()  # type: ignore[misc]

    def memo(self, pe: nn.Module) -> dict[str, Any]:
        """A dict kept for encoding ``pe`` across calls (xPos keeps its centre there)."""
        held = self._memos.get(id(pe))
        if held is None or held[0] is not pe:
            held = self._memos[id(pe)] = (pe, {})
        return held[1]

    def write(self, batch: int) -> CacheWrite:
        """The write side of one forward over ``batch`` rows (a :class:`CacheWrite`, which
        the forward's :class:`~posenc.sequence.context.SequenceContext` holds)."""
        return CacheWrite(self, batch)

    def _catch_up(self) -> None:
        """Fill the padding flags, document ids and runs of the tokens staged without them:
        real tokens of each row's last document."""
        missing = self._length - self._runs.length
        if missing <= 0 or self._last_id is None or self._last_run is None:
            return
        b = self._last_id.shape[0]
        device = self._last_id.device
        self._padding.append(torch.zeros(b, missing, dtype=torch.bool, device=device))
        self._documents.append(self._last_id.expand(b, missing))
        self._runs.append(self._last_run.expand(b, missing))
        for part in (self._padding, self._documents, self._runs):
            part.commit(self._length)

    def _commit(
        self,
        positions: Tensor,
        padding: Tensor | None,
        documents: Tensor | None,
        runs: Tensor | None,
        padded: bool,
        *,
        layers: list[LayerKV],
        bound: PositionBound | None = None,
        keeps: bool = False,
    ) -> None:
        """End a call (:meth:`CacheWrite.commit`): count its staged tokens ``(b, n)`` and the
        appends of its ``layers``, and note
        where each row goes on (``padded``: the call passed a padding mask; ``padding`` and
        the rest ``None``: a step staged with its positions alone). ``bound``: the host's
        bound on the call's positions (``None``: unknown); ``keeps``: every row's document
        went on through the call and none of its tokens is padding, so that each row's next
        position is the larger of its old one and its largest position + 1."""
        n = positions.shape[1]
        old = self._bound
        if n and (bound is None or old is None):
            self._bound = None  # read when next asked
        elif n:  # each row's next position is its largest position + 1, or stays, or falls
            top = bound.largest + 1
            exact = keeps and (
                (bound.exact and top >= old.largest) or (old.exact and old.largest >= top)
            )
            self._bound = PositionBound(max(old.largest, top), exact)
        self._length += n
        self._positions.commit(self._length)
        if padding is not None:
            for part in (self._padding, self._documents, self._runs):
                part.commit(self._length)
        for entry in layers:
            entry.commit(self._length)
        self.batch_size = positions.shape[0]
        self.has_padding = self.has_padding or padded
        if n and (padding is None or documents is None or runs is None):
            assert self.next_position is not None  # a step follows a first call
            top = positions.amax(dim=1, keepdim=True) + 1  # real tokens, the same document
            self.next_position = torch.maximum(self.next_position, top)
        elif n and documents is not None and runs is not None:
            self._follow(positions, padding, documents, runs)
        self._drop_unreadable()

    def _follow(
        self, positions: Tensor, padding: Tensor | None, documents: Tensor, runs: Tensor
    ) -> None:
        """Each row's last document (id and run) and its next position: the largest real
        position of that document, plus one, from this call's tokens and the earlier ones."""
        last_id, last_run = documents[:, -1:], runs[:, -1:]  # (b, 1)
        real = runs == last_run  # (b, n)
        if padding is not None:
            real = real & ~padding
        lowest = positions.new_full((), -1)  # (not torch.tensor: a host copy, a sync on CUDA)
        following = torch.where(real, positions, lowest).amax(dim=1, keepdim=True) + 1
        if self.next_position is not None and self._last_run is not None:
            same = last_run == self._last_run  # the document went on through this call
            following = torch.where(same, torch.maximum(self.next_position, following), following)
        self.next_position, self._last_id, self._last_run = following, last_id, last_run

    def _windowed(self) -> list[LayerKV]:
        """The entries of layers with a sliding window or a chunk (they drop keys)."""
        return [e for e in self._layers.values() if e.window is not None or e.chunk is not None]

    @property
    def floor(self) -> Tensor | None:
        """Once a windowed or chunked layer may have dropped keys, each row's next position
        ``(b, 1)``: the tokens continuing a row's document must not be placed below it."""
        return self.next_position if self._windowed() else None

    def _drop_unreadable(self) -> None:
        """Let each windowed or chunked layer forget the keys no later query can read: those
        of earlier documents, padding, and keys too far back (window) or in an earlier chunk
        than the next position. A prefix common to every row is dropped; the positions of
        tokens continuing a row's document must not go back below ``floor`` afterwards."""
        windowed = self._windowed()
        if not windowed:
            return
        positions, padding, runs = self.positions, self.key_padding_mask, self.document_runs
        following = self.next_position
        if positions is None or padding is None or runs is None or following is None:
            return
        current = (runs == runs[:, -1:]) & ~padding  # (b, N): the documents being continued
        for entry in windowed:
            unreadable = ~current
            if entry.window is not None:
                unreadable = unreadable | (positions <= following - entry.window)
            if entry.chunk is not None:
                chunk = entry.chunk
                earlier = torch.div(positions, chunk, rounding_mode="floor") < torch.div(
                    following, chunk, rounding_mode="floor"
                )
                unreadable = unreadable | earlier
            needed = (~unreadable).any(dim=0)  # (N,)
            first = int(needed.float().argmax()) if bool(needed.any()) else len(self)
            entry.drop_before(first)
