"""posenc.extrapolate.text: finding the text (a file, a folder, the standard library) and
the files skipped.

Every test works in ``tmp_path``; the cache is pointed there through ``POSENC_CACHE_DIR``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from posenc.errors import PosencTypeError, PosencValueError
from posenc.extrapolate import text as text_module
from posenc.extrapolate.corpus import prepare_corpus
from posenc.extrapolate.text import STDLIB_EXCLUDED_DIRS, is_stdlib_source, scan_text
from tests.extrapolate.corpora import many_small, own_cache, some_text, write_corpus


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's cache is its own folder; the real ~/.cache is never touched."""
    return own_cache(tmp_path, monkeypatch)


def test_files_that_are_not_text_are_skipped_and_counted(tmp_path: Path) -> None:
    root = tmp_path / "text"
    texts = write_corpus(
        root, {"a.txt": 3000, "sub/b.md": 3000, ".hidden/c.txt": 100, ".d.txt": 100}
    )
    (root / "binary.bin").write_bytes(bytes(range(256)) * 4)  # NUL bytes, invalid UTF-8
    (root / "latin1.txt").write_bytes("café".encode("latin-1"))
    (root / "nul.txt").write_bytes(b"valid utf-8 \0 but a NUL")
    (root / "cut.txt").write_bytes("ends in half a euro €".encode()[:-1])
    (root / "empty.txt").write_bytes(b"")
    os.mkfifo(root / "pipe")  # not a regular file: never opened
    scan = scan_text(root)
    assert [document.relpath for document in scan.documents] == ["a.txt", "sub/b.md"]
    assert sorted(scan.skipped) == ["binary.bin", "cut.txt", "latin1.txt", "nul.txt", "pipe"]
    corpus = prepare_corpus(root)
    assert corpus.documents == 2 and corpus.skipped == 5
    assert corpus.train_bytes + corpus.valid_bytes == len(texts["a.txt"]) + len(texts["sub/b.md"])


def test_a_folder_without_text_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(
        PosencValueError, match="no usable UTF-8 text: of 2 files, 1 are not text"
    ) as info:
        prepare_corpus(tmp_path)
    assert str(tmp_path) in str(info.value) and "\n" not in str(info.value)


def test_a_missing_path_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(PosencValueError, match=r"nowhere\.txt") as info:
        prepare_corpus(tmp_path / "nowhere.txt")
    assert "No such file" in str(info.value)
    with pytest.raises(PosencTypeError, match="text"):
        prepare_corpus(42)  # type: ignore[arg-type]


def test_an_unreadable_file_inside_the_folder_is_an_error_naming_it(tmp_path: Path) -> None:
    many_small(tmp_path, 10)
    (tmp_path / "dangling.txt").symlink_to(tmp_path / "gone.txt")
    with pytest.raises(PosencValueError, match=r"dangling\.txt"):
        prepare_corpus(tmp_path)


def test_one_file_is_a_corpus_of_one_document(tmp_path: Path) -> None:
    (tmp_path / "book.txt").write_bytes(some_text(0, 20_000))
    corpus = prepare_corpus(tmp_path / "book.txt")
    assert corpus.name == "book.txt" and corpus.documents == 1
    assert {unit["path"] for unit in corpus.units()} == {"book.txt"}


def test_stdlib_filter_leaves_out_tests_and_installed_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = ["json/__init__.py", "json/decoder.py", "lib2to3/fixer_base.py", "os.py"]
    dropped = [
        "test/test_os.py",
        "test/support/__init__.py",
        "unittest/test/test_case.py",
        "ctypes/test/test_bytes.py",
        "distutils/tests/test_core.py",
        "idlelib/idle_test/test_run.py",
        "lib2to3/tests/data/bom.py",
        "site-packages/numpy/core.py",
        "dist-packages/apt/cache.py",
        "__pycache__/os.py",
        "json/README.txt",
        "os.pyc",
    ]
    for relpath in kept + dropped:
        (tmp_path / relpath).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relpath).write_text(f"# {relpath}\n" * 100)
    monkeypatch.setattr(text_module, "stdlib_root", lambda: tmp_path)
    scan = scan_text(None)
    assert [document.relpath for document in scan.documents] == kept
    assert scan.name == f"python{sys.version_info.major}.{sys.version_info.minor}-stdlib"
    assert [path for path in kept + dropped if is_stdlib_source(path)] == kept
    assert {"test", "tests", "idle_test", "site-packages", "dist-packages"} <= STDLIB_EXCLUDED_DIRS


def test_the_default_corpus_is_the_real_stdlib() -> None:
    corpus = prepare_corpus()  # about 12 MB of bytes tokens: a fraction of a second
    assert corpus.name.endswith("-stdlib") and corpus.documents > 300
    relpaths = {unit["path"] for unit in corpus.units()}
    assert {"os.py", "json/decoder.py"} <= relpaths
    assert not any(STDLIB_EXCLUDED_DIRS & set(path.split("/")) for path in relpaths)
    assert 0.02 < corpus.valid_bytes / (corpus.train_bytes + corpus.valid_bytes) < 0.15
