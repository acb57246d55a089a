"""``posenc bench bias encoder --device cuda``: attention with a positional bias on a GPU, and a
training step of a whole encoder against ``torch.nn.TransformerEncoder``.

``bias``: causal attention, batch 1, 16 heads of 64, bf16, n = 4,096 and 16,384, for every bias
scheme with a ``score_mod``, forward and forward+backward, time and peak extra memory:

* ``flash, no bias``: ``F.scaled_dot_product_attention(is_causal=True)``, the floor;
* ``posenc flex``: :func:`~posenc.attention.flex.flex_attention_forward` with the scheme's
``score_mod``
  and a causal block mask (forward: the ``score_mod`` made once beforehand, as every layer of
  an Encoder but the first receives it; forward+backward: made inside the call, so the
  gradients reach the scheme's parameters through its tables);
* ``sdpa, bias materialised``: :func:`~posenc.attention.sdpa.fused_attention` with the ``(h, n, n)``
  bias and the causal mask folded into its additive mask, what peers do.

Schemes without a ``score_mod`` (Transformer-XL, CoPE) and Shaw with values run through
``MultiHeadAttention`` (their bias reads each layer's ``q``/``k``; SDPA or math), at the
smaller length.

``encoder``: one training step (forward under bf16 autocast, backward, AdamW) of an 8-layer
width-512 causal encoder on 32 × 256 tokens, per scheme, against ``nn.TransformerEncoder``
of the same shape (pre-norm, ReLU, FFN 2048).

Each call is timed on the GPU between CUDA events, the device synchronised before it and
after it; compilation happens in the warm-up, never in the medians. The same code runs on
the CPU with ``perf_counter`` (the smoke test: ``tests/bench/test_attention_cuda.py``).

Dimension legend: ``b`` batch, ``h`` heads, ``n`` sequence, ``d`` head dim, ``D`` width.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .harness import Section, Table, ratio

HEADS, HEAD_DIM = 16, 64
SIZES, QUICK_SIZES = (4096, 16384), (64,)
#: The training step: width, depth, heads, FFN width, batch, tokens.
STEP = {"dim": 512, "depth": 8, "heads": 8, "ffn": 2048, "batch": 32, "n": 256}
QUICK_STEP = {"dim": 64, "depth": 2, "heads": 4, "ffn": 128, "batch": 2, "n": 32}
#: Schemes whose bias reads q/k, or adds a value term: measured through MultiHeadAttention.
UNFUSED = ("xl", "cope", "shaw-values")
MIB = 2**20


def measure(fn: Callable[[], object], device: torch.device, repeats: int) -> tuple[float, float]:
    """Median seconds of ``fn`` over ``repeats`` calls after two warm-up calls, and the peak
    memory one call adds (MiB; NaN off CUDA). On CUDA each call sits between two events with
    the device synchronised before (nothing earlier queued) and after (its kernels done)."""
    cuda = device.type == "cuda"
    for _ in range(2):
        fn()
    samples = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize(device)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end) / 1e3)
        else:
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
    peak = float("nan")
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        peak = (torch.cuda.max_memory_allocated(device) - base) / MIB
    return statistics.median(samples), peak


def _cell(fn: Callable[[], object], device: torch.device, repeats: int) -> tuple[str, str, float]:
    """``(time, memory, seconds)`` cells of one row; a failure (out of memory, a refusal by
    posenc's memory budget, a failed compilation) is written in the cell instead."""
    try:
        seconds, peak = measure(fn, device, repeats)
    except Exception as error:  # the table says what happened
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"  failed: {type(error).__name__}: {str(error)[:300]}", file=sys.stderr)
        return f"{type(error).__name__}", "-", float("nan")
    memory = "-" if peak != peak else f"{peak:,.0f} MiB"
    return f"{seconds * 1e3:.2f} ms", memory, seconds


def fused_schemes() -> list[str]:
    """The registered bias schemes on sequences with a ``score_mod`` (and no value term); the
    grid ones (Swin's, on 2-D coordinates) are left out."""
    from ..encodings.base import BiasEncoding
    from ..encodings.registry import available, entry

    names = []
    for name in available():
        cls = entry(name).cls
        if not issubclass(cls, BiasEncoding) or cls.axes != 1:
            continue
        if cls.has_score_mod:
            names.append(name)
    return names


