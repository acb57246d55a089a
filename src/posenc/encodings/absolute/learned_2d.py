"""Learned 2-D position tables of vision transformers: one trained vector per image patch
(row-major over an ``h x w`` grid), after ``cls_tokens`` vectors for the class (and
distillation) tokens, as ViT (Dosovitskiy et al. 2021), DeiT, CLIP, SigLIP and DINOv2 hold them.

A model run at another resolution resamples the patch part of its table to the new grid
(``interpolate_pos_encoding`` in transformers, ``resample_abs_pos_embed`` in timm); the
class-token rows are kept as they are. :meth:`LearnedPositionalEncoding2D.resample` does that,
with each interpolation the families use (``docs/vision.md`` lists them, checked against
transformers 5.24).

Dimension legend: ``b`` batch, ``c`` class tokens, ``h``/``w`` grid rows/columns, ``d`` width.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import PosencTypeError, PosencValueError, check_bytes
from ..checks import check_bool, check_input, check_positive_int, check_probability, compute_dtype
from ..tiles import add_encoding

__all__ = ["LearnedPositionalEncoding2D"]

Init = Literal["xavier", "normal"]
Mode = Literal["bicubic", "bilinear"]
MODES: tuple[str, ...] = ("bicubic", "bilinear")


def _check_grid(name: str, grid: object) -> tuple[int, int]:
    if not isinstance(grid, (tuple, list)) or len(grid) != 2:
        raise PosencTypeError(f"{name} must be a pair (h, w) of ints, got {grid!r}")
    return check_positive_int(f"{name}[0]", grid[0]), check_positive_int(f"{name}[1]", grid[1])


class LearnedPositionalEncoding2D(nn.Module):
    """A learned ``(cls_tokens + h*w, dim)`` table added to a patch sequence.

    Rows ``0 .. cls_tokens-1`` belong to the class tokens (ViT and CLIP have one, DeiT two:
    class and distillation; SigLIP none); the rest are the patches of an ``h x w`` grid in
    row-major order, as ``conv(...).flatten(2).transpose(1, 2)`` orders them.

    Not a registered scheme: its positions are the fixed layout ``cls_tokens + h*w``, not a
    sequence or coordinate tensor the registry's schemes take.

    Args:
        dim: model width.
        grid: ``(h, w)``, patches per column and per row.
        cls_tokens: rows before the patch grid (``>= 0``).
        init: ``"normal"`` (normal(0, 0.02), as ViT's ``trunc_normal_`` is used) or ``"xavier"``.
        dropout: dropout on the sum.

    >>> pe = LearnedPositionalEncoding2D(8, grid=(2, 3))
    >>> pe.weight.shape
    torch.Size([7, 8])
    >>> pe.resample((4, 4)).weight.shape
    torch.Size([17, 8])
    """

    paper: ClassVar[str] = "Dosovitskiy et al. 2021 (ViT); Touvron et al. 2021 (DeiT)"

    def __init__(
        self,
        dim: int,
        grid: tuple[int, int],
        *,
        cls_tokens: int = 1,
        init: Init = "normal",
        dropout: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.grid = _check_grid("grid", grid)
        if isinstance(cls_tokens, bool) or not isinstance(cls_tokens, int):
            raise PosencTypeError(
                f"cls_tokens must be an int, got {type(cls_tokens).__name__} ({cls_tokens!r})"
            )
        if cls_tokens < 0:
            raise PosencValueError(f"cls_tokens must be >= 0, got {cls_tokens}")
        self.cls_tokens = cls_tokens
        if init not in ("xavier", "normal"):
            raise PosencValueError(f"init must be 'xavier' or 'normal', got {init!r}")
        self.init = init
        self.dropout = nn.Dropout(check_probability("dropout", dropout))
        rows = self.num_positions
        itemsize = (dtype or torch.get_default_dtype()).itemsize
        check_bytes("rows x dim", f"{rows} x {dim}", rows * dim * itemsize, device=device)
        self.weight = nn.Parameter(torch.empty(rows, dim, device=device, dtype=dtype))
        self.reset_parameters()

    @property
    def num_positions(self) -> int:
        """Rows of the table: ``cls_tokens + h * w``."""
        return self.cls_tokens + self.grid[0] * self.grid[1]

    def reset_parameters(self) -> None:
        if self.init == "xavier":
            nn.init.xavier_uniform_(self.weight)
        else:
            nn.init.normal_(self.weight, mean=0.0, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        """Shapes: x ``(b, cls_tokens + h*w, d)`` -> ``(b, cls_tokens + h*w, d)``."""
        check_input(x, self.dim)
        if x.shape[1] != self.num_positions:
            h, w = self.grid
            raise PosencValueError(
                f"x has {x.shape[1]} tokens but the table holds {self.num_positions} "
                f"(cls_tokens={self.cls_tokens} + grid {h}x{w}); resample() it to the input's grid"
            )
        pe = self.weight.to(compute_dtype(x.dtype))  # (c + h*w, d)
        return add_encoding(x, pe, self.dropout)

    def resample(
        self,
        grid: tuple[int, int],
        *,
        mode: Mode = "bicubic",
        antialias: bool = False,
        legacy_scale_factor: bool = False,
    ) -> LearnedPositionalEncoding2D:
        """A new encoding for a ``grid = (h2, w2)`` patch grid; this one is unchanged.

        The class-token rows are copied; the patch rows, as a ``(d, h, w)`` image, are resized
        by ``F.interpolate(..., mode=mode, align_corners=False, antialias=antialias)`` in
        float32 (float64 for a float64 table) and rounded once to the table's dtype.

        Args:
            grid: the new ``(h2, w2)``.
            mode: ``"bicubic"`` (ViT, CLIP, SigLIP, DINOv2, ...) or ``"bilinear"``.
            antialias: as ``F.interpolate`` (DINOv2 with registers, RF-DETR; only acts when
                shrinking).
            legacy_scale_factor: pass ``scale_factor=((h2 + 0.1) / h, (w2 + 0.1) / w)``
                instead of ``size``, the form of the original DINO/DINOv2 code that HunYuan
                V4's vision tower keeps: the samples sit at ``(i + 0.5) * h / (h2 + 0.1) - 0.5``
                rather than ``(i + 0.5) * h / h2 - 0.5``.
        """
        h2, w2 = _check_grid("grid", grid)
        if mode not in MODES:
            raise PosencValueError(f"mode must be one of {MODES}, got {mode!r}")
        check_bool("antialias", antialias)
        check_bool("legacy_scale_factor", legacy_scale_factor)
        h, w = self.grid
        out = LearnedPositionalEncoding2D(
            self.dim,
            (h2, w2),
            cls_tokens=self.cls_tokens,
            init=self.init,
            dropout=self.dropout.p,
            device="meta",
            dtype=self.weight.dtype,
        )
        with torch.no_grad():
            weight = self.weight.detach()
            work = torch.float64 if weight.dtype == torch.float64 else torch.float32
            patches = weight[self.cls_tokens :].to(work)  # (h*w, d)
            image = patches.reshape(1, h, w, self.dim).permute(0, 3, 1, 2)  # (1, d, h, w)
            if legacy_scale_factor:
                scale = ((h2 + 0.1) / h, (w2 + 0.1) / w)
                image = F.interpolate(
                    image, scale_factor=scale, mode=mode, align_corners=False, antialias=antialias
                )
                if tuple(image.shape[-2:]) != (h2, w2):  # floor(h * (h2 + 0.1) / h) is h2
                    raise PosencValueError(
                        f"legacy scale factor {scale} gave a {tuple(image.shape[-2:])} grid, "
                        f"not {(h2, w2)}"
                    )
            else:
                image = F.interpolate(
                    image, size=(h2, w2), mode=mode, align_corners=False, antialias=antialias
                )
            patches = image.permute(0, 2, 3, 1).reshape(h2 * w2, self.dim)  # (h2*w2, d)
            table = torch.cat([weight[: self.cls_tokens], patches.to(weight.dtype)])
        out.weight = nn.Parameter(table, requires_grad=self.weight.requires_grad)
        out.train(self.training)
        return out

    def extra_repr(self) -> str:
        h, w = self.grid
        return f"dim={self.dim}, grid=({h}, {w}), cls_tokens={self.cls_tokens}, init={self.init!r}"
