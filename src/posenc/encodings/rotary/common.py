"""What the rotary schemes (:mod:`~.rope`, :mod:`~.xpos`, :mod:`~.axial`) share: the
checks of their arguments and of ``q``/``k``, and the application of tables a scheme made to
``q`` and ``k`` (:func:`apply_tables`, :func:`apply_tables_qk`, and :class:`TableRotation`,
the per-forward state holding them). Each scheme makes its own tables; this module only
applies them.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim, ``r`` rotary dim.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ...errors import PosencTypeError, PosencValueError
from ..checks import check_bool, check_positive_float, check_positive_int
from ..state import RotaryState
from .kernels.kernel import overlap
from .kernels.rotate import check_inplace, pair_node, run_plan, run_plan_pair
from .kernels.select import Mode, Plan, select


def check_qk(q: object, k: object, head_dim: int) -> tuple[Tensor, Tensor]:
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


def check_rotary_dim(head_dim: int, rotary_dim: int | None, multiple: int = 2) -> int:
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


def check_base(base: object) -> float:
    base = check_positive_float("base", base)
    if base == 1.0:
        raise PosencValueError("base must not be 1.0 (every frequency would be equal)")
    return base


class TableRotation(RotaryState):
    """The per-forward state of a scheme with tables: queries turned by ``query`` = (cos, sin)
    and keys by ``key`` (often the same pair), in every layer (:func:`apply_tables_qk`);
    ``heads``: a :class:`~.heads.RotaryHeads` where only some heads turn or the tables have a
    head axis (its ``apply_pair`` then turns them)."""

    def __init__(
        self,
        interleaved: bool,
        query: tuple[Tensor, Tensor],
        key: tuple[Tensor, Tensor],
        heads: Any = None,
    ) -> None:
        super().__init__()
        self.interleaved, self.query, self.key, self.heads = interleaved, query, key, heads

    def rotate(self, q: Tensor, k: Tensor, inplace: bool) -> tuple[Tensor, Tensor]:
        if self.heads is not None:
            return self.heads.apply_pair(q, k, self.query, self.key, self.interleaved, inplace)
        return apply_tables_qk(q, k, self.query, self.key, self.interleaved, inplace)


def unsqueeze_heads(t: Tensor) -> Tensor:
    """``(n, r/2)`` stays; ``(b, n, r/2)`` -> ``(b, 1, n, r/2)`` to broadcast over heads."""
    return t.unsqueeze(-3) if t.dim() == 3 else t


def apply_tables(
    x: Tensor,
    tables: tuple[Tensor, Tensor],
    interleaved: bool,
    inplace: object,
    name: str = "x",
    plan: Plan | None = None,
) -> Tensor:
    """Rotate ``x`` by ``tables`` (``(cos, sin)`` made by the module, in the work dtype): into
    a new tensor, or in its own storage where :func:`check_inplace` allows; the way ``plan``
    says (``None``: :func:`select` it)."""
    inplace = check_bool("inplace", inplace)
    if plan is None:
        plan = select(x, tables, inplace=inplace)
    if inplace:
        check_inplace(x, *tables, name=name, plan=plan)
    return run_plan(x, *tables, interleaved, inplace, plan)


def apply_tables_qk(
    q: Tensor,
    k: Tensor,
    q_tables: tuple[Tensor, Tensor],
    k_tables: tuple[Tensor, Tensor],
    interleaved: bool,
    inplace: object,
    plan: Plan | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`apply_tables` for ``q`` and ``k``, the way ``plan`` says (``None``:
    :func:`select` it for the pair); in place, they must not share memory anywhere
    (:func:`overlap`: the second rotation would turn the first's result). With one pair of
    tables and a kernel running eagerly, :func:`run_plan_pair` first (the pair in one go)."""
    inplace = check_bool("inplace", inplace)
    if plan is None:
        plan = select(q, q_tables, inplace=inplace, pair=k)
    shared_tables = q_tables[0] is k_tables[0] and q_tables[1] is k_tables[1]
    if plan.mode is Mode.EAGER and shared_tables:
        pair = run_plan_pair(q, k, *q_tables, interleaved, inplace, plan)
        if pair is not None:
            return pair
    if inplace and (q is k or (plan.eager and not q.is_meta and not k.is_meta)):
        shared = True if q is k else overlap(q, k)
        if shared is not False:
            raise PosencValueError(
                f"q and k {'share' if shared else 'may share'} memory (q at byte "
                f"{q.data_ptr()}, shape {tuple(q.shape)}, strides {tuple(q.stride())}; k at "
                f"byte {k.data_ptr()}, shape {tuple(k.shape)}, strides {tuple(k.stride())}"
                f"{'' if shared else ': too tangled to tell apart cheaply'}): rotating both in "
                "place would turn the shared elements twice; pass tensors that do not overlap "
                "or rotate out of place"
            )
    compiled_pair = None if plan.kernel is None else plan.kernel.compiled_pair
    if plan.mode is Mode.OPERATOR and compiled_pair is not None and shared_tables:
        pair = compiled_pair(q, k, *q_tables, interleaved)  # one operator inductor sees into
        if pair is not None:
            return pair
    if plan.mode is Mode.FUNCTION and shared_tables:  # one autograd node, one launch
        if inplace:
            check_inplace(q, *q_tables, name="q", plan=plan)
            check_inplace(k, *k_tables, name="k", plan=plan)
        pair = pair_node(q, k, *q_tables, interleaved, inplace, plan)
        if pair is not None:
            return pair
    return (
        apply_tables(q, q_tables, interleaved, inplace, "q", plan),
        apply_tables(k, k_tables, interleaved, inplace, "k", plan),
    )
