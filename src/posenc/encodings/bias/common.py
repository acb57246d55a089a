"""Shared machinery of the bias family: checking query/key positions, pairwise distances, and
``score_mod`` builders that read a per-head table instead of an ``n × n`` bias.

Every attention-bias scheme adds ``B[h, i, j] = f_h(q_pos[i], k_pos[j])`` to the logits. A
materialised ``B`` costs ``h · nq · nk`` floats (4 GiB in fp32 at 16 heads, n = 8192); a
``score_mod`` for :func:`torch.nn.attention.flex_attention` computes each entry inside the
fused kernel instead. Schemes that depend only on the distance ``q_pos - k_pos`` between
integer positions need just one value per head and distance, ``h · (2n - 1)`` floats, which
:func:`distance_table_score_mod` looks up inside the kernel.

Positions whose values the host does not read (:func:`~posenc.encodings.checks.reads_values`:
on a GPU, a read would synchronise) are never read here: a table by distance is sized from a
host bound (``distance_bound``, or where the bias stops changing), and without one the bias
is formed from the distances themselves (:meth:`DistanceBias.formula_score_mod`); the value
checks (finite, whole numbers) run only where the values are read.

Dimension legend: ``b`` batch, ``h`` heads, ``nq``/``nk`` query/key length, ``R`` distinct
distances.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor, nn

from ...errors import PosencTypeError, PosencValueError, check_bytes
from ..base import BiasEncoding, ScoreMod
from ..checks import check_finite, compute_dtype, reads_values

#: ``at(b, idx) -> position`` inside a score_mod.
_Gather = Callable[[Tensor, Tensor], Tensor]


def check_pair_positions(q_positions: object, k_positions: object) -> tuple[Tensor, Tensor]:
    """Validate query and key positions for a bias: each ``(n,)`` or ``(b, n)``, integer or
    float (finite, where the values are read: :func:`~posenc.encodings.checks.reads_values`),
    with batch sizes that broadcast (equal, or one of them 1 or absent)."""
    for name, pos in (("q_positions", q_positions), ("k_positions", k_positions)):
        if not isinstance(pos, Tensor):
            raise PosencTypeError(f"{name} must be a torch.Tensor, got {type(pos).__name__}")
        if pos.dtype == torch.bool or pos.is_complex():
            raise PosencTypeError(
                f"{name} must be an integer or float tensor, got dtype {pos.dtype}"
            )
        if pos.dim() not in (1, 2):
            raise PosencValueError(
                f"{name} must have shape (seq,) or (batch, seq), got {tuple(pos.shape)}"
            )
        if reads_values(pos):
            check_finite(name, pos)
    assert isinstance(q_positions, Tensor) and isinstance(k_positions, Tensor)
    if q_positions.dim() == 2 and k_positions.dim() == 2:
        bq, bk = q_positions.shape[0], k_positions.shape[0]
        if bq != bk and 1 not in (bq, bk):
            raise PosencValueError(
                f"q_positions {tuple(q_positions.shape)} and k_positions "
                f"{tuple(k_positions.shape)} have mismatched batch sizes ({bq} vs {bk})"
            )
    return q_positions, k_positions


def check_bias_bytes(
    q_positions: Tensor, k_positions: Tensor, values_per_pair: int, q: Tensor | None = None
) -> None:
    """Raise :class:`~posenc.errors.MemoryBudgetError` before a bias is materialised when its
    ``b · nq · nk`` pairs, ``values_per_pair`` float64-sized values each (the heads, plus the
    distances and temporaries a scheme forms), would pass the memory budget."""
    if torch.compiler.is_compiling():
        return  # symbolic sizes: checked by the eager call
    batches = [p.shape[0] for p in (q_positions, k_positions) if p.dim() == 2]
    b = max([1 if q is None else q.shape[0], *batches])
    nq, nk = q_positions.shape[-1], k_positions.shape[-1]
    check_bytes(
        "q_positions x k_positions",
        f"{nq} x {nk} (batch {b}, {values_per_pair} values per pair)",
        b * nq * nk * values_per_pair * 8,
        device=q_positions.device,
    )


def relative_distance(q_positions: Tensor, k_positions: Tensor, dtype: torch.dtype) -> Tensor:
    """``q_pos[i] - k_pos[j]`` in ``dtype``: ``(nq, nk)`` for 1-D positions, else
    ``(b, nq, nk)``."""
    q = q_positions.to(dtype).unsqueeze(-1)  # (..., nq, 1)
    k = k_positions.to(dtype).unsqueeze(-2)  # (..., 1, nk)
    return q - k


def is_integral(positions: Tensor) -> bool:
    """True for integer dtypes, and for float tensors holding whole numbers, checked where
    their values are read (:func:`~posenc.encodings.checks.reads_values`); float positions
    that are not read (on a GPU, inside ``torch.compile``, on the meta device): False."""
    if not positions.is_floating_point():
        return True
    if not reads_values(positions):
        return False
    return bool(torch.equal(positions, positions.round()))


def require_integral(name: str, positions: Tensor, scheme: str) -> None:
    """Raise unless ``positions`` hold whole numbers, checked where their values are read
    (:func:`~posenc.encodings.checks.reads_values`); elsewhere nothing is checked, and the
    schemes take float positions as whole."""
    if positions.is_floating_point() and reads_values(positions) and not is_integral(positions):
        bad = positions[positions != positions.round()].flatten()[0].item()
        raise PosencValueError(
            f"{name} must hold whole numbers for {scheme} (its table is indexed by distance), "
            f"got {bad}"
        )


def work_dtype(q: Tensor | None, module: nn.Module) -> torch.dtype:
    """The dtype a bias is computed in: that of the queries when given (fp32 for half types),
    else that of the module's parameters (fp32 when it has none)."""
    if q is not None:
        return compute_dtype(q.dtype)
    for p in module.parameters():
        return compute_dtype(p.dtype)
    return torch.float32


