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
TILED = Backend.TILED
#: 16 heads at n = 1024 reach the CPU's threshold; n = 256 does not.
BIG, SMALL = 1024, 256
assert 16 * BIG * BIG >= FLEX_AUTO_MIN_ELEMENTS > 16 * SMALL * SMALL


def _request(device: str, n: int = SMALL, **fields: Any) -> Request:
    base = Request(requested=AUTO, device=device, dtype=torch.float32, heads=16, nq=n, nk=n)
    return replace(base, **fields)


#: A fused bias with a learned table, training.
TRAINS: dict[str, Any] = {"bias": "score_mod", "grad": True, "table_grad": True}

#: (device, length, request fields, backend)
TABLE: list[tuple[str, int, dict[str, Any], Backend]] = [
    # ---- any device: what only one backend can do
    ("cpu", SMALL, {"need_weights": True, "bias": "score_mod"}, MATH),
    ("cuda", BIG, {"need_weights": True, "requested": FLEX}, MATH),
    ("cuda", BIG, {"bias": "value"}, MATH),  # Shaw with values
    ("cpu", SMALL, {"requested": MATH, "bias": "score_mod"}, MATH),
    ("cuda", BIG, {"requested": SDPA, "bias": "score_mod"}, SDPA),
    # ---- CPU: flex is compiled (tens of seconds) and has no backward
    ("cpu", SMALL, {}, SDPA),
    ("cpu", SMALL, {"bias": "score_mod"}, SDPA),  # under the threshold
    ("cpu", BIG, {"bias": "score_mod"}, FLEX),
    ("cpu", BIG, {"bias": "score_mod", "dtype": torch.bfloat16, "mask": "causal"}, FLEX),
    ("cpu", BIG, {"bias": "score_mod", "grad": True}, SDPA),  # no CPU backward
    ("cpu", BIG, {"bias": "score_mod", "dropout": True}, SDPA),
    ("cpu", BIG, {"bias": "score_mod", "nq": 1}, SDPA),  # a cached decoding step
    ("cpu", BIG, {"bias": "score_mod", "compile_flex": False}, SDPA),
    ("cpu", BIG, {"bias": "score_mod", "flex_available": False}, SDPA),
    ("cpu", BIG, {"bias": "materialised"}, SDPA),  # XL, CoPE: nothing to fuse
    ("cpu", BIG, {"mask": "packed"}, FLEX),  # documents: the block mask skips
    ("cpu", SMALL, {"mask": "packed"}, SDPA),
    ("cpu", BIG, {"mask": "padding"}, SDPA),
    ("cpu", SMALL, {"requested": FLEX}, FLEX),
    ("cpu", SMALL, {"requested": FLEX, "grad": True}, SDPA),
    ("cpu", SMALL, {"requested": FLEX, "dropout": True}, SDPA),
    ("cpu", SMALL, {"requested": FLEX, "nq": 1}, SDPA),
    ("cpu", SMALL, {"requested": FLEX, "nq": 1, "compile_flex": False}, FLEX),
    ("cpu", SMALL, {"requested": SDPA, "bias": "materialised"}, SDPA),
    # ---- GPU: compiling costs seconds once per scheme; flex's backward is compiled too
    ("cuda", SMALL, {}, SDPA),  # flash attention
    ("cuda", SMALL, {"mask": "causal"}, SDPA),
    ("cuda", SMALL, {"mask": "padding"}, SDPA),
    ("cuda", SMALL, {"bias": "score_mod"}, FLEX),  # no threshold
    ("cuda", BIG, {"bias": "score_mod", "dtype": torch.bfloat16}, FLEX),
    ("cuda", BIG, {"bias": "score_mod", "grad": True}, FLEX),  # ALiBi trains through flex
    # a learned table (T5, KERPLE, DPB, FIRE) trains: flex's backward would add each score's
    # gradient into it atomically; the bias is materialised for SDPA, whose backward reduces
    ("cuda", BIG, TRAINS, SDPA),
    ("cuda", SMALL, TRAINS, SDPA),
    ("cuda", BIG, {**TRAINS, "dtype": torch.bfloat16, "mask": "causal"}, SDPA),
    ("cuda", BIG, {**TRAINS, "mask": "packed"}, SDPA),
    ("cuda", BIG, {**TRAINS, "softcap": True}, MATH),
    ("cuda", BIG, {**TRAINS, "requested": FLEX}, FLEX),  # asked for: honoured
    ("cuda", BIG, {**TRAINS, "grad": False, "table_grad": False}, FLEX),  # inference
    # ... and where the bias depends on the positions alone, it is made per tile of queries
    ("cuda", BIG, {**TRAINS, "tiles": True}, TILED),
    ("cuda", BIG, {**TRAINS, "tiles": True, "mask": "packed"}, TILED),
    ("cuda", BIG, {**TRAINS, "tiles": True, "softcap": True}, MATH),
    ("cuda", BIG, {**TRAINS, "tiles": True, "grad": False, "table_grad": False}, FLEX),
    ("cpu", BIG, {**TRAINS, "tiles": True}, SDPA),  # (autograd on the CPU: no flex at all)
    ("cpu", SMALL, {**TRAINS, "tiles": True, "requested": TILED}, TILED),  # asked for
    ("cpu", SMALL, {"bias": "score_mod", "tiles": True, "requested": TILED}, TILED),
    ("cpu", SMALL, {"bias": "score_mod", "requested": TILED}, SDPA),  # (q, k or x: no tiles)
    ("cuda", SMALL, {**TRAINS, "tiles": True, "requested": TILED, "softcap": True}, MATH),
    ("cuda", SMALL, {"tiles": True, "requested": TILED, "need_weights": True}, MATH),
    ("mps", SMALL, TRAINS, SDPA),
    ("cpu", BIG, TRAINS, SDPA),
    ("cuda", BIG, {"bias": "score_mod", "dropout": True}, SDPA),
    ("cuda", BIG, {"bias": "score_mod", "nq": 1}, SDPA),
    ("cuda", BIG, {"bias": "score_mod", "compile_flex": False}, SDPA),
    ("cuda", BIG, {"bias": "materialised", "grad": True}, SDPA),
    ("cuda", SMALL, {"mask": "packed", "grad": True}, FLEX),
    ("cuda", SMALL, {"requested": FLEX, "grad": True}, FLEX),
    ("cuda", SMALL, {"requested": FLEX, "dropout": True}, SDPA),
    # other accelerators follow the GPU rows
    ("mps", SMALL, {"bias": "score_mod", "grad": True}, FLEX),
    # ---- soft-capping: SDPA cannot cap, so math stands wherever SDPA would
    ("cpu", SMALL, {"softcap": True}, MATH),  # under the threshold
    ("cpu", BIG, {"softcap": True}, FLEX),  # a score_mod of its own
    ("cpu", BIG, {"softcap": True, "bias": "score_mod"}, FLEX),
    ("cpu", BIG, {"softcap": True, "bias": "materialised"}, MATH),
    ("cpu", BIG, {"softcap": True, "grad": True}, MATH),  # no CPU flex backward
    ("cpu", BIG, {"softcap": True, "compile_flex": False}, MATH),
    ("cpu", SMALL, {"softcap": True, "requested": SDPA}, MATH),
    ("cpu", SMALL, {"softcap": True, "requested": FLEX}, FLEX),
    ("cpu", SMALL, {"softcap": True, "requested": FLEX, "grad": True}, MATH),
    ("cuda", SMALL, {"softcap": True}, FLEX),
    ("cuda", SMALL, {"softcap": True, "grad": True, "dtype": torch.bfloat16}, FLEX),
    ("cuda", SMALL, {"softcap": True, "dropout": True}, MATH),
    ("cuda", BIG, {"softcap": True, "nq": 1}, MATH),  # a cached decoding step
    ("cuda", SMALL, {"softcap": True, "flex_available": False}, MATH),
    ("cuda", SMALL, {"softcap": True, "need_weights": True}, MATH),
    # ---- sinks: every backend runs them; with a mask SDPA would materialise (h, nq, nk+1)
    ("cpu", SMALL, {"sinks": True, "mask": "causal"}, SDPA),
    ("cpu", BIG, {"sinks": True, "mask": "causal"}, FLEX),
    ("cpu", BIG, {"sinks": True}, SDPA),  # no mask: a (1, h, 1, nk+1) additive mask
    ("cpu", BIG, {"sinks": True, "mask": "causal", "grad": True}, SDPA),
    ("cpu", SMALL, {"sinks": True, "requested": SDPA, "mask": "padding"}, SDPA),
    ("cuda", SMALL, {"sinks": True, "mask": "causal"}, FLEX),
    ("cuda", SMALL, {"sinks": True}, SDPA),
    ("cuda", SMALL, {"sinks": True, "mask": "padding", "dropout": True}, SDPA),
    ("cuda", SMALL, {"sinks": True, "need_weights": True}, MATH),
]


