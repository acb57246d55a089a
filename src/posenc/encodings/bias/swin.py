"""2-D relative position bias over patch offsets (Liu et al. 2021, "Swin Transformer", §3.2,
eq. 4; Bao et al. 2022, "BEiT", §2.5 with its class-token entries).

Each head learns one scalar per offset ``(Δy, Δx) = q_coord - k_coord`` inside a window of
``Wh x Ww`` patches: a table of ``(2Wh - 1)(2Ww - 1)`` rows read at

    index(Δy, Δx) = (Δy + Wh - 1) · (2Ww - 1) + (Δx + Ww - 1)

(transformers' ``relative_position_index``). BEiT adds three rows for its class token: class
query to any key, any query to the class key, class to class. Inside a Swin window no offset
passes ``W - 1``; posenc clips larger offsets to the table's edge on each axis, as Shaw et al.
clip distances.

Dimension legend: ``b`` batch, ``h`` heads, ``nq``/``nk`` query/key length, ``R`` table rows.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import PosencTypeError, PosencValueError
from ..base import BiasEncoding, ScoreMod
from ..checks import check_bool, check_finite, check_positive_int, compute_dtype, reads_values
from ..registry import register
from ..state import BiasState
from .common import check_bias_bytes, require_integral

__all__ = ["SwinRelativeBias", "SwinV2ContinuousBias", "log_spaced_offsets", "window_coordinates"]

#: The coordinates that mark a class token when ``cls_token=True``.
CLS = -1


def _pair(name: str, value: object) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise PosencTypeError(f"{name} must be an int or a pair (h, w) of ints, got {value!r}")
    return check_positive_int(f"{name}[0]", value[0]), check_positive_int(f"{name}[1]", value[1])


def window_coordinates(h: int, w: int, *, cls_token: bool = False, device: Any = None) -> Tensor:
    """Row-major ``(y, x)`` coordinates of an ``h x w`` grid, ``(h*w, 2)`` int64; with
    ``cls_token`` a first row ``(-1, -1)`` for the class token (BEiT's layout)."""
    ys, xs = torch.meshgrid(
        torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij"
    )
    coords = torch.stack([ys, xs], dim=-1).reshape(h * w, 2)
    if cls_token:
        coords = torch.cat([torch.full((1, 2), CLS, device=device, dtype=coords.dtype), coords])
    return coords


class _GridBiasState(BiasState):
    """A bias state whose positions are coordinates ``(n, 2)`` / ``(b, n, 2)``."""

    def last_keys(self, nk: int) -> Tensor:
        if nk == self.key_positions.shape[-2]:
            return self.key_positions
        return self.key_positions[..., -nk:, :]


class GridBias(BiasEncoding):
    """A bias over 2-D patch coordinates ``(n, 2)`` / ``(b, n, 2)``: their checks and state.
    Subclasses set ``cls_token`` and implement ``bias`` and ``score_mod``."""

    axes: ClassVar[int] = 2
    integer_positions: ClassVar[bool] = True
    has_score_mod: ClassVar[bool] = True  # a table by offset, read once per score
    cls_token: bool = False

    # ------------------------------------------------------------------ positions

    def _check(self, name: str, coords: object) -> Tensor:
        if not isinstance(coords, Tensor):
            raise PosencTypeError(f"{name} must be a torch.Tensor, got {type(coords).__name__}")
        if coords.dtype == torch.bool or coords.is_complex():
            raise PosencTypeError(f"{name} must be an integer or float tensor, got {coords.dtype}")
        if coords.dim() not in (2, 3) or coords.shape[-1] != 2:
            raise PosencValueError(
                f"{name} must be coordinates of shape (seq, 2) or (batch, seq, 2), "
                f"got {tuple(coords.shape)}"
            )
        # the values are checked where the host reads them (a read elsewhere would sync)
        readable = reads_values(coords)
        if coords.is_floating_point() and readable:
            check_finite(name, coords)
            require_integral(name, coords, type(self).__name__)
        coords = coords.long()
        if self.cls_token and readable and coords.numel():
            marked = (coords == CLS).all(-1, keepdim=True)
            if bool(((coords < 0) & ~marked).any()):
                bad = coords[((coords < 0) & ~marked).any(-1)][0].tolist()
                raise PosencValueError(
                    f"{name} holds {bad}: with cls_token=True coordinates are >= 0, or "
                    f"({CLS}, {CLS}) for the class token"
                )
        return coords

    def _pair_check(self, q_positions: object, k_positions: object) -> tuple[Tensor, Tensor]:
        q_pos, k_pos = (
            self._check("q_positions", q_positions),
            self._check("k_positions", k_positions),
        )
        if q_pos.dim() == 3 and k_pos.dim() == 3:
            bq, bk = q_pos.shape[0], k_pos.shape[0]
            if bq != bk and 1 not in (bq, bk):
                raise PosencValueError(
                    f"q_positions {tuple(q_pos.shape)} and k_positions {tuple(k_pos.shape)} "
                    f"have mismatched batch sizes ({bq} vs {bk})"
                )
        return q_pos, k_pos

    def position_state(self, positions: Tensor | None, x: Tensor) -> BiasState:
        """The coordinates, validated once; the bias is made at the first layer's request."""
        b, n = x.shape[0], x.shape[1]
        if positions is None:
            raise PosencValueError(
                f"{type(self).__name__} needs positions: coordinates of shape (seq, 2) or "
                f"(batch, seq, 2) with seq={n} (e.g. window_coordinates(h, w)); without them "
                "every token would sit on one row"
            )
        coords = self._check("positions", positions)
        if coords.shape[-2] != n or (coords.dim() == 3 and coords.shape[0] not in (1, b)):
            raise PosencValueError(
                f"positions must be coordinates of shape (seq, 2) or (batch, seq, 2) with "
                f"seq={n} and batch {b}, got {tuple(coords.shape)}"
            )
        return _GridBiasState(self, coords)


@register("swin-bias", "learned per-head bias over 2-D patch offsets (Swin, BEiT)")
class SwinRelativeBias(GridBias):
    """Swin's and BEiT's relative position bias: ``bias[h, i, j] = table[index(q_i - k_j), h]``
    over 2-D patch coordinates.

    Args:
        num_heads: number of heads.
        window: ``Wh`` and ``Ww`` (an int for a square window): offsets ``|Δy| <= Wh - 1``,
            ``|Δx| <= Ww - 1`` each have a row; larger ones are clipped to the edge.
        cls_token: BEiT's three extra rows for a class token, which positions mark with the
            coordinates ``(-1, -1)`` (every other coordinate must then be ``>= 0``).

    Positions are integer coordinates ``(n, 2)`` or ``(b, n, 2)`` (``(y, x)``, as
    :func:`window_coordinates` makes them); they are required. The table,
    ``relative_position_bias_table``, is ``((2Wh - 1)(2Ww - 1) [+ 3], num_heads)``,
    transformers' layout, initialised from N(0, 0.02²).

    >>> pe = SwinRelativeBias(2, window=3)
    >>> pe.bias(window_coordinates(3, 3), window_coordinates(3, 3)).shape
    torch.Size([2, 9, 9])
    """

    paper: ClassVar[str] = "Liu et al. 2021 (Swin Transformer), §3.2; Bao et al. 2022 (BEiT)"

    def __init__(
        self, num_heads: int, *, window: int | tuple[int, int] = 7, cls_token: bool = False
    ) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.window = _pair("window", window)
        self.cls_token = check_bool("cls_token", cls_token)
        wh, ww = self.window
        rows = (2 * wh - 1) * (2 * ww - 1) + (3 if cls_token else 0)
        self.relative_position_bias_table = nn.Parameter(torch.empty(rows, num_heads))
        nn.init.normal_(self.relative_position_bias_table, std=0.02)

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> SwinRelativeBias:
        return cls(num_heads, **kwargs)

    # ------------------------------------------------------------------ the bias

    def index_of(self, dy: Tensor, dx: Tensor) -> Tensor:
        """The table row of each offset ``(dy, dx)`` (int64 tensors of one shape), clipped."""
        wh, ww = self.window
        dy = dy.clamp(-(wh - 1), wh - 1) + (wh - 1)
        dx = dx.clamp(-(ww - 1), ww - 1) + (ww - 1)
        return dy * (2 * ww - 1) + dx

    def _index(self, q_cls: Tensor, k_cls: Tensor, index: Tensor) -> Tensor:
        """BEiT's class rows where a query or a key is the class token."""
        last = self.relative_position_bias_table.shape[0]
        index = torch.where(k_cls, last - 2, index)  # token to class
        index = torch.where(q_cls, last - 3, index)  # class to token
        return torch.where(q_cls & k_cls, last - 1, index)  # class to class

    def relative_position_index(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The table row of every pair: ``(nq, nk)`` or ``(b, nq, nk)`` int64."""
        q_pos, k_pos = self._pair_check(q_positions, k_positions)
        delta = q_pos.unsqueeze(-2) - k_pos.unsqueeze(-3)  # (..., nq, nk, 2)
        index = self.index_of(delta[..., 0], delta[..., 1])
        if self.cls_token:
            q_cls = (q_pos == CLS).all(-1).unsqueeze(-1)  # (..., nq, 1)
            k_cls = (k_pos == CLS).all(-1).unsqueeze(-2)  # (..., 1, nk)
            index = self._index(q_cls, k_cls, index)
        return index

    def bias(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> Tensor:
        """``(h, nq, nk)`` for ``(n, 2)`` coordinates, ``(b, h, nq, nk)`` for batched ones."""
        q_pos, k_pos = self._pair_check(q_positions, k_positions)
        check_bias_bytes(q_pos[..., 0], k_pos[..., 0], self.num_heads + 4, q)
        index = self.relative_position_index(q_pos, k_pos)
        table = self.relative_position_bias_table
        dtype = compute_dtype(table.dtype if q is None else q.dtype)
        values = table[index].to(dtype)  # (..., nq, nk, h)
        return values.movedim(-1, -3)

    def score_mod(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> ScoreMod | None:
        """Reads the table once per score, its row computed from the coordinates in the kernel."""
        q_pos, k_pos = self._pair_check(q_positions, k_positions)
        if not (q_pos.numel() and k_pos.numel()):
            return None
        table = self.relative_position_bias_table.t()  # (h, R)

        at_q, at_k = _coordinate_reader(q_pos), _coordinate_reader(k_pos)
        cls_token = self.cls_token

        def swin_bias(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            qy, qx = at_q(b, q_idx)
            ky, kx = at_k(b, kv_idx)
            index = self.index_of(qy - ky, qx - kx)
            if cls_token:
                index = self._index((qy == CLS) & (qx == CLS), (ky == CLS) & (kx == CLS), index)
            return score + table[h, index].to(score.dtype)

        return swin_bias

    # ------------------------------------------------------------------ resizing

    def resize(self, window: int | tuple[int, int]) -> SwinRelativeBias:
        """A new bias for another window; this one is unchanged. The offset table, as a
        ``(h, 2Wh - 1, 2Ww - 1)`` image, is resized with ``F.interpolate(mode="bilinear",
        align_corners=False)`` in float32 (float64 for a float64 table), as BEiT's
        ``BeitRelativePositionBias`` does for a new window; the class rows are copied."""
        wh2, ww2 = _pair("window", window)
        out = SwinRelativeBias(self.num_heads, window=(wh2, ww2), cls_token=self.cls_token)
        wh, ww = self.window
        with torch.no_grad():
            table = self.relative_position_bias_table.detach()
            work = torch.float64 if table.dtype == torch.float64 else torch.float32
            offsets = table[: (2 * wh - 1) * (2 * ww - 1)].to(work)  # (R, h)
            image = offsets.t().reshape(1, self.num_heads, 2 * wh - 1, 2 * ww - 1)
            image = F.interpolate(
                image, size=(2 * wh2 - 1, 2 * ww2 - 1), mode="bilinear", align_corners=False
            )
            offsets = image.reshape(self.num_heads, -1).t().to(table.dtype)  # (R2, h)
            extra = table[(2 * wh - 1) * (2 * ww - 1) :]  # the class rows, if any
            new = torch.cat([offsets, extra]).to(table.device)
        out.relative_position_bias_table = nn.Parameter(
            new, requires_grad=self.relative_position_bias_table.requires_grad
        )
        return out

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, window={self.window}, cls_token={self.cls_token}"


def log_spaced_offsets(offsets: Tensor, reference: tuple[int, int]) -> Tensor:
    """SwinV2's log-spaced coordinates of offsets ``(..., 2)`` (Liu et al. 2022, eq. 4):
    ``u = 8 · Δ / (W - 1)`` per axis, then ``sign(u) · log2(1 + |u|) / log2(8)``; float64.
    As transformers does, nothing is divided when ``reference[0] = 1``, and an axis of width 1
    (whose offsets are all 0) is divided by 1."""
    u = offsets.to(torch.float64)
    if reference[0] > 1:  # (by numbers, not a tensor: no copy from the host)
        u = torch.stack([u[..., 0] / (reference[0] - 1), u[..., 1] / max(reference[1] - 1, 1)], -1)
    u = u * 8
    return torch.sign(u) * torch.log2(u.abs() + 1.0) / math.log2(8)


@register("swinv2-cpb", "log-spaced continuous 2-D position bias from an MLP (Swin V2)")
class SwinV2ContinuousBias(GridBias):
    """Swin V2's continuous position bias (Liu et al. 2022, "Swin Transformer V2", §3.3):
    ``bias[h, i, j] = 16 · sigmoid(MLP(log_spaced(q_i - k_j))[h])``, an MLP ``2 -> mlp_dim ->
    num_heads`` (ReLU; the second layer has no bias) of the log-spaced offset, so any offset
    has a value (a larger window at test time reads offsets never trained).

    Args:
        num_heads: number of heads.
        window: ``Wh, Ww``: offsets are normalised by ``W - 1`` (``8 · Δ / (W - 1)``).
        pretrained_window: if given (``> 0``), normalise by it instead, as Swin V2 does when
            fine-tuned at a larger window than it was trained with.
        mlp_dim: hidden width of the MLP (512 in Swin V2).

    The MLP is ``continuous_position_bias_mlp`` with transformers' layout
    (``Linear(2, mlp_dim)``, ``ReLU``, ``Linear(mlp_dim, num_heads, bias=False)``). Positions
    are integer coordinates ``(n, 2)`` / ``(b, n, 2)``, required. The MLP is evaluated once
    per distinct offset in the coordinates' span, and the bias reads that table. The span is
    read from coordinates whose values the host reads
    (:func:`~posenc.encodings.checks.reads_values`); elsewhere (a GPU) it is the window's,
    ``|Δ| <= W - 1`` per axis, and an offset past it is NaN, never another offset's value.
    """

    paper: ClassVar[str] = "Liu et al. 2022 (Swin Transformer V2), §3.3"

    def __init__(
        self,
        num_heads: int,
        *,
        window: int | tuple[int, int] = 8,
        pretrained_window: int | tuple[int, int] = 0,
        mlp_dim: int = 512,
    ) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.window = _pair("window", window)
        if pretrained_window in (0, (0, 0), [0, 0]):
            self.pretrained_window = (0, 0)
        else:
            self.pretrained_window = _pair("pretrained_window", pretrained_window)
        self.mlp_dim = check_positive_int("mlp_dim", mlp_dim)
        self.continuous_position_bias_mlp = nn.Sequential(
            nn.Linear(2, mlp_dim, bias=True), nn.ReLU(), nn.Linear(mlp_dim, num_heads, bias=False)
        )

    @classmethod
    def for_model(cls, dim: int, num_heads: int, **kwargs: Any) -> SwinV2ContinuousBias:
        return cls(num_heads, **kwargs)

    @property
    def reference(self) -> tuple[int, int]:
        """The window the offsets are normalised by."""
        return self.pretrained_window if self.pretrained_window[0] > 0 else self.window

    def offset_table(self, lo: tuple[int, int], hi: tuple[int, int], dtype: torch.dtype) -> Tensor:
        """``16 · sigmoid(MLP(...))`` at every offset of ``[lo, hi]`` on each axis:
        ``(h, Ry · Rx)``, row-major over ``(Δy, Δx)``."""
        device = self.continuous_position_bias_mlp[0].weight.device
        dy = torch.arange(lo[0], hi[0] + 1, device=device)
        dx = torch.arange(lo[1], hi[1] + 1, device=device)
        offsets = torch.stack(torch.meshgrid(dy, dx, indexing="ij"), dim=-1).reshape(-1, 2)
        weight_dtype = self.continuous_position_bias_mlp[0].weight.dtype
        coords = log_spaced_offsets(offsets, self.reference).to(weight_dtype)  # (R, 2)
        values = self.continuous_position_bias_mlp(coords).to(dtype)  # (R, h)
        return (16 * torch.sigmoid(values)).t()

    def _span(self, q_pos: Tensor, k_pos: Tensor) -> tuple[tuple[int, int], tuple[int, int], bool]:
        """The smallest and largest offset on each axis over the pairs of one batch row, and
        whether some offset may lie outside: read where the host reads the coordinates'
        values; elsewhere the window's, ``-(W - 1) .. W - 1`` (on the meta device, where there
        are no values, ``(0, 0)``)."""
        if q_pos.device.type == "meta":
            return (0, 0), (0, 0), False
        if not (reads_values(q_pos) and reads_values(k_pos)):
            (wy, wx) = self.window
            return (1 - wy, 1 - wx), (wy - 1, wx - 1), True
        lows = q_pos.amin(-2) - k_pos.amax(-2)  # (..., 2)
        highs = q_pos.amax(-2) - k_pos.amin(-2)
        lo = lows.reshape(-1, 2).amin(0).tolist()
        hi = highs.reshape(-1, 2).amax(0).tolist()
        return (lo[0], lo[1]), (hi[0], hi[1]), False

    def bias(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> Tensor:
        """``(h, nq, nk)`` for ``(n, 2)`` coordinates, ``(b, h, nq, nk)`` for batched ones."""
        q_pos, k_pos = self._pair_check(q_positions, k_positions)
        check_bias_bytes(q_pos[..., 0], k_pos[..., 0], self.num_heads + 4, q)
        dtype = torch.float32 if q is None else compute_dtype(q.dtype)
        if not (q_pos.numel() and k_pos.numel()):
            shape = (*torch.broadcast_shapes(q_pos.shape[:-2], k_pos.shape[:-2]), self.num_heads)
            return torch.zeros(*shape, q_pos.shape[-2], k_pos.shape[-2], dtype=dtype)
        lo, hi, past = self._span(q_pos, k_pos)
        table = self.offset_table(lo, hi, dtype)  # (h, R)
        delta = q_pos.unsqueeze(-2) - k_pos.unsqueeze(-3)  # (..., nq, nk, 2)
        dy, dx = delta[..., 0], delta[..., 1]
        if not past:
            index = (dy - lo[0]) * (hi[1] - lo[1] + 1) + (dx - lo[1])
            return table[:, index].movedim(0, -3)  # (..., h, nq, nk)
        inside = (dy.abs() <= hi[0]) & (dx.abs() <= hi[1])  # (the window's span)
        dy, dx = dy.clamp(lo[0], hi[0]), dx.clamp(lo[1], hi[1])
        index = (dy - lo[0]) * (hi[1] - lo[1] + 1) + (dx - lo[1])
        values = torch.where(inside, table[:, index], float("nan"))
        return values.movedim(0, -3)  # (..., h, nq, nk)

    def score_mod(
        self,
        q_positions: Tensor,
        k_positions: Tensor,
        *,
        q: Tensor | None = None,
        k: Tensor | None = None,
    ) -> ScoreMod | None:
        """The MLP's table over the offsets that occur (the window's where the coordinates
        are not read: see the class), read once per score in the kernel."""
        q_pos, k_pos = self._pair_check(q_positions, k_positions)
        if not (q_pos.numel() and k_pos.numel()):
            return None
        dtype = torch.float32 if q is None else compute_dtype(q.dtype)
        lo, hi, past = self._span(q_pos, k_pos)
        table = self.offset_table(lo, hi, dtype)  # (h, R)
        width = hi[1] - lo[1] + 1
        at_q, at_k = _coordinate_reader(q_pos), _coordinate_reader(k_pos)

        def swinv2_cpb(
            score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor
        ) -> Tensor:
            qy, qx = at_q(b, q_idx)
            ky, kx = at_k(b, kv_idx)
            dy, dx = qy - ky, qx - kx
            if not past:
                return score + table[h, (dy - lo[0]) * width + (dx - lo[1])].to(score.dtype)
            inside = (dy.abs() <= hi[0]) & (dx.abs() <= hi[1])  # (the window's span)
            index = (dy.clamp(lo[0], hi[0]) - lo[0]) * width + (dx.clamp(lo[1], hi[1]) - lo[1])
            value = torch.where(inside, table[h, index], float("nan"))
            return score + value.to(score.dtype)

        return swinv2_cpb

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, window={self.window}, "
            f"pretrained_window={self.pretrained_window}, mlp_dim={self.mlp_dim}"
        )


def _coordinate_reader(coords: Tensor) -> Any:
    """``at(b, idx) -> (y, x)`` reading coordinates ``(n, 2)`` or ``(b, n, 2)`` in a score_mod."""
    if coords.dim() == 3 and coords.shape[0] == 1:
        coords = coords[0]
    ys, xs = coords[..., 0].contiguous(), coords[..., 1].contiguous()
    if coords.dim() == 2:
        return lambda b, idx: (ys[idx], xs[idx])
    return lambda b, idx: (ys[b, idx], xs[b, idx])