def _scheme(name: str, device: torch.device) -> Any:
    from ..encodings.bias.relative_qk import ShawRelativeBias
    from ..encodings.registry import build_for_model

    if name == "shaw-values":
        return ShawRelativeBias(HEADS, HEAD_DIM, values=True).to(device)
    return build_for_model(name, HEADS * HEAD_DIM, HEADS).to(device)


def bias_rows(
    name: str, n: int, device: torch.device, dtype: torch.dtype, repeats: int
) -> list[list[str]]:
    """The flex and materialised-SDPA rows of one scheme at length ``n``, forward and
    forward+backward (each row: scheme, path, pass, time, memory)."""
    from ..attention.flex import flex_attention_forward, flex_block_mask
    from ..attention.sdpa import fused_attention

    torch.manual_seed(0)
    pe = _scheme(name, device)
    q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM, device=device, dtype=dtype) for _ in range(3))
    pos = torch.arange(n, device=device)
    # a scheme that reads the layer's input (FoX, Inkling) gets one
    x = torch.randn(1, n, HEADS * HEAD_DIM, device=device) if pe.needs_x else None
    reads = {} if x is None else {"x": x}
    causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    block_mask = flex_block_mask(1, n, n, causal=True, key_padding_mask=None, device=device)
    grad_out = torch.randn_like(q)
    leaves = [t.requires_grad_() for t in (q, k, v)]

    def flex_forward(mod: Any) -> Callable[[], object]:
        qd, kd, vd = q.detach(), k.detach(), v.detach()

        def run() -> object:
            with torch.no_grad():
                out = flex_attention_forward(qd, kd, vd, score_mod=mod, block_mask=block_mask)
            assert out is not None, "flex did not compile"
            return out

        return run

    def flex_backward() -> object:
        mod = pe.score_mod(pos, pos, q=q, k=k, **reads)
        out = flex_attention_forward(q, k, v, score_mod=mod, block_mask=block_mask)
        assert out is not None, "flex did not compile"
        out.backward(grad_out)
        return None

    def sdpa(backward: bool) -> Callable[[], object]:
        def run() -> object:
            with torch.set_grad_enabled(backward):
                out = fused_attention(q, k, v, causal, pe.bias(pos, pos, q=q, k=k, **reads), 0.0)
                if backward:
                    out.backward(grad_out)
            return None

        return run

    with torch.no_grad():
        mod = pe.score_mod(pos, pos, q=q.detach(), k=k.detach(), **reads)
    flex_backward_ok = device.type != "cpu"  # flex has no CPU backward
    cases = [
        ("posenc flex", "forward", flex_forward(mod)),
        ("sdpa, bias materialised", "forward", sdpa(False)),
        ("sdpa, bias materialised", "forward+backward", sdpa(True)),
    ]
    if flex_backward_ok:
        cases.insert(1, ("posenc flex", "forward+backward", flex_backward))
    rows = []
    for path, kind, fn in cases:
        time_cell, memory, _ = _cell(fn, device, repeats)
        rows.append([name, path, kind, time_cell, memory])
        for t in leaves:
            t.grad = None
    return rows


def floor_rows(n: int, device: torch.device, dtype: torch.dtype, repeats: int) -> list[list[str]]:
    """Flash attention with no bias, forward and forward+backward."""
    q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM, device=device, dtype=dtype) for _ in range(3))
    grad_out = torch.randn_like(q)

    def forward() -> object:
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def backward() -> object:
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).backward(grad_out)
        return None

    rows = []
    for kind, fn in (("forward", forward), ("forward+backward", backward)):
        time_cell, memory, _ = _cell(fn, device, repeats)
        rows.append(["-", "flash, no bias", kind, time_cell, memory])
    return rows


