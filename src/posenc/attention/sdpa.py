"""The two softmax kernels that :class:`~posenc.MultiHeadAttention` runs besides flex
attention: the teaching version written out step by step (backend ``math``, and wherever the
weights are needed), and PyTorch's fused ``scaled_dot_product_attention`` with posenc's boolean
mask and logit bias folded into one additive mask (backend ``sdpa``).

Both take keys and values with fewer heads than the queries (grouped-query attention: ``g``
key/value heads, each serving ``G = h / g`` query heads) without copying them: the query
groups are folded into the query axis, ``(b, h, nq, d) -> (b, g, G·nq, d)``, for the products,
or SDPA's ``enable_gqa`` serves them where its kernel does so itself.

Dimension legend: ``b`` batch, ``h`` heads, ``g`` key/value heads, ``G = h / g``,
``nq``/``nk`` queries and keys, ``d`` head dim.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..encodings.checks import check_probability, compute_dtype
from ..errors import PosencTypeError, PosencValueError, check_bytes
from .groups import fold_groups, groups_of, unfold_groups

__all__ = [
    "autocast_off",
    "folds_groups",
    "fused_attention",
    "kernel_dtype",
    "scaled_dot_product_attention",
]


def kernel_dtype(t: Tensor) -> torch.dtype:
    """The dtype the attention kernels take ``q``, ``k`` and ``v`` in.

    On a GPU (any device but the CPU) the inputs' own: bf16/fp16 products run on tensor cores
    and the kernels keep the scores, the bias and the softmax statistics in fp32 themselves
    (flash attention and flex do; posenc's ``math`` backend upcasts the ``(nq, nk)`` scores,
    never ``q``, ``k`` or ``v``). On the CPU the compute dtype (fp32 for half types): its
    half-precision kernels are no faster and round more, so posenc keeps the exact path there.
    """
    return t.dtype if t.device.type != "cpu" else compute_dtype(t.dtype)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    bias: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``softmax(q kᵀ / sqrt(d) + bias) v``, returning the output and the weights.

    The teaching version of attention (Vaswani et al. 2017, eq. 1), written out step by step.

    Args:
        q: ``(..., nq, d)``; k: ``(..., nk, d)``; v: ``(..., nk, dv)``. With a head axis,
            ``q`` ``(..., h, nq, d)`` and ``k``, ``v`` ``(..., g, nk, ·)`` for any ``g``
            dividing ``h`` (grouped heads: query head ``i`` reads key/value head
            ``i // (h / g)``), never copied.
        mask: broadcastable to ``(..., nq, nk)``; nonzero/True where attending is allowed.
            Masked logits become the dtype's most negative finite value (not ``-1e9``, which
            overflows in float16), so a fully masked row gives uniform weights, never NaN.
        bias: added to the logits, broadcastable to ``(..., nq, nk)``.
        dropout_p: dropout on the weights.
        scale: the logits are ``scale · q kᵀ`` (``None``: ``1 / sqrt(d)``).
        softcap: ``c``: the logits (scaled, bias added) become ``c · tanh(logits / c)``
            before the mask (Gemma 2's ``attn_logit_softcapping``).
        sinks: ``(h,)`` learned attention sinks (gpt-oss), for ``q`` of shape
            ``(..., h, nq, d)``: each row's softmax runs over its logits and its head's sink
            logit, whose column is then dropped, so a row's weights sum to less than 1 (a
            fully masked row gives zero weights, not uniform ones).

    Scores, bias, softmax and the weights are float32 for half-precision inputs, and the
    output is cast back once; the two products take :func:`kernel_dtype` (the inputs' own
    on a GPU, float32 on the CPU). Autocast is switched off here (it would run ``q kᵀ`` in the
    low precision on the CPU too, and round the softmax).

    Returns:
        ``(output (..., nq, dv), weights (..., nq, nk))``.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.dim() < 2:
            raise PosencTypeError(
                f"{name} must be a floating-point tensor (..., n, d), got {t!r:.80}"
            )
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise PosencValueError(
            f"q (..., nq, d), k (..., nk, d) and v (..., nk, dv) disagree: q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    dropout_p = check_probability("dropout_p", dropout_p)
    groups = groups_of(q, k, v)
    if sinks is not None and (q.dim() < 3 or tuple(sinks.shape) != (q.shape[-3],)):
        raise PosencValueError(
            f"sinks must have one entry per head of q (..., h, nq, d): q {tuple(q.shape)}, "
            f"sinks {tuple(sinks.shape)}"
        )
    out_dtype = q.dtype
    work = compute_dtype(q.dtype)
    if not torch.compiler.is_compiling():  # symbolic sizes there
        heads = q.shape[:-2] if groups > 1 else k.shape[:-2]
        lead = math.prod(torch.broadcast_shapes(q.shape[:-2], heads))
        nq, nk = q.shape[-2], k.shape[-2]
        check_bytes(
            "q x k",
            f"{nq} x {nk} queries by keys (times {lead})",
            3 * lead * nq * nk * work.itemsize,  # scores, masked scores, weights
            device=q.device,
        )
    with autocast_off(q.device):
        products = kernel_dtype(q)
        q, k, v = q.to(products), k.to(products), v.to(products)
        if groups == 1:
            scores = (q @ k.transpose(-2, -1)).to(work)  # (..., nq, nk)
        else:  # (..., g, G·nq, d) @ (..., g, d, nk): the keys read in place
            scores = unfold_groups(fold_groups(q, groups) @ k.transpose(-2, -1), groups)
            scores = scores.to(work)  # (..., h, nq, nk)
        scores = scores / math.sqrt(q.shape[-1]) if scale is None else scores * scale
        if bias is not None:
            scores = scores + bias.to(work)
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        if mask is not None:
            scores = scores.masked_fill(~mask.bool(), torch.finfo(scores.dtype).min)
        if sinks is None:
            weights = scores.softmax(dim=-1)
        else:  # one more column per row, the head's sink logit, dropped after the softmax
            sink = sinks.to(work).view(-1, 1, 1).expand(*scores.shape[:-1], 1)  # (..., h, nq, 1)
            weights = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        if groups == 1:
            out = weights.to(products) @ v  # (..., nq, dv)
        else:  # (..., g, G·nq, nk) @ (..., g, nk, dv): the values read in place
            out = unfold_groups(fold_groups(weights.to(products), groups) @ v, groups)
        return out.to(out_dtype), weights.to(out_dtype)


def autocast_off(device: torch.device) -> contextlib.AbstractContextManager:
    """A context in which autocast is off on ``device``'s type (nothing where that type has
    no autocast, e.g. ``meta``): arithmetic meant for float32 stays in float32."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    bias: Tensor | None,
    p: float,
    *,
    plain_causal: bool = False,
    keep: Callable[[Callable[[], Tensor]], Tensor] | None = None,
    scale: float | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """:func:`torch.nn.functional.scaled_dot_product_attention` with posenc's mask and bias.
    ``plain_causal`` says ``mask`` is the square causal mask and nothing else (no padding, no
    documents, as many queries as keys): SDPA's ``is_causal`` then stands for it. Other masks
    and biases become one additive float mask whose masked entries are the most negative
    finite value, so a fully padded row cannot produce NaN; ``keep`` (a memo of the forward)
    makes it once for every layer. ``scale`` is SDPA's (``None``: ``1 / sqrt(d)``).

    ``sinks`` ``(h,)`` (learned attention sinks) run in the same kernel as one more key per
    head: a zero key and a zero value appended, whose additive-mask column is the head's sink
    logit (``q · 0 · scale + sink``), so the softmax runs over the row's logits and the sink,
    and the sink's weight multiplies a zero value. This is exact and differentiable in
    ``sinks`` (SDPA returns the mask's gradient); the additive mask is then always made
    (``(b|1, h, nq|1, nk + 1)``), per layer (each layer has its own sinks), never kept.

    ``q``, ``k`` and ``v`` enter the kernel in :func:`kernel_dtype`: on a GPU bf16/fp16 stay
    bf16/fp16 and the additive mask is rounded to that dtype (SDPA takes its float mask in
    the query's dtype; the bias is formed in fp32 and rounded once, its only loss), on the
    CPU they are computed in fp32.

    Grouped heads (``k``, ``v`` with ``g`` heads dividing ``q``'s ``h``) are never copied:
    SDPA's ``enable_gqa`` serves them where no additive mask is needed, and on the CPU with
    one (its fused kernel takes both); elsewhere (:func:`folds_groups`: on CUDA, SDPA with
    ``enable_gqa`` and a mask runs its math kernel, which repeats the keys and values) the
    query groups are folded into the query axis, ``(b, g, G·nq, d)``, and the additive mask
    with them (a mask of ``G · nq`` rows, made once per forward as the mask is)."""
    groups = groups_of(q, k, v)
    gqa = {"enable_gqa": True} if groups > 1 else {}
    if sinks is None and bias is None and mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, scale=scale, **gqa)
    if sinks is None and bias is None and plain_causal:
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=p, is_causal=True, scale=scale, **gqa
        )
    work = kernel_dtype(q)
    fold = groups > 1 and folds_groups(q.device)

    def additive_mask() -> Tensor:  # (b|1, h|1, nq|1, nk), or (b|1, h, nq|1, nk + 1) with sinks
        b, h, nq, _ = q.shape
        nk = k.shape[-2]
        if not torch.compiler.is_compiling():  # symbolic sizes there
            check_bytes(
                "q x k",
                f"{nq} x {nk} queries by keys (batch {b}, {h} heads)",
                2 * b * h * nq * (nk + 1) * work.itemsize,  # the bias and the masked bias
                device=q.device,
            )
        exact = compute_dtype(work)  # bias and mask combined in fp32, rounded once
        zero = torch.zeros((), dtype=exact, device=q.device)
        additive = zero if bias is None else bias.to(exact)
        if mask is not None:
            # (filled on the device: torch.tensor would copy from the host, a sync on CUDA)
            blocked = torch.full((), torch.finfo(work).min, dtype=exact, device=q.device)
            additive = torch.where(mask, additive, blocked)
        # 4-D: with a 3-D mask SDPA leaves its fused CPU kernel for the math one, which
        # materialises the scores
        additive = additive.view((1,) * (4 - additive.dim()) + tuple(additive.shape))
        if sinks is not None:  # the sink column: (B, h, Q, 1) beside (B, h, Q, nk)
            rows, _, queries, _ = additive.shape
            column = sinks.to(exact).view(1, h, 1, 1).expand(rows, h, queries, 1)
            additive = torch.cat([additive.expand(rows, h, queries, nk), column], dim=-1)
        if fold:  # (B, h, nq, ·) -> (B, g, G·nq, ·), the rows of the folded queries
            additive = additive.expand(additive.shape[0], h, nq, additive.shape[-1])
            additive = fold_groups(additive, groups)
        return additive.to(work)

    additive = additive_mask() if keep is None or sinks is not None else keep(additive_mask)
    if sinks is not None:  # the sink's key and value: zeros, (b, g, 1, d)
        k = torch.cat([k, k.new_zeros(*k.shape[:-2], 1, k.shape[-1])], dim=-2)
        v = torch.cat([v, v.new_zeros(*v.shape[:-2], 1, v.shape[-1])], dim=-2)
    # autocast off: it would round the float32 mask to half precision, where its most negative
    # value becomes -inf and a fully masked row zeros instead of uniform weights
    out_dtype, queries = q.dtype, q
    if fold:  # (b, h, nq, d) -> (b, g, G·nq, d): the keys and values read as they are
        queries, gqa = fold_groups(q, groups), {}
    with autocast_off(q.device):
        out = F.scaled_dot_product_attention(
            queries.to(work), k.to(work), v.to(work), attn_mask=additive, dropout_p=p,
            scale=scale, **gqa,
        )  # fmt: skip
    out = out.to(out_dtype)
    return unfold_groups(out, groups) if fold else out  # (b, h, nq, d)


def folds_groups(device: torch.device) -> bool:
    """Whether :func:`fused_attention` folds the query groups into the query axis when it
    needs an additive mask (rather than SDPA's ``enable_gqa``): everywhere but the CPU, whose
    fused kernel takes grouped heads and a mask together (CUDA's do not: its math kernel
    would run, repeating the keys and values)."""
    return device.type != "cpu"