def _is_shifted_arange(positions: Tensor) -> bool:
    """True when ``positions == positions[0] + arange(n)``, checked where the values are read
    (:func:`~posenc.encodings.checks.reads_values`): elsewhere reading the answer would
    synchronise the host with the device (False there)."""
    if not positions.numel() or not reads_values(positions):
        return False
    steps = torch.arange(positions.shape[0], device=positions.device, dtype=positions.dtype)
    return bool(torch.equal(positions, positions[0] + steps))


def gather_fn(positions: Tensor) -> _Gather:
    """``at(b, idx)`` reading ``positions`` inside a score_mod: ``(n,)`` or ``(1, n)`` ignore
    the batch index, ``(b, n)`` use it."""
    if positions.dim() == 2 and positions.shape[0] == 1:
        positions = positions[0]
    if positions.dim() == 1 and _is_shifted_arange(positions):
        # the usual case on the CPU: index arithmetic instead of a load per score
        start = positions[0].clone()  # 0-d tensor: a new start does not recompile
        return lambda b, idx: idx + start
    if positions.dim() == 1:
        flat = positions
        return lambda b, idx: flat[idx]
    batched = positions
    return lambda b, idx: batched[b, idx]


def table_reader(table: Tensor) -> _Gather:
    """``at(b, idx)`` reading a per-position ``table`` inside a score_mod, ``(n,)`` or
    ``(b, n)`` (``(1, n)`` ignores the batch index): one indexing operation per call, whatever
    the values (:func:`gather_fn` may replace a read by arithmetic on the index, which a
    table that requires gradients must not get)."""
    if table.dim() == 2 and table.shape[0] == 1:
        table = table[0]
    if table.dim() == 1:
        flat = table
        return lambda b, idx: flat[idx]
    batched = table
    return lambda b, idx: batched[b, idx]


def distance_range(q_positions: Tensor, k_positions: Tensor) -> tuple[int, int]:
    """The smallest and largest ``q_pos - k_pos`` over the pairs a score reads, a query and a
    key of one batch row (positions ``(n,)`` or ``(b, n)``): a table over them grows with
    each row's span, never with the gap between rows. Read on the host: called only where
    the values are read (:func:`~posenc.encodings.checks.reads_values`)."""
    q_pos, k_pos = q_positions.long(), k_positions.long()
    lows = q_pos.amin(-1) - k_pos.amax(-1)  # (b,) or ()
    highs = q_pos.amax(-1) - k_pos.amin(-1)
    lo, hi = torch.stack([lows.min(), highs.max()]).tolist()
    return lo, hi


