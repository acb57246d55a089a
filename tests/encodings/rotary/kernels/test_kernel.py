""":func:`~posenc.encodings.rotary.kernels.kernel.overlap` against every address of both tensors
written out, on random strided views of one buffer and on the views attention slices."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from posenc.encodings.rotary.kernels.kernel import overlap


def _addresses(t: torch.Tensor) -> set[int]:
    """The byte address of every element of ``t`` (the brute force the test trusts)."""
    return {
        t.data_ptr() + t.element_size() * sum(i * s for i, s in zip(index, t.stride(), strict=True))
        for index in itertools.product(*map(range, t.shape))
    }


def test_overlap_is_the_brute_force_on_random_views() -> None:
    rng = random.Random(0)
    base = torch.empty(400)

    def view() -> torch.Tensor:
        dims = rng.randint(1, 4)
        sizes = [rng.randint(1, 4) for _ in range(dims)]
        strides = [rng.choice((0, 1, 2, 3, 4, 5, 7, 8, 12, 16, 20)) for _ in range(dims)]
        return base.as_strided(sizes, strides, rng.randint(0, 60))

    answers = []
    for _ in range(400):
        a, b = view(), view()
        got, case = overlap(a, b), (a.shape, a.stride(), b.shape, b.stride())
        assert got is not None, case
        assert got == bool(_addresses(a) & _addresses(b)), case
        assert overlap(b, a) == got
        answers.append(got)
    assert 50 < sum(answers) < 350  # (both answers well represented)


def test_overlap_on_the_views_attention_slices() -> None:
    buf = torch.randn(2, 3, 5, 16)
    assert overlap(buf[..., :8], buf[..., 4:12]) is True  # partly, not at the start
    assert overlap(buf[..., :8], buf[..., 8:]) is False  # interleaved byte ranges, no element
    assert overlap(buf, buf) is True and overlap(buf[:, :0], buf) is False
    assert overlap(buf, torch.randn(2, 3, 5, 16)) is False
    b, n, hq, hk, d = 2, 7, 4, 2, 8
    fused = torch.randn(b, n, (hq + 2 * hk) * d)  # q, k, v heads side by side
    q = fused[..., : hq * d].view(b, n, hq, d).transpose(1, 2)
    k = fused[..., hq * d : (hq + hk) * d].view(b, n, hk, d).transpose(1, 2)
    v = fused[..., (hq + hk) * d :].view(b, n, hk, d).transpose(1, 2)
    assert overlap(q, k) is False and overlap(k, v) is False and overlap(q, v) is False
    wide = fused[..., : (hq + 1) * d].view(b, n, hq + 1, d).transpose(1, 2)  # one head too many
    assert overlap(wide, k) is True
    assert overlap(buf.view(torch.int16)[..., :8], buf[..., 2:4]) is None  # (another item size)


@pytest.mark.parametrize("sizes", [(100, 100), (80, 80, 80)])
def test_overlap_gives_up_rather_than_search_long(sizes: tuple[int, ...]) -> None:
    """Strides that do not nest leave many ways to make up a distance: ``None`` (the callers
    refuse), after a bounded search."""
    base = torch.empty(10_000)
    a = base.as_strided(sizes, (1, 3, 11, 13)[: len(sizes)])
    b = base.as_strided(sizes, (2, 5, 7, 17)[: len(sizes)], 7)
    assert overlap(a, b) is None
