"""Where the tokens of one forward sit and which keys they read: the positions of the new
tokens, the positions of every key (cached ones first), the key padding mask and the document
runs, made once per forward and handed to every attention layer.

A forward needs this context when it is cached (a :class:`~posenc.KVCache`) or packed
(``document_ids``); a plain forward over one sequence per row never builds one.

**Documents.** ``document_ids`` is ``(b, n)`` integers; a document is a run of equal ids next
to each other (``[7, 7, 3, 3, 3]`` holds two documents; ids need not be sorted or distinct
across rows). Attention stays inside a run (causally in a causal model), and positions
restart at 0 at the start of each run unless given. A cached call without ``document_ids``
continues each row's last document.

**Positions.** Explicit positions always win. Otherwise a token continuing a cached document
gets that document's largest cached (non-padding) position plus one, then counts up; a token
opening a document counts from 0.

Dimension legend: ``b`` batch, ``N`` cached tokens, ``n`` new tokens (queries), ``nk = N + n``
keys.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..encodings.base import PositionalEncoding, RotaryEncoding
from ..encodings.checks import PositionBound
from ..encodings.state import BiasState, PositionState
from ..errors import PosencTypeError, PosencValueError
from .cache import CacheWrite, KVCache
from .documents import (
    check_document_ids,
    default_positions,
    given_positions,
    has_splits,
    new_documents,
    within_range,
)
from .masks import MaskSpec, check_key_padding_mask
from .memo import ForwardMemo
from .streaming import StreamingCache, StreamWrite

__all__ = ["SequenceContext", "position_state"]


class SequenceContext:
    """The tokens of one forward and the keys they read (see the module docstring).

    Attributes:
        positions: the new tokens' positions, ``(b, n)`` (``(n,)`` when shared by every row
            and no cache is involved).
        key_positions: every key's position, ``(b, nk)``.
        bound: a :class:`~posenc.encodings.checks.PositionBound` on ``positions``, or
            ``None``.
        key_padding_mask: ``(b, nk)`` bool, True = padding, or ``None`` when no key is.
        q_runs / k_runs: document run numbers of queries ``(b, n)`` and keys ``(b, nk)``, or
            ``None`` without documents.
        write: the write side of the cache being filled (a
            :class:`~posenc.sequence.cache.CacheWrite` or
            :class:`~posenc.sequence.streaming.StreamWrite`), or ``None``: what the forward
            adds to the cache, which :meth:`commit` makes the cache's and :meth:`rollback`
            drops.
        absolute_positions: the positions additive encodings add at: ``positions``, except
            with a StreamingCache (``positions`` are then in-cache ones, these each token's
            position in its row).
        keys_at_read: the cache stores keys before rotation (a StreamingCache): attention
            rotates every key it reads, at ``key_positions``.
        distance_bound: a host number no ``|q_pos - k_pos|`` of one row exceeds, or
            ``None``: positions counted by default (none given, now or in the cache) lie in
            ``0 .. tokens - 1``, tokens counting the cached ones; a StreamingCache's
            in-cache positions lie in ``0 .. bound``. Bias tables by distance are sized
            from it (``distance_bound`` of :class:`~posenc.encodings.state.BiasState`).
        memo: what the layers of this forward share (:class:`ForwardMemo`).
    """

    def __init__(
        self,
        *,
        positions: Tensor,
        key_positions: Tensor,
        key_padding_mask: Tensor | None,
        q_runs: Tensor | None,
        k_runs: Tensor | None,
        write: CacheWrite | StreamWrite | None,
        bound: PositionBound | None = None,
        keeps: bool = True,
        absolute_positions: Tensor | None = None,
        keys_at_read: bool = False,
        arange_keys: bool = False,
        distance_bound: int | None = None,
    ) -> None:
        self.positions, self.key_positions = positions, key_positions
        self.distance_bound = distance_bound
        self.absolute_positions = positions if absolute_positions is None else absolute_positions
        self.keys_at_read = keys_at_read
        self._arange_keys = arange_keys  # key_positions is arange(nk) in every row
        #: What the host knows of ``positions``' largest value without reading the device
        #: (``None``: nothing): the bound continuing the cache's, or the value read once from
        #: positions a user gave. Rotary tables are sized from it.
        self.bound = bound
        self.key_padding_mask = key_padding_mask
        self.q_runs, self.k_runs = q_runs, k_runs
        self.write = write
        self._keeps = keeps  # what the cache learns of its rows' next positions on commit
        self._masks: dict[tuple[bool, int, int, int | None, int | None], Tensor | None] = {}
        self._specs: dict[tuple[bool, int, int, int | None, int | None], MaskSpec] = {}
        self.memo = ForwardMemo()

    @property
    def past(self) -> int:
        """Tokens cached before this call."""
        return 0 if self.write is None else len(self.write)

    @classmethod
    def build(
        cls,
        *,
        batch: int,
        seq: int,
        device: torch.device,
        positions: Tensor | None,
        key_padding_mask: Tensor | None,
        document_ids: Tensor | None,
        cache: KVCache | StreamingCache | None,
        axes: int = 1,
        scheme: str = "",
        windowed: bool = False,
    ) -> SequenceContext | None:
        """The context of a forward over ``batch`` rows of ``seq`` new tokens, or ``None``
        when there is neither a cache nor documents nor a ``windowed`` layer (a sliding
        window or chunk, whose mask reads positions). Every argument is checked here, before
        any work: ``key_padding_mask`` and ``document_ids`` are ``(batch, seq)``. A cache is
        opened for writing (its write side is the context's :attr:`write`)."""
        _check_cache(cache)
        if isinstance(cache, StreamingCache):
            return cls._streaming(
                cache, batch, seq, device, positions, key_padding_mask, document_ids, axes, scheme
            )
        document_ids = check_document_ids(document_ids, batch, seq)
        if cache is None and document_ids is None and not windowed:
            return None
        if axes != 1:
            raise PosencValueError(
                f"cache=, document_ids=, window= and chunk= need a scheme with 1-D positions; "
                f"{scheme or 'this pe'} takes {axes}-D positions"
            )
        check_key_padding_mask(key_padding_mask, batch, seq)
        write = None if cache is None else cache.write(batch)
        if (
            cache is not None
            and len(cache)
            and document_ids is None
            and key_padding_mask is None
            and not (cache.has_documents or cache.has_padding)
        ):
            return cls._step(write, batch, seq, device, positions)
        return cls._tokens(write, batch, seq, device, positions, key_padding_mask, document_ids)

    @classmethod
    def _tokens(
        cls,
        write: CacheWrite | None,
        batch: int,
        seq: int,
        device: torch.device,
        positions: Tensor | None,
        key_padding_mask: Tensor | None,
        document_ids: Tensor | None,
    ) -> SequenceContext:
        """The context of a forward that records every token: padding and document runs (a
        first cached call, padding or documents given now or held by the cache, or an
        uncached packed or windowed forward)."""
        cache = None if write is None else write.cache
        given = document_ids is not None
        distance_bound = _counted_bound(write, positions, seq)
        padding = (
            torch.zeros(batch, seq, dtype=torch.bool, device=device)
            if key_padding_mask is None
            else key_padding_mask
        )
        last_id, last_run = (None, None) if cache is None or not len(cache) else cache.last_document
        document_ids, q_runs, opens = new_documents(
            document_ids, last_id, last_run, batch, seq, device
        )
        if positions is None:
            positions, bound = default_positions(cache, q_runs, opens, last_run, given)
        else:
            continuing = None if last_run is None else (q_runs == last_run) & ~padding
            positions, bound = given_positions(positions, cache, continuing, batch, seq, device)
        key_positions, keys_padding, k_runs = positions, padding, q_runs
        if write is not None:  # staged past the cache's length: counted only on commit
            key_positions, keys_padding, k_runs = write.stage(
                positions, padding, document_ids, q_runs, padded=key_padding_mask is not None
            )
        # a document mask only where some row's keys hold two documents or more
        held = cache is not None and cache.has_documents
        with_documents = held or (given and has_splits(k_runs))
        if write is not None:
            write.documents = with_documents
        any_padding = key_padding_mask is not None or (cache is not None and cache.has_padding)
        if key_padding_mask is not None:  # the earlier keys' rows were checked when cached
            keys = (0 if cache is None else len(cache)) + seq
            check_key_padding_mask(keys_padding, batch, keys, read_values=True)
        return cls(
            positions=positions,
            key_positions=key_positions,
            key_padding_mask=keys_padding if any_padding else None,
            q_runs=q_runs if with_documents else None,
            k_runs=k_runs if with_documents else None,
            write=write,
            bound=bound,
            keeps=not given and key_padding_mask is None,
            distance_bound=distance_bound,
        )

    @classmethod
    def _step(
        cls,
        write: CacheWrite | None,
        batch: int,
        seq: int,
        device: torch.device,
        positions: Tensor | None,
    ) -> SequenceContext:
        """A decoding step's context: real tokens continuing each row's document, in a cache
        without padding or documents; only their positions are recorded."""
        assert write is not None
        cache = write.cache
        following = cache.next_position
        assert following is not None
        bound = None
        distance_bound = _counted_bound(write, positions, seq)
        if positions is None:
            positions = following + torch.arange(seq, device=device)  # (b, n)
            start = cache.position_bound()  # every row's next position is at most this
            if start is not None and seq:
                bound = within_range(start.largest + seq - 1, start.exact)
        else:
            every = torch.ones(batch, seq, dtype=torch.bool, device=device)
            positions, bound = given_positions(positions, cache, every, batch, seq, device)
        key_positions, _, _ = write.stage(positions)
        return cls(
            positions=positions,
            key_positions=key_positions,
            key_padding_mask=None,
            q_runs=None,
            k_runs=None,
            write=write,
            bound=bound,
            distance_bound=distance_bound,
        )

    @classmethod
    def _streaming(
        cls,
        cache: StreamingCache,
        batch: int,
        seq: int,
        device: torch.device,
        positions: Tensor | None,
        key_padding_mask: Tensor | None,
        document_ids: Tensor | None,
        axes: int,
        scheme: str,
    ) -> SequenceContext:
        """The context of a call joining a :class:`~posenc.StreamingCache`: in-cache
        positions for queries and keys (see :mod:`posenc.sequence.streaming`)."""
        if positions is not None:
            raise PosencValueError(
                "positions= cannot be given with a StreamingCache: it places every token "
                "itself (rotary and bias schemes at in-cache positions, additive ones at each "
                "token's position in its row)"
            )
        if document_ids is not None:
            raise PosencValueError(
                "document_ids= cannot be given with a StreamingCache: its sinks and window "
                "are those of one sequence per row"
            )
        if axes != 1:
            raise PosencValueError(
                f"a StreamingCache needs a scheme with 1-D positions; {scheme or 'this pe'} "
                f"takes {axes}-D positions"
            )
        # (values are read by the plan: padding must come first in each row; a row with no
        # real token yet, a long left padding fed in parts, is let through)
        check_key_padding_mask(key_padding_mask, batch, seq)
        write = cache.write(batch, seq, key_padding_mask, device)
        step = write.step
        return cls(
            positions=step.positions,
            key_positions=step.key_positions,
            key_padding_mask=step.key_padding_mask,
            q_runs=None,
            k_runs=None,
            write=write,
            bound=step.bound,
            absolute_positions=step.absolute_positions,
            keys_at_read=True,
            arange_keys=step.arange_keys,
            distance_bound=step.bound.largest,  # in-cache positions: 0 .. bound
        )

    def state(self, pe: PositionalEncoding, x: Tensor) -> PositionState | None:
        """``pe``'s state for this forward over ``x`` ``(b, n, D)``: its
        :meth:`~posenc.PositionalEncoding.context_state`, or, where keys are rotated when
        read (a StreamingCache), a rotary scheme's
        :meth:`~posenc.RotaryEncoding.read_state`. The encoding's memo across calls is the
        cache's, as this forward's write sees it."""
        memo = {} if self.write is None else self.write.memo(pe)
        if self.keys_at_read and isinstance(pe, RotaryEncoding):
            nk = self.key_positions.shape[-1]
            keys = None if self._arange_keys else self.key_positions
            return pe.read_state(keys, x, memo, queries=x.shape[1], keys=nk, bound=self.bound)
        state = pe.context_state(self.positions, self.key_positions, x, memo, bound=self.bound)
        if isinstance(state, BiasState):
            state.distance_bound = self.distance_bound
        return state

    def keys_values(self, module: nn.Module, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values ``(b, h, nk, d)`` that ``module``'s new queries read: its cached
        ones followed by ``k`` and ``v`` (which join the cache), or ``k`` and ``v`` alone."""
        if self.write is None:
            return k, v
        return self.write.append_kv(module, k, v)

    def mask(
        self,
        causal: bool,
        nq: int,
        nk: int,
        device: torch.device,
        window: int | None = None,
        chunk: int | None = None,
    ) -> Tensor | None:
        """The boolean ``(b, 1, nq, nk)`` mask (True = may attend) of a layer, made once per
        forward for each kind of layer: causal (the new queries are the last ``nq`` of the
        ``nk`` keys), padding, documents, and a sliding ``window`` or ``chunk`` over
        positions; ``None`` when every pair may attend."""
        key = (causal, nq, nk, window, chunk)
        if key not in self._masks:
            self._masks[key] = self.mask_spec(causal, nq, nk, window, chunk).dense(device)
        return self._masks[key]

    def mask_spec(
        self,
        causal: bool,
        nq: int,
        nk: int,
        window: int | None = None,
        chunk: int | None = None,
    ) -> MaskSpec:
        """The :class:`~posenc.sequence.masks.MaskSpec` of a layer (arguments as for
        :meth:`mask`), made once per forward for each kind of layer: what both the dense
        mask and flex's block mask read."""
        key = (causal, nq, nk, window, chunk)
        spec = self._specs.get(key)
        if spec is None:
            batch = self.key_positions.shape[0]
            k_positions, padding, k_runs = self.last_keys(nk)
            windowed = window is not None or chunk is not None
            spec = self._specs[key] = MaskSpec.build(
                batch,
                nq,
                nk,
                causal=causal,
                key_padding_mask=padding,
                q_documents=self.q_runs,
                k_documents=k_runs,
                q_positions=self.positions.expand(batch, nq) if windowed else None,
                k_positions=k_positions.expand(batch, nk) if windowed else None,
                window=window,
                chunk=chunk,
            )
        return spec

    def last_keys(self, nk: int) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """The positions ``(b, nk)``, padding flags and document runs of the last ``nk`` keys:
        a windowed layer of a cached forward holds only those (the cache dropped the keys it
        can no longer read); every other layer holds them all."""
        total = self.key_positions.shape[-1]
        if nk == total:
            return self.key_positions, self.key_padding_mask, self.k_runs
        start = total - nk

        def tail(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[..., start:]

        return self.key_positions[..., start:], tail(self.key_padding_mask), tail(self.k_runs)

    def keep(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """``make()`` kept under ``key`` for the rest of this forward (see
        :meth:`ForwardMemo.keep`)."""
        return self.memo.keep(key, make)

    def commit(self) -> None:
        """End the forward: the cache (if any) holds the new tokens."""
        if self.write is not None:
            self.write.commit(bound=self.bound, keeps=self._keeps)

    def rollback(self) -> None:
        """End a forward that failed: the cache (if any) stays as it was before it."""
        if self.write is not None:
            self.write.rollback()


def position_state(
    pe: PositionalEncoding | None,
    x: Tensor,
    positions: Tensor | None,
    context: SequenceContext | None,
) -> PositionState | None:
    """The one place a forward asks encoding ``pe`` for its per-forward state over ``x``
    ``(b, n, D)``: through the ``context`` of a cached, packed or windowed forward
    (:meth:`SequenceContext.state`), else at ``positions``
    (:meth:`~posenc.PositionalEncoding.position_state`); ``None`` without an encoding."""
    if pe is None:
        return None
    if context is None:
        return pe.position_state(positions, x)
    return context.state(pe, x)


def _counted_bound(write: CacheWrite | None, positions: Tensor | None, seq: int) -> int | None:
    """The distance bound of a forward of ``seq`` new tokens (see
    :attr:`SequenceContext.distance_bound`): ``tokens - 1`` where every position is counted
    by default, else ``None``; records given positions on the cache's write side."""
    if positions is not None:
        if write is not None:
            write.given = True
        return None
    if write is not None and not write.cache.counted:
        return None
    tokens = seq + (0 if write is None else len(write))
    return tokens - 1 if tokens else None


def _check_cache(cache: object) -> None:
    if cache is not None and not isinstance(cache, (KVCache, StreamingCache)):
        raise PosencTypeError(
            "cache must be a posenc.KVCache, a posenc.StreamingCache or None, got "
            f"{type(cache).__name__}"
        )
