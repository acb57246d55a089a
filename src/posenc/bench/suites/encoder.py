"""The ``encoder`` suite of ``posenc bench``: a whole ``posenc.Encoder``, forward and
forward+backward, train and eval mode, against ``torch.nn.TransformerEncoder`` of the same
shape with the same encoding added; where posenc is slower, the operators that account for it
(``torch.profiler``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..harness import Case, Section, Table, ms, ratio, round_robin, spread
from .settings import Settings


def _torch_encoder(dim: int, depth: int, heads: int, ffn: int, dropout: float) -> nn.Module:
    """``nn.TransformerEncoder`` shaped like ``posenc.Encoder``: pre-norm, ReLU, a final
    LayerNorm, batch first, with posenc's sinusoidal encoding added to its input."""
    from ...encodings.absolute.sinusoidal import SinusoidalPositionalEncoding

    layer = nn.TransformerEncoderLayer(
        dim, heads, ffn, dropout, activation="relu", batch_first=True, norm_first=True
    )
    encoder = nn.TransformerEncoder(
        layer, depth, norm=nn.LayerNorm(dim), enable_nested_tensor=False
    )
    return nn.Sequential(SinusoidalPositionalEncoding(dim), encoder)


def _step(model: nn.Module, x: Tensor, backward: bool) -> Callable[[], object]:
    def forward() -> object:
        return model(x)

    def forward_backward() -> object:
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()
        return None

    return forward_backward if backward else forward


def _profile(fn: Callable[[], object], grad: bool, calls: int = 3) -> dict[str, tuple[float, int]]:
    """Self CPU time (ms) and call count per operator per call of ``fn``, averaged over
    ``calls`` profiled calls."""
    from contextlib import nullcontext

    from torch.profiler import ProfilerActivity, profile

    with nullcontext() if grad else torch.inference_mode():
        fn()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(calls):
                fn()
    return {
        e.key: (e.self_cpu_time_total / 1e3 / calls, round(e.count / calls))
        for e in prof.key_averages()
    }


def _breakdown(
    title: str, mine: Callable[[], object], peer: Callable[[], object], grad: bool, k: int = 8
) -> Table:
    """The operators whose self CPU time differs most between posenc and torch: the ``k``
    where posenc spends the most extra, then the ``k // 2`` where torch does (its fused
    kernels appear there)."""
    ours, theirs = _profile(mine, grad), _profile(peer, grad)
    keys = sorted(
        set(ours) | set(theirs),
        key=lambda key: ours.get(key, (0.0, 0))[0] - theirs.get(key, (0.0, 0))[0],
        reverse=True,
    )
    table = Table(
        ["operator", "posenc self ms", "posenc calls", "torch self ms", "torch calls",
         "difference ms"],
        caption=f"Where the time goes, {title} (posenc slower by more than 5%): self CPU time "
        "per operator and call, averaged over 3 profiled calls of each (`torch.profiler`), "
        "posenc's largest excess "
        "first, torch's last. "
        f"Totals: posenc {sum(v[0] for v in ours.values()):.1f} ms, torch "
        f"{sum(v[0] for v in theirs.values()):.1f} ms.",
    )  # fmt: skip
    shown = keys[:k] + [key for key in keys[-(k // 2) :] if key not in keys[:k]]
    for key in shown:
        (a, na), (b, nb) = ours.get(key, (0.0, 0)), theirs.get(key, (0.0, 0))
        table.rows.append([f"`{key}`", f"{a:.2f}", str(na), f"{b:.2f}", str(nb), f"{a - b:+.2f}"])
    return table


def suite_encoder(s: Settings) -> Section:
    from ...model.encoder import Encoder

    dim, depth, heads, ffn, batch, n = s.encoder
    dropout = 0.1
    section = Section("encoder", "A whole encoder: posenc.Encoder vs torch.nn.TransformerEncoder")
    section.intro = [
        f"Width {dim}, depth {depth}, {heads} heads, feed-forward {ffn}, dropout {dropout}, "
        f"input ({batch}, {n}, {dim}) fp32 ({batch * n} tokens). Both are pre-norm with ReLU "
        "and a final LayerNorm; both add the same sinusoidal encoding (posenc's, "
        '`pe="sinusoidal"`) to their input; torch\'s is `nn.TransformerEncoder` '
        "(`batch_first=True, norm_first=True, enable_nested_tensor=False`). Modes: `eval` "
        "(no dropout; its forward runs under `torch.inference_mode`, where torch takes its "
        "fused fast path) and `train` (dropout on). `forward+backward` is "
        "`zero_grad; model(x).sum().backward()`. Tokens/s = batch × n / median. "
        f"Medians over {s.encoder_repeats} timed calls per case, posenc and torch "
        f"alternating, after {s.warmup} warm-up call(s) of each.",
    ]
    torch.manual_seed(0)
    ours = Encoder(dim, depth, heads, pe="sinusoidal", ffn_dim=ffn, dropout=dropout)
    theirs = _torch_encoder(dim, depth, heads, ffn, dropout)
    x = torch.randn(batch, n, dim)
    table = Table(
        ["mode", "pass", "implementation", "median ms", "range ms", "tokens/s",
         "posenc speed-up"],
        text_columns=3,
    )  # fmt: skip
    slower: list[tuple[str, str, Callable[[], object], Callable[[], object], bool]] = []
    for mode in ("eval", "train"):
        ours.train(mode == "train")
        theirs.train(mode == "train")
        for backward in (False, True):
            grad = backward or mode == "train"
            cases = [
                Case("posenc Encoder", _step(ours, x, backward)),
                Case("torch TransformerEncoder", _step(theirs, x, backward)),
            ]
            mine, peer = round_robin(cases, warmup=s.warmup, repeats=s.encoder_repeats, grad=grad)
            label = "forward+backward" if backward else "forward"
            for case, t in zip(cases, (mine, peer), strict=True):
                table.rows.append(
                    [mode, label, case.name, ms(t.median), spread(t),
                     f"{batch * n / t.median:,.0f}",
                     ratio(peer.median, mine.median) if t is mine else "-"]
                )  # fmt: skip
            if mine.median > 1.05 * peer.median:
                slower.append((mode, label, cases[0].fn, cases[1].fn, grad))
    section.tables.append(table)
    section.notes.append(
        "`posenc speed-up` is torch's median over posenc's (above 1: posenc is faster)."
    )
    for mode, label, mine_fn, peer_fn, grad in slower:
        ours.train(mode == "train")
        theirs.train(mode == "train")
        section.tables.append(_breakdown(f"{mode} {label}", mine_fn, peer_fn, grad))
    return section
