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
angles as ``(..., n, r/2)``. The modules differ only in how they form the angles:

* :class:`RotaryEmbedding`: ``positions * inv_freq``, with the Hugging Face context
  extensions (``rope_scaling.py``) and their attention factor folded into cos and sin;
* :class:`XPos`: RoPE plus the per-pair exponential decay of Sun et al. 2022;
* :class:`AxialRotaryEmbedding`: per-axis frequencies on N-D coordinates (2-D images,
  3-D video), each pair rotating with one axis's coordinate.

Precision: angles are formed in float64 from float64 frequencies and cast once, so cos/sin are
within float32 rounding at any position; the cached tables stay float32 after
``module.to(torch.bfloat16)`` (``_apply`` rebuilds them); bf16/fp16 queries and keys are
rotated in float32 and cast back once.

The arithmetic lives in ``rotate.py``: the float64 reference formula; the native kernel
(``_rotary_native.c``, compiled at install time by ``setup.py`` where a C compiler exists);
and the blocked pure-torch path where it is not built. Inside ``torch.compile`` and
``torch.export`` the rotation is one custom operator (``posenc::rotary``, in place
``posenc::rotary_``). Every module takes ``inplace=True`` to rotate ``q`` and ``k`` in their
own storage (:func:`apply_rotary_`). A call with one or a few integer positions (decoding
with a KV cache) reads the positions once and rotates with its rows of the cached table
where they lie. See ``benchmarks/rope.md``.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim, ``r`` rotary dim,
``a`` number of axes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..errors import MemoryBudgetError, PosencTypeError, PosencValueError, check_bytes
from .base import (
    RotaryEncoding,
    check_bool,
    check_finite,
    check_positive_float,
    check_positive_int,
    compute_dtype,
    register,
    resolve_positions,
)
from .hf_config import rotary_arguments_from_hf_config
from .rope_scaling import (
    ROPE_TYPES,
    RopeType,
    default_inv_freq,
    rope_parameters,
    validate_rope_scaling,
)
from .rotate import (
    apply_rotary,
    apply_rotary_,
    check_inplace,
    fast_path_ok,
    rotate,
    rotate_pair,
    set_rotary_compile,
)
from .state import RotaryState

PAPER = "Su et al. 2021, RoFormer: Enhanced Transformer with Rotary Position Embedding, eq. 15"

__all__ = [
    "AxialRotaryEmbedding",
    "Rotary2DEmbedding",
    "Rotary3DEmbedding",
    "RotaryEmbedding",
    "XPos",
    "apply_rotary",
    "apply_rotary_",
    "set_rotary_compile",
]

# --------------------------------------------------------------------------- checks


def _check_qk(q: object, k: object, head_dim: int) -> tuple[Tensor, Tensor]:
    """q, k: ``(b, h, n, d)`` floating tensors with equal ``b``, ``n`` and ``d = head_dim``
    (head counts may differ, as in grouped-query attention)."""
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, Tensor):
            raise PosencTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise PosencTypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
        if t.dim() != 4:
            raise PosencValueError(
                f"{name} must have shape (batch, heads, seq, head_dim), got {tuple(t.shape)}"
            )
        if t.shape[-1] != head_dim:
            raise PosencValueError(f"{name} has head_dim {t.shape[-1]}, expected {head_dim}")
    assert isinstance(q, Tensor) and isinstance(k, Tensor)
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise PosencValueError(
            f"q and k must share batch and seq: q {tuple(q.shape)} vs k {tuple(k.shape)} "
            "(rotate cached keys separately with .rotate(k, positions))"
        )
    return q, k


def _check_rotary_dim(head_dim: int, rotary_dim: int | None, multiple: int = 2) -> int:
    check_positive_int("head_dim", head_dim)
    r = head_dim if rotary_dim is None else check_positive_int("rotary_dim", rotary_dim)
    if r > head_dim:
        raise PosencValueError(f"rotary_dim ({r}) must be <= head_dim ({head_dim})")
    if r % multiple:
        name = "head_dim" if rotary_dim is None else "rotary_dim"
        raise PosencValueError(
            f"{name} ({r}) must be divisible by {multiple} for rotary embeddings"
        )
    return r


def _check_base(base: object) -> float:
    base = check_positive_float("base", base)
    if base == 1.0:
        raise PosencValueError("base must not be 1.0 (every frequency would be equal)")
    return base


def _state(
    interleaved: bool, query: tuple[Tensor, Tensor], key: tuple[Tensor, Tensor]
) -> RotaryState:
    """A :class:`RotaryState` rotating queries by ``query`` = (cos, sin) and keys by ``key``."""

    def rotate(q: Tensor, k: Tensor, inplace: bool) -> tuple[Tensor, Tensor]:
        return _rotate_qk(q, k, query, key, interleaved, inplace)

    return RotaryState(rotate)


def _unsqueeze_heads(t: Tensor) -> Tensor:
    """``(n, r/2)`` stays; ``(b, n, r/2)`` -> ``(b, 1, n, r/2)`` to broadcast over heads."""
    return t.unsqueeze(-3) if t.dim() == 3 else t


