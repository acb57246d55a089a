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

Precision: angles are formed in float64 from float64 frequencies and cast once, so cos/sin are
within float32 rounding at any position; the cached tables stay float32 after
``module.to(torch.bfloat16)`` (``_apply`` rebuilds them); bf16/fp16 queries and keys are
rotated in float32 and cast back once.

The arithmetic lives in ``kernels/``: ``rotate.py`` (the float64 reference formula and the
entry points), three kernels behind one interface (``native.py``, the C kernel
``_rotary_native.c`` compiled at install time by ``setup.py`` where a C compiler exists;
``pytorch.py``, the tiled pure-torch path; ``triton_kernel.py``, Triton on CUDA) and
``ops.py`` (inside ``torch.compile`` and ``torch.export`` the rotation is one custom operator,
``posenc::rotary``, in place ``posenc::rotary_``). The mode and the kernel are decided once
per call by :func:`~posenc.encodings.rotary.kernels.select.select`; the forward, the position reader
and the tables act on its answer. Every module takes ``inplace=True`` to rotate ``q`` and
``k`` in their own storage (:func:`apply_rotary_`). A call with one or a few integer positions
(decoding with a KV cache) reads the positions once and rotates with its rows of the cached
table where they lie. In a cached or packed forward of a model nothing is read: the tables
are sized from the bound on the positions the host knows (:meth:`context_state`), so that on
CUDA a decode step does not synchronise. See ``benchmarks/rope.md`` (CPU) and
``benchmarks/gpu.md``.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim, ``r`` rotary dim,
``a`` number of axes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ...errors import PosencTypeError, PosencValueError, check_bytes
from ..base import RotaryEncoding
from ..checks import PositionBound, check_bool, compute_dtype
from ..registry import register
from ..rope_types.registry import RopeType
from ..state import RotaryState
from .common import check_qk, rotary_state, rotate_one, rotate_qk
from .kernels.rotate import rotate_pair_function
from .kernels.select import Mode, Plan, select
from .spec import RotarySpec
from .tables import Extent, RotaryTables, bounded_positions, read_positions

PAPER = "Su et al. 2021, RoFormer: Enhanced Transformer with Rotary Position Embedding, eq. 15"

__all__ = ["RotaryEmbedding"]

#: The classes :meth:`RotaryEmbedding.from_hf_config` builds besides its own: ``"mrope"``, for a
#: multimodal-RoPE config (arguments naming ``mrope_section``), registered by
#: :mod:`~.multimodal`, which derives it from :class:`RotaryEmbedding`.
HF_CLASSES: dict[str, type[RotaryEmbedding]] = {}


def _hf_class(cls: type[RotaryEmbedding], arguments: Mapping[str, Any]) -> type[RotaryEmbedding]:
    """The class to build ``arguments`` read from a config with: ``cls``, or the multimodal
    class where they name ``mrope_section`` and ``cls`` is not one already."""
    multimodal = HF_CLASSES.get("mrope")
    if "mrope_section" in arguments and multimodal and not issubclass(cls, multimodal):
        return multimodal
    return cls


# --------------------------------------------------------------------------- RoPE


