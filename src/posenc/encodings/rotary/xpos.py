"""xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", eq. 9): RoPE whose queries
and keys are also scaled, so that scores decay with the distance.

It stands beside :class:`~posenc.RotaryEmbedding`, not under it: the two share the rotation
(:mod:`~.common`, :mod:`~posenc.encodings.rotary.kernels.rotate`) and nothing else. xPos has no
cached tables, no
context extension and no learned frequencies: every call forms its scaled cos and sin from
the positions in float64.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim, ``r`` rotary dim.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from ...errors import PosencTypeError, PosencValueError, check_bytes
from ..base import RotaryEncoding
from ..checks import (
    PositionBound,
    check_bool,
    check_positive_float,
    check_positive_int,
    compute_dtype,
    reads_values,
    resolve_positions,
    take_position_ids,
)
from ..registry import register
from ..rope_types.builtin import default_inv_freq
from ..state import RotaryState
from .common import (
    TableRotation,
    apply_tables,
    apply_tables_qk,
    check_base,
    check_qk,
    check_rotary_dim,
    unsqueeze_heads,
)
from .heads import RotaryHeads, check_rotary_heads, heads_group
from .layouts import Layout, stated_layout

__all__ = ["XPos"]


@register("xpos", "RoPE with per-pair exponential decay (length-extrapolatable)")
class XPos(RotaryEncoding):
    """xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", eq. 9): RoPE with queries
    scaled by ``ζ_i^(m/γ)`` and keys by ``ζ_i^(-n/γ)``, so the score between positions ``m``
    and ``n`` decays like ``ζ_i^((m-n)/γ)``, where ``ζ_i = (2i/r + 0.4) / 1.4`` and
    ``γ = scale_base``.

    The exponent is taken relative to a centre, ``(p - center) / γ``, which cancels in every
    score and halves the exponents' reach: by default ``center = (max position + 1) // 2`` of
    the call, as rotary-embedding-torch's ``use_xpos`` and x-transformers do (checked equal to
    rotary-embedding-torch in float32). With a KV cache, queries and keys rotated in different
    calls must share the centre: pass a fixed ``center``.

    The scales still grow as ``(1/ζ_0)^(|p - center|/γ)`` with ``ζ_0 = 2/7``: past about
    ``70.8 γ`` positions from the centre (``±36,000`` for ``γ = 512``: a call of about 72,000
    positions) a scale is not finite in float32 or bfloat16, past about ``8.85 γ`` (``±4,500``)
    not in float16. Where the positions are read (on the CPU, or under
    ``POSENC_CHECK_POSITIONS=1``) such a call is refused by name before any work, as the
    rotated queries or keys would be ``inf``; a larger ``scale_base`` reaches further.

    Args:
        head_dim: channels per head ``d``.
        base: the wavelength base θ of the rotation, as for :class:`RotaryEmbedding`.
        rotary_dim: channels rotated (and scaled), ``r <= d`` and even (default ``d``).
        interleaved: pairs ``(x[2i], x[2i+1])`` instead of the half layout.
        scale_base: ``γ`` (512 in the paper).
        center: a fixed centre for the exponent, or ``None`` for the per-call default.
        rotary_heads, rotary_heads_at: rotate (and scale) only these query heads, as for
            :class:`RotaryEmbedding` (:mod:`~.heads`; x-transformers' ``rotate_num_heads``
            with ``use_xpos``).
    """

    paper: ClassVar[str] = "Sun et al. 2022, A Length-Extrapolatable Transformer, eq. 9"
    #: xPos turns each pair counter-clockwise, as RoPE does by default.
    clockwise: ClassVar[bool] = False
    inv_freq: Tensor

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        scale_base: float = 512.0,
        center: float | None = None,
        rotary_heads: int | None = None,
        rotary_heads_at: str = "first",
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        count, last = check_rotary_heads(rotary_heads, rotary_heads_at)
        self.rotary_heads, self.rotary_heads_at = count, rotary_heads_at
        #: Which heads turn (:class:`~.heads.RotaryHeads`).
        self.heads = RotaryHeads(count, last)
        #: ``heads`` where it is not every head, for the per-forward states.
        self._some_heads = None if self.heads.trivial else self.heads
        check_positive_int("head_dim", head_dim)
        check_bytes("head_dim", head_dim, head_dim * 8 * 4, device=device)  # the frequencies
        self.head_dim = head_dim
        self.rotary_dim = check_rotary_dim(head_dim, rotary_dim)
        self.base = check_base(base)
        self.interleaved = bool(interleaved)
        self.scale_base = check_positive_float("scale_base", scale_base)
        if center is not None and (
            isinstance(center, bool) or not isinstance(center, (int, float))
        ):
            raise PosencTypeError(f"center must be a number or None, got {center!r}")
        if center is not None and not math.isfinite(center):
            raise PosencValueError(f"center must be a finite number, got {center!r}")
        self.center = None if center is None else float(center)
        inv_freq = default_inv_freq(self.rotary_dim, self.base, device=device)  # (r/2,) float64
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def reset_tables(self) -> None:
        """Rebuild the float64 frequencies on the module's device (xPos has no other fixed
        buffer); used after ``to_empty``/``.to()``."""
        device = self.inv_freq.device
        if device.type != "meta":
            self.inv_freq = default_inv_freq(self.rotary_dim, self.base, device=device)

    def _apply(self, fn: Any, recurse: bool = True) -> XPos:
        super()._apply(fn, recurse)
        self.reset_tables()  # a cast must not degrade the float64 frequencies
        return self

    def zeta(self, device: Any = None) -> Tensor:
        """``ζ_i = (2i + 0.4 r) / (1.4 r)`` for each pair, float64."""
        r = self.rotary_dim
        return (torch.arange(0, r, 2, dtype=torch.float64, device=device) + 0.4 * r) / (1.4 * r)

    def scaled_cos_sin(
        self,
        positions: Tensor,
        dtype: torch.dtype,
        *,
        key: bool,
        center: float | Tensor | None = None,
        out: torch.dtype | None = None,
        reach: float | None = None,
    ) -> tuple[Tensor, Tensor]:
        """cos and sin times ``ζ^(±(p - center)/γ)`` (``-`` for keys): ``(n, r/2)`` or
        ``(b, 1, n, r/2)``. ``positions`` are already validated; ``center`` (default: the
        module's) overrides the centre; ``out`` (default ``dtype``) is the dtype the rotated
        tensor comes out in, where every scale must be finite (:meth:`check_finite`, spared
        where ``reach``, a bound the host knows on every ``|p - center|``, shows them so)."""
        pos = positions.to(torch.float64)
        center = self.center if center is None else center
        if center is None:
            # a 0-d tensor, not a Python float: no .item() (meta tensors, export, compile)
            center = torch.floor((pos.max() + 1) / 2) if pos.numel() else 0.0
        out = dtype if out is None else out
        if reach is None or reach > self._reach(out):
            self.check_finite(positions, pos, center, out, key=key)
        angles = pos[..., None] * self.inv_freq.to(torch.float64)  # (..., n, r/2)
        power = (pos[..., None] - center) / self.scale_base  # (..., n, 1)
        scale = self.zeta(pos.device) ** (-power if key else power)  # (..., n, r/2)
        cos, sin = (angles.cos() * scale).to(dtype), (angles.sin() * scale).to(dtype)
        return unsqueeze_heads(cos), unsqueeze_heads(sin)

    def check_finite(
        self, positions: Tensor, pos: Tensor, center: float | Tensor, out: torch.dtype, *, key: bool
    ) -> None:
        """Refuse, where ``positions``' values are read (:func:`~..checks.reads_values`), a
        call whose largest scale ``(1/ζ_0)^(|p - center|/γ)`` is not finite in ``out``: the
        query's scale grows before the centre, the key's past it (``pos``: the positions in
        float64)."""
        if not pos.numel() or not reads_values(positions) or not out.is_floating_point:
            return
        reach = (center - pos if not key else pos - center).max().item()  # exponent's top
        limit = self._reach(out)
        if reach > limit:
            side = "keys" if key else "queries"
            raise PosencValueError(
                f"xPos's scale for the {side} reaches (7/2)^({reach:g}/scale_base) with "
                f"center {float(center):g} and scale_base {self.scale_base:g}: past {out}'s "
                f"largest finite value, so the rotated {side} would be inf; positions may lie "
                f"at most {limit:.0f} from the centre for {out} (pass a larger scale_base, "
                "or a shorter span of positions per call)"
            )

    def _reach(self, out: torch.dtype) -> float:
        """How far from the centre a position may lie for its scale, at most
        ``(1/ζ_0)^(reach/γ)`` with ``ζ_0 = 2/7``, to be finite in ``out``."""
        return math.log(torch.finfo(out).max) / math.log(7 / 2) * self.scale_base

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
        pos = resolve_positions(
            positions,
            x.shape[1],
            batch=x.shape[0],
            device=x.device,
        )
        work = compute_dtype(x.dtype)
        query = self.scaled_cos_sin(pos, work, key=False, out=x.dtype)
        keys = self.scaled_cos_sin(pos, work, key=True, out=x.dtype)
        return TableRotation(self.interleaved, query, keys, self._some_heads)

    def context_state(
        self,
        positions: Tensor,
        key_positions: Tensor,
        x: Tensor,
        memo: dict[str, Any],
        *,
        bound: PositionBound | None = None,
    ) -> RotaryState:
        """:meth:`position_state` with the centre fixed at the first cached call's: queries
        and keys rotated in later calls share it (the centre cancels in every score only
        when they do), so decoding equals one forward with ``center`` set to it. The context
        validated ``positions``, and the centre stays on the device: nothing is read, but for
        :meth:`check_finite` where the host's bound leaves the scales' range in doubt."""
        pos = positions
        center, reach = self._cached_center(pos, memo, bound)
        work = compute_dtype(x.dtype)
        query = self.scaled_cos_sin(pos, work, key=False, center=center, out=x.dtype, reach=reach)
        keys = self.scaled_cos_sin(pos, work, key=True, center=center, out=x.dtype, reach=reach)
        return TableRotation(self.interleaved, query, keys, self._some_heads)

    def _cached_center(
        self, pos: Tensor, memo: dict[str, Any], bound: PositionBound | None
    ) -> tuple[float | Tensor, float | None]:
        """The centre of a cached call: the module's, or the first cached call's ``(top + 1)
        // 2`` (kept in ``memo``, on the device); and a bound the host knows on every ``|p -
        center|`` of the call, from ``bound`` (its positions lie in ``0 .. bound.largest``)
        and from the first call's bound on the centre (``None`` where unknown)."""
        if self.center is None and "center" not in memo:
            top = pos.to(torch.float64).max() if pos.numel() else pos.new_tensor(-1.0).double()
            memo["center"] = torch.floor((top + 1) / 2)
            memo["center_at_most"] = None if bound is None else (bound.largest + 1) // 2
        if bound is None:
            return memo.get("center", self.center), None
        if self.center is not None:
            return self.center, max(self.center, bound.largest - self.center)
        at_most = memo["center_at_most"]  # (and at least 0)
        return memo["center"], None if at_most is None else max(at_most, bound.largest)

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
        """Keys at ``key_positions`` ``(b, keys)`` (``None``: ``arange(keys)``) and queries
        at the last ``queries`` of them, with the centre of :meth:`context_state` (the first
        cached call's); see :meth:`posenc.RotaryEncoding.read_state`."""
        pos = torch.arange(keys, device=x.device) if key_positions is None else key_positions
        center, reach = self._cached_center(pos, memo, bound)
        work = compute_dtype(x.dtype)
        query = self.scaled_cos_sin(
            pos[..., keys - queries :], work, key=False, center=center, out=x.dtype, reach=reach
        )
        rows = self.scaled_cos_sin(pos, work, key=True, center=center, out=x.dtype, reach=reach)
        return TableRotation(self.interleaved, query, rows, self._some_heads)

    def rotate(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        *,
        key: bool = False,
        position_ids: Tensor | None = None,
        inplace: bool = False,
        layout: Layout = "bhsd",
        cu_seqlens: Tensor | None = None,
        seqlen_offsets: int | Tensor = 0,
        max_seqlen: int | None = None,
        query_heads: int | None = None,
    ) -> Tensor:
        """Rotate and scale one tensor ``(b, h, n, d)``: queries, or keys with ``key=True``;
        with ``inplace=True`` in its own storage. Pass a fixed ``center`` at construction when
        queries and keys come in separate calls;
        ``position_ids`` is ``positions``'s other name; ``layout`` and the packing arguments
        as for :meth:`RotaryEmbedding.forward` (:mod:`~.layouts`); ``query_heads`` as for
        :meth:`RotaryEmbedding.rotate`."""
        positions = take_position_ids(positions, position_ids)
        stated = stated_layout(x, None, positions, layout, cu_seqlens, seqlen_offsets, max_seqlen)
        if stated is not None:
            turned = self.rotate(
                stated.q, stated.positions, key=key, inplace=inplace, query_heads=query_heads
            )
            return stated.one(turned)
        x, _ = check_qk(x, x, self.head_dim)
        group = heads_group(query_heads, x.shape[1])
        pos = resolve_positions(
            positions,
            x.shape[2],
            batch=x.shape[0],
            device=x.device,
        )
        tables = self.scaled_cos_sin(pos, compute_dtype(x.dtype), key=key, out=x.dtype)
        if self.heads.trivial:
            return apply_tables(x, tables, self.interleaved, inplace)
        return self.heads.apply_one(x, tables, group, self.interleaved, inplace)

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
        """Shapes: q ``(b, hq, n, d)``, k ``(b, hk, n, d)``, positions ``(n,)`` or ``(b, n)``;
        ``inplace`` as for :meth:`RotaryEmbedding.forward`;
        ``position_ids`` is ``positions``'s other name; ``layout`` and the packing arguments
        as for :meth:`RotaryEmbedding.forward` (:mod:`~.layouts`)."""
        positions = take_position_ids(positions, position_ids)
        stated = stated_layout(q, k, positions, layout, cu_seqlens, seqlen_offsets, max_seqlen)
        if stated is not None:
            return stated.pair(self(stated.q, stated.k, stated.positions, inplace=inplace))
        q, k = check_qk(q, k, self.head_dim)
        if not self.heads.trivial:
            self.heads.pair(q, k)  # (refused before any work where the heads do not fit)
        b, _, n, _ = q.shape
        pos = resolve_positions(positions, n, batch=b, device=q.device)
        work = torch.promote_types(compute_dtype(q.dtype), compute_dtype(k.dtype))
        q_tables = self.scaled_cos_sin(pos, work, key=False, out=q.dtype)
        k_tables = self.scaled_cos_sin(pos, work, key=True, out=k.dtype)
        if self.heads.trivial:
            return apply_tables_qk(q, k, q_tables, k_tables, self.interleaved, inplace)
        return self.heads.apply_pair(q, k, q_tables, k_tables, self.interleaved, inplace)

    def extra_repr(self) -> str:
        text = f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base:g}"
        if self.interleaved:
            text += ", interleaved=True"
        return text + f", scale_base={self.scale_base:g}" + self.heads.summary()