@pytest.mark.parametrize(("device", "n", "fields", "backend"), TABLE)
def test_decision_table(device: str, n: int, fields: dict[str, Any], backend: Backend) -> None:
    assert choose_backend(_request(device, n, **fields)) == backend


def test_the_table_reaches_every_backend_and_every_field() -> None:
    answers = {row[3] for row in TABLE}
    assert answers == {FLEX, SDPA, MATH, TILED}
    named = {key for row in TABLE for key in row[2]}
    fields = set(Request.__dataclass_fields__) - {"device", "heads", "nk"}
    assert fields <= named | {"nq"}, f"fields the table never varies: {fields - named}"


@pytest.mark.parametrize(
    ("name", "positions", "kind"),
    [
        ("alibi", None, "score_mod"),
        ("fire", None, "score_mod"),
        ("kerple", None, "score_mod"),
        ("kerple", torch.arange(5) * 0.5, "materialised"),  # a table by distance: no fused form
        ("kerple", torch.arange(5.0), "score_mod"),  # whole numbers in floats index it
        ("alibi", torch.arange(5) * 0.5, "score_mod"),  # computed in the kernel
        ("xl", None, "materialised"),
        ("cope", None, "materialised"),
    ],
)
def test_bias_kind_is_the_scheme_s_declaration(
    name: str, positions: torch.Tensor | None, kind: str
) -> None:
    state = posenc.build_for_model(name, 16, 4).position_state(positions, torch.zeros(1, 5, 16))
    assert Request.kind_of(state) == kind
    shaw = posenc.ShawRelativeBias(4, 4, values=True).position_state(None, torch.zeros(1, 5, 16))
    assert Request.kind_of(shaw) == "value" and Request.kind_of(None) == "none"