def bounded_table(
    table_fn: Callable[[Tensor], Tensor], q_pos: Tensor, k_pos: Tensor, bound: int
) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """``value(b, h, q_idx, kv_idx)`` inside a score_mod: ``table_fn(d)[h]`` at ``d =
    q_pos[i] - k_pos[j]`` (integer positions), read from one table over ``-bound .. bound``
    (``(h, 2 bound + 1)``, made here). ``bound`` is a host number that no distance of the
    forward exceeds (``distance_bound`` of :class:`~posenc.encodings.state.BiasState`), so
    nothing is read from the positions; a distance past it (a broken promise) reads NaN,
    never another distance's value."""
    table = table_fn(torch.arange(-bound, bound + 1, device=q_pos.device))  # (h, 2 bound + 1)
    # two tensors even when the queries' and keys' positions are one (compiled flex's
    # guards on captured tensors break on aliases when it recompiles)
    at_q, at_k = gather_fn(q_pos), gather_fn(k_pos.clone())

    def value(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        d = at_q(b, q_idx) - at_k(b, kv_idx)
        inside = table[h, d.clamp(-bound, bound) + bound]
        return torch.where(d.abs() <= bound, inside, float("nan"))

    return value


def distance_table_score_mod(
    table_fn: Callable[[Tensor], Tensor],
    q_positions: Tensor,
    k_positions: Tensor,
    *,
    span: int | None = None,
    bound: int | None = None,
    whole: bool | None = None,
) -> ScoreMod | None:
    """A score_mod adding ``table_fn(d)[h]`` at ``d = q_pos[i] - k_pos[j]``, built from one
    table over every distance that occurs: ``table_fn(arange(lo, hi + 1))`` is ``(h, R)``.
    ``span``: the bias is constant past ``±span`` (T5's last buckets), so the table covers
    ``-span .. span`` and the distances are clamped to it: nothing is read from the positions.
    ``bound``: no distance of the forward exceeds it (a host number, see
    :func:`bounded_table`): the table covers ``-bound .. bound`` and nothing is read. Without
    either, the distances' range is read once (:func:`distance_range`): only for positions
    whose values the host reads (:meth:`DistanceBias.score_mod` sends the others elsewhere).
    ``whole``: the positions hold whole numbers (default: :func:`is_integral` of both; a
    scheme that requires them passes True, their check having run where values are read).

    Returns ``None`` for fractional positions (no finite table covers them) or empty inputs.
    The table is computed here, eagerly; the kernel only indexes it.
    """
    if not (q_positions.numel() and k_positions.numel()):
        return None
    if whole is None:
        whole = is_integral(q_positions) and is_integral(k_positions)
    if not whole:
        return None
    q_pos, k_pos = q_positions.long(), k_positions.long()
    if bound is not None and span is None:
        value = bounded_table(table_fn, q_pos, k_pos, bound)

        def bounded(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + value(b, h, q_idx, kv_idx).to(score.dtype)

        return bounded
    if span is not None:
        table = table_fn(torch.arange(-span, span + 1, device=q_pos.device))  # (h, 2 span + 1)
        at_q, at_k = gather_fn(q_pos), gather_fn(k_pos.clone())  # (no alias: see above)

        def clamped_table(
            score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor
        ) -> Tensor:
            d = (at_q(b, q_idx) - at_k(b, kv_idx)).clamp(-span, span)
            return score + table[h, d + span].to(score.dtype)

        return clamped_table
    lo, hi = distance_range(q_pos, k_pos)
    distances = torch.arange(lo, hi + 1, device=q_pos.device)
    table = table_fn(distances)  # (h, R)
    at_q, at_k = gather_fn(q_pos - lo), gather_fn(k_pos)  # shifted so the index is >= 0

    def distance_table(
        score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor
    ) -> Tensor:
        return score + table[h, at_q(b, q_idx) - at_k(b, kv_idx)].to(score.dtype)

    return distance_table


class DistanceBias(BiasEncoding):
    """A bias that depends only on the distance ``q_pos - k_pos`` (ALiBi, T5, KERPLE, DPB).

    Subclasses implement :meth:`distance_bias`; this class turns it into ``bias`` (all pairs)
    and a table-lookup ``score_mod`` (one value per head and distance).
    """

    #: Whether positions must be whole numbers (a bucket or table lookup needs them).
    integer_positions: bool = False
    #: A distance past which the bias no longer changes (T5's last buckets): the fused form's
    #: table then has a fixed size and reads nothing from the positions. ``None``: unbounded.
    saturates_at: int | None = None
    has_score_mod: ClassVar[bool] = True
    #: Whether :meth:`score_mod` takes ``distance_bound=`` (a host bound on ``|q_pos -
    #: k_pos|``, see ``distance_bound`` of :class:`~posenc.encodings.state.BiasState`).
    reads_distance_bound: ClassVar[bool] = True
    #: Whether the fused form reads one table by distance (then it exists only at whole-number
    #: positions); False for a scheme that computes its bias inside the kernel (ALiBi).
    table_score_mod: ClassVar[bool] = True

    def fused_at(self, q_positions: Tensor, k_positions: Tensor) -> bool:
        """A table by distance covers whole-number positions only: integer dtypes, or float
        ones holding whole numbers (read once; a scheme with :attr:`integer_positions`
        refuses the others in :meth:`score_mod` and :meth:`bias` alike). Positions whose
        values are not read take :meth:`formula_score_mod`, at any values."""
        if not super().fused_at(q_positions, k_positions):
            return False
        if not self.table_score_mod or self.integer_positions:
            return True
        if not (reads_values(q_positions) and reads_values(k_positions)):
            return True
        return is_integral(q_positions) and is_integral(k_positions)

    def distance_bias(self, distance: Tensor) -> Tensor:
        """The bias at ``distance = q_pos - k_pos`` (any shape ``S``, float) -> ``(h, *S)``."""
        raise NotImplementedError

    def _check(self, q_positions: object, k_positions: object) -> tuple[Tensor, Tensor]:
        q_pos, k_pos = check_pair_positions(q_positions, k_positions)
        if self.integer_positions:
            require_integral("q_positions", q_pos, type(self).__name__)
            require_integral("k_positions", k_pos, type(self).__name__)
        return q_pos, k_pos

    def bias(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> Tensor:
        """``(h, nq, nk)`` for 1-D positions, ``(b, h, nq, nk)`` for batched ones."""
        q_pos, k_pos = self._check(q_positions, k_positions)
        check_bias_bytes(q_pos, k_pos, self.num_heads + 2, q)
        distance = relative_distance(q_pos, k_pos, work_dtype(q, self))  # (nq, nk) | (b, nq, nk)
        values = self.distance_bias(distance)  # (h, nq, nk) | (h, b, nq, nk)
        return values if values.dim() == 3 else values.transpose(0, 1)

    def score_mod(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
        distance_bound: int | None = None,
    ) -> ScoreMod | None:
        """One table by distance read in the kernel (:func:`distance_table_score_mod`),
        sized from ``distance_bound`` (a host number no ``|q_pos - k_pos|`` exceeds) or
        from :attr:`saturates_at` without a read; else, for positions whose values the host
        reads (:func:`~posenc.encodings.checks.reads_values`), from the distances' range,
        read; for the others, :meth:`formula_score_mod` (nothing read)."""
        q_pos, k_pos = self._check(q_positions, k_positions)
        if not (q_pos.numel() and k_pos.numel()):
            return None
        dtype = work_dtype(q, self)
        whole = self.integer_positions or (is_integral(q_pos) and is_integral(k_pos))
        sized = self.saturates_at is not None or (distance_bound is not None and whole)
        if not sized and not (reads_values(q_pos) and reads_values(k_pos)):
            return self.formula_score_mod(q_pos, k_pos, dtype)

        def table_fn(distances: Tensor) -> Tensor:
            return self.distance_bias(distances.to(dtype))

        return distance_table_score_mod(
            table_fn, q_pos, k_pos, span=self.saturates_at, bound=distance_bound, whole=whole
        )

    def formula_score_mod(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> ScoreMod:
        """The fused form where no table by distance can be sized without reading the
        positions: :meth:`distance_bias` of every pair's distance (``relative_distance``,
        as :meth:`bias` forms it), read once per score. Its cost and memory grow with ``h ·
        nq · nk``, never with a position's value; a scheme with a closed form per distance
        (KERPLE, Sandwich) computes it in the kernel instead."""
        check_bias_bytes(q_pos, k_pos, self.num_heads + 2)
        values = self.distance_bias(relative_distance(q_pos, k_pos, dtype))
        if values.dim() == 4 and values.shape[1] == 1:  # (h, 1, nq, nk): one row for all
            values = values[:, 0]
        if values.dim() == 3:  # (h, nq, nk)
            per_pair = values

            def pairs(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
                return score + per_pair[h, q_idx, kv_idx].to(score.dtype)

            return pairs
        per_row = values.transpose(0, 1)  # (b, h, nq, nk)

        def row_pairs(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
            return score + per_row[b, h, q_idx, kv_idx].to(score.dtype)

        return row_pairs


def distance_reader(
    q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype
) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """``d(b, q_idx, kv_idx) = q_pos[i] - k_pos[j]`` in ``dtype`` inside a score_mod, as a
    table by distance holds it: integer positions subtracted exactly, then converted; float
    ones in ``dtype``. Nothing is read from the positions."""
    kind = torch.long if is_integral(q_pos) and is_integral(k_pos) else dtype
    # (two tensors even where the positions are one: flex's guards break on aliases)
    at_q, at_k = gather_fn(q_pos.to(kind)), gather_fn(k_pos.to(kind).clone())

    def distance(b: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (at_q(b, q_idx) - at_k(b, kv_idx)).to(dtype)

    return distance
