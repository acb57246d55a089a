"""posenc.extrapolate.split: the train/validation split, by document and by chunk, and units
cut at character boundaries.

Every test works in ``tmp_path``; the cache is pointed there through ``POSENC_CACHE_DIR``.
"""

from __future__ import annotations

import hashlib
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.errors import PosencTypeError, PosencValueError
from posenc.extrapolate.corpus import prepare_corpus
from posenc.extrapolate.split import chunk_size, plan_split, read_units
from posenc.extrapolate.text import Document, scan_text
from tests.extrapolate.corpora import many_small, own_cache, split_streams, write_corpus


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's cache is its own folder; the real ~/.cache is never touched."""
    return own_cache(tmp_path, monkeypatch)


def test_small_documents_are_split_by_document(tmp_path: Path) -> None:
    texts = many_small(tmp_path / "text")
    corpus = prepare_corpus(tmp_path / "text")
    units = list(corpus.units())
    assert [unit["path"] for unit in units] == sorted(texts)  # one unit per document
    valid = [unit["path"] for unit in units if unit["split"] == "valid"]
    assert 3 <= len(valid) <= 40  # about 5% of 300 documents, never a handful
    assert corpus.documents == 300 and corpus.skipped == 0
    # Each split is its documents' bytes, concatenated in path order.
    for split, tokens in (("train", corpus.train), ("valid", corpus.valid)):
        paths = [unit["path"] for unit in units if unit["split"] == split]
        assert tokens.tobytes() == b"".join(texts[path] for path in paths)
    assert corpus.train_bytes == len(corpus.train) and corpus.valid_bytes == len(corpus.valid)
    assert corpus.train_bytes + corpus.valid_bytes == sum(map(len, texts.values()))


def test_split_is_stable_across_runs_and_folders(tmp_path: Path) -> None:
    many_small(tmp_path / "a")
    first = prepare_corpus(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    second = prepare_corpus(tmp_path / "b", cache=tmp_path / "other-cache")
    assert first.sha256 == second.sha256 and first.key == second.key
    assert list(first.units()) == list(second.units())
    np.testing.assert_array_equal(first.valid, second.valid)
    # The written split is the planned one.
    scan = scan_text(tmp_path / "a")
    plan = plan_split(scan.documents, first.chunk_bytes, first.valid_fraction)
    planned = [("valid" if in_valid else "train") for units in plan for in_valid in units]
    assert [unit["split"] for unit in first.units()] == planned


def test_few_large_documents_are_split_by_chunk(tmp_path: Path) -> None:
    texts = write_corpus(tmp_path / "text", {"one.txt": 120_000, "two.txt": 90_000})
    corpus = prepare_corpus(tmp_path / "text")
    total = sum(map(len, texts.values()))
    assert corpus.chunk_bytes == chunk_size(total) == math.ceil(total / 200)
    units = list(corpus.units())
    assert len(units) >= 200
    for path, text in texts.items():
        assert sum(unit["path"] == path for unit in units) == math.ceil(
            len(text) / corpus.chunk_bytes
        )
    valid = [unit for unit in units if unit["split"] == "valid"]
    assert len(valid) >= 5
    assert {unit["path"] for unit in valid} == set(texts)  # both documents give validation
    # Reading the units back from the two splits rebuilds every document.
    streams = split_streams(corpus)
    for path, text in texts.items():
        pieces = {unit["unit"]: None for unit in units if unit["path"] == path}
        for split in ("train", "valid"):
            split_units = [
                unit["unit"] for unit in units if unit["path"] == path and unit["split"] == split
            ]
            for index, piece in zip(split_units, streams[split].get(path, []), strict=True):
                pieces[index] = piece
        assert b"".join(pieces[index] for index in sorted(pieces)) == text


@pytest.mark.parametrize("fraction", [1e-9, 0.5, 1 - 1e-9])
def test_both_splits_are_never_empty(tmp_path: Path, fraction: float) -> None:
    write_corpus(tmp_path / "text", {"only.txt": 5000})
    corpus = prepare_corpus(tmp_path / "text", valid_fraction=fraction)
    assert len(corpus.train) > 0 and len(corpus.valid) > 0
    assert corpus.train_bytes + corpus.valid_bytes == 5000


def test_one_tiny_document_is_too_little_to_split(tmp_path: Path) -> None:
    (tmp_path / "tiny.txt").write_text("print('hello')\n")
    with pytest.raises(PosencValueError, match="too little to split"):
        prepare_corpus(tmp_path / "tiny.txt")


@given(text=st.text(min_size=1, max_size=200), chunk_bytes=st.integers(4, 40))
@settings(max_examples=50, deadline=None)
def test_units_are_cut_at_character_boundaries(text: str, chunk_bytes: int) -> None:
    raw = text.encode()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "doc.txt"
        path.write_bytes(raw)
        document = Document("doc.txt", path, len(raw), hashlib.sha256(raw).hexdigest())
        units = list(read_units(document, chunk_bytes))
    assert len(units) == math.ceil(len(raw) / chunk_bytes)
    assert b"".join(units) == raw
    for unit in units:
        assert 0 < len(unit) <= chunk_bytes + 3
        unit.decode("utf-8")  # every unit is whole characters


def test_a_file_that_changes_while_preparing_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "doc.txt").write_text("abc" * 1000)
    document = scan_text(tmp_path / "doc.txt").documents[0]
    (tmp_path / "doc.txt").write_text("abd" * 1000)
    with pytest.raises(PosencValueError, match="changed while"):
        list(read_units(document, 1024))


def test_bad_valid_fraction_is_an_error(tmp_path: Path) -> None:
    many_small(tmp_path, 10)
    for bad in (0.0, 1.0, float("nan"), -0.1):
        with pytest.raises(PosencValueError, match="valid_fraction"):
            prepare_corpus(tmp_path, valid_fraction=bad)
    with pytest.raises(PosencTypeError, match="valid_fraction"):
        prepare_corpus(tmp_path, valid_fraction=True)