def unfused_rows(name: str, n: int, device: torch.device, repeats: int) -> list[list[str]]:
    """A scheme without a score_mod through MultiHeadAttention (bf16 autocast on CUDA)."""
    from ..attention.module import MultiHeadAttention

    torch.manual_seed(0)
    attn = MultiHeadAttention(HEADS * HEAD_DIM, HEADS, pe=_scheme(name, device), causal=True).to(
        device
    )
    x = torch.randn(1, n, HEADS * HEAD_DIM, device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    def forward() -> object:
        with torch.no_grad(), autocast:
            return attn(x)

    def backward() -> object:
        with autocast:
            out = attn(x)
        out.float().sum().backward()
        return None

    rows = []
    for kind, fn in (("forward", forward), ("forward+backward", backward)):
        time_cell, memory, _ = _cell(fn, device, repeats)
        rows.append([name, f"MultiHeadAttention ({attn.last_backend})", kind, time_cell, memory])
    return rows


def cuda_bias(*, quick: bool, device: str = "cuda", repeats: int = 10) -> Section:
    """The ``bias`` section on ``device``."""
    start = time.perf_counter()
    where = torch.device(device)
    dtype = torch.bfloat16 if where.type == "cuda" else torch.float32
    section = Section("bias", f"Bias attention on {_device_name(where)}")
    section.intro = [
        f"Causal, batch 1, {HEADS} heads of {HEAD_DIM}, {str(dtype).removeprefix('torch.')}; "
        "median of CUDA-event timings; memory is the peak the call adds."
    ]
    for n in QUICK_SIZES if quick else SIZES:
        rows = floor_rows(n, where, dtype, repeats)
        for name in fused_schemes():
            rows += bias_rows(name, n, where, dtype, repeats)
        if n == (QUICK_SIZES if quick else SIZES)[0]:
            for name in UNFUSED:
                rows += unfused_rows(name, n, where, repeats)
        section.tables.append(
            Table(["scheme", "path", "pass", "time", "memory"], rows, f"n = {n:,}", 3)
        )
    section.seconds = time.perf_counter() - start
    return section


def _training_step(model: nn.Module, x: Tensor, device: torch.device) -> Callable[[], object]:
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> object:
        optimiser.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = model(x)
        out.float().pow(2).mean().backward()
        optimiser.step()
        return None

    return step


class _TorchEncoder(nn.Module):
    """``nn.TransformerEncoder`` shaped like posenc's Encoder, causal."""

    def __init__(self, dim: int, depth: int, heads: int, ffn: int) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            dim, heads, ffn, 0.0, activation="relu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(
            layer, depth, norm=nn.LayerNorm(dim), enable_nested_tensor=False
        )

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=x.device, dtype=x.dtype)
        return self.encoder(x, mask=mask, is_causal=True)


def cuda_encoder(*, quick: bool, device: str = "cuda", repeats: int = 10) -> Section:
    """The ``encoder`` section on ``device``: training steps per scheme against torch's."""
    from ..encodings.bias.relative_qk import ShawRelativeBias
    from ..model.encoder import Encoder

    start = time.perf_counter()
    where = torch.device(device)
    s = QUICK_STEP if quick else STEP
    section = Section("encoder", f"Training step on {_device_name(where)}")
    section.intro = [
        f"{s['depth']} layers, width {s['dim']}, {s['heads']} heads, FFN {s['ffn']}, causal, "
        f"{s['batch']} × {s['n']} tokens, bf16 autocast, AdamW; median step time."
    ]
    torch.manual_seed(0)
    x = torch.randn(s["batch"], s["n"], s["dim"], device=where)
    model = _TorchEncoder(s["dim"], s["depth"], s["heads"], s["ffn"]).to(where)
    cell, _, reference = _cell(_training_step(model, x, where), where, repeats)
    rows = [["torch.nn.TransformerEncoder", cell, "1.00x"]]
    names = ["none", "rope", *fused_schemes(), "xl", "cope", "shaw-values"]
    for name in names:
        pe: Any = name
        if name == "shaw-values":
            pe = ShawRelativeBias(s["heads"], s["dim"] // s["heads"], values=True)
        model = Encoder(s["dim"], s["depth"], s["heads"], pe=pe, ffn_dim=s["ffn"], causal=True)
        model = model.to(where)
        cell, _, seconds = _cell(_training_step(model, x, where), where, repeats)
        rows.append([f"posenc {name}", cell, f"{ratio(reference, seconds)}x"])
    section.tables.append(Table(["model", "step", "speed vs torch"], rows))
    section.seconds = time.perf_counter() - start
    return section


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type.upper()


#: The suites ``--device cuda`` runs, by name.
CUDA_SUITES: dict[str, Callable[..., Section]] = {"bias": cuda_bias, "encoder": cuda_encoder}