def test_attention_hands_the_chooser_its_call(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Request] = []

    def spy(request: Request) -> Backend:
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
        bias="score_mod", mask="padding", grad=True, dropout=True, tiles=True,
    )  # fmt: skip
    assert evaluate == replace(train, mask="causal", grad=False, dropout=False)
    assert attn.last_backend == "sdpa"


def test_a_scheme_without_a_fused_form_here_is_decided_up_front(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """KERPLE at fractional positions has no fused form (a table by distance): ``auto`` runs
    SDPA, chosen before any score_mod is made; an explicit ``flex`` reads the materialised
    bias. Its score_mod is never asked for."""
    monkeypatch.setattr(backends, "FLEX_AUTO_MIN_ELEMENTS", 1)
    pe = posenc.build_for_model("kerple", 16, 4)
    asked: list[object] = []
    real = type(pe).score_mod
    monkeypatch.setattr(type(pe), "score_mod", lambda *a, **k: asked.append(a) or real(*a, **k))
    x = torch.randn(1, 5, 16)
    positions = torch.arange(5) * 0.5
    attn = posenc.MultiHeadAttention(16, 4, pe=pe).eval()
    attn.compile_flex = False
    outs, ran = {}, {}
    for backend in (AUTO, FLEX, MATH):
        attn.backend = backend
        with torch.no_grad():
            outs[backend] = attn(x, positions=positions)
        ran[backend] = attn.last_backend
    assert ran == {AUTO: "sdpa", FLEX: "flex", MATH: "math"} and asked == []
    torch.testing.assert_close(outs[AUTO], outs[MATH], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[FLEX], outs[MATH], atol=1e-5, rtol=1e-5)


def test_a_declared_fused_form_that_is_not_there_is_a_clear_error() -> None:
    class Broken(posenc.ALiBi):
        def score_mod(self, *args: Any, **kwargs: Any) -> None:
            return None

    attn = posenc.MultiHeadAttention(16, 4, pe=Broken(4), backend="flex").eval()
    attn.compile_flex = False
    with torch.no_grad(), pytest.raises(posenc.PosencValueError, match=r"Broken\.score_mod"):
        attn(torch.randn(1, 5, 16))


def _seen_request(monkeypatch: pytest.MonkeyPatch, pe: Any, train: bool) -> Request:
    """The request a forward of attention with ``pe`` hands the chooser (on the CPU)."""
    seen: list[Request] = []
    real = choose_backend

    def spy(request: Request) -> Backend:
        seen.append(request)
        return real(request)

    monkeypatch.setattr(posenc.attention.module, "choose_backend", spy)
    attn = posenc.MultiHeadAttention(16, 4, pe=pe, causal=True)
    x = torch.randn(1, 5, 16)
    coords = None
    if pe.axes == 2:
        coords = torch.stack([torch.arange(5) // 3, torch.arange(5) % 3], dim=-1)
    with torch.set_grad_enabled(train):
        attn.train(train)(x, positions=coords)
    return seen[-1]


#: What ``auto`` runs on CUDA for each scheme: (inference, training). A learned table in a
#: fused form trains on SDPA, per tile of queries where the bias depends on the positions
#: alone, else with the bias materialised; a fixed bias (ALiBi, Sandwich) stays on flex; a
#: scheme without a fused form runs SDPA; Shaw with values the math backend.
ON_CUDA = {
    "alibi": (FLEX, FLEX),
    "sandwich": (FLEX, FLEX),
    "t5": (FLEX, TILED),
    "kerple": (FLEX, TILED),
    "dpb": (FLEX, TILED),
    "fire": (FLEX, TILED),
    "shaw": (FLEX, SDPA),  # its per-query terms carry q's gradient
    "swin-bias": (FLEX, SDPA),  # (2-D positions: not tiled)
    "swinv2-cpb": (FLEX, SDPA),
    "xl": (SDPA, SDPA),
    "cope": (SDPA, SDPA),
    "fox": (FLEX, SDPA),  # its per-token sums carry the gates' gradient
    "inkling": (FLEX, SDPA),
    "deberta": (FLEX, SDPA),  # its tiles carry q's and k's gradient
}


@pytest.mark.parametrize("name", sorted(ON_CUDA))
@pytest.mark.parametrize("requested", [AUTO, FLEX, SDPA, MATH, TILED])
@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_every_scheme_on_every_backend(
    name: str, requested: Backend, train: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chooser's answer for each registered bias scheme (its request as attention makes
    it on the CPU, then asked for CUDA) and each requested backend."""
    assert set(ON_CUDA) == set(posenc.available("bias"))
    pe = posenc.build_for_model(name, 16, 4)
    request = replace(_seen_request(monkeypatch, pe, train), requested=requested)
    assert request.table_grad is (train and ON_CUDA[name] in ((FLEX, SDPA), (FLEX, TILED)))
    assert request.tiles is (name in ("alibi", "sandwich", "t5", "kerple", "dpb", "fire"))
    cuda = choose_backend(replace(request, device="cuda"))
    cpu = choose_backend(replace(request, nq=BIG, nk=BIG, heads=16))
    if requested == AUTO:
        assert cuda == ON_CUDA[name][train]
        want = FLEX if request.bias == "score_mod" and not train else SDPA
        assert cpu == want  # (past the threshold; no CPU flex backward)
    else:
        ran = {MATH: MATH, SDPA: SDPA, FLEX: FLEX, TILED: TILED}[requested]
        if requested == FLEX and train:
            ran = SDPA  # (dropout is off; autograd on the CPU) / asked-for flex on CUDA
        if requested == TILED and not request.tiles:
            ran = SDPA
        assert cpu == ran
        assert cuda == (ran if requested == TILED else requested)
