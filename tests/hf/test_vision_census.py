"""The vision RoPE census as a test (``tests/hf/vision_census.py`` finds the vision call sites
in transformers' source, runs each family's own rotary module and apply function, and
posenc's, on the same grid; ``python -m tests.hf.vision_census`` prints the table).

Every family must be exact (``max|posenc - family| / max|family| <= 2e-5`` over the whole q and
k) or refused as :data:`posenc.hf.vision.REFUSED` says (at most three, each with its reason in
``docs/peers.md``); none wrong, none crashed; every vision call site of the modeling sources run,
refused, or listed as a sequence.
"""

from __future__ import annotations

from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from posenc.hf.vision import REFUSED, VISION_MODEL_TYPES  # noqa: E402
from tests.hf import vision_census as vc  # noqa: E402

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def census() -> list[vc.Result]:
    return vc.run_census()


def test_every_vision_family_is_exact_or_refused_by_name(census: list[vc.Result]) -> None:
    problems = [
        f"{r.family.model_type}: {r.kind} {r.detail}"
        for r in census
        if r.kind not in (vc.EXACT, vc.REFUSED)
        or (r.kind == vc.REFUSED) != (r.family.model_type in REFUSED)
        or (r.kind == vc.REFUSED and r.family.model_type not in r.detail)
    ]
    counts = {kind: sum(r.kind == kind for r in census) for kind in (vc.EXACT, vc.REFUSED)}
    assert not problems, f"{counts}, transformers {transformers.__version__}:\n" + "\n".join(
        problems
    )
    assert counts[vc.REFUSED] <= 3
    assert counts[vc.EXACT] >= 36


def test_the_census_fails_on_a_rotation_it_missed() -> None:
    """Every vision call site of the modeling sources is run, refused or a listed sequence;
    every listed sequence site still exists."""
    assert vc.uncovered_sites() == []
    found = {(folder, cls) for folder, cls, _ in vc.vision_sites()}
    assert sorted(set(vc.SEQUENCE_SITES) - found) == []
    assert sorted({(f.folder, s) for f in vc.FAMILIES for s in f.sites} - found) == []


def test_every_model_type_posenc_reads_is_in_the_census() -> None:
    swept = {f.model_type for f in vc.FAMILIES}
    assert sorted((set(VISION_MODEL_TYPES) | set(REFUSED)) - swept) == []
    assert sorted(swept - set(VISION_MODEL_TYPES) - set(REFUSED)) == []


def test_each_refusal_has_its_reason_in_peers() -> None:
    peers = (DOCS / "peers.md").read_text()
    assert [name for name in REFUSED if f"`{name}`" not in peers] == []


def test_a_missed_site_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The coverage check can fail: drop one family and its site is reported."""
    monkeypatch.setattr(vc, "FAMILIES", tuple(f for f in vc.FAMILIES if f.folder != "pixtral"))
    assert vc.uncovered_sites() == [("pixtral", "PixtralAttention", "apply_rotary_pos_emb")]


def test_a_wrong_reading_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison can fail: read Pixtral with Step3p7's table (columns first)."""
    from posenc.hf import vision

    monkeypatch.setitem(
        vision.VISION_MODEL_TYPES, "pixtral", vision.VISION_MODEL_TYPES["step3p5_vision"]
    )
    (pixtral,) = [f for f in vc.FAMILIES if f.model_type == "pixtral"]
    result = vc.run_family(pixtral)
    assert result.kind == vc.WRONG and result.error is not None and result.error > 0.1