def _rotate_one(
    x: Tensor, tables: tuple[Tensor, Tensor], interleaved: bool, inplace: object, name: str = "x"
) -> Tensor:
    """Rotate ``x`` by ``tables`` (``(cos, sin)`` made by the module, in the work dtype): into
    a new tensor, or in its own storage where :func:`check_inplace` allows."""
    if check_bool("inplace", inplace):
        check_inplace(x, *tables, name=name)
    return rotate(x, *tables, interleaved, bool(inplace))


def _rotate_qk(
    q: Tensor,
    k: Tensor,
    q_tables: tuple[Tensor, Tensor],
    k_tables: tuple[Tensor, Tensor],
    interleaved: bool,
    inplace: object,
) -> tuple[Tensor, Tensor]:
    """:func:`_rotate_one` for ``q`` and ``k``; in place, they must not start at the same
    memory (the second rotation would turn the first's result). With one pair of tables,
    :func:`rotate_pair` first (the eager call in one go)."""
    eager = not torch.compiler.is_compiling()  # (dynamo cannot trace ``is`` on tuples)
    if (inplace is False or inplace is True) and eager and q_tables is k_tables:
        pair = rotate_pair(q, k, *q_tables, interleaved, inplace)
        if pair is not None:
            return pair
    if inplace is True and (
        q is k or (fast_path_ok(q) and not q.is_meta and q.numel() and q.data_ptr() == k.data_ptr())
    ):
        raise PosencValueError(
            "q and k start at the same memory: rotating both in place would turn it twice; "
            "pass separate tensors or rotate out of place"
        )
    return (
        _rotate_one(q, q_tables, interleaved, inplace, "q"),
        _rotate_one(k, k_tables, interleaved, inplace, "k"),
    )


#: Integer dtypes whose positions :meth:`RotaryEmbedding.forward` validates in one read.
_INTEGER = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
#: Up to this many positions are read whole (one transfer), and a run ``p, p+1, ...`` is
#: taken from the table as a view instead of gathered.
_FEW_POSITIONS = 16


