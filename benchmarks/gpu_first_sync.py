"""Section 7 of ``gpu_first.py``: host synchronisations on the paths that must have none (a
cached decoding step, a flex call with a causal mask, a training step), each run once in CUDA's
sync debug mode ``"error"`` after a warm-up, and which SDPA kernel takes grouped heads with and
without a mask. Imported by ``gpu_first.py`` (run as a script, so this folder is on the path).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import posenc

Fn = Callable[[], object]


def say(text: str = "") -> None:
    print(text, flush=True)


def sync_paths(left: Callable[[], bool], tiny: bool, device: torch.device) -> None:
    """Each path once in CUDA's sync debug mode "error" (a host synchronisation raises), after
    a warm-up outside it (compilation, allocation, table growth); on another device each path
    runs once without the check (the dry run)."""
    dim, heads, n = (32, 2, 16) if tiny else (1024, 16, 1024)
    say("| path | host synchronisation |")
    say("| --- | --- |")
    for name, make in _sync_paths(dim, heads, n, device).items():
        if not left():
            say(f"| {name} | skipped (budget) |")
            continue
        try:
            step = make()
            step()  # the warm-up
            if device.type != "cuda":
                step()
                say(f"| {name} | n/a (no CUDA: ran without the sync check) |")
                continue
            torch.cuda.synchronize(device)
            torch.cuda.set_sync_debug_mode("error")
            try:
                step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize(device)
            say(f"| {name} | pass: none |")
        except Exception as error:
            message = str(error).splitlines()[0][:150] if str(error) else ""
            say(f"| {name} | FAIL: {type(error).__name__}: {message} |")


def _sync_paths(dim: int, heads: int, n: int, device: torch.device) -> dict[str, Callable[[], Fn]]:
    """Each path as a maker of its step (made outside the sync check)."""

    def decode() -> Fn:
        encoder = posenc.Encoder(dim, 2, heads, pe="rope", causal=True).to(device).eval()
        x = torch.randn(1, n + 2, dim, device=device)
        cache = posenc.KVCache()
        with torch.no_grad():
            encoder(x[:, :n], cache=cache)
        steps = iter(range(n, n + 2))

        def step() -> object:
            t = next(steps)
            with torch.no_grad():
                return encoder(x[:, t : t + 1], cache=cache)

        return step

    def flex(scheme: str) -> Callable[[], Fn]:
        def make() -> Fn:
            attn = posenc.MultiHeadAttention(dim, heads, pe=scheme, causal=True, backend="flex")
            attn = attn.to(device).eval()
            x = torch.randn(2, n, dim, device=device)

            def step() -> object:  # (a key padding mask is checked by reading it: one sync)
                with torch.no_grad():
                    return attn(x)

            return step

        return make

    def training(scheme: str) -> Callable[[], Fn]:
        def make() -> Fn:
            encoder = posenc.Encoder(dim, 2, heads, pe=scheme, causal=True).to(device)
            optimizer = torch.optim.SGD(encoder.parameters(), lr=1e-4)
            x = torch.randn(2, n, dim, device=device)

            def step() -> None:
                optimizer.zero_grad(set_to_none=True)
                encoder(x).square().mean().backward()
                optimizer.step()

            return step

        return make

    return {
        "decode step (rope, KVCache)": decode,
        "flex call with a causal mask (alibi)": flex("alibi"),
        "flex call with a causal mask (t5)": flex("t5"),
        "training step (alibi)": training("alibi"),
        "training step (t5)": training("t5"),
    }


def sdpa_kernels(tiny: bool, device: torch.device) -> None:
    """Which SDPA kernel runs grouped heads (8 query heads on 2 key/value heads, or as many),
    with and without an additive mask: each backend alone, ran or refused."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    n = 16 if tiny else 1024
    dtype = torch.float32 if tiny else torch.bfloat16
    q = torch.randn(2, 8, n, 64, device=device, dtype=dtype)
    k, v = (torch.randn(2, 2, n, 64, device=device, dtype=dtype) for _ in range(2))
    mask = torch.randn(1, 8, n, n, device=device, dtype=dtype)
    folded = q.reshape(2, 2, 4 * n, 64)
    cases = {
        "grouped, no mask (enable_gqa)": lambda: F.scaled_dot_product_attention(
            q, k, v, enable_gqa=True
        ),
        "grouped, causal (enable_gqa)": lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True
        ),
        "grouped, mask (enable_gqa)": lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=True
        ),
        "grouped, mask, query groups folded (posenc)": lambda: F.scaled_dot_product_attention(
            folded, k, v, attn_mask=mask.reshape(1, 2, 4 * n, n)
        ),
        "8 heads, mask": lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=mask),
    }
    backends = [b for b in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
                if hasattr(SDPBackend, b)]  # fmt: skip
    say(f"\nSDPA kernels, q (2, 8, {n}, 64), k and v (2, 2, {n}, 64), {str(dtype)[6:]}:")
    say("| case | " + " | ".join(backends) + " |")
    say("| --- |" + " --- |" * len(backends))
    for name, fn in cases.items():
        cells = []
        for backend in backends:
            try:
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    fn()
                cells.append("ran")
            except RuntimeError:
                cells.append("refused")
        say(f"| {name} | " + " | ".join(cells) + " |")
