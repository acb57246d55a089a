"""The rotary arithmetic never invokes a compiler (``posenc.encodings.rotary.kernels``): not
at import, not on any path a rotation takes; and ``torch.func`` transforms and dispatch modes
see every operation of the formula."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc import apply_rotary, apply_rotary_
from tests.encodings.rotary.kernels.test_rotate import DTYPES, _tables, make_x

# --------------------------------------------------------------------------- no compiler


def _every_path() -> None:
    """Every route through the rotary code: both functions, every dtype and layout, partial,
    many blocks, autograd in and out of place, learned tables, and every module with and
    without ``inplace``, positions given or not, prefill and decode."""
    for dtype in DTYPES:
        for interleaved in (False, True):
            x = make_x("fused", 2, 3, 40, 10, dtype)
            angles = torch.rand(40, 3)
            with torch.no_grad():
                apply_rotary(x, angles.cos(), angles.sin(), interleaved=interleaved)
                apply_rotary_(x, angles.cos(), angles.sin(), interleaved=interleaved)
            y = x.detach().float().requires_grad_()
            (apply_rotary_(y * 1, angles.cos(), angles.sin()).sum()).backward()
            apply_rotary(y, angles.cos().requires_grad_(), angles.sin()).sum().backward()
    modules = [
        posenc.RotaryEmbedding(8),
        posenc.RotaryEmbedding(8, interleaved=True, rotary_dim=4),
        posenc.RotaryEmbedding(8, scaling={"rope_type": "dynamic", "factor": 2.0},
                               max_position_embeddings=16),
        posenc.RotaryEmbedding(8, learned_freq=True),
        posenc.XPos(8),
        posenc.Rotary2DEmbedding(8),
        posenc.Rotary3DEmbedding(12),
    ]  # fmt: skip
    for module in modules:
        axes = getattr(module, "ndim", 0)
        for positions in (None, torch.arange(5, 10), torch.tensor([[40], [41]])):
            n = 5 if positions is None else positions.shape[-1]
            if axes:  # N-D schemes take coordinates, never the 1-D default
                positions = torch.randint(0, 9, (n, axes))
            q, k = torch.randn(2, 4, n, module.head_dim), torch.randn(2, 2, n, module.head_dim)
            module(q, k, positions)
            with torch.no_grad():
                module(q, k, positions, inplace=True)
                module.rotate(q, positions, inplace=True)


def test_no_compiler_is_invoked_on_any_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the rotary code invoked a compiler or a process")

    monkeypatch.setattr(torch, "compile", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)
    monkeypatch.setattr(subprocess, "run", forbidden)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nor any warning about a missing compiler
        _every_path()


@pytest.mark.slow
def test_no_compiler_is_invoked_at_import_or_on_any_path() -> None:
    """A fresh interpreter where torch.compile, subprocess and ctypes' loader raise: importing
    posenc and running every rotary path works."""
    script = f"""
import ctypes, subprocess, sys, torch
def forbidden(*args, **kwargs):
    raise AssertionError("compiler or process")
torch.compile = subprocess.Popen = subprocess.run = ctypes.CDLL = forbidden
sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
import posenc
from test_rotate_no_compiler import _every_path
_every_path()
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[4],  # (the repository: ``tests`` is importable)
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_transforms_and_modes_see_every_operation() -> None:
    """torch.func (vmap, grad), a dispatch mode (FlopCounterMode) and jit.trace run the
    rotation, in place and not, with the values of the eager call."""
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.randn(3, 2, 5, 8)
    cos, sin = (t.float() for t in _tables(5, 4))
    want = apply_rotary(x, cos, sin)
    with torch.no_grad():
        assert_close(torch.vmap(lambda t: apply_rotary(t, cos, sin))(x), want)
        assert_close(torch.vmap(lambda t: apply_rotary_(t.clone(), cos, sin))(x), want)
        with FlopCounterMode(display=False):
            assert_close(apply_rotary_(x.clone(), cos, sin), want)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TracerWarning; jit.trace is deprecated in torch 2.13
            traced = torch.jit.trace(lambda t: apply_rotary(t, cos, sin), (x,))
        assert_close(traced(x), want)
    grad = torch.func.grad(lambda t: apply_rotary(t, cos, sin).square().sum())(x)
    y = x.clone().requires_grad_()
    apply_rotary(y, cos, sin).square().sum().backward()
    assert_close(grad, y.grad)
