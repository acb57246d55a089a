"""StreamingLLM's cache (Xiao et al. 2024, "Efficient Streaming Language Models with Attention
Sinks", ICLR, §3.2): the first ``S`` tokens (the attention sinks) and the last ``W``, with
positions inside the cache.

A :class:`StreamingCache` keeps, in every attention layer, the keys and values of each row's
first ``S`` real tokens and of its last ``W`` real tokens (the current one included), so it
holds at most ``S + W`` tokens whatever the length generated. The tokens it keeps are placed
at their positions *inside the cache*: the sinks at ``0 .. S - 1``, the window right after
them, and a new query at the position of its own key, right after the keys it reads. Keys are
therefore stored **before** rotation and rotated when read (the paper's §3.2: "we focus on
positions within the cache rather than those in the original text"); bias schemes take their
distances from the same in-cache positions. Additive encodings are added to the embeddings
at each token's position in its row (the count of real tokens before it), as without a
cache: those positions are baked into the cached keys and values.

**What a call may hold.** A call of one token always fits. A call of ``n > 1`` tokens (a
prompt) must not evict: each row's real tokens seen so far plus its real tokens in the call
must be at most ``S + W``; a longer prompt is fed ``S + W`` tokens at once and then one token
per call (:meth:`posenc.TransformerModel.generate` does). This is what keeps every query
exact: a query of a call that evicted part-way would read keys whose in-cache positions
differ from those its neighbours read them at.

**Padding.** A call's ``key_padding_mask`` (True = padding) must put each row's padding
before its real tokens (left padding); padding is never kept, so each row's sinks are its
first ``S`` real tokens and its positions count from its first real token: each row decodes
as it would alone. Rows without padding share one layout (slices, no gather); after a padded
call each step gathers each row's kept tokens (``O(S + W)`` per layer, like the slices).

Dimension legend: ``b`` batch, ``g`` key/value heads, ``L`` held tokens, ``n`` new tokens,
``d`` head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..encodings.checks import PositionBound
from ..errors import PosencTypeError, PosencValueError
from .cache import claim_layer, encoding_memo

__all__ = ["StreamStep", "StreamWrite", "StreamingCache"]


@dataclass
class StreamStep:
    """How one call joins a :class:`StreamingCache`, planned once and used by every layer.

    Attributes:
        positions: the new queries' in-cache positions ``(b, n)``.
        key_positions: the in-cache positions of the keys they read ``(b, L')`` (the
            cached ones kept, then the new ones); padding at 0.
        key_padding_mask: ``(b, L')`` bool, True = padding, or ``None`` (no row has any).
        absolute_positions: the new tokens' positions in their rows ``(b, n)``, for additive
            encodings.
        bound: the host's bound on ``key_positions``.
        arange_keys: ``key_positions`` is ``arange(L')`` in every row.
    """

    positions: Tensor
    key_positions: Tensor
    key_padding_mask: Tensor | None
    absolute_positions: Tensor
    bound: PositionBound
    arange_keys: bool
    #: Slices (no padding): sinks kept and keys dropped after them; or the gather index.
    sinks: int = 0
    dropped: int = 0
    index: Tensor | None = None
    valid: Tensor | None = None  # (b, L') True = a real token, after the call
    seen: Tensor | None = None  # (b, 1) real tokens per row, after the call
    real: int = 0  # (no padding) tokens per row, after the call


class _LayerEntry:
    """One attention layer's held keys (unrotated) and values ``(b, g, L, d)``."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module  # kept so that a reused id() is never mistaken for this layer
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]


class StreamingCache:
    """The first ``sink_tokens`` and the last ``window`` tokens of every attention layer, at
    positions inside the cache (StreamingLLM; see the module docstring). Accepted wherever a
    :class:`~posenc.KVCache` is (``cache=`` of :class:`~posenc.MultiHeadAttention`,
    :class:`~posenc.Encoder`, :class:`~posenc.TransformerModel` and its ``generate``).

    Args:
        sink_tokens: ``S >= 0``, the first tokens of each row, kept for good.
        window: ``W >= 1``, the last tokens of each row (the current one included).

    Rotary schemes with 1-D positions (RoPE with any scaling, interleaved RoPE, xPos) rotate
    the held keys when they are read; bias schemes, additive schemes and NoPE need nothing
    more. Refused by name: schemes with N-D positions (axial, multimodal RoPE), rotary
    schemes that cannot rotate keys apart from queries, ``positions=`` and ``document_ids=``.

    >>> import posenc
    >>> model = posenc.TransformerModel(50, 16, 2, 2, pe="rope", causal=True).eval()
    >>> cache = posenc.StreamingCache(sink_tokens=2, window=3)
    >>> model(torch.tensor([[1, 2, 3, 4]]), cache=cache).shape
    torch.Size([1, 4, 50])
    >>> for token in (5, 6, 7):
    ...     _ = model(torch.tensor([[token]]), cache=cache)
    >>> len(cache), cache.positions.tolist(), cache.tokens_seen.tolist()
    (5, [[0, 1, 2, 3, 4]], [7])
    """

    def __init__(self, sink_tokens: int, window: int) -> None:
        for name, value, low in (("sink_tokens", sink_tokens, 0), ("window", window, 1)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise PosencTypeError(f"{name} must be an int, got {value!r}")
            if value < low:
                raise PosencValueError(f"{name} must be >= {low}, got {value}")
        self.sink_tokens, self.window = sink_tokens, window
        self._layers: dict[int, _LayerEntry] = {}
        self._memos: dict[int, tuple[nn.Module, dict[str, Any]]] = {}
        self.batch_size: int | None = None
        self._length = 0  # held tokens per row (padding included)
        self._real = 0  # without padding: real tokens seen per row (every row alike)
        #: Set once a call passed padding: rows then differ, and each keeps its own layout.
        self.has_padding = False
        self._valid: Tensor | None = None  # (b, L) True = a real token (after padding)
        self._seen: Tensor | None = None  # (b, 1) real tokens seen per row (after padding)
        self._positions: Tensor | None = None  # (b, L) in-cache positions

    @property
    def capacity(self) -> int:
        """``S + W``: the most tokens a row holds after any call of one token."""
        return self.sink_tokens + self.window

    def __len__(self) -> int:
        """Tokens held per row (padding included)."""
        return self._length

    def __repr__(self) -> str:
        return (
            f"StreamingCache(sink_tokens={self.sink_tokens}, window={self.window}, "
            f"batch_size={self.batch_size}, length={self._length}, layers={len(self._layers)})"
        )

    @property
    def positions(self) -> Tensor | None:
        """The held tokens' in-cache positions ``(b, L)`` (padding at 0), or ``None``."""
        return self._positions

    @property
    def key_padding_mask(self) -> Tensor | None:
        """The held tokens' padding flags ``(b, L)`` (True = padding), or ``None``."""
        return None if self._valid is None else ~self._valid

    @property
    def tokens_seen(self) -> Tensor | None:
        """Real tokens each row has passed through the cache ``(b,)``, or ``None``."""
        if self._seen is not None:
            return self._seen[:, 0]
        if self.batch_size is None:
            return None
        return torch.full((self.batch_size,), self._real, dtype=torch.long)

    def layers(self) -> list[nn.Module]:
        """The attention modules with an entry, in order of first use."""
        return [entry.module for entry in self._layers.values()]

    def keys_values(self, module: nn.Module) -> tuple[Tensor, Tensor] | None:
        """``module``'s held keys (**before** rotation) and values ``(b, g, L, d)``."""
        entry = self._layers.get(id(module))
        if entry is None or entry.module is not module or entry.keys is None:
            return None
        assert entry.values is not None
        return entry.keys, entry.values

    def storage_bytes(self) -> int:
        """Bytes held: every layer's keys and values and the token records."""
        held = [self._valid, self._seen, self._positions]
        for entry in self._layers.values():
            held += [entry.keys, entry.values]
        return sum(t.numel() * t.element_size() for t in held if t is not None)

    def reset(self) -> None:
        """Forget everything (the sizes stay): the next call fills the cache anew."""
        self.__init__(self.sink_tokens, self.window)  # type: ignore[misc]

    def memo(self, pe: nn.Module) -> dict[str, Any]:
        """A dict kept for encoding ``pe`` across calls (xPos keeps its centre there)."""
        held = self._memos.get(id(pe))
        if held is None or held[0] is not pe:
            held = self._memos[id(pe)] = (pe, {})
        return held[1]

    def write(
        self, batch: int, n: int, key_padding_mask: Tensor | None, device: torch.device
    ) -> StreamWrite:
        """The write side of one forward of ``n`` new tokens per row (a
        :class:`StreamWrite`, which the forward's
        :class:`~posenc.sequence.context.SequenceContext` holds), planned first."""
        return StreamWrite(self, self._plan(batch, n, key_padding_mask, device))

    def _plan(
        self, batch: int, n: int, key_padding_mask: Tensor | None, device: torch.device
    ) -> StreamStep:
        """Plan a call of ``n`` new tokens per row (``key_padding_mask`` checked ``(b, n)``):
        which held tokens stay, and every position. Refuses a call that would evict part-way
        and padding after a real token in a row, naming them."""
        if self.batch_size is not None and batch != self.batch_size:
            raise PosencValueError(
                f"this StreamingCache holds {self.batch_size} row(s), got a batch of {batch}; "
                "use one cache per batch (or cache.reset())"
            )
        S, cap = self.sink_tokens, self.capacity
        if key_padding_mask is None and not self.has_padding:
            if n > 1 and self._real + n > cap:
                raise PosencValueError(
                    f"a call of {n} tokens after {self._real} would pass the StreamingCache's "
                    f"sink_tokens + window = {cap} part-way: feed at most {cap - self._real} "
                    "tokens in this call and the rest one per call (generate does)"
                )
            held = self._length
            dropped = max(0, held + n - cap)
            total = held + n - dropped
            keys = torch.arange(total, device=device)
            step = StreamStep(
                positions=keys[total - n :].expand(batch, n),
                key_positions=keys.expand(batch, total),
                key_padding_mask=None,
                absolute_positions=(self._real + torch.arange(n, device=device)).expand(batch, n),
                bound=PositionBound(total - 1, True),
                arange_keys=True,
                sinks=min(S, held),
                dropped=dropped,
                real=self._real + n,
            )
        else:
            step = self._plan_padded(batch, n, key_padding_mask, device)
        return step

    def _plan_padded(
        self, batch: int, n: int, key_padding_mask: Tensor | None, device: torch.device
    ) -> StreamStep:
        """:meth:`plan` once some row has padding: each row keeps its first ``S`` and last
        ``W`` real tokens, right-aligned in ``L'`` columns (its padding on the left)."""
        new_real = (
            torch.ones(batch, n, dtype=torch.bool, device=device)
            if key_padding_mask is None
            else ~key_padding_mask.to(device)
        )
        if n > 1 and bool((new_real[:, :-1] & ~new_real[:, 1:]).any()):
            rows = (new_real[:, :-1] & ~new_real[:, 1:]).any(dim=1).nonzero().flatten().tolist()
            raise PosencValueError(
                f"a StreamingCache needs each row's padding before its real tokens within a "
                f"call (left padding): row(s) {rows[:8]} of key_padding_mask have padding after "
                "a real token"
            )
        held_valid, held_seen = self._valid, self._seen
        if held_valid is None or held_seen is None:  # the first padded call: rows were alike
            held_valid = torch.ones(batch, self._length, dtype=torch.bool, device=device)
            held_seen = torch.full((batch, 1), self._real, dtype=torch.long, device=device)
        counts = new_real.sum(dim=1, keepdim=True)  # (b, 1)
        seen = held_seen + counts
        cap = self.capacity
        if n > 1:
            over = (counts > 1) & (seen > cap)  # (b, 1): would evict part-way
            if bool(over.any()):
                row = int(over.flatten().float().argmax())
                raise PosencValueError(
                    f"a call of {int(counts[row])} real tokens after {int(held_seen[row])} in "
                    f"row {row} would pass the StreamingCache's sink_tokens + window = {cap} "
                    "part-way: feed at most that many in one call and the rest one per call "
                    "(generate does)"
                )
        valid = torch.cat([held_valid, new_real], dim=1)  # (b, L + n)
        width = valid.shape[1]
        left = valid.long().cumsum(dim=1) - 1  # rank among the row's real tokens
        right = valid.long().sum(dim=1, keepdim=True) - 1 - left
        keep = valid & ((left < self.sink_tokens) | (right < self.window))
        total = max(n, min(width, cap))
        columns = torch.arange(width, device=device)
        order = torch.argsort(keep.long() * width + columns, dim=1)  # dropped first, kept last
        index = order[:, width - total :]  # (b, L')
        kept = keep.gather(1, index)
        key_positions = (kept.long().cumsum(dim=1) - 1).clamp_(min=0) * kept
        absolute = (held_seen + new_real.long().cumsum(dim=1) - 1).clamp_(min=0) * new_real
        return StreamStep(
            positions=key_positions[:, total - n :],
            key_positions=key_positions,
            key_padding_mask=~kept,
            absolute_positions=absolute,
            bound=PositionBound(total - 1, False),
            arange_keys=False,
            index=index,
            valid=kept,
            seen=seen,
        )

    @staticmethod
    def _join(held: Tensor | None, new: Tensor, step: StreamStep) -> Tensor:
        """``held`` ``(b, g, L, d)`` less what ``step`` drops, then ``new`` ``(b, g, n, d)``."""
        if held is None or held.shape[2] == 0:
            parts = [new]
        else:
            held = held.to(new.dtype)  # the model may have moved to another dtype
            if step.index is not None:
                both = torch.cat([held, new], dim=2)  # (b, g, L + n, d)
                b, g, _, d = both.shape
                index = step.index[:, None, :, None].expand(b, g, step.index.shape[1], d)
                return both.gather(2, index)
            s, dropped = step.sinks, step.dropped
            parts = [held[:, :, :s], held[:, :, s + dropped :], new]
        return torch.cat(parts, dim=2) if len(parts) > 1 else new.clone()

    def _commit(self, step: StreamStep, joined: dict[int, tuple[_LayerEntry, Any]]) -> None:
        """End a call (:meth:`StreamWrite.commit`): every layer's joined keys and values
        become what it holds."""
        for key, (entry, (keys, values)) in joined.items():
            entry.keys, entry.values = keys, values
            self._layers.setdefault(key, entry)
        self._length = step.key_positions.shape[1]
        self._positions = step.key_positions
        if step.valid is not None:
            self.has_padding = True
            self._valid, self._seen = step.valid, step.seen
        else:
            self._real = step.real
        self.batch_size = step.key_positions.shape[0]


class StreamWrite:
    """The write side of one forward into a :class:`StreamingCache`, held by the forward's
    :class:`~posenc.sequence.context.SequenceContext`: the planned ``step``, each layer's
    joined keys and values and the encodings' memos (copies), none of which the cache holds
    until :meth:`commit`; :meth:`rollback` (or a forward that never commits) leaves the
    cache as it was."""

    def __init__(self, cache: StreamingCache, step: StreamStep) -> None:
        self.cache, self.step = cache, step
        self._joined: dict[int, tuple[_LayerEntry, Any]] = {}  # in order of first use
        self._memos: dict[int, tuple[nn.Module, dict[str, Any]]] = {}
        self.closed = False

    def __len__(self) -> int:
        """Tokens the cache holds before this forward."""
        return len(self.cache)

    def append_kv(self, module: nn.Module, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Join one layer's new keys (unrotated) and values ``(b, g, n, d)`` to those it
        holds; return the ones the new queries read ``(b, g, L', d)``: the kept held ones
        first, then the new ones."""
        cache = self.cache
        entry = claim_layer(cache, module, self._joined, _LayerEntry)  # joins on commit
        step = self.step
        joined = (cache._join(entry.keys, k, step), cache._join(entry.values, v, step))
        self._joined[id(module)] = (entry, joined)
        return joined

    def memo(self, pe: nn.Module) -> dict[str, Any]:
        """Encoding ``pe``'s memo for this forward: a copy of the cache's, which replaces it
        on commit."""
        return encoding_memo(self.cache._memos, self._memos, pe)

    def commit(self, **_: Any) -> None:
        """End the forward: the cache holds what it joined."""
        if self.closed:
            return
        self.closed = True
        self.cache._memos.update(self._memos)
        self.cache._commit(self.step, self._joined)

    def rollback(self) -> None:
        """Drop what the forward joined: the cache stays as it was."""
        self.closed = True
