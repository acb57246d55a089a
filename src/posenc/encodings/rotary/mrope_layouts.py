"""Multimodal RoPE (M-RoPE): which row of a ``(rows, batch, seq)`` position tensor turns each
pair of rotary channels.

M-RoPE (Wang et al. 2024, "Qwen2-VL", §2.1) gives every token one position per axis
(temporal, height, width: one *row* each) and keeps RoPE's single set of frequencies
``θ_i = base^(-2i/r)``: pair ``i`` turns by ``p[row(i)] · θ_i``, where the *layout* maps each
frequency to a row and ``mrope_section`` says how many frequencies each row takes. A text
token has equal rows, so it turns exactly as with 1-D RoPE.

The layouts, for ``h = r/2`` pairs and sections ``s_0 .. s_{R-1}`` (``R`` rows):

* ``blocked`` (Qwen2-VL): consecutive blocks, the first ``s_0`` pairs take row 0, the next
  ``s_1`` row 1, ...; ``sum(s) = h``.
* ``interleaved`` (Qwen3-VL's MRoPE-I): row ``k >= 1`` takes pairs ``k, k + R, ...`` (``s_k``
  of them), row 0 every other pair (its own ``s_0`` is not read).
* ``alternating`` (ERNIE-4.5-VL): the first ``(R - 1) s_1`` pairs cycle over rows
  ``1 .. R-1``, the last ``s_0`` take row 0; ``s_1 = ... = s_{R-1}``, ``sum(s) = h``.
* ``blocked-channels`` (HunYuan-VL): blocks of ``2 s_k`` channels over the ``2h`` rotated
  channels, channel ``c`` (half layout) having frequency ``c mod h``; ``sum(s) = h``.

With ``blocked-channels`` and distinct rows, a pair's first channel is turned by one row's
angle and its second by another's (what HunYuan-VL's code computes: not a rotation, and
reduced to plain RoPE for text, where the rows agree).

How each transformers family states its layout in its config is read by
:mod:`posenc.hf.mrope_layouts`.

Dimension legend: ``r`` rotary dim, ``h = r/2`` pairs, ``R`` rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import PosencTypeError, PosencValueError

__all__ = ["LAYOUTS", "check_mrope", "pair_rows"]

#: The layouts :func:`pair_rows` knows (see the module docstring).
LAYOUTS = ("blocked", "interleaved", "alternating", "blocked-channels")


def check_mrope(
    section: object, layout: object, rotary_dim: int | None, *, name: str = "mrope_section"
) -> tuple[int, ...]:
    """``section`` as a tuple of ints after checking it against ``layout`` and ``rotary_dim``
    (see the module docstring for what each layout requires; ``rotary_dim=None``: only the
    types, the layout's name and the number of rows); raise naming ``name``."""
    if not isinstance(layout, str):
        raise PosencTypeError(f"mrope_layout must be a str, got {type(layout).__name__}")
    if layout not in LAYOUTS:
        raise PosencValueError(f"mrope_layout must be one of {list(LAYOUTS)}, got {layout!r}")
    if isinstance(section, (str, bytes)) or not isinstance(section, Sequence):
        raise PosencTypeError(
            f"{name} must be a list of ints (one per row), got {type(section).__name__}"
        )
    for value in section:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PosencTypeError(f"{name} must hold ints, got {list(section)!r}")
        if value < 0:
            raise PosencValueError(f"{name} must hold counts >= 0, got {list(section)!r}")
    section = tuple(section)
    if not section:
        raise PosencValueError(f"{name} must name at least one row, got []")
    rows = len(section)
    if layout == "alternating" and (rows < 2 or len(set(section[1:])) != 1):
        raise PosencValueError(
            f"{name}={list(section)}: the 'alternating' layout needs two rows or more and equal "
            "sections for rows 1 .. R-1 (their pairs alternate)"
        )
    if rotary_dim is None:
        return section
    half = rotary_dim // 2
    if layout != "interleaved" and sum(section) != half:
        raise PosencValueError(
            f"{name}={list(section)} must sum to rotary_dim / 2 = {half} for the {layout!r} "
            f"layout, got {sum(section)}"
        )
    if layout == "interleaved":
        for k, count in enumerate(section[1:], start=1):
            if count and k + rows * (count - 1) >= half:
                raise PosencValueError(
                    f"{name}={list(section)}: row {k} of the 'interleaved' layout takes pairs "
                    f"{k}, {k + rows}, ... ({count} of them), past the {half} pairs of "
                    f"rotary_dim={rotary_dim}"
                )
    return section


def pair_rows(layout: str, section: Sequence[int], half: int) -> tuple[list[int], list[int]]:
    """For each of the ``half`` pairs, the row whose position turns its first channel and the
    row that turns its second (equal except in ``blocked-channels``). ``section`` and
    ``layout`` are assumed checked (:func:`check_mrope`).

    >>> pair_rows("blocked", (1, 2, 1), 4)[0], pair_rows("interleaved", (2, 1, 1), 4)[0]
    ([0, 1, 1, 2], [0, 1, 2, 0])
    >>> pair_rows("alternating", (2, 1, 1), 4)[0], pair_rows("blocked-channels", (1, 1, 1, 1), 4)
    ([1, 2, 0, 0], ([0, 0, 1, 1], [2, 2, 3, 3]))
    """
    rows = len(section)
    if layout == "interleaved":  # Qwen3-VL: row k >= 1 at k, k + R, ..., below R * s_k
        first = [0] * half
        for k in range(1, rows):
            for i in range(k, min(rows * section[k], half), rows):
                first[i] = k
        return first, first
    if layout == "alternating":  # ERNIE-4.5-VL: rows 1 .. R-1 in turn, then row 0's block
        cycled = (rows - 1) * section[1]
        first = [1 + i % (rows - 1) if i < cycled else 0 for i in range(half)]
        return first, first
    if layout == "blocked-channels":  # HunYuan-VL: blocks of 2 s_k over the 2h channels
        channel = [k for k, count in enumerate(section) for _ in range(2 * count)]
        return channel[:half], channel[half:]
    first = [k for k, count in enumerate(section) for _ in range(count)]  # blocked
    return first, first


# --------------------------------------------------------------------------- the families
