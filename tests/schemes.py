"""The registered schemes as the tests parametrise over them, and the few facts about each
that the registry does not hold.

Names, families and axes come from the registry (``posenc.available()``,
``posenc.entry(name)``), so a scheme registered in ``src/posenc`` is tested everywhere with no
edit here, except one: :data:`FACTS` must describe it (its constructor arguments and the
properties the tests check it against); ``tests/encodings/test_base.py`` fails, naming this
file, for a registered scheme without an entry. Schemes registered by tests (toy schemes)
are left out: :data:`NAMES` holds only those whose class is defined inside ``posenc``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

import posenc

#: Every scheme posenc itself registers, sorted.
NAMES: list[str] = [
    name for name in posenc.available() if posenc.entry(name).cls.__module__.startswith("posenc.")
]


def of_family(family: str) -> list[str]:
    """The names in :data:`NAMES` of one family (``additive``, ``rotary``, ``bias``, ``none``)."""
    return [name for name in NAMES if posenc.entry(name).family == family]


#: The bias schemes on sequences, which the shared bias tests hand 1-D positions.
BIAS: list[str] = [name for name in of_family("bias") if posenc.entry(name).cls.axes == 1]
#: The bias schemes on grids (``(n, 2)`` coordinates): each tested in its own file.
GRID_BIAS: list[str] = [name for name in of_family("bias") if posenc.entry(name).cls.axes > 1]
#: Schemes on sequences (one coordinate per position), as opposed to 2-D/3-D grids.
SEQUENCE: list[str] = [name for name in NAMES if posenc.entry(name).cls.axes == 1]


def _width(dim: int, heads: int) -> dict[str, Any]:
    return {"dim": dim}


def _head_dim(dim: int, heads: int) -> dict[str, Any]:
    return {"head_dim": dim // heads}


def _heads(dim: int, heads: int) -> dict[str, Any]:
    return {"num_heads": heads}


def _heads_and_head_dim(dim: int, heads: int) -> dict[str, Any]:
    return {"num_heads": heads, "head_dim": dim // heads}


def _width_and_heads(dim: int, heads: int) -> dict[str, Any]:
    return {"dim": dim, "num_heads": heads}


@dataclass(frozen=True)
class Facts:
    """What the tests are told about one scheme."""

    #: Its own constructor's arguments for a model of width ``dim`` with ``heads`` heads, as
    #: ``posenc.build(name, **arguments(dim, heads))`` takes them.
    arguments: Callable[[int, int], dict[str, Any]]
    #: It reads a table by position or by distance: float positions must hold whole numbers.
    integer_positions: bool = False
    #: Its output depends on positions only through differences ``i - j`` (or not at all):
    #: adding a constant to every position changes nothing.
    relative: bool = False
    #: Bias schemes: it can add its bias through a flex_attention ``score_mod`` (without one,
    #: attention materialises the bias).
    score_mod: bool = False
    #: The head size must be a multiple of this (rotary schemes: pairs over their axes).
    head_dim_multiple: int = 1
    #: Each head turns by its own rotation: a key head cannot serve a group of query heads.
    per_head: bool = False
    #: A StreamingCache takes it (exact at in-cache positions); else it refuses by name.
    streams: bool = True
    #: Its positions must be one full ``h x w`` grid in row-major order (a conditional
    #: scheme convolving over the grid): other coordinates, a cache, packed documents and
    #: padding of its grid's tokens are refused by name; :func:`coordinates` gives it a grid.
    full_grid: bool = False


FACTS: dict[str, Facts] = {
    "none": Facts(lambda dim, heads: {}, relative=True),
    "sinusoidal": Facts(_width),
    "scaled-sinusoidal": Facts(_width),
    "sinusoidal-2d": Facts(_width),
    "sinusoidal-3d": Facts(_width),
    "learned": Facts(_width, integer_positions=True),
    "abacus": Facts(_width, integer_positions=True),
    "rope": Facts(_head_dim, relative=True),
    "rope-interleaved": Facts(_head_dim, relative=True),
    "xpos": Facts(_head_dim),  # its decay is centred on the sequence: relative only if fixed
    "rope2d": Facts(_head_dim, relative=True),
    "rope3d": Facts(_head_dim, relative=True),
    "rope-dinov3": Facts(_head_dim, head_dim_multiple=4),  # normalised by the positions' extent
    "rope-mixed": Facts(_heads_and_head_dim, relative=True, head_dim_multiple=4, per_head=True),
    "pope": Facts(_heads_and_head_dim, relative=True),
    "fope": Facts(_head_dim, head_dim_multiple=2),  # mixed tables: not a rotation
    "alibi": Facts(_heads, relative=True, score_mod=True),
    "t5": Facts(_heads, integer_positions=True, relative=True, score_mod=True),
    "kerple": Facts(_heads, relative=True, score_mod=True),
    "fire": Facts(_heads, score_mod=True),  # normalised by the query position
    "dpb": Facts(_heads, relative=True, score_mod=True),
    "sandwich": Facts(_heads_and_head_dim, relative=True, score_mod=True, head_dim_multiple=2),
    "shaw": Facts(_heads_and_head_dim, integer_positions=True, relative=True, score_mod=True),
    "xl": Facts(_heads_and_head_dim, integer_positions=True, relative=True),
    "cope": Facts(_heads_and_head_dim, relative=True),  # counts gates: reads no positions
    "deberta": Facts(_heads_and_head_dim, integer_positions=True, relative=True, score_mod=True),
    # sums the gates of the tokens between key and query: a StreamingCache evicts some
    "fox": Facts(_width_and_heads, relative=True, score_mod=True, streams=False),
    "inkling": Facts(_width_and_heads, integer_positions=True, relative=True, score_mod=True),
    "swin-bias": Facts(_heads, integer_positions=True, relative=True, score_mod=True),
    "swinv2-cpb": Facts(_heads, integer_positions=True, relative=True, score_mod=True),
    "peg": Facts(_width, integer_positions=True, relative=True, streams=False, full_grid=True),
}


def coordinates(name: str, n: int, coords: torch.Tensor) -> torch.Tensor:
    """The coordinates a test gives scheme ``name`` for ``n`` tokens: ``coords`` ``(n, axes)``
    as the test made them, or, for a scheme that takes only a full grid (:attr:`Facts.full_grid`),
    the row-major ``h x w`` grid of ``n`` tokens with ``h`` the largest divisor of ``n`` not
    above its square root."""
    if not FACTS[name].full_grid:
        return coords
    h = max(d for d in range(1, int(n**0.5) + 1) if n % d == 0)
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(n // h), indexing="ij")
    return torch.stack([rows, cols], dim=-1).reshape(n, 2).to(coords.device, coords.dtype)


#: The schemes that take only a full grid (see :attr:`Facts.full_grid`).
FULL_GRID: list[str] = [name for name in NAMES if FACTS.get(name, Facts(_width)).full_grid]


def qk(
    b: int, h: int, n: int, d: int, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random queries and keys ``(b, h, n, d)`` from the test's seed."""
    return torch.randn(b, h, n, d, dtype=dtype), torch.randn(b, h, n, d, dtype=dtype)


def reads(
    pe: Any, q: torch.Tensor | None = None, k: torch.Tensor | None = None, *, rows: int = 1
) -> dict[str, Any]:
    """The keyword arguments a bias scheme's ``bias``/``score_mod`` read: ``q`` and ``k`` as
    given, and, for a scheme that reads the layer's input (``needs_x``), a random ``x``
    ``(b, n, D)`` from the test's seed, ``b`` and ``n`` those of ``q`` (else ``rows``, and
    the ``n`` of ``k``)."""
    kwargs: dict[str, Any] = {"q": q, "k": k}
    if getattr(pe, "needs_x", False):
        ref = q if q is not None else k
        b, n = (rows, 1) if ref is None else (ref.shape[0], ref.shape[2])
        dtype = torch.float64 if ref is None else ref.dtype
        kwargs["x"] = torch.randn(b, n, pe.dim, dtype=dtype)
    return kwargs
