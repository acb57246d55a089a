"""Rotary position embeddings (Su et al. 2021, "RoFormer", §3.2–3.4).

RoPE rotates each pair of query/key channels by an angle proportional to the position,

    f(x, m)[pair i] = R(m θ_i) · (x_a, x_b),   θ_i = base^(-2i/r),   i = 0 .. r/2 - 1     (eq. 15)

so that ``<f(q, m), f(k, n)>`` depends on ``m - n`` only (eq. 16). Two layouts pair the
channels differently:

* half (GPT-NeoX, Llama, Hugging Face): pair ``i`` is ``(x[i], x[i + r/2])``;
* interleaved (GPT-J, RoFormer, rotary-embedding-torch): pair ``i`` is ``(x[2i], x[2i+1])``.

With ``rotary_dim = r < head_dim`` only the first ``r`` channels rotate ("partial rotary");
the rest pass through unchanged.

Everything reduces to one primitive, :func:`apply_rotary`, taking the cos and sin of the
angles as ``(..., n, r/2)``. The schemes differ only in how they form the angles, and each
stands on its own (they share the rotation, :mod:`~.common`, and nothing else):

* :class:`RotaryEmbedding` (this file): ``positions * inv_freq``, with the Hugging Face
  context extensions (``rope_types/``) and their attention factor folded into cos and sin.
  It is put together from three objects with one job each: its settings, one frozen
  :class:`~.spec.RotarySpec`; its cos/sin tables, :class:`~.tables.RotaryTables`;
  and the positions of a call, read once by :func:`~.tables.read_positions`;
* :class:`XPos` (``rotary/xpos.py``): RoPE plus the per-pair exponential decay of Sun et al. 2022;
* :class:`AxialRotaryEmbedding` (``rotary/axial.py``): per-axis frequencies on N-D
  coordinates (2-D images, 3-D video), each pair rotating with one axis's coordinate.

Dynamic NTK's base grows with the longest call past the original context, as in Hugging Face
(:meth:`RotarySpec.next_length`). Keys cached in an earlier call were rotated with the old
base: their scores against new queries are no longer a function of ``m - n`` alone
(``tests/encodings/rotary/test_rope.py``). Re-rotate the cache (keep keys unrotated and call
:meth:`RotaryEmbedding.rotate`) if that matters.

Precision: angles are formed in float64 from float64 frequencies and cast once, so cos/sin are
within float32 rounding at any position; the cached tables stay float32 after
``module.to(torch.bfloat16)`` (``_apply`` rebuilds them); bf16/fp16 queries and keys are
rotated in float32 and cast back once.

The arithmetic lives in ``kernels/``: ``rotate.py`` (the float64 reference formula, the
public :func:`apply_rotary` / :func:`apply_rotary_` and the plan's dispatcher), three kernels
behind one interface (``kernel.py``: the C kernel ``native.py``, built at install time by
``setup.py`` where a C compiler exists; ``pytorch.py``, the tiled pure-torch path; Triton on
CUDA, ``triton_entry.py``) and ``ops.py`` (inside ``torch.compile`` and ``torch.export`` the
rotation is one custom operator). The mode and the kernel are decided once per call by
:func:`~posenc.encodings.rotary.kernels.select.select`; the forward, the position reader and
the tables act on its answer. Every module takes ``inplace=True`` to rotate ``q`` and ``k`` in
their own storage (:func:`apply_rotary_`), ``position_ids=`` for ``positions=``, and
``layout="bhsd" | "bshd" | "thd"`` (:mod:`~.layouts`: stated, never guessed). A decode step
rotates with its rows of the cached table where they lie
(:meth:`~.tables.RotaryTables.turn_at_rows`). Positions on a GPU are never read on the host:
the tables are sized ahead and a position outside them turns its row by NaN (the checks run on
the CPU, or under ``POSENC_CHECK_POSITIONS=1``; see :mod:`~.tables`). In a cached or packed
forward of a model the tables are sized from the bound on the positions the host knows
(:meth:`context_state`). See ``benchmarks/rope.md`` (CPU) and ``benchmarks/gpu.md``.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim, ``r`` rotary dim,
``a`` number of axes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ...errors import PosencValueError, check_bytes
from ..base import RotaryEncoding
from ..checks import PositionBound, check_bool, compute_dtype, take_position_ids
from ..registry import register
from ..rope_types.registry import RopeType
from ..state import RotaryState
from .common import TableRotation, apply_tables, apply_tables_qk, check_qk
from .heads import (
    RotaryHeads,
    check_rotary_heads,
    frequencies,
    given_frequencies,
    head_axis,
    heads_group,
    per_head_bases,
)
from .kernels.select import Plan, select
from .layouts import Layout, stated_layout
from .rope_build import rope_with_scaling, rotary_from_hf_config
from .spec import RotarySpec
from .tables import Extent, RotaryTables, bounded_positions

PAPER = "Su et al. 2021, RoFormer: Enhanced Transformer with Rotary Position Embedding, eq. 15"

__all__ = ["RotaryEmbedding"]

# --------------------------------------------------------------------------- RoPE


@register("rope", "rotary embedding, half layout (GPT-NeoX / Llama), with HF scaling")
class RotaryEmbedding(RotaryEncoding):
    """Rotary position embedding (Su et al. 2021, eq. 15), with Hugging Face's context
    extensions; checked against transformers' ``LlamaRotaryEmbedding`` and
    ``modeling_rope_utils`` for every ``rope_type``, against rotary-embedding-torch for the
    interleaved layout, and against a float64 transcription of eq. 15.

    Args:
        head_dim: channels per head ``d``.
        base: the wavelength base θ (10000 in the paper; ``rope_theta`` in HF configs).
        rotary_dim: channels rotated, ``r <= d`` and even (default ``d``); the rest pass
            through.
        interleaved: GPT-J / RoFormer pairs ``(2i, 2i+1)`` instead of the half layout.
        clockwise: turn each pair by ``-angle``, as NanoChat does (``cat(x2, -x1)``).
        scaling: a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict, e.g.
            ``{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}``
            (types: ``default linear ntk dynamic yarn longrope llama3``, and any added with
            :func:`~posenc.register_rope_type`). A ``rope_theta`` or
            ``partial_rotary_factor`` in it sets ``base`` / ``rotary_dim``.
        max_position_embeddings: the model's context length: fills a missing
            ``original_max_position_embeddings``, and sizes the tables of positions on a GPU.
        learned_freq: make the frequencies a trainable parameter (no cached tables).
        rotary_heads: rotate only this many query heads (``0 < R <= heads``; ``None``: all);
            the others pass through unchanged (x-transformers' ``rotate_num_heads``). With
            grouped-query attention ``R`` must be a multiple of the query heads per key head
            (see :mod:`~.heads`).
        rotary_heads_at: ``"first"`` (default) or ``"last"``: which ``R`` heads rotate
            (x-transformers rotates the last: ``rotate_num_heads=R`` is
            ``rotary_heads=R, rotary_heads_at="last"``).
        inv_freq: the frequencies themselves instead of ``base`` and ``scaling``: ``(r/2,)``
            for every head, or ``(H, r/2)`` per head (flash-attention issue 578), one row per
            rotated key head (per query head without grouped-query attention).

    ``base`` may also be a sequence of bases, one per rotated key head (e.g. ``[1e4, 1e4,
    5e5, 5e5]``: some heads short-range, some long-range): each row of frequencies is what
    that base alone gives (with ``scaling`` applied to each). One base, or one row of
    ``inv_freq``, is one table for every head. With grouped-query attention
    query head ``i`` of the rotated ones turns by row ``i // (query heads per key head)``,
    as the key head it reads; per-head tables are turned by the same kernels (their head
    axis is a stride), :meth:`cos_sin` returns them as ``(H, n, r/2)`` or ``(b, H, n, r/2)``.

    Integer positions read cached float32 cos/sin tables, float positions are evaluated in
    float64; dynamic NTK's base grows with the longest call (see the module docstring).

    >>> rope = RotaryEmbedding(8)
    >>> q, k = rope(torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8))
    >>> q.shape
    torch.Size([2, 4, 5, 8])
    """

    paper: ClassVar[str] = PAPER
    cos_cached: Tensor
    sin_cached: Tensor
    inv_freq: Tensor
    #: Rows built when the tables are first made; they grow by doubling when needed.
    initial_table_size: ClassVar[int] = 4096
    #: The softmax scale of the attention this rotation belongs to where the rotary config
    #: changes it (:meth:`from_hf_config`); ``None``: the attention's own. Not used here.
    softmax_scale: float | None = None

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        scaling: Mapping[str, Any] | None = None,
        max_position_embeddings: int | None = None,
        learned_freq: bool = False,
        clockwise: bool = False,
        rotary_heads: int | None = None,
        rotary_heads_at: str = "first",
        inv_freq: Tensor | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        count, last = check_rotary_heads(rotary_heads, rotary_heads_at)
        self.rotary_heads, self.rotary_heads_at = count, rotary_heads_at
        bases = per_head_bases(base)
        first_base = base if bases is None else bases[0]
        #: One base per head where ``base`` was a sequence of several (else ``None``).
        self.bases: tuple[float, ...] | None = bases if bases and len(bases) > 1 else None
        if self.bases is not None and scaling is not None and "rope_theta" in scaling:
            raise PosencValueError(
                f"base={self.bases} (one per head) conflicts with scaling['rope_theta']="
                f"{scaling['rope_theta']}"
            )
        #: The checked, normalised settings (one frozen record; see :class:`RotarySpec`).
        self.spec = spec = RotarySpec.build(
            head_dim,
            base=first_base,
            rotary_dim=rotary_dim,
            interleaved=interleaved,
            clockwise=clockwise,
            scaling=scaling,
            max_position_embeddings=max_position_embeddings,
        )
        check_bytes("head_dim", head_dim, head_dim * 8 * 4, device=device)  # the frequencies
        self.head_dim, self.rotary_dim, self.base = spec.head_dim, spec.rotary_dim, spec.base
        self.interleaved, self.clockwise = spec.interleaved, spec.clockwise
        self.max_position_embeddings = spec.max_position_embeddings
        #: The validated scaling parameters, ``rope_type`` included (read-only).
        self.scaling: Mapping[str, Any] = spec.scaling
        self.rope_type: str = spec.rope_type
        #: The record of ``rope_type`` (how its frequencies depend on the length).
        self.rope_spec: RopeType = spec.record
        if learned_freq and self.rope_spec.uses_length:
            raise PosencValueError(f"learned_freq cannot be combined with {self.rope_type!r}")
        self.learned_freq = bool(learned_freq)
        self._seq_len: float | None = None  # the length the frequencies follow (None: none)
        #: The frequencies given as ``inv_freq`` (float64 on the CPU), else ``None``.
        self._given = given_frequencies(inv_freq, spec, base, scaling)
        inv_freq, self.attention_factor = self._frequencies(None)
        table_heads = inv_freq.shape[0] if inv_freq.dim() == 2 else None
        #: Which heads turn, and how a per-head table's rows map to them.
        self.heads = RotaryHeads(count, last, table_heads)
        inv_freq = inv_freq.to(device)
        if self.learned_freq:
            self.freq = nn.Parameter(inv_freq.float())
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        #: The float32 cos/sin (buffers ``cos_cached``/``sin_cached``), and the decode lane.
        # per-head tables are kept flat, (positions, H * r/2), and given a head axis when read
        self._tables = RotaryTables(
            self,
            self.rotary_dim * (table_heads or 1),
            caches=self.rope_spec.caches_table and not self.learned_freq,
            initial_size=self.initial_table_size,
            max_positions=max_position_embeddings,
            decode_lane=not self.rope_spec.uses_length and table_heads is None,
            device=device,
        )
        self.reset_tables()  # built now, so that a compiled forward reads a table that stays

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> RotaryEmbedding:
        """The rotation of a model of width ``dim`` with ``num_heads`` query heads:
        ``rotary_heads`` checked against ``num_heads`` before anything is built."""
        count, _ = check_rotary_heads(
            kwargs.get("rotary_heads"), kwargs.get("rotary_heads_at", "first")
        )
        if count is not None and count > num_heads:
            raise PosencValueError(f"rotary_heads ({count}) must be <= num_heads ({num_heads})")
        return cls(dim // num_heads, **kwargs)

    def _frequencies(self, seq_len: float | None) -> tuple[Tensor, float]:
        """``(inv_freq, attention_factor)`` float64 (:func:`~.heads.frequencies`)."""
        return frequencies(self.spec, self.bases, self._given, seq_len)

    @classmethod
    def from_hf_config(
        cls, config: Any, *, layer_type: str | None = None, strict: bool = False, **kwargs: Any
    ) -> RotaryEmbedding:
        """Build the rotary embedding a transformers model config describes (a
        ``PretrainedConfig`` or a ``config.json`` dict), so that rotating ``q, k``
        ``(b, h, n, head_dim)`` gives what that model's own code gives; ``kwargs`` override
        what the config says. See :func:`~.rope_build.rotary_from_hf_config` for how it is read."""
        return rotary_from_hf_config(cls, config, layer_type=layer_type, strict=strict, **kwargs)

    def reset_tables(self, num_positions: int | None = None) -> None:
        """Recompute the frequencies (float64) and the float32 cos/sin tables on the module's
        device with ``num_positions`` rows (default: as many as now, and at least
        :attr:`initial_table_size` where the module reads a table, within the memory budget);
        run at construction, after ``.to()``, and when the frequencies or positions move."""
        device = self.cos_cached.device
        if device.type == "meta":
            return
        if not self.learned_freq:
            inv_freq, self.attention_factor = self._frequencies(self._seq_len)
            self.inv_freq = inv_freq.to(device)
        self._tables.scale(self.attention_factor, clockwise=self.clockwise)
        self._tables.build(num_positions)

    def _apply(self, fn: Any, recurse: bool = True) -> RotaryEmbedding:
        super()._apply(fn, recurse)
        # a cast must not degrade the float64 frequencies or the float32 tables
        self.reset_tables()
        return self

    def _follow_length(
        self, positions: Tensor | None, n: int, eager: bool, largest: int | None = None
    ) -> None:
        """Frequencies that use the length (dynamic NTK, LongRoPE; HF's ``dynamic_rope_update``)
        changed, with the tables, when the largest position + 1 moves (``largest`` where the
        host knows it, else read); never inside a captured graph."""
        if not self.rope_spec.uses_length or not eager:
            return
        if positions is None or positions.is_meta or not positions.numel():
            seq_len = float(n)  # (meta positions have no largest value to read)
        else:
            seq_len = float((positions.max() if largest is None else largest) + 1)
        new = self.spec.next_length(self._seq_len, seq_len)
        if new != self._seq_len:
            self._seq_len = new
            self.reset_tables()

    def cos_sin(
        self, positions: Tensor | None, seq_len: int, *, dtype: torch.dtype, device: Any = None
    ) -> tuple[Tensor, Tensor]:
        """cos and sin (times the attention factor) for ``positions`` (``None``:
        ``arange(seq_len)``), ``(n, r/2)`` or ``(b, 1, n, r/2)`` (per-head frequencies:
        ``(H, n, r/2)`` or ``(b, H, n, r/2)``) in ``dtype``: what
        :meth:`forward` would rotate by now, made by the same code (lengths followed too)."""
        batch = positions.shape[0] if isinstance(positions, Tensor) and positions.dim() == 2 else 1
        plan = select(self.inv_freq, inplace=False, positions=positions, kernel=False)  # (the mode)
        return self._cos_sin(positions, batch, seq_len, dtype, device, plan)

    def position_state(self, positions: Tensor | None, x: Tensor) -> RotaryState:
        """cos and sin computed once for every layer of a forward (see :class:`RotaryState`)."""
        return self.read_state(positions, x, {}, queries=x.shape[1], keys=x.shape[1])

    def context_state(
        self,
        positions: Tensor,
        key_positions: Tensor,
        x: Tensor,
        memo: dict[str, Any],
        *,
        bound: PositionBound | None = None,
    ) -> RotaryState:
        """:meth:`position_state` for a cached or packed forward: nothing is read where the
        host knows a ``bound`` (:func:`~.tables.bounded_positions`), except by a rope type whose
        frequencies follow the length without an exact bound (read once per forward)."""
        n = x.shape[1]
        return self.read_state(positions, x, memo, queries=n, keys=n, bound=bound)

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
        """Every key read at ``key_positions`` ``(b, keys)`` (``None``: ``arange(keys)``), the
        queries by the last ``queries`` rows of the same tables: one set of frequencies for
        both (see :meth:`posenc.RotaryEncoding.read_state`)."""
        plan = select(
            x, inplace=False, learned=self.learned_freq, positions=key_positions, kernel=False
        )
        read = None
        if key_positions is not None:
            read = bounded_positions(key_positions, bound, plan.eager)
        exact = bound.largest if read is not None and bound is not None and bound.exact else None
        work, b = compute_dtype(x.dtype), x.shape[0]
        cos, sin = self._cos_sin(key_positions, b, keys, work, x.device, plan, read, exact)
        heads = None if self.heads.trivial else self.heads
        if queries == keys:
            return TableRotation(self.interleaved, (cos, sin), (cos, sin), heads)
        query = cos[..., keys - queries :, :], sin[..., keys - queries :, :]
        return TableRotation(self.interleaved, query, (cos, sin), heads)

    def _cos_sin(
        self,
        positions: Tensor | None,
        batch: int,
        n: int,
        dtype: torch.dtype,
        device: Any,
        plan: Plan,
        read: tuple[Tensor | None, Extent | None] | None = None,
        largest: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The tables of :meth:`cos_sin` for the selector's ``plan``: ``positions`` validated
        (unless ``read`` has them), the length followed (to ``largest`` + 1 where known)."""
        eager = plan.eager
        if read is None:
            read = self._tables.read(positions, n, batch, device, eager)
        positions, extent = read
        self._follow_length(positions, n, eager, largest)
        freq = self.freq if self.learned_freq else self._buffers["inv_freq"]
        cos, sin = self._tables.rows(positions, n, dtype, device, extent, eager, freq)
        if self.heads.table_heads is None:
            return cos, sin
        return head_axis(cos, self.heads.table_heads), head_axis(sin, self.heads.table_heads)

    def rotate(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        *,
        position_ids: Tensor | None = None,
        inplace: bool = False,
        layout: Layout = "bhsd",
        cu_seqlens: Tensor | None = None,
        seqlen_offsets: int | Tensor = 0,
        max_seqlen: int | None = None,
        query_heads: int | None = None,
    ) -> Tensor:
        """Rotate one tensor (queries, or keys for a KV cache) in ``layout`` (as
        :meth:`forward`); with ``inplace=True`` in its own storage, returning ``x``.
        ``query_heads``: where ``x`` holds the keys of grouped-query attention and only some
        heads turn or the frequencies are per head, the query heads of that attention (a
        multiple of ``x``'s heads; default: ``x``'s heads, as for queries)."""
        positions = take_position_ids(positions, position_ids)
        stated = stated_layout(x, None, positions, layout, cu_seqlens, seqlen_offsets, max_seqlen)
        if stated is not None:
            turned = self.rotate(
                stated.q, stated.positions, inplace=inplace, query_heads=query_heads
            )
            return stated.one(turned)
        x, _ = check_qk(x, x, self.head_dim)
        inplace = check_bool("inplace", inplace)
        group = heads_group(query_heads, x.shape[1])
        plan = select(x, inplace=inplace, learned=self.learned_freq, positions=positions)
        work = compute_dtype(x.dtype)
        tables = self._cos_sin(positions, x.shape[0], x.shape[2], work, x.device, plan)
        if self.heads.trivial:
            return apply_tables(x, tables, self.interleaved, inplace, "x", plan)
        return self.heads.apply_one(x, tables, group, self.interleaved, inplace, plan)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        positions: Tensor | None = None,
        *,
        position_ids: Tensor | None = None,
        inplace: bool = False,
        layout: Layout = "bhsd",
        cu_seqlens: Tensor | None = None,
        seqlen_offsets: int | Tensor = 0,
        max_seqlen: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Rotate queries and keys by positions ``(n,)`` or ``(b, n)`` (``position_ids``: the
        same). ``layout`` (:mod:`~.layouts`): ``"bhsd"`` ``(b, h, n, d)``, ``"bshd"``
        ``(b, n, h, d)``, ``"thd"`` ``(t, h, d)`` with ``cu_seqlens``, ``seqlen_offsets`` and
        ``max_seqlen`` as flash-attention's ``apply_rotary_emb`` takes them. Returns new
        ``(q, k)``, or with ``inplace=True`` ``q`` and ``k`` themselves rotated in their own
        storage (any strided views; :func:`apply_rotary_` says when autograd allows it)."""
        positions = take_position_ids(positions, position_ids)
        stated = stated_layout(q, k, positions, layout, cu_seqlens, seqlen_offsets, max_seqlen)
        if stated is not None:
            return stated.pair(self(stated.q, stated.k, stated.positions, inplace=inplace))
        q, k = check_qk(q, k, self.head_dim)
        inplace = check_bool("inplace", inplace)
        plan = select(q, inplace=inplace, learned=self.learned_freq, pair=k, positions=positions)
        b, _, n, _ = q.shape
        read = self._tables.read(positions, n, b, q.device, plan.eager)
        heads = self.heads
        if heads.trivial:
            pair = self._tables.turn_at_rows(q, k, read, self.interleaved, inplace, plan)
            if pair is not None:
                return pair
        else:
            heads.pair(q, k)  # (refused before any work where the heads do not fit)
        work = compute_dtype(q.dtype)
        if k.dtype != q.dtype:
            work = torch.promote_types(work, compute_dtype(k.dtype))
        tables = self._cos_sin(positions, b, n, work, q.device, plan, read)
        if heads.trivial:
            return apply_tables_qk(q, k, tables, tables, self.interleaved, inplace, plan)
        return heads.apply_pair(q, k, tables, tables, self.interleaved, inplace, plan)

    def extra_repr(self) -> str:
        text = self.spec.summary()
        if self._given is not None:
            text = text.replace(f", base={self.base:g}", "")
            text += f", inv_freq={tuple(self._given.shape)}"
        elif self.bases is not None:
            text = text.replace(f"base={self.base:g}", f"base={self.bases}")
        return text + self.heads.summary()

    def with_scaling(
        self,
        scaling: Mapping[str, Any] | None,
        *,
        original_max_position_embeddings: int | None = None,
    ) -> RotaryEmbedding:
        """A new rotary embedding with this one's settings and device and ``scaling`` in place
        of its own: see :func:`~.rope_build.rope_with_scaling`.

        >>> rope = RotaryEmbedding(8)
        >>> rope.with_scaling({"rope_type": "linear", "factor": 4.0}).inv_freq.tolist()
        [0.25, 0.025, 0.0025, 0.00025]
        """
        plain = (RotaryEmbedding, InterleavedRotaryEmbedding)
        return rope_with_scaling(self, scaling, original_max_position_embeddings, plain)


@register("rope-interleaved", "rotary embedding, interleaved layout (GPT-J / RoFormer)")
class InterleavedRotaryEmbedding(RotaryEmbedding):
    """:class:`RotaryEmbedding` with ``interleaved=True`` (pairs ``(x[2i], x[2i+1])``), as in
    GPT-J, the RoFormer paper and rotary-embedding-torch."""

    def __init__(self, head_dim: int, **kwargs: Any) -> None:
        kwargs.setdefault("interleaved", True)
        super().__init__(head_dim, **kwargs)
