"""PoPE: polar coordinate position embeddings (Gopalakrishnan, Csordás, Schmidhuber & Mozer 2025,
"Decoupling the 'What' and 'Where' With Polar Coordinate Positional Embeddings",
arXiv:2509.10534).

Each channel ``c`` of a query or key becomes a complex number whose magnitude is the content,
``softplus(x_c)``, and whose phase is the position, ``p θ_c``, with one frequency per channel
``θ_c = base^(-c/d)``, ``c = 0..d-1``. The score is the real part of ``q'·conj(k')`` plus a
learned phase offset ``δ_{h,c} ∈ [-2π, 0]`` per head and channel:

    score(m, n) = sum_c softplus(q_c) softplus(k_c) cos((m - n) θ_c - δ_c)

The real part of a product of complex numbers is a real dot product of twice the width, so PoPE
is a transform of queries and keys, ``d`` channels in, ``2d`` out:

    q' = √2 · softplus(q) · (cos(m θ - δ), sin(m θ - δ))
    k' =       softplus(k) · (cos(n θ),     sin(n θ))

``δ`` sits on the queries, which have a phase per query head, so grouped-query keys need none
and cached keys stay valid when ``δ`` is trained. x-transformers (``PolarEmbedding``,
``apply_polar_pos_emb``) adds ``δ`` to the keys' phase instead: the same ``cos((m - n)θ - δ)``
in every score. The factor ``√2`` on the queries keeps x-transformers' score scale:
attention divides by the square root of the width it sees, ``2d``, and
``√2 / √(2d) = 1 / √d``.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import PosencValueError, check_bytes
from ..base import RotaryEncoding
from ..checks import (
    PositionBound,
    check_bool,
    check_positive_int,
    compute_dtype,
    resolve_positions,
    take_position_ids,
)
from ..registry import register
from ..state import RotaryState
from .common import check_base, check_qk
from .layouts import Layout, stated_layout

__all__ = ["PoPE"]


@register("pope", "softplus magnitudes with rotating phases and learned offsets (PoPE)")
class PoPE(RotaryEncoding):
    """Polar coordinate position embeddings (Gopalakrishnan et al. 2025): ``score(m, n) =
    sum_c softplus(q_c) softplus(k_c) cos((m - n) θ_c - δ_{h,c})``, as queries and keys of
    twice the head dim (see the module docstring).

    Checked against x-transformers' ``PolarEmbedding`` and ``apply_polar_pos_emb`` with the
    same ``δ``: the transformed keys, the scores, the attention outputs and the gradients of
    ``q``, ``k`` and ``δ``; and its ``Attention(polar_pos_emb=...)`` against
    :class:`~posenc.MultiHeadAttention` with the weights copied
    (``tests/encodings/rotary/test_pope.py``).

    Angles ``p θ_c - δ`` are formed in float64 and cast once to the work dtype (float32 for
    half-precision inputs); softplus is taken in the work dtype; the outputs have the inputs'
    dtypes. ``δ`` is clamped to ``[-2π, 0]`` in every forward, as x-transformers does (no
    gradient reaches an entry outside that range).

    Args:
        head_dim: channels per head ``d`` (the outputs have ``2d``).
        num_heads: query heads; ``phase`` holds one offset per head and channel.
        base: the wavelength base of the frequencies ``θ_c = base^(-c/d)``.
        uniform_phase: draw ``δ`` uniformly from ``[-2π, 0]`` (x-transformers'
            ``polar_bias_uniform_init``) instead of zeros.
    """

    width_factor = 2

    paper: ClassVar[str] = "Gopalakrishnan et al. 2025, PoPE, arXiv:2509.10534"
    inv_freq: Tensor

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        *,
        base: float = 10000.0,
        uniform_phase: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.num_heads = check_positive_int("num_heads", num_heads)
        check_bytes("head_dim", head_dim, num_heads * head_dim * 8 * 2, device=device)
        self.base = check_base(base)
        self.uniform_phase = check_bool("uniform_phase", uniform_phase)
        self.phase = nn.Parameter(torch.zeros(num_heads, head_dim, device=device))  # δ (h, d)
        if self.uniform_phase:
            with torch.no_grad():
                self.phase.uniform_(-2.0 * math.pi, 0.0)
        self.register_buffer("inv_freq", self._inv_freq(device), persistent=False)

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> PoPE:
        return cls(kwargs.pop("head_dim", dim // num_heads), num_heads, **kwargs)

    def _inv_freq(self, device: Any) -> Tensor:
        """``θ_c = base^(-c/d)``, ``c = 0..d-1``, float64 ``(d,)``."""
        c = torch.arange(self.head_dim, dtype=torch.float64, device=device)
        return self.base ** (-c / self.head_dim)

    def reset_tables(self) -> None:
        """Rebuild the float64 frequencies on the module's device (after ``to_empty``/``.to()``)."""
        if self.inv_freq.device.type != "meta":
            self.inv_freq = self._inv_freq(self.inv_freq.device)

    def _apply(self, fn: Any, recurse: bool = True) -> PoPE:
        super()._apply(fn, recurse)
        self.reset_tables()  # a cast must not degrade the float64 frequencies
        return self

    def tables(
        self, positions: Tensor, dtype: torch.dtype
    ) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        """cos and sin of the queries' angles ``p θ - δ``, ``(h, n, d)`` (``(b, h, n, d)`` for
        batched positions), and of the keys' ``p θ``, ``(n, d)`` (``(b, 1, n, d)``), in
        ``dtype``; ``positions`` ``(n,)`` or ``(b, n)`` are already validated."""
        where = positions.to(torch.float64)[..., None] * self.inv_freq.to(torch.float64)
        if where.dim() == 3:
            where = where.unsqueeze(1)  # (b, 1, n, d)
        # clamped in float64: a bf16 phase clamped in bf16 would stop at bf16(-2π)
        delta = self.phase.to(torch.float64).clamp(-2.0 * math.pi, 0.0)[:, None, :]  # (h, 1, d)
        query = where - delta  # (h, n, d) | (b, h, n, d)
        return (query.cos().to(dtype), query.sin().to(dtype)), (
            where.cos().to(dtype),
            where.sin().to(dtype),
        )

    def _transform(
        self, q: Tensor, k: Tensor, tables: tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]
    ) -> tuple[Tensor, Tensor]:
        (q_cos, q_sin), (k_cos, k_sin) = tables
        if q.shape[1] != self.num_heads:
            raise PosencValueError(
                f"q has {q.shape[1]} heads but PoPE has a phase for num_heads={self.num_heads}"
            )
        work = q_cos.dtype
        a, b = F.softplus(q.to(work)), F.softplus(k.to(work))  # magnitudes
        q_out = torch.cat([a * q_cos, a * q_sin], dim=-1) * math.sqrt(2.0)  # (b, h, n, 2d)
        k_out = torch.cat([b * k_cos, b * k_sin], dim=-1)
        return q_out.to(q.dtype), k_out.to(k.dtype)

    def position_state(self, positions: Tensor | None, x: Tensor) -> RotaryState:
        """The tables of one forward, computed once for every layer."""
        pos = resolve_positions(
            positions,
            x.shape[1],
            batch=x.shape[0],
            device=x.device,
        )
        return PopeTransform(self, self.tables(pos, compute_dtype(x.dtype)), check=True)

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
        """Keys at ``key_positions`` ``(b, keys)`` (``None``: ``arange(keys)``), transformed
        when read, and the queries at the last ``queries`` of them (a
        :class:`~posenc.StreamingCache`; see :meth:`posenc.RotaryEncoding.read_state`)."""
        pos = torch.arange(keys, device=x.device) if key_positions is None else key_positions
        work = compute_dtype(x.dtype)
        query_tables = self.tables(pos[..., keys - queries :], work)[0]
        key_tables = self.tables(pos, work)[1]
        return PopeTransform(self, (query_tables, key_tables), check=False)

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
        """Shapes: q ``(b, h, n, d)``, k ``(b, hk, n, d)``, positions ``(n,)`` or ``(b, n)``;
        returns q' ``(b, h, n, 2d)`` and k' ``(b, hk, n, 2d)`` (in ``layout``). ``inplace`` is
        accepted for the rotary protocol and ignored: the outputs are new tensors of twice the
        width;
        ``position_ids`` is ``positions``'s other name; ``layout`` and the packing arguments
        as for :meth:`RotaryEmbedding.forward` (:mod:`~.layouts`)."""
        positions = take_position_ids(positions, position_ids)
        stated = stated_layout(q, k, positions, layout, cu_seqlens, seqlen_offsets, max_seqlen)
        if stated is not None:
            return stated.pair(self(stated.q, stated.k, stated.positions, inplace=inplace))
        q, k = check_qk(q, k, self.head_dim)
        b, _, n, _ = q.shape
        pos = resolve_positions(positions, n, batch=b, device=q.device)
        work = torch.promote_types(compute_dtype(q.dtype), compute_dtype(k.dtype))
        return self._transform(q, k, self.tables(pos, work))

    def extra_repr(self) -> str:
        text = f"head_dim={self.head_dim}, num_heads={self.num_heads}"
        return text if self.base == 10000.0 else text + f", base={self.base:g}"


class PopeTransform(RotaryState):
    """PoPE's per-forward state: each layer's ``q`` and ``k`` transformed with the tables
    computed once; ``check``: whether ``q`` and ``k`` are checked as a pair of one length
    (not where queries and keys read from a cache differ in length)."""

    def __init__(self, pope: PoPE, tables: Any, *, check: bool) -> None:
        super().__init__()
        self.pope, self.tables, self.check = pope, tables, check

    def rotate(self, q: Tensor, k: Tensor, inplace: bool) -> tuple[Tensor, Tensor]:
        if self.check:
            q, k = check_qk(q, k, self.pope.head_dim)
        return self.pope._transform(q, k, self.tables)
