"""FoPE: Fourier position embedding (Hua, Jiang, Li, Xu et al. 2025, "Fourier Position Embedding:
Enhancing Attention's Periodic Extension for Length Generalization", ICML; Intern-S1-Pro; vLLM
``FourierRotaryEmbedding``).

RoPE's frequencies ``ω_k = base^(-2k/d)`` whose period is longer than the training length
``L`` (``ω_k ≤ 2π / L``) are never seen through a whole turn in training; FoPE zeroes them (their
channels pass through, ``cos = 1``, ``sin = 0``), and turns each kept dimension into a Fourier
series over every kept frequency, with learned coefficients per key/value head ``g`` (§4,
eqs. 8-9):

    C_g(p)[c] = Σ_k cos(p ω_k) A_g[k, c],    S_g(p)[c] = Σ_k sin(p ω_k) B_g[k, c]

    q'[c]       = q[c] C(p)[c] - q[c + d/2] S(p)[c]
    q'[c + d/2] = q[c + d/2] C(p)[c] + q[c] S(p)[c]

in the half (GPT-NeoX) layout, keys alike; query head ``h`` uses its key/value head's
coefficients. With ``A = B = I`` it is RoPE over the kept frequencies. Mixed, ``(C, S)`` is no
longer a rotation, so the score is not a function of ``m - n`` alone.

Dimension legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads (coefficient sets),
``n`` sequence, ``d`` head dim, ``K`` kept frequencies.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ...errors import PosencTypeError, PosencValueError
from ..base import RotaryEncoding
from ..checks import (
    PositionBound,
    check_positive_int,
    compute_dtype,
    resolve_positions,
    take_position_ids,
)
from ..registry import register
from ..state import RotaryState
from .common import check_base, check_qk
from .layouts import Layout, stated_layout

__all__ = ["FoPE"]


@register("fope", "RoPE with long periods zeroed and frequencies mixed per KV head (FoPE)")
class FoPE(RotaryEncoding):
    """Fourier position embedding (Hua et al. 2025): RoPE whose frequencies below ``2π / L``
    are zeroed and whose cos and sin tables are mixed over the kept frequencies by learned
    matrices, one pair per key/value head (see the module docstring).

    Checked against vLLM's ``FourierRotaryEmbedding.forward_native`` written out in float64
    (the table build, its padding and the half-layout application), per-head and shared
    coefficients (``tests/encodings/rotary/test_fope.py``). Angles ``p ω_k`` are formed in
    float64; the mixed tables are cast once to the work dtype (float32 for half inputs),
    where q and k are transformed.

    Args:
        head_dim: channels per head ``d`` (even).
        num_kv_heads: coefficient sets ``g``: of ``H`` query (or key) heads, head ``h`` uses
            set ``h // (H / g)``, so grouped key/value heads take one set each; ``1`` shares
            one set (vLLM's ``fope_sep_head=False``).
        base: the wavelength base of ``ω_k = base^(-2k/d)``.
        max_position_embeddings: the training length ``L``: frequencies ``ω_k ≤ 2π / L`` are
            zeroed.
        num_inv_freq: keep the first ``K`` frequencies instead (vLLM's ``num_inv_freq``).
        init_std: the coefficients start at the identity plus this standard deviation of
            Gaussian noise (``0``: RoPE over the kept frequencies).
    """

    paper: ClassVar[str] = "Hua et al. 2025, Fourier Position Embedding (FoPE), ICML"
    inv_freq: Tensor

    def __init__(
        self,
        head_dim: int,
        *,
        num_kv_heads: int = 1,
        base: float = 10000.0,
        max_position_embeddings: int = 2048,
        num_inv_freq: int | None = None,
        init_std: float = 0.02,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = check_positive_int("head_dim", head_dim)
        if head_dim % 2:
            raise PosencValueError(f"head_dim must be even for FoPE, got {head_dim}")
        self.num_kv_heads = check_positive_int("num_kv_heads", num_kv_heads)
        self.base = check_base(base)
        self.max_position_embeddings = check_positive_int(
            "max_position_embeddings", max_position_embeddings
        )
        if num_inv_freq is not None:
            check_positive_int("num_inv_freq", num_inv_freq)
            if num_inv_freq > head_dim // 2:
                raise PosencValueError(
                    f"num_inv_freq must be at most head_dim / 2 = {head_dim // 2}, "
                    f"got {num_inv_freq}"
                )
        self.num_inv_freq = num_inv_freq
        if isinstance(init_std, bool) or not isinstance(init_std, int | float):
            raise PosencTypeError(f"init_std must be a number, got {type(init_std).__name__}")
        if not (math.isfinite(init_std) and init_std >= 0):
            raise PosencValueError(f"init_std must be finite and >= 0, got {init_std}")
        kept_freq = self._inv_freq("cpu")  # (a meta device cannot count the kept ones)
        kept = kept_freq.shape[0]
        inv_freq = torch.empty(kept, dtype=torch.float64, device=device).copy_(kept_freq)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        if kept == 0:
            raise PosencValueError(
                f"FoPE keeps no frequency: every period of head_dim={head_dim}, base={base:g} "
                f"is longer than max_position_embeddings={max_position_embeddings}"
            )
        eye = torch.eye(kept, device=device).expand(num_kv_heads, kept, kept)
        #: ``A_g``: mixes the cosines of the kept frequencies ``(g, K, K)``.
        self.cos_coef = nn.Parameter(eye + init_std * torch.randn_like(eye))
        #: ``B_g``: mixes the sines ``(g, K, K)``.
        self.sin_coef = nn.Parameter(eye + init_std * torch.randn_like(eye))

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> FoPE:
        """One shared coefficient set unless ``num_kv_heads`` is given (a model's key/value
        head count, for one set per key/value head)."""
        return cls(kwargs.pop("head_dim", dim // num_heads), **kwargs)

    def _inv_freq(self, device: Any) -> Tensor:
        """The kept ``ω_k``, float64 ``(K,)``."""
        k = torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=device)
        inv_freq = self.base ** (-k / self.head_dim)
        if self.num_inv_freq is not None:
            return inv_freq[: self.num_inv_freq]
        return inv_freq[inv_freq > 2.0 * math.pi / self.max_position_embeddings]

    def reset_tables(self) -> None:
        """Rebuild the float64 frequencies on the module's device (after ``to_empty``/``.to()``)."""
        if self.inv_freq.device.type != "meta":
            self.inv_freq = self._inv_freq(self.inv_freq.device)

    def _apply(self, fn: Any, recurse: bool = True) -> FoPE:
        super()._apply(fn, recurse)
        self.reset_tables()  # a cast must not degrade the float64 frequencies
        return self

    def tables(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The mixed ``C`` and ``S`` at ``positions`` ``(n,)`` or ``(b, n)``, padded over the
        zeroed frequencies (``C = 1``, ``S = 0``) and repeated over both halves:
        ``(g, n, d)`` or ``(b, g, n, d)``, in ``dtype``."""
        angles = positions.to(torch.float64)[..., None] * self.inv_freq.to(torch.float64)
        angles = angles.unsqueeze(-3)  # (1, n, K) | (b, 1, n, K)
        cos = angles.cos() @ self.cos_coef.to(torch.float64)  # (g, n, K) | (b, g, n, K)
        sin = angles.sin() @ self.sin_coef.to(torch.float64)
        pad = self.head_dim // 2 - cos.shape[-1]
        cos = torch.nn.functional.pad(cos, (0, pad), value=1.0)
        sin = torch.nn.functional.pad(sin, (0, pad), value=0.0)
        return torch.cat([cos, cos], -1).to(dtype), torch.cat([sin, sin], -1).to(dtype)

    def _heads(self, t: Tensor, tables: tuple[Tensor, Tensor], name: str) -> Tensor:
        """``t`` ``(b, heads, n, d)`` transformed by its heads' coefficient sets."""
        cos, sin = tables
        heads, g = t.shape[1], self.num_kv_heads
        if heads % g:
            raise PosencValueError(
                f"{name} has {heads} heads, not a multiple of FoPE's num_kv_heads={g} "
                "(its coefficient sets)"
            )
        if heads != g:  # each set serves heads / g heads, in order
            cos, sin = (x.repeat_interleave(heads // g, dim=-3) for x in (cos, sin))
        work = cos.dtype
        x = t.to(work)
        half = self.head_dim // 2
        turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return (x * cos + turned * sin).to(t.dtype)

    def _transform(
        self, q: Tensor, k: Tensor, q_tables: tuple[Tensor, Tensor], k_tables: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, Tensor]:
        return self._heads(q, q_tables, "q"), self._heads(k, k_tables, "k")

    def position_state(self, positions: Tensor | None, x: Tensor) -> RotaryState:
        """The tables of one forward, computed once for every layer."""
        pos = resolve_positions(positions, x.shape[1], batch=x.shape[0], device=x.device)
        tables = self.tables(pos, compute_dtype(x.dtype))

        def transform(q: Tensor, k: Tensor, inplace: bool) -> tuple[Tensor, Tensor]:
            return self._transform(*check_qk(q, k, self.head_dim), tables, tables)

        return RotaryState(transform)

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
        q_tables = self.tables(pos[..., keys - queries :], work)
        k_tables = self.tables(pos, work)

        def transform(q: Tensor, k: Tensor, inplace: bool) -> tuple[Tensor, Tensor]:
            return self._transform(q, k, q_tables, k_tables)

        return RotaryState(transform)

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
        returns both transformed, as new tensors (``inplace`` is accepted for the rotary
        protocol and ignored); ``position_ids`` is ``positions``'s other name; ``layout``
        and the packing arguments as for :meth:`RotaryEmbedding.forward` (:mod:`~.layouts`)."""
        positions = take_position_ids(positions, position_ids)
        stated = stated_layout(q, k, positions, layout, cu_seqlens, seqlen_offsets, max_seqlen)
        if stated is not None:
            return stated.pair(self(stated.q, stated.k, stated.positions))
        q, k = check_qk(q, k, self.head_dim)
        b, _, n, _ = q.shape
        pos = resolve_positions(positions, n, batch=b, device=q.device)
        work = torch.promote_types(compute_dtype(q.dtype), compute_dtype(k.dtype))
        tables = self.tables(pos, work)
        return self._transform(q, k, tables, tables)

    def extra_repr(self) -> str:
        text = f"head_dim={self.head_dim}, num_kv_heads={self.num_kv_heads}"
        text += f", kept={self.inv_freq.shape[0]}, max_position_embeddings="
        text += str(self.max_position_embeddings)
        return text if self.base == 10000.0 else text + f", base={self.base:g}"