@register("rope", "rotary embedding, half layout (GPT-NeoX / Llama), with HF scaling")
class RotaryEmbedding(RotaryEncoding):
    """Rotary position embedding (Su et al. 2021, eq. 15), with Hugging Face's context
    extensions.

    Checked against transformers' ``LlamaRotaryEmbedding`` / ``apply_rotary_pos_emb`` and
    ``modeling_rope_utils`` for every ``rope_type``, against rotary-embedding-torch for the
    interleaved layout, and against a float64 transcription of eq. 15.

    Args:
        head_dim: channels per head ``d``.
        base: the wavelength base θ (10000 in the paper; ``rope_theta`` in HF configs).
        rotary_dim: channels rotated, ``r <= d`` and even (default ``d``); the rest pass
            through.
        interleaved: GPT-J / RoFormer pairs ``(2i, 2i+1)`` instead of the half layout.
        clockwise: turn each pair by ``-angle``, as NanoChat does (its ``rotate_half``
            returns ``cat(x2, -x1)``): position ``p`` turns as ``-p`` would otherwise.
        scaling: a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict, e.g.
            ``{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}``
            (types: ``default linear ntk dynamic yarn longrope llama3``, and any added with
            :func:`~posenc.register_rope_type`). A ``rope_theta`` or
            ``partial_rotary_factor`` in it sets ``base`` / ``rotary_dim``.
        max_position_embeddings: the model's context length (HF's config field): fills a
            missing ``original_max_position_embeddings`` (``dynamic`` needs one of the two).
        learned_freq: make the frequencies a trainable parameter (no cached tables).

    Positions are ``(n,)`` or ``(b, n)``, integer or float, defaulting to ``arange(n)``;
    integer positions read cached float32 cos/sin tables (grown on demand), float positions
    are evaluated in float64.

    Dynamic NTK's base grows with the longest call past the original context, as in Hugging
    Face (:meth:`RotarySpec.next_length`). Keys cached in an earlier call were rotated with
    the old base: their scores against new queries are no longer a function of ``m - n``
    alone (``tests/encodings/rotary/test_rope.py``). Re-rotate the cache (keep keys unrotated and
    call :meth:`rotate`) if that matters.

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
    #: The softmax scale of the attention this rotation belongs to, where the rotary config
    #: changes it (:meth:`from_hf_config`: DeepSeek's YaRN ``mscale_all_dim``); ``None``: the
    #: attention's own ``1 / sqrt(head_dim)``. Not used by the rotation itself.
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
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        #: The checked, normalised settings (one frozen record; see :class:`RotarySpec`).
        self.spec = RotarySpec.build(
            head_dim,
            base=base,
            rotary_dim=rotary_dim,
            interleaved=interleaved,
            clockwise=clockwise,
            scaling=scaling,
            max_position_embeddings=max_position_embeddings,
        )
        check_bytes("head_dim", head_dim, head_dim * 8 * 4, device=device)  # the frequencies
        spec = self.spec
        self.head_dim, self.rotary_dim, self.base = spec.head_dim, spec.rotary_dim, spec.base
        self.interleaved, self.clockwise = spec.interleaved, spec.clockwise
        self.max_position_embeddings = spec.max_position_embeddings
        #: The validated scaling parameters, ``rope_type`` included (read-only).
        self.scaling: Mapping[str, Any] = spec.scaling
        self.rope_type: str = spec.rope_type
        #: The record of ``rope_type`` (how its frequencies depend on the length).
        self.rope_spec: RopeType = spec.record
        if learned_freq and self.rope_spec.uses_length:
            raise PosencValueError(
                f"learned_freq cannot be combined with rope_type {self.rope_type!r}"
            )
        self.learned_freq = bool(learned_freq)
        # The length the frequencies were made for: grows with dynamic NTK, picks longrope's
        # long factors; None means "the initial state".
        self._seq_len: float | None = None
        inv_freq, self.attention_factor = spec.frequencies(None)
        inv_freq = inv_freq.to(device)
        if self.learned_freq:
            self.freq = nn.Parameter(inv_freq.float())
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        #: The cached float32 cos/sin (the buffers ``cos_cached``/``sin_cached``) and the
        #: formula where no table applies.
        self._tables = RotaryTables(
            self,
            self.rotary_dim,
            caches=self.rope_spec.caches_table and not self.learned_freq,
            initial_size=self.initial_table_size,
            max_positions=max_position_embeddings,
            device=device,
        )
        # a decode step reads the table where it lies unless the frequencies move with it
        self._decode_lane = self._tables.caches and not self.rope_spec.uses_length
        self.reset_tables()  # built now, so that a compiled forward reads a table that stays

    @classmethod
    def from_hf_config(
        cls, config: Any, *, layer_type: str | None = None, strict: bool = False, **kwargs: Any
    ) -> RotaryEmbedding:
        """Build the rotary embedding a transformers model config describes, so that rotating
        ``q, k`` of shape ``(b, h, n, head_dim)`` gives what that model's own code gives.

        ``config`` is a ``PretrainedConfig`` or a ``config.json`` dict, read as
        :mod:`posenc.hf.config` tabulates; per-layer RoPE (Gemma 3) needs
        ``layer_type``. A ``model_type`` outside ``KNOWN_MODEL_TYPES`` (each
        checked against its own transformers code) is read from the generic fields with a
        one-time ``UserWarning``, or refused with ``strict=True``. Where transformers writes
        an interleaved rotation de-interleaved (``rope_interleave=True``, DeepSeek-V3 family,
        ``DEINTERLEAVED_MODEL_TYPES``) this module rotates the same pairs in place: ``q @ k^T``
        is equal. For multi-head latent attention ``head_dim`` is ``qk_rope_head_dim``.

        ``kwargs`` go to the constructor and override what the config says (e.g. ``device``).
        Raises :class:`~posenc.errors.PosencValueError` naming the field and its value for a
        config it cannot map exactly (no rotary embedding, contradicting fields, an odd or
        oversized rotary dimension, an unknown ``rope_type`` or key). A multimodal-RoPE config
        (Qwen2-VL, Qwen3-VL, GLM-4V, ...) gives a :class:`~posenc.MultimodalRotaryEmbedding`.

        Where the rotary config changes the attention's softmax scale (DeepSeek-V2/V3 and
        their kin: YaRN with ``mscale_all_dim`` multiplies ``qk_head_dim ** -0.5`` by
        ``yarn_get_mscale(factor, mscale_all_dim) ** 2``), the module's :attr:`softmax_scale`
        holds that scale; elsewhere it is ``None``.
        """
        from ...hf.config import (  # the one call up to posenc.hf
            rotary_arguments_from_hf_config,
            softmax_scale_from_hf_config,
        )

        arguments = rotary_arguments_from_hf_config(config, layer_type=layer_type, strict=strict)
        softmax_scale = softmax_scale_from_hf_config(config, layer_type=layer_type)
        arguments.update(kwargs)
        head_dim = arguments.pop("head_dim")
        module = _hf_class(cls, arguments)(head_dim, **arguments)
        module.softmax_scale = softmax_scale
        return module

    def reset_tables(self, num_positions: int | None = None) -> None:
        """Recompute the frequencies (float64) and the float32 cos/sin tables on the module's
        device; ``num_positions`` rows (default: as many as now, and at least
        :attr:`initial_table_size` where the module reads a table: fixed frequencies whose
        rope type caches one (not dynamic NTK), within the memory budget). Called at
        construction, after ``.to()``, ``to_empty``, a change of a length-dependent type's
        frequencies, and when a position is past the table's end."""
        device = self.cos_cached.device
        if device.type == "meta":
            return
        if not self.learned_freq:
            inv_freq, self.attention_factor = self.spec.frequencies(self._seq_len)
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
        """Rope types whose frequencies use the current length (dynamic NTK, LongRoPE; HF's
        ``dynamic_rope_update``): change the frequencies, and the tables, when it moves. Not
        inside a captured graph (``eager`` false), which must not change the module. The
        length is the largest position + 1: ``largest`` where the host knows it exactly, else
        read (one read per forward)."""
        if not self.rope_spec.uses_length or not eager:
            return
        if positions is not None and (positions.is_meta or not positions.numel()):
            positions = None  # meta positions have no largest value to read: use the length
        if positions is None:
            seq_len = float(n)
        elif largest is not None:
            seq_len = float(largest + 1)
        else:
            seq_len = float(positions.max() + 1)
        new = self.spec.next_length(self._seq_len, seq_len)
        if new != self._seq_len:
            self._seq_len = new
            self.reset_tables()

    def cos_sin(
        self, positions: Tensor | None, seq_len: int, *, dtype: torch.dtype, device: Any = None
    ) -> tuple[Tensor, Tensor]:
        """cos and sin (times the attention factor) for ``positions`` (``None``:
        ``arange(seq_len)``), as ``(n, r/2)`` or ``(b, 1, n, r/2)`` in ``dtype``: the tables
        :meth:`forward` would rotate by if called now with the same positions, made by the
        same code (dynamic NTK and LongRoPE first follow the length, as that forward would)."""
        batch = positions.shape[0] if isinstance(positions, Tensor) and positions.dim() == 2 else 1
        # (only whether the call is eager matters here: the frequencies stand in for q)
        plan = select(
            self.inv_freq,
            inplace=False,
            learned=self.learned_freq,
            positions=positions,
            kernel=False,
        )
        return self._cos_sin(positions, batch, seq_len, dtype, device, plan)

    def position_state(self, positions: Tensor | None, x: Tensor) -> RotaryState:
        """cos and sin computed once for every layer of a forward (see :class:`RotaryState`)."""
        return self._state(positions, x, None)

    def context_state(
        self,
        positions: Tensor,
        key_positions: Tensor,
        x: Tensor,
        memo: dict[str, Any],
        *,
        bound: PositionBound | None = None,
    ) -> RotaryState:
        """:meth:`position_state` for a cached or packed forward (:mod:`posenc.sequence.context`).
        Nothing is read where the host knows a ``bound``: the tables grow to it
        (:func:`~.tables.bounded_positions`), so that on CUDA a decode step does not
        synchronise. A rope type whose frequencies
        follow the length (dynamic NTK, LongRoPE) needs the largest position itself: from an
        exact bound (a prompt, positions a user gave), else read once per forward."""
        return self._state(positions, x, bound)

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
        """Every key read at ``key_positions`` ``(b, keys)`` (``None``: ``arange(keys)``),
        and the queries by the last ``queries`` rows of the same tables, so that both use
        one set of frequencies (dynamic NTK and LongRoPE follow the largest key position);
        see :meth:`posenc.RotaryEncoding.read_state`."""
        plan = select(
            x, inplace=False, learned=self.learned_freq, positions=key_positions, kernel=False
        )
        work = compute_dtype(x.dtype)
        read = None
        if key_positions is not None:
            read = bounded_positions(key_positions, bound, plan.eager)
        exact = bound.largest if read is not None and bound is not None and bound.exact else None
        b = x.shape[0]
        cos, sin = self._cos_sin(key_positions, b, keys, work, x.device, plan, read, largest=exact)
        query = cos[..., keys - queries :, :], sin[..., keys - queries :, :]
        return rotary_state(self.interleaved, query, (cos, sin))

    def _state(
        self, positions: Tensor | None, x: Tensor, bound: PositionBound | None
    ) -> RotaryState:
        """The rotation of :meth:`position_state` and :meth:`context_state`."""
        plan = select(
            x, inplace=False, learned=self.learned_freq, positions=positions, kernel=False
        )
        work = compute_dtype(x.dtype)
        read = None if positions is None else bounded_positions(positions, bound, plan.eager)
        exact = bound.largest if read is not None and bound is not None and bound.exact else None
        b, n = x.shape[0], x.shape[1]
        tables = self._cos_sin(positions, b, n, work, x.device, plan, read, largest=exact)
        return rotary_state(self.interleaved, tables, tables)

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
        """Validate ``positions`` (unless ``read`` has them), follow the length (to
        ``largest`` + 1 where the host knows it), and return the tables of :meth:`cos_sin`,
        acting on the selector's ``plan``."""
        eager = plan.eager
        if read is None:
            read = read_positions(positions, n, batch, device, eager)
        positions, extent = read
        self._follow_length(positions, n, eager, largest)
        freq = self.freq if self.learned_freq else self._buffers["inv_freq"]
        return self._tables.rows(positions, n, dtype, device, extent, eager, freq)

    def rotate(
        self, x: Tensor, positions: Tensor | None = None, *, inplace: bool = False
    ) -> Tensor:
        """Rotate one tensor ``(b, h, n, d)`` (queries, or keys for a KV cache); with
        ``inplace=True`` in its own storage, returning ``x``."""
        x, _ = check_qk(x, x, self.head_dim)
        inplace = check_bool("inplace", inplace)
        plan = select(x, inplace=inplace, learned=self.learned_freq, positions=positions)
        work = compute_dtype(x.dtype)
        tables = self._cos_sin(positions, x.shape[0], x.shape[2], work, x.device, plan)
        return rotate_one(x, tables, self.interleaved, inplace, "x", plan)

    def forward(
        self, q: Tensor, k: Tensor, positions: Tensor | None = None, *, inplace: bool = False
    ) -> tuple[Tensor, Tensor]:
        """Rotate queries and keys by their positions.

        Shapes:
            q: ``(b, hq, n, d)``; k: ``(b, hk, n, d)``; positions: ``(n,)`` or ``(b, n)``.
            Returns new ``(q, k)`` of the same shapes and dtypes, or with ``inplace=True``
            ``q`` and ``k`` themselves, rotated in their own storage (any strided views, e.g.
            sliced from a fused qkv projection; see :func:`apply_rotary_` for when autograd
            allows it).
        """
        q, k = check_qk(q, k, self.head_dim)
        inplace = check_bool("inplace", inplace)
        plan = select(q, inplace=inplace, learned=self.learned_freq, pair=k, positions=positions)
        b, _, n, _ = q.shape
        read = read_positions(positions, n, b, q.device, plan.eager)
        if positions is None and n:
            read = None, (0, n - 1, True)  # (the default arange: one run from row 0)
        lane = plan.mode is Mode.EAGER or (plan.mode is Mode.FUNCTION and not inplace)
        if lane and self._decode_lane:  # rows of the table where they lie
            # one run p, p+1, ... (a decode step): its first row; other integer positions in
            # the table: the positions, for a kernel that indexes rows on the device
            rows = self._tables.first_row(read[1], n, q.device)
            given = read[0]
            if (
                rows is None
                and given is not None
                and given.dtype in (torch.int64, torch.int32)
                and given.device == q.device
                and self._tables.in_table(read[1], q.device)
            ):
                rows = given
            if rows is not None:
                buffers = self._buffers
                cos, sin = buffers["cos_cached"], buffers["sin_cached"]
                if plan.mode is Mode.EAGER:
                    kernel = plan.kernel
                    assert kernel is not None
                    pair = kernel.rotate_pair(q, k, cos, sin, self.interleaved, inplace, rows)
                else:  # under autograd: one node, its backward the same kernel clockwise
                    pair = rotate_pair_function(
                        q, k, cos, sin, self.interleaved, inplace, plan, rows
                    )
                if pair is not None:
                    return pair
        work = compute_dtype(q.dtype)
        if k.dtype != q.dtype:
            work = torch.promote_types(work, compute_dtype(k.dtype))
        tables = self._cos_sin(positions, b, n, work, q.device, plan, read)
        return rotate_qk(q, k, tables, tables, self.interleaved, inplace, plan)

    def extra_repr(self) -> str:
        text = f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base:g}"
        if self.interleaved:
            text += ", interleaved=True"
        if self.clockwise:
            text += ", clockwise=True"
        if self.rope_type != "default":
            text += f", scaling={dict(self.scaling)}"
        return text

    def with_scaling(
        self,
        scaling: Mapping[str, Any] | None,
        *,
        original_max_position_embeddings: int | None = None,
    ) -> RotaryEmbedding:
        """A new rotary embedding with this one's ``head_dim``, ``base``, ``rotary_dim``,
        layout, ``clockwise``, ``max_position_embeddings`` and device, and ``scaling`` in place
        of its own (``None``: plain RoPE). This module is left as it is.
        ``original_max_position_embeddings``: the context the model was trained at, filled in
        where the new type needs an original context and ``scaling`` lacks one.

        This is how a RoPE model trained at length ``L`` is evaluated with a context
        extension (position interpolation, dynamic NTK, YaRN) without retraining; for a whole
        model see :meth:`posenc.Encoder.with_rope_scaling`.

        >>> rope = RotaryEmbedding(8)
        >>> rope.with_scaling({"rope_type": "linear", "factor": 4.0}).inv_freq.tolist()
        [0.25, 0.025, 0.0025, 0.00025]
        """
        if type(self) not in (RotaryEmbedding, InterleavedRotaryEmbedding):
            raise PosencTypeError(
                f"with_scaling rebuilds a RotaryEmbedding; {type(self).__name__} has settings "
                "of its own that it would lose"
            )
        if self.learned_freq:
            raise PosencValueError(
                "with_scaling: learned_freq=True frequencies are trained, not derived from a "
                "scaling"
            )
        spec = self.spec.with_scaling(scaling, original=original_max_position_embeddings)
        new = RotaryEmbedding(**spec.arguments(), device=self.inv_freq.device)
        return new.train(self.training)


@register("rope-interleaved", "rotary embedding, interleaved layout (GPT-J / RoFormer)")
class InterleavedRotaryEmbedding(RotaryEmbedding):
    """:class:`RotaryEmbedding` with ``interleaved=True`` (pairs ``(x[2i], x[2i+1])``), as in
    GPT-J, the RoFormer paper and rotary-embedding-torch."""

    def __init__(self, head_dim: int, **kwargs: Any) -> None:
        kwargs.setdefault("interleaved", True)
        super().__init__(head_dim, **kwargs)
