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

Speed (CPU), without autograd: the interleaved layout is one complex multiply per tensor
(``view_as_complex(x) * (cos + i sin)``, written straight into the output); for bfloat16 and
float16 it is one pass of a native kernel (``native.py``: C built with the system compiler on
first use, with AVX-512 where the CPU has it), or, where that cannot be built, a torch path
that converts, rotates and rounds back block by block in a cache-sized float32 buffer. The
half layout is one ``torch.compile``-d fused kernel (compiled per shape and dtype by dynamo),
falling back to eager kernels when compilation is unavailable. All of these give
bit-identical results. When autograd is recording, a plain differentiable formula is used.
See ``benchmarks/rope.md``.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim, ``r`` rotary dim,
``a`` number of axes.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..errors import MemoryBudgetError, PosencTypeError, PosencValueError, check_bytes
from . import base, native
from .base import (
    RotaryEncoding,
    check_finite,
    check_positive_float,
    check_positive_int,
    compute_dtype,
    register,
    resolve_positions,
)
from .hf_config import rotary_arguments_from_hf_config
from .rope_scaling import default_inv_freq, rope_parameters, validate_rope_scaling
from .state import RotaryState

PAPER = "Su et al. 2021, RoFormer: Enhanced Transformer with Rotary Position Embedding, eq. 15"

__all__ = [
    "AxialRotaryEmbedding",
    "Rotary2DEmbedding",
    "Rotary3DEmbedding",
    "RotaryEmbedding",
    "XPos",
    "apply_rotary",
    "set_rotary_compile",
]

# --------------------------------------------------------------------------- apply