def _extent(positions: Tensor) -> tuple[int, int, bool]:
    """The smallest and largest of integer ``positions`` and whether they are one run
    ``lo, lo + 1, ...`` (1-D only), read from the device once."""
    if positions.numel() <= _FEW_POSITIONS:
        if positions.dim() == 1:
            values = positions.tolist()
            lo, hi = min(values), max(values)
            return lo, hi, hi - lo == len(values) - 1 and values == list(range(lo, hi + 1))
        values = positions.flatten().tolist()
        return min(values), max(values), False
    lo, hi = torch.aminmax(positions)
    return int(lo), int(hi), False


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

    Dynamic NTK (``rope_type="dynamic"``) follows Hugging Face: when a call's largest position
    ``p`` has ``p + 1`` beyond both the original context (``original_max_position_embeddings``,
    default ``max_position_embeddings``) and the longest length seen so far, the base grows to
    fit ``p + 1``; a call that fits in the original context again resets it. Keys cached in
    an earlier call were rotated with the old base: they no longer equal a recomputation with
    the new one, and their scores against new queries are no longer a function of ``m - n``
    alone (``tests/encodings/test_rotary.py`` shows both). Re-rotate the cache (keep keys
    unrotated and call :meth:`rotate`) if that matters.

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
        check_positive_int("head_dim", head_dim)
        check_bytes("head_dim", head_dim, head_dim * 8 * 4, device=device)  # the frequencies
        if max_position_embeddings is not None:
            check_positive_int("max_position_embeddings", max_position_embeddings)
        if scaling is not None and not isinstance(scaling, Mapping):
            raise PosencTypeError(f"scaling must be a dict or None, got {type(scaling).__name__}")
        scaling = dict(scaling or {})
        base = _check_base(base)
        theta = scaling.pop("rope_theta", None)
        if theta is not None:
            theta = _check_base(theta)
            if base not in (10000.0, theta):
                raise PosencValueError(f"base={base} conflicts with scaling['rope_theta']={theta}")
            base = theta
        factor = scaling.pop("partial_rotary_factor", None)
        if factor is not None:
            factor = check_positive_float("scaling['partial_rotary_factor']", factor)
            implied = int(head_dim * factor)
            if rotary_dim not in (None, implied):
                raise PosencValueError(
                    f"rotary_dim={rotary_dim} conflicts with partial_rotary_factor={factor} "
                    f"(head_dim * factor = {implied})"
                )
            rotary_dim = implied
        self.head_dim = head_dim
        self.rotary_dim = _check_rotary_dim(head_dim, rotary_dim)
        self.base = base
        self.interleaved = bool(interleaved)
        self.clockwise = check_bool("clockwise", clockwise)
        self.max_position_embeddings = max_position_embeddings
        self.scaling = validate_rope_scaling(
            scaling or None,
            rotary_dim=self.rotary_dim,
            max_position_embeddings=max_position_embeddings,
        )
        self.rope_type: str = self.scaling["rope_type"]
        #: The record of ``rope_type`` (how its frequencies depend on the length).
        self.rope_spec: RopeType = ROPE_TYPES[self.rope_type]
        if learned_freq and self.rope_spec.uses_length:
            raise PosencValueError(
                f"learned_freq cannot be combined with rope_type {self.rope_type!r}"
            )
        self.learned_freq = bool(learned_freq)
        # The length the frequencies were made for: grows with dynamic NTK, picks longrope's
        # long factors; None means "the initial state".
        self._seq_len: float | None = None
        inv_freq, self.attention_factor = self._frequencies(None, device)
        if self.learned_freq:
            self.freq = nn.Parameter(inv_freq.float())
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        half = self.rotary_dim // 2
        empty = torch.empty(0, half, dtype=torch.float32, device=device)
        self.register_buffer("cos_cached", empty, persistent=False)
        self.register_buffer("sin_cached", empty.clone(), persistent=False)
        self.reset_tables()  # built now, so that a compiled forward reads a table that stays

    @classmethod
    def from_hf_config(
        cls, config: Any, *, layer_type: str | None = None, strict: bool = False, **kwargs: Any
    ) -> RotaryEmbedding:
        """Build the rotary embedding a transformers model config describes, so that rotating
        ``q, k`` of shape ``(b, h, n, head_dim)`` gives what that model's own code gives.

        Reads every convention of transformers' configs (``hf_config.py`` has the table):
        ``head_dim`` or ``hidden_size // num_attention_heads``; the rotated part from
        ``partial_rotary_factor`` (Phi, StableLM, Persimmon, GLM), ``rotary_pct`` (GPT-NeoX) or
        ``rotary_dim`` (GPT-J, CodeGen); the base from ``rope_theta`` (in ``rope_parameters`` or
        at the top level) or ``rotary_emb_base``; the context extension from
        ``rope_parameters`` / ``rope_scaling``; the interleaved layout for GPT-J, CodeGen, GLM,
        Cohere and the other families in ``INTERLEAVED_MODEL_TYPES``; ``clockwise=True`` for
        NanoChat. ``config`` may also be a ``config.json`` dict. Per-layer RoPE (parameters
        nested by layer type, Gemma 3) needs ``layer_type``.

        No config field states the pair layout, so it comes from the ``model_type``: the types
        in ``KNOWN_MODEL_TYPES`` were each checked against their own transformers code (version
        ``CHECKED_TRANSFORMERS_VERSION``). Any other non-empty ``model_type`` is read from the
        generic fields with a one-time ``UserWarning`` (the layout and the fields read were not
        checked for it), or, with ``strict=True``, refused. A ``config.json`` dict without a
        ``model_type`` is read from the generic fields without a warning.

        With ``rope_interleave=True`` (DeepSeek-V3 family) and for the MLA models in
        ``DEINTERLEAVED_MODEL_TYPES`` (DeepSeek-V3.2, GLM-MoE-DSA, LongCat-Flash, ...)
        transformers rotates interleaved pairs but writes the result de-interleaved
        (``cat(x[0::2], x[1::2])`` order); this module returns the same rotation in place, so
        ``q @ k^T`` is equal and the channels are a fixed permutation of transformers'. For
        multi-head latent attention, ``head_dim`` is ``qk_rope_head_dim``: the module rotates
        the ``q_rot``/``k_rot`` slice.

        ``kwargs`` go to the constructor and override what the config says (e.g. ``device``).

        Raises :class:`~posenc.errors.PosencValueError` naming the field and its value for a
        config it cannot map exactly: no rotary embedding at all, fields that contradict each
        other, an odd or oversized rotary dimension, an unknown ``rope_type`` or key, multimodal
        RoPE, an unchecked ``model_type`` with ``strict=True``.
        """
        arguments = rotary_arguments_from_hf_config(config, layer_type=layer_type, strict=strict)
        arguments.update(kwargs)
        head_dim = arguments.pop("head_dim")
        return cls(head_dim, **arguments)

    # ------------------------------------------------------------------ frequencies

    def _frequencies(self, seq_len: float | None, device: Any) -> tuple[Tensor, float]:
        inv_freq, factor = rope_parameters(
            self.scaling,
            self.rotary_dim,
            self.base,
            max_position_embeddings=self.max_position_embeddings,
            seq_len=seq_len,
        )
        return inv_freq.to(device), factor

    def _table_rows(self, num_positions: int, device: Any) -> tuple[Tensor, Tensor]:
        positions = torch.arange(num_positions, dtype=torch.float64, device=device)
        angles = positions[:, None] * self.inv_freq.to(device, torch.float64)  # (n, r/2)
        return (
            (angles.cos() * self.attention_factor).float(),
            (angles.sin() * self._sin_factor()).float(),
        )

    def _sin_factor(self) -> float:
        """What sin is multiplied by: the attention factor, negated for ``clockwise``
        (``sin(-a) = -sin(a)``; ``cos`` is even)."""
        return -self.attention_factor if self.clockwise else self.attention_factor

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
        # tables built under inference_mode would be inference tensors, which a later
        # training step could not save for backward
        with torch.inference_mode(False):
            if not self.learned_freq:
                self.inv_freq, self.attention_factor = self._frequencies(self._seq_len, device)
            n = self.cos_cached.shape[0] if num_positions is None else num_positions
            reads_table = not self.learned_freq and self.rope_spec.caches_table
            if num_positions is None and reads_table and n < self.initial_table_size:
                n = self._table_rows_for(self.initial_table_size, 0, device) or n
            self.cos_cached, self.sin_cached = self._table_rows(n, device)

    def _apply(self, fn: Any, recurse: bool = True) -> RotaryEmbedding:
        super()._apply(fn, recurse)
        # a cast must not degrade the float64 frequencies or the float32 tables
        self.reset_tables()
        return self

    def _update_state(self, positions: Tensor | None, n: int) -> None:
        """Rope types whose frequencies use the current length (dynamic NTK, LongRoPE; HF's
        ``dynamic_rope_update``): change the frequencies, and drop the tables, when it moves."""
        spec = self.rope_spec
        if not spec.uses_length or torch.compiler.is_compiling():
            return
        if positions is not None and (positions.is_meta or not positions.numel()):
            positions = None  # meta positions have no largest value to read: use the length
        seq_len = float(n if positions is None else positions.max() + 1)
        original = self.scaling["original_max_position_embeddings"]
        if spec.switches_at_original:  # LongRoPE: only which side of the original context
            new = float(original + 1) if seq_len > original else None
        else:  # dynamic NTK: the longest length seen past the original context
            new = self._seq_len
            current = original if self._seq_len is None else self._seq_len
            if seq_len > current:  # grow
                new = seq_len
            if seq_len < original and current > original:  # back within the window: reset
                new = None
        if new != self._seq_len:
            self._seq_len = new
            self.reset_tables()

    def cos_sin(
        self, positions: Tensor | None, seq_len: int, *, dtype: torch.dtype, device: Any = None
    ) -> tuple[Tensor, Tensor]:
        """cos and sin (times the attention factor) for ``positions`` (``None``:
        ``arange(seq_len)``), as ``(n, r/2)`` or ``(b, 1, n, r/2)`` in ``dtype``
        (float32 for half-precision work, float64 when asked).

        These are the tables :meth:`forward` would rotate by if called now with the same
        positions, made by the same code: the positions are validated, and dynamic NTK and
        LongRoPE first pick their frequencies from them (which changes the module's state
        exactly as that forward would)."""
        batch = positions.shape[0] if isinstance(positions, Tensor) and positions.dim() == 2 else 1
        return self._tables(positions, batch, seq_len, dtype, device)

    def _cos_sin(
        self,
        positions: Tensor | None,
        seq_len: int,
        dtype: torch.dtype,
        device: Any,
        extent: tuple[int, int, bool] | None,
    ) -> tuple[Tensor, Tensor]:
        """:meth:`cos_sin`, given the :func:`_extent` of integer ``positions`` where known."""
        buffers = self._buffers  # (nn.Module's __getattr__ costs a microsecond a buffer)
        table_cos = buffers["cos_cached"]
        if (  # the common case first (a decode step): one run of rows already in the table
            extent is not None
            and extent[2]
            and extent[1] < table_cos.shape[0]
            and table_cos.dtype is dtype
            and self.rope_spec.caches_table
            and not self.learned_freq
            and not table_cos.is_meta
        ):
            lo = extent[0]
            table_sin = buffers["sin_cached"]
            return table_cos[lo : lo + seq_len], table_sin[lo : lo + seq_len]  # (n, r/2)
        device = table_cos.device if device is None else device
        if self.learned_freq:
            pos = torch.arange(seq_len, device=device) if positions is None else positions
            angles = pos.to(torch.float64)[..., None] * self.freq.to(torch.float64)
            return self._finish(angles, dtype)
        # dynamic NTK changes its frequencies as the length grows: no table to rebuild then
        table_ok = (
            dtype != torch.float64
            and self.rope_spec.caches_table
            # a meta module has no table to read, and meta positions no largest value
            and not table_cos.is_meta
            and not (positions is not None and positions.is_meta)
        )
        if torch.compiler.is_compiling():  # dynamo must not grow the cache, only read it
            if table_ok and positions is None and seq_len <= table_cos.shape[0]:
                # rows of the table are one input of the graph; the formula would instead be
                # fused into (and recomputed by) every use, q's and k's rotation alike
                cos, sin = table_cos[:seq_len].to(dtype), self.sin_cached[:seq_len].to(dtype)
                return cos, sin  # (n, r/2)
            table_ok = False
        if positions is not None and (positions.is_floating_point() or not table_ok):
            angles = positions.to(torch.float64)[..., None] * self.inv_freq.to(torch.float64)
            return self._finish(angles, dtype)
        if positions is None and not table_ok:
            angles = torch.arange(seq_len, dtype=torch.float64, device=device)[:, None]
            return self._finish(angles * self.inv_freq.to(torch.float64), dtype)
        if positions is None or not positions.numel():
            needed = seq_len
        else:
            needed = (int(positions.max()) if extent is None else extent[1]) + 1
        if needed > table_cos.shape[0]:
            rows = self._table_rows_for(needed, seq_len, device)
            if rows is None:
                # a far position (one new token at 10^9 in a long KV cache): the angles of
                # the positions asked for, never a table up to the largest one
                pos = torch.arange(seq_len, device=device) if positions is None else positions
                angles = pos.to(torch.float64)[..., None] * self.inv_freq.to(torch.float64)
                return self._finish(angles, dtype)
            self.reset_tables(rows)
            table_cos = self.cos_cached
        table_sin = self.sin_cached
        if positions is None:
            cos, sin = table_cos[:seq_len], table_sin[:seq_len]  # (n, r/2)
        elif extent is not None and extent[2]:  # one run p, p+1, ...: rows of the table, views
            lo = extent[0]
            cos, sin = table_cos[lo : lo + seq_len], table_sin[lo : lo + seq_len]
        else:
            cos, sin = table_cos[positions], table_sin[positions]  # (..., n, r/2)
        if cos.dtype != dtype:
            cos, sin = cos.to(dtype), sin.to(dtype)
        return _unsqueeze_heads(cos), _unsqueeze_heads(sin)

    def _table_rows_for(self, needed: int, seq_len: int, device: Any) -> int | None:
        """Rows to grow the cached tables to so that they cover ``needed`` positions for a
        request of ``seq_len``, or ``None`` to compute the angles of the positions given
        instead (the same values: float64 angles, cos/sin, cast once). Tables grow by doubling
        but stay in proportion to the work: at most the first :attr:`initial_table_size`
        rows, the model's context, or four times the request, and within the memory budget."""
        limit = max(self.initial_table_size, self.max_position_embeddings or 0, 4 * seq_len)
        if needed > limit:
            return None
        rows = min(max(needed, self.initial_table_size, 2 * self.cos_cached.shape[0]), limit)
        # float32 cos and sin tables, plus the float64 angles, cos and sin while building
        nbytes = rows * (self.rotary_dim // 2) * (2 * 4 + 3 * 8)
        try:
            check_bytes("positions", f"up to {rows - 1}", nbytes, device=device)
        except MemoryBudgetError:
            return None
        return rows

    def _finish(self, angles: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        cos = (angles.cos() * self.attention_factor).to(dtype)
        sin = (angles.sin() * self._sin_factor()).to(dtype)
        return _unsqueeze_heads(cos), _unsqueeze_heads(sin)

    def position_state(self, positions: Tensor | None, x: Tensor) -> RotaryState:
        """cos and sin computed once for every layer of a forward (see :class:`RotaryState`)."""
        tables = self._tables(positions, x.shape[0], x.shape[1], compute_dtype(x.dtype), x.device)
        return _state(self.interleaved, tables, tables)

    # ------------------------------------------------------------------ forward

    def _positions(
        self, positions: Tensor | None, n: int, batch: int, device: Any
    ) -> Tensor | None:
        return self._positions_extent(positions, n, batch, device)[0]

    def _positions_extent(
        self, positions: Tensor | None, n: int, batch: int, device: Any
    ) -> tuple[Tensor | None, tuple[int, int, bool] | None]:
        """Validated positions (``None`` stays ``None``) and, for integer positions read in
        eager mode, their :func:`_extent`. The common case (an integer tensor of the right
        shape, nothing negative) costs one read; anything else goes through
        :func:`resolve_positions`, which names what is wrong."""
        if positions is None:
            return None, None
        if (
            isinstance(positions, Tensor)
            and positions.dtype in _INTEGER
            and positions.dim() in (1, 2)
            and positions.shape[-1] == n
            and (positions.dim() == 1 or positions.shape[0] in (1, batch))
            and positions.numel() > 0
            and not positions.is_meta
            and fast_path_ok(positions)
        ):
            extent = _extent(positions)
            if extent[0] >= 0:
                return positions, extent
        return resolve_positions(positions, n, batch=batch, device=device), None

    def _first_row(self, positions: Tensor | None, n: int) -> int | None:
        """Where the rows of the cached float32 tables for ``positions`` start, when they are
        rows ``p, p + 1, ..., p + n - 1`` already there: ``positions`` is ``None`` or at most
        :data:`_FEW_POSITIONS` 1-D integer CPU positions making one run (a decode step). The
        forward then rotates with those rows where they lie, and nothing else is built or
        checked. ``None`` for anything else: the general path validates the positions (and
        names what is wrong), grows the tables or computes the angles."""
        if self.learned_freq or self.rope_spec.uses_length:
            return None  # (their tables move with the length, or there are none)
        table = self._buffers["cos_cached"]
        if positions is None:
            first = 0
        elif (
            type(positions) is Tensor
            and positions.dim() == 1
            and 0 < n <= _FEW_POSITIONS
            and positions.shape[0] == n
            and positions.dtype in _INTEGER
            and positions.is_cpu
            and fast_path_ok(positions)
        ):
            values = positions.tolist()
            first = values[0]
            if first < 0 or (n > 1 and values != list(range(first, first + n))):
                return None
        else:
            return None
        if first + n > table.shape[0] or table.dtype is not torch.float32 or not table.is_cpu:
            return None
        return first

    def _tables(
        self, positions: Tensor | None, batch: int, n: int, dtype: torch.dtype, device: Any
    ) -> tuple[Tensor, Tensor]:
        """Validate ``positions``, follow dynamic scaling, and return :meth:`cos_sin`."""
        positions, extent = self._positions_extent(positions, n, batch, device)
        self._update_state(positions, n)
        return self._cos_sin(positions, n, dtype, device, extent)

    def rotate(
        self, x: Tensor, positions: Tensor | None = None, *, inplace: bool = False
    ) -> Tensor:
        """Rotate one tensor ``(b, h, n, d)`` (queries, or keys for a KV cache); with
        ``inplace=True`` in its own storage, returning ``x``."""
        x, _ = _check_qk(x, x, self.head_dim)
        tables = self._tables(positions, x.shape[0], x.shape[2], compute_dtype(x.dtype), x.device)
        return _rotate_one(x, tables, self.interleaved, inplace)

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
        q, k = _check_qk(q, k, self.head_dim)
        first = self._first_row(positions, q.shape[2])
        if first is not None and (inplace is False or inplace is True):
            buffers = self._buffers
            cos, sin = buffers["cos_cached"], buffers["sin_cached"]
            pair = rotate_pair(q, k, cos, sin, self.interleaved, inplace, first)
            if pair is not None:
                return pair
        work = compute_dtype(q.dtype)
        if k.dtype != q.dtype:
            work = torch.promote_types(work, compute_dtype(k.dtype))
        tables = self._tables(positions, q.shape[0], q.shape[2], work, q.device)
        return _rotate_qk(q, k, tables, tables, self.interleaved, inplace)

    def extra_repr(self) -> str:
        text = f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base:g}"
        if self.interleaved:
            text += ", interleaved=True"
        if self.clockwise:
            text += ", clockwise=True"
        if self.rope_type != "default":
            text += f", scaling={self.scaling}"
        return text

    def with_scaling(self, scaling: Mapping[str, Any] | None) -> RotaryEmbedding:
        """A new rotary embedding with this one's ``head_dim``, ``base``, ``rotary_dim``,
        layout, ``clockwise``, ``max_position_embeddings`` and device, and ``scaling`` in place
        of its own (``None``: plain RoPE). This module is left as it is.

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
        new = RotaryEmbedding(
            self.head_dim,
            base=self.base,
            rotary_dim=self.rotary_dim,
            interleaved=self.interleaved,
            clockwise=self.clockwise,
            scaling=scaling,
            max_position_embeddings=self.max_position_embeddings,
            device=self.inv_freq.device,
        )
        return new.train(self.training)


@register("rope-interleaved", "rotary embedding, interleaved layout (GPT-J / RoFormer)")
class InterleavedRotaryEmbedding(RotaryEmbedding):
    """:class:`RotaryEmbedding` with ``interleaved=True`` (pairs ``(x[2i], x[2i+1])``), as in
    GPT-J, the RoFormer paper and rotary-embedding-torch."""

    def __init__(self, head_dim: int, **kwargs: Any) -> None:
        kwargs.setdefault("interleaved", True)
        super().__init__(head_dim, **kwargs)


# --------------------------------------------------------------------------- xPos


@register("xpos", "RoPE with per-pair exponential decay (length-extrapolatable)")
class XPos(RotaryEmbedding):
    """xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", eq. 9): RoPE with queries
    scaled by ``ζ_i^(m/γ)`` and keys by ``ζ_i^(-n/γ)``, so the score between positions ``m``
    and ``n`` decays like ``ζ_i^((m-n)/γ)``, where ``ζ_i = (2i/r + 0.4) / 1.4`` and
    ``γ = scale_base``.

    The exponent is taken relative to a centre, ``(p - center) / γ``, which cancels in every
    score but keeps the scales finite: by default ``center = (max position + 1) // 2`` of the
    call, as rotary-embedding-torch's ``use_xpos`` and x-transformers do (checked equal to
    rotary-embedding-torch in float32). With a KV cache, queries and keys rotated in different
    calls must share the centre: pass a fixed ``center``.

    Args:
        head_dim, base, rotary_dim, interleaved: as for :class:`RotaryEmbedding`.
        scale_base: ``γ`` (512 in the paper).
        center: a fixed centre for the exponent, or ``None`` for the per-call default.
    """

    paper: ClassVar[str] = "Sun et al. 2022, A Length-Extrapolatable Transformer, eq. 9"

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        scale_base: float = 512.0,
        center: float | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(
            head_dim, base=base, rotary_dim=rotary_dim, interleaved=interleaved, device=device
        )
        self.scale_base = check_positive_float("scale_base", scale_base)
        if center is not None and (
            isinstance(center, bool) or not isinstance(center, (int, float))
        ):
            raise PosencTypeError(f"center must be a number or None, got {center!r}")
        if center is not None and not math.isfinite(center):
            raise PosencValueError(f"center must be a finite number, got {center!r}")
        self.center = None if center is None else float(center)

    def zeta(self, device: Any = None) -> Tensor:
        """``ζ_i = (2i + 0.4 r) / (1.4 r)`` for each pair, float64."""
        r = self.rotary_dim
        return (torch.arange(0, r, 2, dtype=torch.float64, device=device) + 0.4 * r) / (1.4 * r)

    def scaled_cos_sin(
        self, positions: Tensor, dtype: torch.dtype, *, key: bool
    ) -> tuple[Tensor, Tensor]:
        """cos and sin times ``ζ^(±(p - center)/γ)`` (``-`` for keys): ``(n, r/2)`` or
        ``(b, 1, n, r/2)``. ``positions`` are already validated."""
        pos = positions.to(torch.float64)
        center = self.center
        if center is None:
            # a 0-d tensor, not a Python float: no .item() (meta tensors, export, compile)
            center = torch.floor((pos.max() + 1) / 2) if pos.numel() else 0.0
        angles = pos[..., None] * self.inv_freq.to(torch.float64)  # (..., n, r/2)
        power = (pos[..., None] - center) / self.scale_base  # (..., n, 1)
        scale = self.zeta(pos.device) ** (-power if key else power)  # (..., n, r/2)
        cos, sin = (angles.cos() * scale).to(dtype), (angles.sin() * scale).to(dtype)
        return _unsqueeze_heads(cos), _unsqueeze_heads(sin)

    def cos_sin(
        self,
        positions: Tensor | None,
        seq_len: int,
        *,
        dtype: torch.dtype,
        device: Any = None,
        key: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """The tables :meth:`forward` rotates queries by (``key=True``: keys by) at
        ``positions`` (``None``: ``arange(seq_len)``): cos and sin times xPos's scale, from
        :meth:`scaled_cos_sin`; ``(n, r/2)`` or ``(b, 1, n, r/2)`` in ``dtype``."""
        batch = positions.shape[0] if isinstance(positions, Tensor) and positions.dim() == 2 else 1
        device = self.inv_freq.device if device is None else device
        pos = resolve_positions(positions, seq_len, batch=batch, device=device)
        return self.scaled_cos_sin(pos, dtype, key=check_bool("key", key))

    def position_state(self, positions: Tensor | None, x: Tensor) -> RotaryState:
        """The scaled cos and sin of queries and of keys, computed once for every layer."""
        pos = resolve_positions(positions, x.shape[1], batch=x.shape[0], device=x.device)
        work = compute_dtype(x.dtype)
        query = self.scaled_cos_sin(pos, work, key=False)
        return _state(self.interleaved, query, self.scaled_cos_sin(pos, work, key=True))

    def rotate(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        *,
        key: bool = False,
        inplace: bool = False,
    ) -> Tensor:
        """Rotate and scale one tensor ``(b, h, n, d)``: queries, or keys with ``key=True``;
        with ``inplace=True`` in its own storage. Pass a fixed ``center`` at construction when
        queries and keys come in separate calls."""
        x, _ = _check_qk(x, x, self.head_dim)
        pos = resolve_positions(positions, x.shape[2], batch=x.shape[0], device=x.device)
        tables = self.scaled_cos_sin(pos, compute_dtype(x.dtype), key=key)
        return _rotate_one(x, tables, self.interleaved, inplace)

    def forward(
        self, q: Tensor, k: Tensor, positions: Tensor | None = None, *, inplace: bool = False
    ) -> tuple[Tensor, Tensor]:
        """Shapes: q ``(b, hq, n, d)``, k ``(b, hk, n, d)``, positions ``(n,)`` or ``(b, n)``;
        ``inplace`` as for :meth:`RotaryEmbedding.forward`."""
        q, k = _check_qk(q, k, self.head_dim)
        b, _, n, _ = q.shape
        pos = resolve_positions(positions, n, batch=b, device=q.device)
        work = torch.promote_types(compute_dtype(q.dtype), compute_dtype(k.dtype))
        q_tables = self.scaled_cos_sin(pos, work, key=False)
        k_tables = self.scaled_cos_sin(pos, work, key=True)
        return _rotate_qk(q, k, q_tables, k_tables, self.interleaved, inplace)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", scale_base={self.scale_base:g}"


# --------------------------------------------------------------------------- axial N-D


class AxialRotaryEmbedding(RotaryEncoding):
    """Axial N-D RoPE for image patches (2-D) and video (3-D): the rotary channels are split
    into ``ndim`` equal groups of pairs, and the pairs of group ``a`` rotate by the token's
    coordinate on axis ``a`` times that group's frequencies ``base^(-2i/(r/ndim))``
    (Heo et al. 2024, "Rotary Position Embedding for Vision Transformer", RoPE-Axial, eq. 12).
    Scores then depend only on the coordinate differences. In the interleaved layout this is
    rotary-embedding-torch's ``get_axial_freqs`` layout (checked equal in float32).

    Args:
        head_dim: channels per head; ``rotary_dim`` (default ``head_dim``) must be divisible
            by ``2 * ndim``.
        ndim: number of axes.
        base: the wavelength base of every axis.
        interleaved: pair layout, as for :class:`RotaryEmbedding`.
        learned_freq: make the per-axis frequencies trainable (RoPE-Mixed style learning
            per pair; initialised to the axial frequencies).

    Positions are coordinates, ``(n, ndim)`` or ``(b, n, ndim)``, integer or float. Without
    them a plain sequence is taken as one row: token ``t`` sits at ``(t, 0, ..., 0)``.
    """

    paper: ClassVar[str] = "Heo et al. 2024, Rotary Position Embedding for Vision Transformer"

    def __init__(
        self,
        head_dim: int,
        *,
        ndim: int = 2,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        learned_freq: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.ndim = check_positive_int("ndim", ndim)
        self.head_dim = head_dim
        self.rotary_dim = _check_rotary_dim(head_dim, rotary_dim, multiple=2 * ndim)
        self.base = _check_base(base)
        self.interleaved = bool(interleaved)
        self.learned_freq = bool(learned_freq)
        per_axis = self.rotary_dim // ndim
        freq = default_inv_freq(per_axis, self.base, device=device).repeat(ndim)  # (r/2,)
        axis = torch.arange(ndim, device=device).repeat_interleave(per_axis // 2)  # (r/2,)
        self.register_buffer("axis_of_pair", axis, persistent=False)
        if self.learned_freq:
            self.freq = nn.Parameter(freq.float())
        else:
            self.register_buffer("inv_freq", freq, persistent=False)

    def reset_tables(self) -> None:
        """Rebuild the fixed buffers (the axis of each pair and, unless learned, the float64
        frequencies) on the module's device; used after ``to_empty``/``.to()``."""
        device = self.axis_of_pair.device
        if device.type == "meta":
            return
        per_axis = self.rotary_dim // self.ndim
        axis = torch.arange(self.ndim, device=device).repeat_interleave(per_axis // 2)
        self.axis_of_pair = axis
        if not self.learned_freq:
            self.inv_freq = default_inv_freq(per_axis, self.base, device=device).repeat(self.ndim)

    def _apply(self, fn: Any, recurse: bool = True) -> AxialRotaryEmbedding:
        super()._apply(fn, recurse)
        self.reset_tables()
        return self

    def coordinates(self, positions: Tensor | None, n: int, batch: int, device: Any) -> Tensor:
        """Validate coordinates ``(n, ndim)`` / ``(b, n, ndim)``, or make the one-row default."""
        if positions is None:
            coords = torch.zeros(n, self.ndim, device=device)
            coords[:, 0] = torch.arange(n, device=device)
            return coords
        if not isinstance(positions, Tensor):
            raise PosencTypeError(
                f"positions must be a torch.Tensor, got {type(positions).__name__}"
            )
        if positions.dtype == torch.bool or positions.is_complex():
            raise PosencTypeError(
                f"positions must be an integer or float tensor, got {positions.dtype}"
            )
        shape = tuple(positions.shape)
        if positions.dim() not in (2, 3) or shape[-2:] != (n, self.ndim):
            raise PosencValueError(
                f"positions must be coordinates of shape (seq, {self.ndim}) or "
                f"(batch, seq, {self.ndim}) with seq={n}, got {shape}"
            )
        if positions.dim() == 3 and shape[0] not in (1, batch):
            raise PosencValueError(f"positions has batch size {shape[0]} but the input has {batch}")
        return check_finite("positions", positions)

    @staticmethod
    def grid(*shape: int, device: Any = None) -> Tensor:
        """Row-major coordinates of every point of a grid: ``(prod(shape), len(shape))``."""
        for axis, size in enumerate(shape):
            check_positive_int(f"shape[{axis}]", size)
        axes = torch.meshgrid(*(torch.arange(s, device=device) for s in shape), indexing="ij")
        return torch.stack(axes, dim=-1).reshape(-1, len(shape))

    def cos_sin(self, coords: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin of the per-pair angles: ``(n, r/2)`` or ``(b, 1, n, r/2)``."""
        freq = self.freq if self.learned_freq else self.inv_freq
        axis = self.axis_of_pair.to(coords.device)
        picked = coords.to(torch.float64)[..., axis]  # (..., n, r/2): each pair's coordinate
        angles = picked * freq.to(coords.device, torch.float64)
        return _unsqueeze_heads(angles.cos().to(dtype)), _unsqueeze_heads(angles.sin().to(dtype))

    def position_state(self, positions: Tensor | None, x: Tensor) -> RotaryState:
        """cos and sin of the coordinates, computed once for every layer of a forward."""
        coords = self.coordinates(positions, x.shape[1], x.shape[0], x.device)
        cos_sin = self.cos_sin(coords, compute_dtype(x.dtype))
        return _state(self.interleaved, cos_sin, cos_sin)

    def rotate(
        self, x: Tensor, positions: Tensor | None = None, *, inplace: bool = False
    ) -> Tensor:
        """Rotate one tensor ``(b, h, n, d)`` by coordinates ``(n, a)`` / ``(b, n, a)``; with
        ``inplace=True`` in its own storage."""
        x, _ = _check_qk(x, x, self.head_dim)
        coords = self.coordinates(positions, x.shape[2], x.shape[0], x.device)
        tables = self.cos_sin(coords, compute_dtype(x.dtype))
        return _rotate_one(x, tables, self.interleaved, inplace)

    def forward(
        self, q: Tensor, k: Tensor, positions: Tensor | None = None, *, inplace: bool = False
    ) -> tuple[Tensor, Tensor]:
        """Shapes: q ``(b, hq, n, d)``, k ``(b, hk, n, d)``, positions ``(n, a)`` or
        ``(b, n, a)``; ``inplace`` as for :meth:`RotaryEmbedding.forward` (not with learned
        frequencies under autograd)."""
        q, k = _check_qk(q, k, self.head_dim)
        b, _, n, _ = q.shape
        coords = self.coordinates(positions, n, b, q.device)
        work = torch.promote_types(compute_dtype(q.dtype), compute_dtype(k.dtype))
        tables = self.cos_sin(coords, work)
        return _rotate_qk(q, k, tables, tables, self.interleaved, inplace)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, ndim={self.ndim}, rotary_dim={self.rotary_dim}, "
            f"base={self.base:g}, interleaved={self.interleaved}, learned_freq={self.learned_freq}"
        )


@register("rope2d", "axial 2-D rotary embedding on (row, col) coordinates (images)")
class Rotary2DEmbedding(AxialRotaryEmbedding):
    """:class:`AxialRotaryEmbedding` with ``ndim=2``; positions ``(n, 2)`` or ``(b, n, 2)``."""

    axes: ClassVar[int] = 2

    def __init__(self, head_dim: int, **kwargs: Any) -> None:
        super().__init__(head_dim, ndim=2, **kwargs)


@register("rope3d", "axial 3-D rotary embedding on (t, row, col) coordinates (video)")
class Rotary3DEmbedding(AxialRotaryEmbedding):
    """:class:`AxialRotaryEmbedding` with ``ndim=3``; positions ``(n, 3)`` or ``(b, n, 3)``."""

    axes: ClassVar[int] = 3

    def __init__(self, head_dim: int, **kwargs: Any) -> None:
        super().__init__(head_dim, ndim=3, **kwargs)
