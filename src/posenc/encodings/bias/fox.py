"""FoX, the Forgetting Transformer (Lin, Nikishin, He & Courville 2025, "Forgetting Transformer:
Softmax Attention with a Forget Gate", ICLR): a data-dependent ALiBi. Each token ``l`` has a
forget gate per head, ``f_{h,l} = σ(w_hᵀ x_l + b_h)`` from the attention layer's input ``x``,
and the logit of query ``i`` for key ``j ≤ i`` gains the log of the gates in between (eq. 5):

    bias[h, i, j] = Σ_{l=j+1..i} log f_{h,l} = F_{h,i} - F_{h,j},   F_{h,i} = Σ_{l≤i} log f_{h,l}

so a flex ``score_mod`` reads one per-token cumulative sum twice per score. A bidirectional
model (x-transformers' ``DataDependentAlibi(causal=False)``) has a second set of gates ``g``
for keys after the query: ``bias[h, i, j] = G_{h,j} - G_{h,i}`` for ``j > i``.

The sums run over the tokens of the sequence (or of the cache), in order; positions are not
read. Packed documents are contiguous runs, so a pair inside one document sums only its own
gates; left or right padding never lies between two real tokens of a row.

Dimension legend: ``b`` batch, ``h`` heads, ``c`` gate sets × heads, ``nq``/``nk``
query/key length, ``D`` model width.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import PosencTypeError, PosencValueError
from ..base import BiasEncoding, ScoreMod
from ..checks import PositionBound, check_bool, check_finite, check_positive_int, compute_dtype
from ..registry import register
from ..state import BiasState
from .common import check_bias_bytes, check_pair_positions

__all__ = ["FoX"]

PAPER = "Lin et al. 2025, Forgetting Transformer (FoX), ICLR"


@register("fox", "data-dependent ALiBi: sums of per-token log forget gates (FoX)")
class FoX(BiasEncoding):
    """The Forgetting Transformer's forget-gate bias (Lin et al. 2025, eq. 5):
    ``bias[h, i, j] = Σ_{l=j+1..i} log σ(w_hᵀ x_l + b_h)`` for ``j ≤ i`` (and, bidirectional,
    ``Σ_{l=i+1..j} log σ(v_hᵀ x_l + c_h)`` for ``j > i``), ``x`` the attention layer's input.

    Checked against x-transformers' ``DataDependentAlibi`` (causal and bidirectional) with
    the weights copied, bias and gradients, and against a float64 transcription of the sum
    (``tests/encodings/bias/test_fox.py``). The gate projection runs in ``x``'s dtype; the
    log-gates and their cumulative sums in the work dtype (float32 for half inputs).

    A :class:`~posenc.KVCache` keeps each layer's log-gates (``b · c`` floats a token, in the
    cache's per-encoding memo) so a decoding step sums the cached tokens' gates too; a
    :class:`~posenc.StreamingCache` is refused (its evicted tokens' gates would drop out of
    the sums between a sink and the window).

    Args:
        dim: the width ``D`` of the attention layer's input.
        num_heads: number of heads ``H``.
        causal: one gate per head (keys up to the query), as the paper; ``False`` adds the
            second set for keys after the query. A causal model builds it with ``True``.
        bias_init: the gates' initial bias ``b_h`` (x-transformers: 5, ``σ(5) ≈ 0.993``).
        post_log_scale: a factor on the log-gates (x-transformers' ``post_log_scale``).
    """

    paper: ClassVar[str] = PAPER
    needs_x: ClassVar[bool] = True
    has_score_mod: ClassVar[bool] = True
    causal_defaults: ClassVar[dict[str, Any]] = {"causal": True}

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        causal: bool = False,
        bias_init: float = 5.0,
        post_log_scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.causal = check_bool("causal", causal)
        for name, value in (("bias_init", bias_init), ("post_log_scale", post_log_scale)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise PosencTypeError(f"{name} must be a number, got {type(value).__name__}")
            check_finite(name, torch.tensor(float(value)))
        self.bias_init, self.post_log_scale = float(bias_init), float(post_log_scale)
        #: ``w_h`` and ``b_h`` of every gate: the forward gates first, then the backward ones.
        self.gate = nn.Linear(dim, num_heads * (1 if causal else 2))
        nn.init.constant_(self.gate.bias, self.bias_init)

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> FoX:
        return cls(dim, num_heads, **kwargs)

    def log_gates(self, x: Tensor) -> Tensor:
        """``post_log_scale · log σ(W x + b)`` ``(b, c, n)`` for ``x`` ``(b, n, D)``: the
        forward gates in ``[:, :H]``, the backward ones (bidirectional) in ``[:, H:]``."""
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise PosencTypeError(f"FoX needs x= as a floating-point (b, n, D) tensor, got {x!r}")
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise PosencValueError(
                f"FoX expects x of shape (b, n, D={self.dim}), got {tuple(x.shape)}"
            )
        # (b, n, c): the projection in the weights' dtype, the gates in the input's work dtype
        logits = self.gate(x.to(self.gate.weight.dtype))
        gates = F.logsigmoid(logits.to(compute_dtype(x.dtype))) * self.post_log_scale
        return gates.transpose(1, 2)  # (b, c, n)

    def _sums(
        self, q_positions: Tensor, k_positions: Tensor, x: Tensor | None, gates: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """The cumulative sums of the queries ``(b, c, nq)`` and keys ``(b, c, nk)``: the keys
        are the last ``nk`` tokens whose log-``gates`` ``(b, c, nk)`` are given (from ``x``
        when not), the queries the last ``nq`` of them."""
        q_pos, k_pos = check_pair_positions(q_positions, k_positions)
        nq, nk = q_pos.shape[-1], k_pos.shape[-1]
        if gates is None:
            if x is None:
                raise PosencValueError("FoX.bias needs x= (the (b, n, D) input of attention)")
            gates = self.log_gates(x)
        if gates.shape[-1] != nk or nq > nk:
            raise PosencValueError(
                f"FoX reads the gates of every key: {gates.shape[-1]} tokens for {nk} keys "
                f"and {nq} queries (the queries are the last keys)"
            )
        total = gates.cumsum(-1)  # (b, c, nk): F_j
        return total[..., nk - nq :], total

    def bias(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        x: Tensor | None = None,
        gates: Tensor | None = None,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> Tensor:
        """``(b, h, nq, nk)``: ``F_i - F_j`` for ``j ≤ i`` (bidirectional: ``G_j - G_i`` for
        ``j > i``), ``x`` ``(b, nk, D)`` or the keys' log-``gates`` ``(b, c, nk)``."""
        fq, fk = self._sums(q_positions, k_positions, x, gates)
        b, h, nq, nk = fq.shape[0], self.num_heads, fq.shape[-1], fk.shape[-1]
        check_bias_bytes(q_positions, k_positions, h + 2, fq.new_empty(b, 0))
        forward = fq[:, :h, :, None] - fk[:, :h, None, :]  # (b, h, nq, nk)
        if self.causal:
            return forward
        backward = fk[:, h:, None, :] - fq[:, h:, :, None]
        i = torch.arange(nk - nq, nk, device=fq.device)[:, None]
        after = torch.arange(nk, device=fq.device)[None, :] > i  # (nq, nk): key after query
        return torch.where(after, backward, forward)

    def score_mod(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        x: Tensor | None = None,
        gates: Tensor | None = None,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> ScoreMod | None:
        """Adds ``F[b, h, i] - F[b, h, j]`` inside the kernel (two reads of the per-token
        sums per score; bidirectional: the backward sums where the key is after the query)."""
        fq, fk = self._sums(q_positions, k_positions, x, gates)
        h, offset = self.num_heads, fk.shape[-1] - fq.shape[-1]
        # one tensor per read (compiled flex's backward takes one indexing per captured tensor)
        fwd_q, fwd_k = fq[:, :h].clone(), fk[:, :h].clone()

        if self.causal:

            def forget(score: Tensor, b: Tensor, hh: Tensor, q_idx: Tensor, kv_idx: Tensor):
                return score + (fwd_q[b, hh, q_idx] - fwd_k[b, hh, kv_idx]).to(score.dtype)

            return forget
        bwd_q, bwd_k = fq[:, h:].clone(), fk[:, h:].clone()
        start = torch.tensor(offset, device=fq.device)

        def forget_both(score: Tensor, b: Tensor, hh: Tensor, q_idx: Tensor, kv_idx: Tensor):
            before = fwd_q[b, hh, q_idx] - fwd_k[b, hh, kv_idx]
            after = bwd_k[b, hh, kv_idx] - bwd_q[b, hh, q_idx]
            return score + torch.where(kv_idx > q_idx + start, after, before).to(score.dtype)

        return forget_both

    def context_state(
        self,
        positions: Tensor,
        key_positions: Tensor,
        x: Tensor,
        memo: dict[str, Any],
        *,
        bound: PositionBound | None = None,
    ) -> BiasState:
        """A cached or packed forward: each layer's keys read the log-gates of the cached
        tokens (kept in ``memo``) followed by the new tokens'."""
        return _CachedGates(self, positions, key_positions, memo)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, causal={self.causal}"


class _CachedGates(BiasState):
    """FoX's state in a cached or packed forward: every layer keeps the log-gates of its
    tokens under its own key in the cache's memo, and its keys read them all."""

    def __init__(self, pe: FoX, positions: Tensor, key_positions: Tensor, memo: dict) -> None:
        super().__init__(pe, positions, key_positions)
        self.memo = memo
        self.gates: Tensor | None = None

    def reading(self, x: Tensor, layer: nn.Module, *, streaming: bool = False) -> BiasState:
        if streaming:
            raise PosencValueError(
                "fox cannot join a StreamingCache: its bias sums the forget gates of every "
                "token between a key and a query, and the cache evicts them; use a "
                "posenc.KVCache"
            )
        state = super().reading(x, layer, streaming=streaming)
        assert isinstance(state, _CachedGates) and isinstance(self.pe, FoX)
        new = self.pe.log_gates(x)  # (b, c, n)
        held = self.key_positions.shape[-1] - x.shape[1]  # the cached tokens' count
        past = self.memo.get(layer)
        if held and (past is None or past.shape[-1] < held):
            raise PosencValueError(
                f"fox: the cache holds {held} tokens but the log-gates of "
                f"{0 if past is None else past.shape[-1]} for this layer"
            )
        every = new if not held else torch.cat([past[..., past.shape[-1] - held :], new], -1)
        self.memo[layer] = every
        state.gates = every
        return state

    def _ask(self, name: str, hook: Callable[..., Any], q: Tensor, k: Tensor) -> Any:
        q_pos, k_pos = self.positions, self.last_keys(k.shape[-2])
        assert self.gates is not None
        gates = self.gates[..., self.gates.shape[-1] - k.shape[-2] :]
        return hook(q_pos, k_pos, gates=gates)