def _rotate_eager(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """The differentiable reference: split the pairs, rotate, put them back (RoFormer eq. 34).

    ``x`` is ``(..., d)`` in the work dtype; cos/sin ``(..., r/2)``; returns ``(..., d)``.
    """
    half = cos.shape[-1]
    r = 2 * half
    rot, rest = x[..., :r], x[..., r:]
    if interleaved:
        pairs = rot.unflatten(-1, (half, 2))  # (..., r/2, 2)
        x1, x2 = pairs[..., 0], pairs[..., 1]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        x1, x2 = rot[..., :half], rot[..., half:]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((out, rest), dim=-1) if rest.shape[-1] else out


def _fused(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """What the compiled kernel computes: :func:`_rotate_eager` written so that inductor emits
    one pass, with each half converted to the tables' dtype on load and cast back on store."""
    half = cos.shape[-1]
    r = 2 * half
    if interleaved:
        x1, x2 = x[..., 0:r:2].to(cos.dtype), x[..., 1:r:2].to(cos.dtype)  # (..., r/2) each
    else:
        x1, x2 = x[..., :half].to(cos.dtype), x[..., half:r].to(cos.dtype)
    out1, out2 = (x1 * cos - x2 * sin).to(x.dtype), (x2 * cos + x1 * sin).to(x.dtype)
    if interleaved:
        rotated = torch.stack((out1, out2), dim=-1).flatten(-2)  # (..., r)
    else:
        rotated = torch.cat((out1, out2), dim=-1)
    return torch.cat((rotated, x[..., r:]), dim=-1) if r < x.shape[-1] else rotated


def _complex_view_ok(x: Tensor) -> bool:
    """Whether ``view_as_complex`` can view the channel pairs of ``x`` in place."""
    return (
        x.dtype in (torch.float32, torch.float64)
        and x.stride(-1) == 1
        and all(s % 2 == 0 for s in x.stride()[:-1])
    )


def _rotate_into(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """Eager, no autograd: write the rotation straight into a fresh output, without the
    temporaries of :func:`_rotate_eager`. ``x`` is already in the tables' dtype."""
    half = cos.shape[-1]
    r = 2 * half
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if r < x.shape[-1]:
        out[..., r:].copy_(x[..., r:])
    if interleaved and _complex_view_ok(x):
        # (x1 + i x2)(cos + i sin): one complex multiply over the pairs
        table = torch.complex(cos, sin)  # (..., r/2)
        src = torch.view_as_complex(x[..., :r].unflatten(-1, (half, 2)))  # (..., r/2) complex
        dst = torch.view_as_complex(out[..., :r].unflatten(-1, (half, 2)))
        torch.mul(src, table, out=dst)
        return out
    if interleaved:
        src = x[..., :r].unflatten(-1, (half, 2))  # (..., r/2, 2)
        dst = out[..., :r].unflatten(-1, (half, 2))
        x1, x2, o1, o2 = src[..., 0], src[..., 1], dst[..., 0], dst[..., 1]
    else:
        x1, x2, o1, o2 = x[..., :half], x[..., half:r], out[..., :half], out[..., half:r]
    torch.mul(x1, cos, out=o1)
    o1.addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=o2)
    o2.addcmul_(x1, sin)
    return out


def _rotate_blocked(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """Eager, no autograd, for half-precision ``x`` and float32 tables: one pass over memory.

    Converting all of ``x`` to float32, rotating and converting back would stream three
    full-size temporaries through memory. Instead each cache-sized block of rows is converted
    into one reused float32 buffer, rotated there in place (a complex multiply for the
    interleaved layout) and written back to the output with a single rounding, so memory sees
    ``x`` read once and the output written once. Bit-identical to rotating in float32 and
    casting the result once.
    """
    half = cos.shape[-1]
    r = 2 * half
    n, d = x.shape[-2], x.shape[-1]
    lead = x.shape[:-2]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous
    as_complex = interleaved and d % 2 == 0  # the pairs of a (rows, d) block view as complex
    if as_complex:
        table = torch.complex(cos, sin).expand(*lead, n, half)  # (..., n, r/2), a view
    cos, sin = cos.expand(*lead, n, half), sin.expand(*lead, n, half)  # views, no copies
    rows = base.block_rows(n, d)
    buf = torch.empty(rows, d, dtype=cos.dtype, device=x.device)  # (rows, d)
    spare = torch.empty(rows, half, dtype=cos.dtype, device=x.device)
    for index, span in base.row_blocks(x.shape, rows):
        block = buf[: span.stop - span.start]
        block.copy_(x[index][span])  # converts to float32
        if as_complex:  # (x1 + i x2)(cos + i sin)
            pairs = torch.view_as_complex(block[:, :r].unflatten(-1, (half, 2)))
            pairs.mul_(table[index][span])
        else:
            c, s = cos[index][span], sin[index][span]  # (rows, r/2)
            if interleaved:
                x1, x2 = block[:, 0:r:2], block[:, 1:r:2]
            else:
                x1, x2 = block[:, :half], block[:, half:r]
            keep = spare[: span.stop - span.start].copy_(x1)
            x1.mul_(c).addcmul_(x2, s, value=-1)
            x2.mul_(c).addcmul_(keep, s)
        out[index][span].copy_(block)  # rounds once
    return out


#: Tensors smaller than this many elements skip compilation (it costs seconds once per shape).
COMPILE_MIN_NUMEL = 1 << 20
_compile_enabled = os.environ.get("POSENC_COMPILE", "1") not in ("0", "false", "False", "")
_compiled: Callable[..., Tensor] | None = None


def set_rotary_compile(enabled: bool) -> None:
    """Allow (default) or forbid compiled rotary kernels: the native C kernel
    (``posenc.encodings.native``) and the ``torch.compile``-d one for large inputs.

    Forbidden, rotary uses torch's eager kernels only, as on a machine with no compiler. The
    environment variable ``POSENC_COMPILE=0`` forbids them from the start. Results are the
    same either way (``tests/test_rotary.py`` and ``tests/test_native.py`` check).
    """
    global _compile_enabled
    _compile_enabled = bool(enabled)


def _compiled_kernel() -> Callable[..., Tensor] | None:
    global _compiled, _compile_enabled
    if _compiled is None:
        try:
            _compiled = torch.compile(_fused, dynamic=False, fullgraph=True)
        except Exception as error:  # pragma: no cover - depends on the installation
            _compile_enabled = False
            warnings.warn(f"torch.compile unavailable ({error}); rotary stays eager", stacklevel=3)
            return None
    return _compiled


def _use_compiled(x: Tensor, work: torch.dtype, interleaved: bool) -> bool:
    if not _compile_enabled or x.numel() < COMPILE_MIN_NUMEL or torch.compiler.is_compiling():
        return False
    # The interleaved layout is a complex multiply (blocked for half precision); inductor
    # emits scalar code for its stride-2 pairs, so the compiled kernel helps the half layout.
    return not interleaved


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """Rotate the first ``r = 2 * cos.shape[-1]`` channels of ``x`` pairwise (RoFormer eq. 34).

    Args:
        x: ``(..., n, d)`` queries or keys, any float dtype; ``d >= r``.
        cos, sin: ``(..., n, r/2)`` cos and sin of the angles (one per pair), broadcastable
            against ``x.shape[:-1]``; e.g. ``(n, r/2)`` or ``(b, 1, n, r/2)`` for
            ``x`` of shape ``(b, h, n, d)``. They set the work dtype: half-precision ``x``
            is rotated in the tables' dtype (float32) and cast back once.
        interleaved: pairs ``(x[2i], x[2i+1])`` (GPT-J) instead of ``(x[i], x[i+r/2])``
            (GPT-NeoX / Llama).

    Returns a new tensor like ``x``; channels ``r:`` are copied unchanged. Differentiable in
    ``x``, ``cos`` and ``sin``.

    >>> x = torch.tensor([[1.0, 0.0, 2.0, 5.0]])  # one position, d = 4, r = 2
    >>> apply_rotary(x, torch.tensor([[0.0]]), torch.tensor([[1.0]]))  # rotate by 90 degrees
    tensor([[0., 1., 2., 5.]])
    """
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise PosencTypeError(
            f"x must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}"
        )
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise PosencTypeError(f"{name} must be a floating-point tensor")
    if cos.shape != sin.shape:
        raise PosencValueError(
            f"cos and sin differ in shape: {tuple(cos.shape)} vs {tuple(sin.shape)}"
        )
    if x.dim() < 1 or 2 * cos.shape[-1] > x.shape[-1] or cos.shape[-1] < 1:
        raise PosencValueError(
            f"cos/sin of shape {tuple(cos.shape)} need x with at least 2 * {cos.shape[-1]} "
            f"channels, got x of shape {tuple(x.shape)}"
        )
    work = cos.dtype if cos.dtype == sin.dtype else torch.promote_types(cos.dtype, sin.dtype)
    work = torch.promote_types(work, compute_dtype(x.dtype))
    cos, sin = cos.to(work), sin.to(work)
    if torch.compiler.is_compiling():  # inside the caller's graph: let inductor fuse it
        return _fused(x, cos, sin, interleaved)
    if (
        torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad)
    ) or not native.opaque_call_ok(x, cos, sin):  # autograd, vmap, jit.trace, modes
        return _rotate_eager(x.to(work), cos, sin, interleaved).to(x.dtype)
    if _compile_enabled and interleaved and x.dtype in (torch.bfloat16, torch.float16):
        # The native kernel's one pass beats the blocked torch path for half precision; for
        # float32 (one complex multiply) and the half layout (one compiled kernel) torch's own
        # OpenMP threads do as well or better (benchmarks/rope.md).
        fast = native.rotate(x, cos, sin, interleaved)
        if fast is not None:
            return fast
    if _use_compiled(x, work, interleaved):
        kernel = _compiled_kernel()
        if kernel is not None:
            try:
                return kernel(x, cos, sin, interleaved)
            except Exception as error:  # pragma: no cover - compiler missing or broken
                set_rotary_compile(False)
                warnings.warn(
                    f"compiling the rotary kernel failed ({type(error).__name__}: {error}); "
                    "using the eager kernel from now on",
                    stacklevel=2,
                )
    if x.dtype != work and x.dim() >= max(2, cos.dim()):  # half precision in, one pass
        return _rotate_blocked(x, cos, sin, interleaved)
    return _rotate_into(x.to(work), cos, sin, interleaved).to(x.dtype)


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

    def rotate(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return (
            apply_rotary(q, *query, interleaved=interleaved),
            apply_rotary(k, *key, interleaved=interleaved),
        )

    return RotaryState(rotate)


def _unsqueeze_heads(t: Tensor) -> Tensor:
    """``(n, r/2)`` stays; ``(b, n, r/2)`` -> ``(b, 1, n, r/2)`` to broadcast over heads."""
    return t.unsqueeze(-3) if t.dim() == 3 else t


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
        scaling: a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict, e.g.
            ``{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}``
            (types: ``default linear ntk dynamic yarn longrope llama3``). A ``rope_theta``
            or ``partial_rotary_factor`` in it sets ``base`` / ``rotary_dim``.
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
    alone (``tests/test_rotary.py`` shows both). Re-rotate the cache (keep keys unrotated and
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
        self.max_position_embeddings = max_position_embeddings
        self.scaling = validate_rope_scaling(
            scaling or None,
            rotary_dim=self.rotary_dim,
            max_position_embeddings=max_position_embeddings,
        )
        self.rope_type: str = self.scaling["rope_type"]
        if learned_freq and self.rope_type in ("dynamic", "longrope"):
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

    @classmethod
    def from_hf_config(
        cls, config: Any, *, layer_type: str | None = None, **kwargs: Any
    ) -> RotaryEmbedding:
        """Build the rotary embedding a transformers model config describes, so that rotating
        ``q, k`` of shape ``(b, h, n, head_dim)`` gives what that model's own code gives.

        Reads every convention of transformers' configs (``hf_config.py`` has the table):
        ``head_dim`` or ``hidden_size // num_attention_heads``; the rotated part from
        ``partial_rotary_factor`` (Phi, StableLM, Persimmon, GLM), ``rotary_pct`` (GPT-NeoX) or
        ``rotary_dim`` (GPT-J, CodeGen); the base from ``rope_theta`` (in ``rope_parameters`` or
        at the top level) or ``rotary_emb_base``; the context extension from
        ``rope_parameters`` / ``rope_scaling``; the interleaved layout for GPT-J, CodeGen, GLM
        and the other families in ``INTERLEAVED_MODEL_TYPES``. ``config`` may also be a
        ``config.json`` dict. Per-layer RoPE (parameters nested by layer type, Gemma 3) needs
        ``layer_type``.

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
        RoPE.
        """
        arguments = rotary_arguments_from_hf_config(config, layer_type=layer_type)
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
            (angles.sin() * self.attention_factor).float(),
        )

    def reset_tables(self, num_positions: int | None = None) -> None:
        """Recompute the frequencies (float64) and the float32 cos/sin tables on the module's
        device; ``num_positions`` rows (default: as many as now). Called after ``.to()``,
        ``to_empty``, a dynamic-NTK change, and when a position is past the table's end."""
        device = self.cos_cached.device
        if device.type == "meta":
            return
        # tables built under inference_mode would be inference tensors, which a later
        # training step could not save for backward
        with torch.inference_mode(False):
            if not self.learned_freq:
                self.inv_freq, self.attention_factor = self._frequencies(self._seq_len, device)
            n = self.cos_cached.shape[0] if num_positions is None else num_positions
            self.cos_cached, self.sin_cached = self._table_rows(n, device)

    def _apply(self, fn: Any, recurse: bool = True) -> RotaryEmbedding:
        super()._apply(fn, recurse)
        # a cast must not degrade the float64 frequencies or the float32 tables
        self.reset_tables()
        return self

    def _update_state(self, positions: Tensor | None, n: int) -> None:
        """Dynamic NTK and LongRoPE depend on the current length (HF's
        ``dynamic_rope_update``); change the frequencies, and drop the tables, when it moves."""
        if self.rope_type not in ("dynamic", "longrope") or torch.compiler.is_compiling():
            return
        if positions is not None and (positions.is_meta or not positions.numel()):
            positions = None  # meta positions have no largest value to read: use the length
        seq_len = float(n if positions is None else positions.max() + 1)
        new = self._seq_len
        if self.rope_type == "dynamic":
            original = self.scaling["original_max_position_embeddings"]
            current = original if self._seq_len is None else self._seq_len
            if seq_len > current:  # grow
                new = seq_len
            if seq_len < original and current > original:  # back within the window: reset
                new = None
        else:  # longrope: only which side of the original context matters
            original = self.scaling["original_max_position_embeddings"]
            new = float(original + 1) if seq_len > original else None
        if new != self._seq_len:
            self._seq_len = new
            self.reset_tables()

    def cos_sin(
        self, positions: Tensor | None, seq_len: int, *, dtype: torch.dtype, device: Any = None
    ) -> tuple[Tensor, Tensor]:
        """cos and sin (times the attention factor) for ``positions`` (``None``:
        ``arange(seq_len)``), as ``(n, r/2)`` or ``(b, 1, n, r/2)`` in ``dtype``
        (float32 for half-precision work, float64 when asked)."""
        device = self.cos_cached.device if device is None else device
        if self.learned_freq:
            pos = torch.arange(seq_len, device=device) if positions is None else positions
            angles = pos.to(torch.float64)[..., None] * self.freq.to(torch.float64)
            return self._finish(angles, dtype)
        # dynamic NTK changes its frequencies as the length grows: no table to rebuild then
        table_ok = (
            dtype != torch.float64
            and self.rope_type != "dynamic"
            and not torch.compiler.is_compiling()  # first: dynamo must not touch the cache
            # a meta module has no table to read, and meta positions no largest value
            and not self.cos_cached.is_meta
            and not (positions is not None and positions.is_meta)
        )
        if positions is not None and (positions.is_floating_point() or not table_ok):
            angles = positions.to(torch.float64)[..., None] * self.inv_freq.to(torch.float64)
            return self._finish(angles, dtype)
        if positions is None and not table_ok:
            angles = torch.arange(seq_len, dtype=torch.float64, device=device)[:, None]
            return self._finish(angles * self.inv_freq.to(torch.float64), dtype)
        needed = seq_len if positions is None or not positions.numel() else int(positions.max()) + 1
        if needed > self.cos_cached.shape[0]:
            rows = self._table_rows_for(needed, seq_len, device)
            if rows is None:
                # a far position (one new token at 10^9 in a long KV cache): the angles of
                # the positions asked for, never a table up to the largest one
                pos = torch.arange(seq_len, device=device) if positions is None else positions
                angles = pos.to(torch.float64)[..., None] * self.inv_freq.to(torch.float64)
                return self._finish(angles, dtype)
            self.reset_tables(rows)
        if positions is None:
            cos, sin = self.cos_cached[:seq_len], self.sin_cached[:seq_len]  # (n, r/2)
        else:
            cos, sin = self.cos_cached[positions], self.sin_cached[positions]  # (..., n, r/2)
        return _unsqueeze_heads(cos.to(dtype)), _unsqueeze_heads(sin.to(dtype))

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
        sin = (angles.sin() * self.attention_factor).to(dtype)
        return _unsqueeze_heads(cos), _unsqueeze_heads(sin)

    def position_state(self, positions: Tensor | None, x: Tensor) -> RotaryState:
        """cos and sin computed once for every layer of a forward (see :class:`RotaryState`)."""
        b, n, work = x.shape[0], x.shape[1], compute_dtype(x.dtype)
        positions = self._positions(positions, n, b, x.device)
        self._update_state(positions, n)
        cos, sin = self.cos_sin(positions, n, dtype=work, device=x.device)
        return _state(self.interleaved, (cos, sin), (cos, sin))

    # ------------------------------------------------------------------ forward

    def _positions(
        self, positions: Tensor | None, n: int, batch: int, device: Any
    ) -> Tensor | None:
        if positions is None:
            return None
        return resolve_positions(positions, n, batch=batch, device=device)

    def rotate(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Rotate one tensor ``(b, h, n, d)`` (queries, or keys for a KV cache)."""
        x, _ = _check_qk(x, x, self.head_dim)
        positions = self._positions(positions, x.shape[2], x.shape[0], x.device)
        self._update_state(positions, x.shape[2])
        cos, sin = self.cos_sin(
            positions, x.shape[2], dtype=compute_dtype(x.dtype), device=x.device
        )
        return apply_rotary(x, cos, sin, interleaved=self.interleaved)

    def forward(
        self, q: Tensor, k: Tensor, positions: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Rotate queries and keys by their positions.

        Shapes:
            q: ``(b, hq, n, d)``; k: ``(b, hk, n, d)``; positions: ``(n,)`` or ``(b, n)``.
            Returns new ``(q, k)`` of the same shapes and dtypes.
        """
        q, k = _check_qk(q, k, self.head_dim)
        b, _, n, _ = q.shape
        positions = self._positions(positions, n, b, q.device)
        self._update_state(positions, n)
        work = torch.promote_types(compute_dtype(q.dtype), compute_dtype(k.dtype))
        cos, sin = self.cos_sin(positions, n, dtype=work, device=q.device)
        return (
            apply_rotary(q, cos, sin, interleaved=self.interleaved),
            apply_rotary(k, cos, sin, interleaved=self.interleaved),
        )

    def extra_repr(self) -> str:
        text = f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base:g}"
        if self.interleaved:
            text += ", interleaved=True"
        if self.rope_type != "default":
            text += f", scaling={self.scaling}"
        return text

    def with_scaling(self, scaling: Mapping[str, Any] | None) -> RotaryEmbedding:
        """A new rotary embedding with this one's ``head_dim``, ``base``, ``rotary_dim``,
        layout, ``max_position_embeddings`` and device, and ``scaling`` in place of its own
        (``None``: plain RoPE). This module is left as it is.

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

    def position_state(self, positions: Tensor | None, x: Tensor) -> RotaryState:
        """The scaled cos and sin of queries and of keys, computed once for every layer."""
        pos = resolve_positions(positions, x.shape[1], batch=x.shape[0], device=x.device)
        work = compute_dtype(x.dtype)
        query = self.scaled_cos_sin(pos, work, key=False)
        return _state(self.interleaved, query, self.scaled_cos_sin(pos, work, key=True))

    def rotate(self, x: Tensor, positions: Tensor | None = None, *, key: bool = False) -> Tensor:
        """Rotate and scale one tensor ``(b, h, n, d)``: queries, or keys with ``key=True``.
        Pass a fixed ``center`` at construction when queries and keys come in separate calls."""
        x, _ = _check_qk(x, x, self.head_dim)
        pos = resolve_positions(positions, x.shape[2], batch=x.shape[0], device=x.device)
        cos, sin = self.scaled_cos_sin(pos, compute_dtype(x.dtype), key=key)
        return apply_rotary(x, cos, sin, interleaved=self.interleaved)

    def forward(
        self, q: Tensor, k: Tensor, positions: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Shapes: q ``(b, hq, n, d)``, k ``(b, hk, n, d)``, positions ``(n,)`` or ``(b, n)``."""
        q, k = _check_qk(q, k, self.head_dim)
        b, _, n, _ = q.shape
        pos = resolve_positions(positions, n, batch=b, device=q.device)
        work = torch.promote_types(compute_dtype(q.dtype), compute_dtype(k.dtype))
        q_cos, q_sin = self.scaled_cos_sin(pos, work, key=False)
        k_cos, k_sin = self.scaled_cos_sin(pos, work, key=True)
        return (
            apply_rotary(q, q_cos, q_sin, interleaved=self.interleaved),
            apply_rotary(k, k_cos, k_sin, interleaved=self.interleaved),
        )

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

    def rotate(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Rotate one tensor ``(b, h, n, d)`` by coordinates ``(n, a)`` / ``(b, n, a)``."""
        x, _ = _check_qk(x, x, self.head_dim)
        coords = self.coordinates(positions, x.shape[2], x.shape[0], x.device)
        cos, sin = self.cos_sin(coords, compute_dtype(x.dtype))
        return apply_rotary(x, cos, sin, interleaved=self.interleaved)

    def forward(
        self, q: Tensor, k: Tensor, positions: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Shapes: q ``(b, hq, n, d)``, k ``(b, hk, n, d)``, positions ``(n, a)`` or
        ``(b, n, a)``."""
        q, k = _check_qk(q, k, self.head_dim)
        b, _, n, _ = q.shape
        coords = self.coordinates(positions, n, b, q.device)
        work = torch.promote_types(compute_dtype(q.dtype), compute_dtype(k.dtype))
        cos, sin = self.cos_sin(coords, work)
        return (
            apply_rotary(q, cos, sin, interleaved=self.interleaved),
            apply_rotary(k, cos, sin, interleaved=self.interleaved),
        )

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
