"""The position encoding generator (PEG) of Chu et al. 2023, "Conditional Positional Encodings
for Vision Transformers" (CPVT, ICLR 2023; arXiv:2102.10882): a depth-wise ``k x k``
convolution over the patch tokens laid back on their ``h x w`` grid, added to them, applied to
the hidden states after the first encoder block. The encoding is conditioned on each token's
neighbourhood (zero padding at the border tells a patch where it sits), so it needs no table
and follows any image size. timm's Twins ``PosConv`` is the same module (stride 1).

Dimension legend: ``b`` batch, ``n`` tokens (``c`` class/extra tokens first, then
``m = h·w`` patch tokens in row-major order), ``D`` model width.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import PosencTypeError, PosencValueError
from ..base import ConditionalEncoding
from ..checks import check_grid_positions, check_input, check_positive_int, take_position_ids
from ..registry import register

__all__ = ["PositionEncodingGenerator"]

#: What every refusal of positions says a PEG needs.
NEEDS = (
    "peg needs the patch tokens of one full h x w grid in row-major order (token i at "
    "origin + (i // w, i % w), the same grid in every batch row)"
)


def _check_grid(name: str, grid: object) -> tuple[int, int] | None:
    """``grid`` as ``(h, w)`` of positive ints, or ``None``."""
    if grid is None:
        return None
    if not isinstance(grid, (tuple, list)) or len(grid) != 2:
        raise PosencTypeError(f"{name} must be a pair (h, w) of positive ints, got {grid!r}")
    return check_positive_int(f"{name}[0]", grid[0]), check_positive_int(f"{name}[1]", grid[1])


@register("peg", "CPVT's position encoding generator: depth-wise conv after the first block")
class PositionEncodingGenerator(ConditionalEncoding):
    """CPVT's PEG: ``x + DWConv_k(x)`` over the patch tokens on their grid, the class tokens
    passed through unchanged (Chu et al. 2023, eq. in §3.2 and Fig. 2; timm's Twins
    ``PosConv``, checked equal in float32 forward and backward).

    Args:
        dim: model width (the convolution's channels, one ``k x k`` filter each).
        kernel_size: ``k``, odd (zero padding ``k // 2`` keeps the grid's size); CPVT uses 3.
        bias: a bias per channel, as CPVT and Twins have.
        after_block: the :class:`~posenc.Encoder` applies the PEG to the hidden states after
            this many blocks (1: after the first block, as CPVT; 0: to the input).
        cls_tokens: class/extra tokens at the start of the sequence, kept out of the
            convolution and passed through (CPVT's class token).
        grid: ``(h, w)`` used when no positions are given (default: a square grid).

    Positions are ``(n, 2)`` or ``(b, n, 2)`` ``(row, col)`` coordinates of every token, as
    ``rope2d`` takes them; the first ``cls_tokens`` rows are not read. The patch tokens' rows
    must be one full ``h x w`` grid in row-major order, starting anywhere; ``h`` and ``w`` are
    read from them. Anything else (a partial grid, shuffled tokens) is refused, as are, in an
    Encoder, a KV cache, packed documents, windows and padding that removes patch tokens:
    the convolution needs every neighbour of every patch. Without positions the grid is
    ``grid`` if given, else ``√m x √m`` when the ``m`` patch tokens are a square number (as
    CPVT assumes square images), else refused.

    >>> peg = PositionEncodingGenerator(8, cls_tokens=1)
    >>> peg(torch.randn(2, 1 + 3 * 4, 8), PositionEncodingGenerator.grid(3, 4, cls_tokens=1)).shape
    torch.Size([2, 13, 8])
    """

    paper: ClassVar[str] = "Chu et al. 2023, Conditional Positional Encodings (CPVT)"
    axes: ClassVar[int] = 2

    def __init__(
        self,
        dim: int,
        *,
        kernel_size: int = 3,
        bias: bool = True,
        after_block: int = 1,
        cls_tokens: int = 0,
        grid: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.kernel_size = check_positive_int("kernel_size", kernel_size)
        if kernel_size % 2 == 0:
            raise PosencValueError(
                f"kernel_size must be odd (zero padding k // 2 keeps the grid), got {kernel_size}"
            )
        if isinstance(after_block, bool) or not isinstance(after_block, int) or after_block < 0:
            raise PosencValueError(f"after_block must be an int >= 0, got {after_block!r}")
        if isinstance(cls_tokens, bool) or not isinstance(cls_tokens, int) or cls_tokens < 0:
            raise PosencValueError(f"cls_tokens must be an int >= 0, got {cls_tokens!r}")
        self.after_block = after_block
        self.cls_tokens = cls_tokens
        self.default_grid = _check_grid("grid", grid)
        # depth-wise: one k x k filter per channel (groups = dim), as CPVT and Twins
        self.proj = nn.Conv2d(
            dim, dim, kernel_size, padding=kernel_size // 2, groups=dim, bias=bool(bias)
        )

    @staticmethod
    def grid(h: int, w: int, *, cls_tokens: int = 0, device: Any = None) -> Tensor:
        """Positions of ``cls_tokens`` extra tokens (at ``(-1, -1)``, not read) followed by a
        row-major ``h x w`` grid: ``(cls_tokens + h·w, 2)`` int64."""
        check_positive_int("h", h)
        check_positive_int("w", w)
        rows, cols = torch.meshgrid(
            torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij"
        )
        patches = torch.stack([rows, cols], dim=-1).reshape(-1, 2)  # (m, 2)
        extra = torch.full((cls_tokens, 2), -1, dtype=patches.dtype, device=patches.device)
        return torch.cat([extra, patches])

    def prepare(
        self,
        x: Tensor,
        positions: Tensor | None,
        *,
        key_padding_mask: Tensor | None = None,
        grid: tuple[int, int] | None = None,
    ) -> tuple[int, int]:
        """The ``(h, w)`` grid of the patch tokens of ``x`` ``(b, n, D)``, from ``grid``, the
        positions, the module's ``grid`` or a square; raises naming the argument and value
        when the tokens are not one full grid, or ``key_padding_mask`` removes a patch token."""
        b, n, _ = x.shape
        m = n - self.cls_tokens
        if m < 1:
            raise PosencValueError(
                f"x has {n} tokens but peg has cls_tokens={self.cls_tokens}: no patch token "
                "is left for the convolution"
            )
        grid = _check_grid("grid", grid)
        if key_padding_mask is not None and bool(key_padding_mask[:, self.cls_tokens :].any()):
            raise PosencValueError(
                "key_padding_mask marks patch tokens as padding: peg convolves every patch "
                "with its neighbours on the grid, so no patch token can be removed"
            )
        if positions is not None:
            return self._grid_of(positions, b, n, grid)
        grid = grid or self.default_grid
        if grid is None:
            side = math.isqrt(m)
            if side * side != m:
                raise PosencValueError(
                    "peg needs positions: grid coordinates of shape (seq, 2) or (batch, seq, "
                    f"2), or grid=(h, w); without them the {m} patch tokens (the {n} tokens "
                    f"after cls_tokens={self.cls_tokens}) must form a square grid, and {m} is "
                    "not a square number"
                )
            grid = (side, side)
        if grid[0] * grid[1] != m:
            raise PosencValueError(f"grid={grid} holds {grid[0] * grid[1]} patches, x has {m}")
        return grid

    def _grid_of(
        self, positions: Tensor, b: int, n: int, grid: tuple[int, int] | None
    ) -> tuple[int, int]:
        """``(h, w)`` read from the patch rows of ``positions``, checked to be one full grid
        (one host read of the coordinates)."""
        check_grid_positions(positions, n, 2, b)
        shape = tuple(positions.shape)
        patches = positions.detach()[..., self.cls_tokens :, :].to("cpu", torch.float64)
        patches = patches.reshape(-1, n - self.cls_tokens, 2)  # (rows, m, 2)
        m = patches.shape[1]
        offsets = patches - patches[:, :1]  # each row from its first patch
        if grid is None:
            w = int(offsets[0, :, 1].max().item()) + 1 if torch.isfinite(offsets).all() else 0
            grid = (m // w, w) if w >= 1 and m % w == 0 else None
        if grid is None or grid[0] * grid[1] != m:
            raise PosencValueError(
                f"{NEEDS}; the {m} patch rows of positions {shape} are no such grid"
                + ("" if grid is None else f" (grid={grid} holds {grid[0] * grid[1]})")
                + self._class_hint(patches)
            )
        expected = self.grid(*grid).to(torch.float64)  # (m, 2)
        wrong = (offsets != expected).any(dim=-1)  # (rows, m)
        if bool(wrong.any()):
            row, token = (int(i) for i in wrong.nonzero()[0])
            got = tuple(patches[row, token].tolist())
            want = tuple((patches[row, 0] + expected[token]).tolist())
            raise PosencValueError(
                f"{NEEDS}; positions {shape} has positions[..., {self.cls_tokens + token}, :] "
                f"= {got} in batch row {row}, where a {grid[0]} x {grid[1]} grid has {want}"
                + self._class_hint(patches)
            )
        return grid

    def _class_hint(self, patches: Tensor) -> str:
        """Where the rows taken for patches start with rows whose coordinates are all
        negative (as :meth:`grid` marks class tokens), a note that ``cls_tokens`` may be too
        small; else ``""``."""
        negative = (patches[0] < 0).all(dim=-1)  # (m,)
        leading = int(negative.long().cumprod(0).sum())
        if leading == 0 or leading == negative.numel():
            return ""
        return (
            f" (its first {leading} patch rows are negative, as grid(..., cls_tokens=...) "
            f"marks class tokens: cls_tokens={self.cls_tokens + leading}, not "
            f"{self.cls_tokens}?)"
        )

    def generate(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        """``x`` with the PEG applied on a checked ``(h, w)`` grid (:meth:`prepare`).

        Shapes: x ``(b, c + h·w, D)`` -> ``(b, c + h·w, D)``."""
        b, _, d = x.shape
        extra, patches = x[:, : self.cls_tokens], x[:, self.cls_tokens :]  # (b, c, D), (b, m, D)
        feat = patches.transpose(1, 2).reshape(b, d, *grid)  # (b, D, h, w)
        weight = self.proj.weight.to(x.dtype)
        bias = None if self.proj.bias is None else self.proj.bias.to(x.dtype)
        out = F.conv2d(feat, weight, bias, padding=self.kernel_size // 2, groups=d) + feat
        out = out.flatten(2).transpose(1, 2)  # (b, m, D)
        return torch.cat([extra, out], dim=1) if self.cls_tokens else out

    def forward(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        *,
        grid: tuple[int, int] | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """Apply the PEG to ``x`` at ``positions`` (or on ``grid``).

        Shapes:
            x: ``(b, n, D)``; positions: ``(n, 2)`` or ``(b, n, 2)``; returns ``(b, n, D)``.
        """
        positions = take_position_ids(positions, position_ids)
        check_input(x, self.dim)
        return self.generate(x, self.prepare(x, positions, grid=grid))

    def extra_repr(self) -> str:
        return (
            f"{self.dim}, kernel_size={self.kernel_size}, after_block={self.after_block}, "
            f"cls_tokens={self.cls_tokens}"
        )
