"""The backend choice as a decision table: :func:`posenc.attention.backends.choose_backend` is a
pure
function of a :class:`~posenc.attention.backends.Request`, so every row below is one call and its
answer, a block per device kind; and :class:`~posenc.MultiHeadAttention` hands it the request
its call describes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

import posenc
from posenc.attention import backends
from posenc.attention.backends import FLEX_AUTO_MIN_ELEMENTS, Backend, Request, choose_backend

AUTO, FLEX, SDPA, MATH = Backend.AUTO, Backend.FLEX, Backend.SDPA, Backend.MATH
#: 16 heads at n = 1024 reach the CPU's threshold; n = 256 does not.
BIG, SMALL = 1024, 256
assert 16 * BIG * BIG >= FLEX_AUTO_MIN_ELEMENTS > 16 * SMALL * SMALL


def _request(device: str, n: int = SMALL, **fields: Any) -> Request:
    base = Request(requested=AUTO, device=device, dtype=torch.float32, heads=16, nq=n, nk=n)
    return replace(base, **fields)


#: (device, length, request fields, backend, flex only for a fused score_mod)
TABLE: list[tuple[str, int, dict[str, Any], Backend, bool]] = [
    # ---- any device: what only one backend can do
    ("cpu", SMALL, {"need_weights": True, "bias": "score_mod"}, MATH, False),
    ("cuda", BIG, {"need_weights": True, "requested": FLEX}, MATH, False),
    ("cuda", BIG, {"bias": "value"}, MATH, False),  # Shaw with values
    ("cpu", SMALL, {"requested": MATH, "bias": "score_mod"}, MATH, False),
    ("cuda", BIG, {"requested": SDPA, "bias": "score_mod"}, SDPA, False),
    # ---- CPU: flex is compiled (tens of seconds) and has no backward
    ("cpu", SMALL, {}, SDPA, False),
    ("cpu", SMALL, {"bias": "score_mod"}, SDPA, False),  # under the threshold
    ("cpu", BIG, {"bias": "score_mod"}, FLEX, True),
    ("cpu", BIG, {"bias": "score_mod", "dtype": torch.bfloat16, "mask": "causal"}, FLEX, True),
    ("cpu", BIG, {"bias": "score_mod", "grad": True}, SDPA, False),  # no CPU backward
    ("cpu", BIG, {"bias": "score_mod", "dropout": True}, SDPA, False),
    ("cpu", BIG, {"bias": "score_mod", "nq": 1}, SDPA, False),  # a cached decoding step
    ("cpu", BIG, {"bias": "score_mod", "compile_flex": False}, SDPA, False),
    ("cpu", BIG, {"bias": "score_mod", "flex_available": False}, SDPA, False),
    ("cpu", BIG, {"bias": "materialised"}, SDPA, False),  # XL, CoPE: nothing to fuse
    ("cpu", BIG, {"mask": "packed"}, FLEX, False),  # documents: the block mask skips
    ("cpu", SMALL, {"mask": "packed"}, SDPA, False),
    ("cpu", BIG, {"mask": "padding"}, SDPA, False),
    ("cpu", SMALL, {"requested": FLEX}, FLEX, False),
    ("cpu", SMALL, {"requested": FLEX, "grad": True}, SDPA, False),
    ("cpu", SMALL, {"requested": FLEX, "dropout": True}, SDPA, False),
    ("cpu", SMALL, {"requested": FLEX, "nq": 1}, SDPA, False),
    ("cpu", SMALL, {"requested": FLEX, "nq": 1, "compile_flex": False}, FLEX, False),
    ("cpu", SMALL, {"requested": SDPA, "bias": "materialised"}, SDPA, False),
    # ---- GPU: compiling costs seconds once per scheme; flex's backward is compiled too
    ("cuda", SMALL, {}, SDPA, False),  # flash attention
    ("cuda", SMALL, {"mask": "causal"}, SDPA, False),
    ("cuda", SMALL, {"mask": "padding"}, SDPA, False),
    ("cuda", SMALL, {"bias": "score_mod"}, FLEX, True),  # no threshold
    ("cuda", BIG, {"bias": "score_mod", "dtype": torch.bfloat16}, FLEX, True),
    ("cuda", BIG, {"bias": "score_mod", "grad": True}, FLEX, True),  # trains through flex
    ("cuda", BIG, {"bias": "score_mod", "dropout": True}, SDPA, False),
    ("cuda", BIG, {"bias": "score_mod", "nq": 1}, SDPA, False),
    ("cuda", BIG, {"bias": "score_mod", "compile_flex": False}, SDPA, False),
    ("cuda", BIG, {"bias": "materialised", "grad": True}, SDPA, False),
    ("cuda", SMALL, {"mask": "packed", "grad": True}, FLEX, False),
    ("cuda", SMALL, {"requested": FLEX, "grad": True}, FLEX, False),
    ("cuda", SMALL, {"requested": FLEX, "dropout": True}, SDPA, False),
    # other accelerators follow the GPU rows
    ("mps", SMALL, {"bias": "score_mod", "grad": True}, FLEX, True),
    # ---- soft-capping: SDPA cannot cap, so math stands wherever SDPA would
    ("cpu", SMALL, {"softcap": True}, MATH, False),  # under the threshold
    ("cpu", BIG, {"softcap": True}, FLEX, False),  # a score_mod of its own
    ("cpu", BIG, {"softcap": True, "bias": "score_mod"}, FLEX, True),
    ("cpu", BIG, {"softcap": True, "bias": "materialised"}, MATH, False),
    ("cpu", BIG, {"softcap": True, "grad": True}, MATH, False),  # no CPU flex backward
    ("cpu", BIG, {"softcap": True, "compile_flex": False}, MATH, False),
    ("cpu", SMALL, {"softcap": True, "requested": SDPA}, MATH, False),
    ("cpu", SMALL, {"softcap": True, "requested": FLEX}, FLEX, False),
    ("cpu", SMALL, {"softcap": True, "requested": FLEX, "grad": True}, MATH, False),
    ("cuda", SMALL, {"softcap": True}, FLEX, False),
    ("cuda", SMALL, {"softcap": True, "grad": True, "dtype": torch.bfloat16}, FLEX, False),
    ("cuda", SMALL, {"softcap": True, "dropout": True}, MATH, False),
    ("cuda", BIG, {"softcap": True, "nq": 1}, MATH, False),  # a cached decoding step
    ("cuda", SMALL, {"softcap": True, "flex_available": False}, MATH, False),
    ("cuda", SMALL, {"softcap": True, "need_weights": True}, MATH, False),
    # ---- sinks: every backend runs them; with a mask SDPA would materialise (h, nq, nk+1)
    ("cpu", SMALL, {"sinks": True, "mask": "causal"}, SDPA, False),
    ("cpu", BIG, {"sinks": True, "mask": "causal"}, FLEX, False),
    ("cpu", BIG, {"sinks": True}, SDPA, False),  # no mask: a (1, h, 1, nk+1) additive mask
    ("cpu", BIG, {"sinks": True, "mask": "causal", "grad": True}, SDPA, False),
    ("cpu", SMALL, {"sinks": True, "requested": SDPA, "mask": "padding"}, SDPA, False),
    ("cuda", SMALL, {"sinks": True, "mask": "causal"}, FLEX, False),
    ("cuda", SMALL, {"sinks": True}, SDPA, False),
    ("cuda", SMALL, {"sinks": True, "mask": "padding", "dropout": True}, SDPA, False),
    ("cuda", SMALL, {"sinks": True, "need_weights": True}, MATH, False),
]


@pytest.mark.parametrize(("device", "n", "fields", "backend", "fused_only"), TABLE)
def test_decision_table(
    device: str, n: int, fields: dict[str, Any], backend: Backend, fused_only: bool
) -> None:
    assert choose_backend(_request(device, n, **fields)) == (backend, fused_only)


def test_the_table_reaches_every_backend_and_every_field() -> None:
    answers = {row[3] for row in TABLE}
    assert answers == {FLEX, SDPA, MATH}
    named = {key for row in TABLE for key in row[2]}
    fields = set(Request.__dataclass_fields__) - {"device", "heads", "nk"}
    assert fields <= named | {"nq"}, f"fields the table never varies: {fields - named}"


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("alibi", "score_mod"),
        ("fire", "score_mod"),
        ("xl", "materialised"),
        ("cope", "materialised"),
    ],
)
def test_bias_kind_is_the_scheme_s_fused_form(name: str, kind: str) -> None:
    state = posenc.build_for_model(name, 16, 4).position_state(None, torch.zeros(1, 5, 16))
    assert Request.kind_of(state) == kind
    shaw = posenc.ShawRelativeBias(4, 4, values=True).position_state(None, torch.zeros(1, 5, 16))
    assert Request.kind_of(shaw) == "value" and Request.kind_of(None) == "none"


def test_attention_hands_the_chooser_its_call(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Request] = []

    def spy(request: Request) -> tuple[Backend, bool]:
        seen.append(request)
        return choose_backend(request)

    monkeypatch.setattr(posenc.attention.module, "choose_backend", spy)
    attn = posenc.MultiHeadAttention(16, 4, pe=posenc.ALiBi(4), causal=True, dropout=0.1)
    x = torch.randn(2, 6, 16)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[1, 4:] = True
    attn(x, key_padding_mask=padding)  # training, autograd on
    with torch.no_grad():
        attn.eval()(x)
    train, evaluate = seen
    assert train == Request(
        requested=AUTO, device="cpu", dtype=torch.float32, heads=4, nq=6, nk=6,
        bias="score_mod", mask="padding", grad=True, dropout=True,
    )  # fmt: skip
    assert evaluate == replace(train, mask="causal", grad=False, dropout=False)
    assert attn.last_backend == "sdpa"


def test_flex_that_cannot_run_falls_back_to_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fused-only flex whose score_mod is None (T5 at fractional positions cannot be
    asked; a scheme may decline) runs SDPA and says so."""
    monkeypatch.setattr(backends, "FLEX_AUTO_MIN_ELEMENTS", 1)
    attn = posenc.MultiHeadAttention(16, 4, pe=posenc.build_for_model("kerple", 16, 4)).eval()
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        out = attn(x, positions=torch.arange(5) * 0.5)  # KERPLE's table needs integers
    assert attn.last_backend == "sdpa" and torch.isfinite(out).all()
