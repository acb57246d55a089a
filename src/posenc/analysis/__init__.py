"""Measured properties of positional encodings: the demonstrations the tour prints.

- :func:`permutation_test`: self-attention is permutation-equivariant without positions
  (shuffling the tokens shuffles the weights the same way, so each token attends exactly as
  before), and stops being so once an encoding is added.
- :func:`relative_shift`: for the sinusoidal table, every offset ``k`` has one fixed linear map
  ``M_k`` (a block-diagonal rotation) with ``PE(p + k) = M_k PE(p)`` for all ``p``.
- :func:`uniqueness`: the smallest distance between two rows of a table.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..attention.sdpa import scaled_dot_product_attention
from ..encodings.absolute.sinusoidal import inverse_frequencies, sinusoidal_table
from ..encodings.base import AdditiveEncoding, PositionalEncoding
from ..encodings.checks import check_positive_int
from ..encodings.registry import build_for_model, entry
from ..errors import PosencValueError, check_bytes
from ..model.encoder import Encoder

#: The seed tutorial's toy embeddings: three words, four dimensions.
TOY_EMBEDDINGS: dict[str, tuple[float, ...]] = {
    "cat": (1.0, 0.0, 0.5, 0.2),
    "sat": (0.0, 1.0, 0.3, 0.8),
    "mat": (0.5, 0.0, 1.0, 0.1),
}


@dataclass(frozen=True)
class PermutationResult:
    """Attention weights for a sentence and a shuffled copy, with and without positions.

    ``order`` maps shuffled slot -> original slot (``shuffled[i] = original[order[i]]``).
    ``*_gap`` is the largest absolute difference between the original weights and the shuffled
    weights put back in the original order: 0 means attention cannot tell the two orders apart.
    """

    words: tuple[str, ...]
    shuffled_words: tuple[str, ...]
    order: tuple[int, ...]
    weights_plain: Tensor
    weights_plain_shuffled: Tensor
    weights_pos: Tensor
    weights_pos_shuffled: Tensor
    gap_plain: float
    gap_pos: float

    @property
    def blind_without_positions(self) -> bool:
        return self.gap_plain < 1e-6

    @property
    def sees_order_with_positions(self) -> bool:
        return self.gap_pos > 1e-3


def _inverse(order: Sequence[int]) -> Tensor:
    """The permutation that undoes ``order`` (``x[order][_inverse(order)] == x``)."""
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return inverse


def _unshuffle(weights: Tensor, order: Sequence[int]) -> Tensor:
    """Put weights computed on a shuffled sequence back into the original token order."""
    inverse = _inverse(order)
    return weights[..., inverse, :][..., :, inverse]


def permutation_test(
    words: Sequence[str] = ("cat", "sat", "mat"),
    order: Sequence[int] = (2, 0, 1),
    *,
    embeddings: dict[str, Sequence[float]] | None = None,
    encoding: AdditiveEncoding | None = None,
) -> PermutationResult:
    """The seed's demonstration ("cat sat mat" vs "mat cat sat"), measured.

    Attention is computed with ``q = k = v = x`` as in the tutorial, once on the plain
    embeddings and once after ``encoding`` (default: sinusoidal) adds positions.
    """
    table = embeddings if embeddings is not None else TOY_EMBEDDINGS
    if sorted(order) != list(range(len(words))):
        raise PosencValueError(
            f"order must be a permutation of 0..{len(words) - 1}, got {list(order)}"
        )
    unknown = [w for w in words if w not in table]
    if unknown:
        raise PosencValueError(f"no embedding for {unknown}; known words: {sorted(table)}")
    x = torch.tensor([list(table[w]) for w in words], dtype=torch.float64).unsqueeze(0)
    x_shuffled = x[:, list(order)]
    if encoding is None:
        from ..encodings.absolute.sinusoidal import SinusoidalPositionalEncoding

        encoding = SinusoidalPositionalEncoding(x.shape[-1])

    def weights(h: Tensor) -> Tensor:
        return scaled_dot_product_attention(h, h, h)[1][0]  # (n, n)

    with torch.no_grad():
        plain, plain_s = weights(x), weights(x_shuffled)
        pos, pos_s = weights(encoding(x)), weights(encoding(x_shuffled))
    return PermutationResult(
        words=tuple(words),
        shuffled_words=tuple(words[i] for i in order),
        order=tuple(order),
        weights_plain=plain,
        weights_plain_shuffled=plain_s,
        weights_pos=pos,
        weights_pos_shuffled=pos_s,
        gap_plain=float((plain - _unshuffle(plain_s, order)).abs().max()),
        gap_pos=float((pos - _unshuffle(pos_s, order)).abs().max()),
    )


def encoder_permutation_gap(encoder: torch.nn.Module, x: Tensor, order: Sequence[int]) -> float:
    """Largest difference between ``encoder(x)`` and ``encoder(x[order])`` put back in order.

    0 (up to round-off) means the encoder is permutation-equivariant: it cannot see order.
    """
    with torch.no_grad():
        out = encoder(x)
        out_shuffled = encoder(x[:, list(order)])
    return float((out - out_shuffled[:, _inverse(order)]).abs().max())


@dataclass(frozen=True)
class ShiftResult:
    """``PE(p + k) ≈ M_k PE(p)`` for every ``p``: the map and how well it holds."""

    offset: int
    matrix: Tensor  # (d, d), float64
    residual: float  # max |PE(p + k) - M_k PE(p)| over all p, in float64
    difference_spread: float  # max over p of |(PE(p+k) - PE(p)) - (PE(k) - PE(0))|


def shift_matrix(offset: float, dim: int, *, base: float = 10000.0) -> Tensor:
    """The block-diagonal ``M_k`` with ``PE(p + k) = M_k PE(p)`` for the sinusoidal table.

    Each (sin, cos) pair at frequency ``w`` rotates by ``k·w``:
    ``sin(w(p+k)) = sin(wp)cos(wk) + cos(wp)sin(wk)``,
    ``cos(w(p+k)) = cos(wp)cos(wk) - sin(wp)sin(wk)``. An odd ``dim`` ends on a lone sine
    column, which no fixed linear map can shift: that column is left out (zero row).
    """
    check_positive_int("dim", dim)
    angles = offset * inverse_frequencies(dim, base)  # float64 (ceil(d/2),)
    m = torch.zeros(dim, dim, dtype=torch.float64)
    for i, a in enumerate(angles.tolist()):
        s, c = 2 * i, 2 * i + 1
        if c >= dim:
            break
        cos_a, sin_a = math.cos(a), math.sin(a)
        m[s, s], m[s, c] = cos_a, sin_a
        m[c, s], m[c, c] = -sin_a, cos_a
    return m


def relative_shift(
    offset: int, dim: int = 64, num_positions: int = 100, *, base: float = 10000.0
) -> ShiftResult:
    """Build ``M_k`` for ``offset`` and measure ``max_p |PE(p + k) - M_k PE(p)|`` in float64.

    The residual is float64 round-off (~1e-15): the shift really is one linear map. The seed
    only eyeballed that ``PE(3) - PE(0)`` and ``PE(13) - PE(10)`` look "similar"; they are not
    equal (``difference_spread``), which is why the property is about a linear map, not a
    difference.
    """
    check_positive_int("num_positions", num_positions)
    if dim % 2:
        raise PosencValueError(f"dim must be even for an exact shift map, got {dim}")
    table = sinusoidal_table(num_positions + offset, dim, base=base, dtype=torch.float64)
    m = shift_matrix(offset, dim, base=base)
    predicted = table[:num_positions] @ m.T  # (p, d)
    residual = float((table[offset:] - predicted).abs().max())
    diffs = table[offset:] - table[:num_positions]
    spread = float((diffs - diffs[0]).abs().max())
    return ShiftResult(offset, m, residual, spread)


def uniqueness(table: Tensor) -> tuple[float, int, int]:
    """Smallest Euclidean distance between two rows of ``table`` and the two row indices.

    A positive value means every position has its own encoding.
    """
    if table.dim() != 2 or table.shape[0] < 2:
        raise PosencValueError(f"table must be (positions >= 2, dim), got {tuple(table.shape)}")
    t = table.to(torch.float64)
    dist = torch.cdist(t, t)
    dist.fill_diagonal_(float("inf"))
    flat = int(dist.argmin())
    i, j = divmod(flat, t.shape[0])
    return float(dist[i, j]), min(i, j), max(i, j)


# --------------------------------------------------------------------------- any encoding
#
# The probes below see an encoding only through its family hook, so they work for every
# registered scheme, present and future.


def _head_dim(pe: PositionalEncoding, default: int) -> int:
    return int(getattr(pe, "head_dim", default))


def grid_coordinates(shape: Sequence[int]) -> Tensor:
    """Integer coordinates of every point of a grid, row-major: ``(prod(shape), len(shape))``."""
    return torch.cartesian_prod(*(torch.arange(s) for s in shape)).reshape(-1, len(shape))


def default_positions(pe: PositionalEncoding, n: int) -> Tensor:
    """``arange(n)`` for sequence encodings; for grid encodings the first ``n`` points of a
    near-square grid."""
    if pe.axes == 1:
        return torch.arange(n)
    side = math.ceil(n ** (1 / pe.axes))
    return grid_coordinates([side] * pe.axes)[:n]


@torch.no_grad()
def contribution_matrix(
    pe: PositionalEncoding,
    positions: Tensor | int,
    *,
    dim: int = 64,
    samples: int = 32,
    seed: int = 0,
) -> Tensor:
    """What positions ``i`` and ``j`` contribute to the attention logit, ``(heads, n, n)``.

    - additive: ``PE(i) · PE(j) / sqrt(d)`` (the position-position term of the logit of
      ``x + PE``), one "head";
    - rotary: ``<R(i) q, R(j) q> / sqrt(w)`` averaged over random ``q`` (for a zero-mean
      random q and k the average would vanish, so the query and key share one vector), ``w``
      the width of the rotated vectors; per head for schemes with per-head phases (PoPE);
    - bias: the bias itself (schemes that read q and k, or the layer's input, get random
      ones), per head;
    - none, and conditional (a PEG's term depends on the hidden states, not on positions
      alone): zeros.
    """
    pe = pe.eval()
    count = positions if isinstance(positions, int) else positions.shape[0]
    d = int(getattr(pe, "dim", dim)) if pe.family == "additive" else _head_dim(pe, dim)
    heads = int(getattr(pe, "num_heads", 1))
    # float64: the n x n result per head, the bias's temporaries, and the rotated samples
    rows = samples * heads * 2 if pe.family == "rotary" else max(samples, heads)  # 2d: PoPE
    nbytes = 8 * (3 * heads * count * count + 4 * rows * count * d)
    check_bytes("positions x dim", f"{count} x {d}", nbytes)
    pos = default_positions(pe, positions) if isinstance(positions, int) else positions
    n = pos.shape[0]
    gen = torch.Generator().manual_seed(seed)
    if pe.family == "additive":
        width = int(getattr(pe, "dim", dim))
        table = pe(torch.zeros(1, n, width, dtype=torch.float64), pos)[0]  # (n, d)
        return (table @ table.T / math.sqrt(width)).unsqueeze(0)
    if pe.family == "rotary":
        d = _head_dim(pe, dim)
        q = torch.randn(samples, 1, d, generator=gen, dtype=torch.float64).expand(samples, n, d)
        # (1, samples, n, d): the samples ride on the head axis; with a phase per head
        # (PoPE) on the batch axis instead, (samples, h, n, d)
        q = q.unsqueeze(0) if heads == 1 else q.unsqueeze(1).expand(samples, heads, n, d)
        rq, rk = pe(q, q, pos)  # (1, samples, n, w) | (samples, h, n, w)
        # the mean over samples of rq_s(i) . rk_s(j) is one product of (n, samples * w)
        # matrices: never the (samples, n, n) stack, which is 4 GiB for a 16^3 grid. The
        # width w is what attention scales by: d, or 2d for PoPE's complex channels
        w = rq.shape[-1]
        if heads == 1:
            rq, rk = (t.transpose(1, 2).reshape(1, n, samples * w) for t in (rq, rk))
        else:
            rq, rk = (t.permute(1, 2, 0, 3).reshape(heads, n, samples * w) for t in (rq, rk))
        return rq @ rk.transpose(1, 2) / (samples * math.sqrt(w))  # (1 | h, n, n)
    if pe.family == "bias":
        h = pe.num_heads  # type: ignore[attr-defined]
        d = _head_dim(pe, dim)
        q = torch.randn(1, h, n, d, generator=gen, dtype=torch.float64)
        k = torch.randn(1, h, n, d, generator=gen, dtype=torch.float64)
        reads = {}
        if pe.needs_x:  # type: ignore[attr-defined]  # a data-dependent bias: a random input
            width = int(pe.dim)  # type: ignore[attr-defined]
            reads["x"] = torch.randn(1, n, width, generator=gen, dtype=torch.float64)
        bias = pe.double().bias(pos, pos, q=q, k=k, **reads)  # type: ignore[attr-defined]
        return bias.reshape(-1, h, n, n).mean(0).double()
    return torch.zeros(1, n, n, dtype=torch.float64)


def distance_profile(matrix: Tensor) -> Tensor:
    """Mean of ``matrix[..., i, j]`` over all pairs with ``|i - j| = δ``: ``(heads, n)``."""
    n = matrix.shape[-1]
    idx = torch.arange(n)
    dist = (idx[:, None] - idx[None, :]).abs()  # (n, n)
    sums = torch.zeros(*matrix.shape[:-2], n, dtype=torch.float64)
    sums.index_add_(-1, dist.flatten(), matrix.flatten(-2).double())
    counts = torch.bincount(dist.flatten(), minlength=n).double()
    return sums / counts


def translation_residual(matrix: Tensor) -> float:
    """How far ``matrix[i, j]`` is from a function of ``i - j`` alone: the largest spread
    (max − min) along any diagonal, relative to the largest magnitude. 0 means translation
    invariant."""
    n = matrix.shape[-1]
    scale = float(matrix.abs().max())
    if scale == 0.0:
        return 0.0
    worst = 0.0
    for offset in range(-(n - 1), n):
        diag = matrix.diagonal(offset, dim1=-2, dim2=-1)
        worst = max(worst, float((diag.max(-1).values - diag.min(-1).values).max()))
    return worst / scale


def decay_fraction(matrix: Tensor, *, tol: float = 1e-9) -> float:
    """Fraction of distances ``δ = 1 .. n-1`` at which the mean contribution does not rise
    (``f(δ) <= f(δ-1)``), averaged over heads. 1 means monotone decay with distance."""
    profile = distance_profile(matrix)  # (heads, n)
    steps = profile[..., 1:] <= profile[..., :-1] + tol * profile.abs().max().clamp_min(1.0)
    return float(steps.double().mean())


@dataclass(frozen=True)
class Analysis:
    """Measured properties of one encoding (see :func:`analyze`)."""

    name: str
    family: str
    uniqueness: float  # smallest distance between two positions' representations
    translation_residual: float  # 0 = the logit contribution depends only on i - j
    decay_fraction: float  # 1 = it decays monotonically with distance
    beyond_exists: bool  # the encoding can be evaluated at 2x the training length
    beyond_drift: float | None  # change of the structure in [L, 2L) vs [0, L); None if absent
    permutation_gap: float | None  # 0 = a random bidirectional encoder is blind to order
    length: int

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)

    def _repr_html_(self) -> str:
        return analysis_html([self])


def analysis_html(rows: Sequence[Analysis]) -> str:
    """An HTML table of analyses (for Jupyter and the report)."""
    head = "".join(f"<th>{c}</th>" for c in ANALYSIS_COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{v}</td>" for v in format_analysis(r)) + "</tr>" for r in rows
    )
    return f"<table class='analysis'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


ANALYSIS_COLUMNS = (
    "encoding",
    "family",
    "unique",
    "shift resid.",
    "decay",
    "at 2L",
    "drift past L",
    "perm. gap",
)


def format_analysis(row: Analysis) -> list[str]:
    if row.family == "conditional":  # its term reads the hidden states: positions alone give 0
        return [row.name, row.family, *["n/a"] * (len(ANALYSIS_COLUMNS) - 2)]
    drift = "n/a" if row.beyond_drift is None else f"{row.beyond_drift:.2e}"
    return [
        row.name,
        row.family,
        f"{row.uniqueness:.3g}",
        f"{row.translation_residual:.2e}",
        f"{row.decay_fraction:.2f}",
        "yes" if row.beyond_exists else "no",
        drift,
        "n/a" if row.permutation_gap is None else f"{row.permutation_gap:.2e}",
    ]


def _build_for_analysis(name: str, dim: int, num_heads: int, length: int) -> PositionalEncoding:
    cls = entry(name).cls
    kwargs = {}
    # a lookup table (whole-number positions) sized by ``max_len`` gets exactly the training
    # length, so "past L" means past its rows
    table = getattr(cls, "integer_positions", False)
    if table and "max_len" in inspect.signature(cls).parameters:
        kwargs["max_len"] = length
    return build_for_model(name, dim, num_heads, **kwargs)


def analyze(
    name: str, *, length: int = 64, dim: int = 96, num_heads: int = 4, seed: int = 0
) -> Analysis:
    """Measure the properties of the encoding registered as ``name`` at training length
    ``length`` (a model of width ``dim`` with ``num_heads`` heads, randomly initialised with
    ``seed``). The default width 96 (head dim 24) suits every registered scheme, 3-axis
    rotary included."""
    check_positive_int("length", length)
    if length < 2:
        raise PosencValueError(f"length must be >= 2, got {length}")
    torch.manual_seed(seed)
    pe = _build_for_analysis(name, dim, num_heads, length).double()
    m = contribution_matrix(pe, length, dim=dim, seed=seed)
    if pe.family == "additive":
        width = int(getattr(pe, "dim", dim))
        with torch.no_grad():
            pos = default_positions(pe, length)
            rep = pe.eval()(torch.zeros(1, length, width, dtype=torch.float64), pos)[0]
    else:
        rep = m.permute(1, 0, 2).reshape(length, -1)  # row i: position i against all j
    unique = uniqueness(rep)[0]
    try:
        m2 = contribution_matrix(pe, 2 * length, dim=dim, seed=seed)
        exists = True
        scale = float(m2[..., :length, :length].abs().max()) or 1.0
        drift = float((m2[..., length:, length:] - m2[..., :length, :length]).abs().max()) / scale
    except ValueError:
        exists, drift = False, None
    gap = None  # grid encodings need coordinates: the sequence encoder test does not apply
    if pe.axes == 1:
        torch.manual_seed(seed)
        enc = Encoder(dim, 2, num_heads, pe=_build_for_analysis(name, dim, num_heads, length))
        # 16 tokens, or fewer at a shorter training length (a learned table has only L rows)
        n = min(16, length)
        x = torch.randn(1, n, dim, generator=torch.Generator().manual_seed(seed))
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 1)).tolist()
        if order == sorted(order):  # a short draw can leave the order as it was: reverse it
            order.reverse()
        gap = encoder_permutation_gap(enc.double().eval(), x.double(), order)
    return Analysis(
        name=name,
        family=pe.family,
        uniqueness=unique,
        translation_residual=translation_residual(m),
        decay_fraction=decay_fraction(m),
        beyond_exists=exists,
        beyond_drift=drift,
        permutation_gap=gap,
        length=length,
    )
