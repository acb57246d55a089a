"""posenc.extrapolate.corpus: the token cache that prepare_corpus writes once and reopens,
its key, and what a failed, killed or full-disk prepare leaves.

Every test works in ``tmp_path``; the cache is pointed there through ``POSENC_CACHE_DIR``.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import numpy as np
import pytest

from posenc.errors import PosencValueError
from posenc.extrapolate import corpus as corpus_module
from posenc.extrapolate import split as split_module
from posenc.extrapolate.corpus import cache_dir, prepare_corpus
from posenc.extrapolate.text import Document
from tests.extrapolate.corpora import many_small, own_cache, split_streams, write_corpus


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's cache is its own folder; the real ~/.cache is never touched."""
    return own_cache(tmp_path, monkeypatch)


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert cache_dir() == tmp_path / "cache" / "extrapolate"
    monkeypatch.delenv("POSENC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "posenc" / "extrapolate"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "posenc" / "extrapolate"


def test_tokens_are_a_read_only_memmap_of_the_file_bytes(tmp_path: Path) -> None:
    texts = write_corpus(tmp_path / "text", {"a.txt": 30_000, "b/c.txt": 20_000})
    corpus = prepare_corpus(tmp_path / "text")
    for split in ("train", "valid"):
        tokens = getattr(corpus, split)
        assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint8
        assert Path(tokens.filename) == corpus.path / f"{split}.bin"
        assert not tokens.flags.writeable
    assert corpus.path.parent == cache_dir() and corpus.vocab_size == 256
    streams = split_streams(corpus)
    units = list(corpus.units())
    for path, text in texts.items():
        order = sorted((unit["unit"], unit["split"]) for unit in units if unit["path"] == path)
        taken = {"train": 0, "valid": 0}
        rebuilt = []
        for _, split in order:
            rebuilt.append(streams[split][path][taken[split]])
            taken[split] += 1
        assert b"".join(rebuilt) == text


def test_a_second_prepare_opens_the_entry_without_tokenizing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    many_small(tmp_path / "text", 50)
    first = prepare_corpus(tmp_path / "text")
    written = (first.path / "train.bin").stat().st_mtime_ns

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("tokenized again")

    monkeypatch.setattr(corpus_module, "_write_tokens", refuse)
    second = prepare_corpus(tmp_path / "text")
    assert second.path == first.path
    assert (second.path / "train.bin").stat().st_mtime_ns == written
    np.testing.assert_array_equal(second.train, first.train)


def test_the_key_follows_content_tokenizer_and_split(tmp_path: Path) -> None:
    texts = many_small(tmp_path / "text", 50)
    first = prepare_corpus(tmp_path / "text")
    path = tmp_path / "text" / sorted(texts)[7]
    path.write_bytes(path.read_bytes().replace(b"e", b"E", 1))  # same size, new content
    changed = prepare_corpus(tmp_path / "text")
    assert changed.sha256 != first.sha256 and changed.path != first.path
    assert first.path.is_dir()  # the old entry stays until the cache is cleared
    other_fraction = prepare_corpus(tmp_path / "text", valid_fraction=0.2)
    assert other_fraction.sha256 == changed.sha256 and other_fraction.path != changed.path
    (tmp_path / "text" / "z.bin").write_bytes(b"\0\1\2")  # a new skipped file
    assert prepare_corpus(tmp_path / "text").path != changed.path


def test_a_failed_prepare_leaves_nothing_to_trust(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    many_small(tmp_path / "text", 50)
    real = split_module.read_units

    def dies_after_a_while(document: Document, chunk_bytes: int):  # type: ignore[no-untyped-def]
        if document.relpath.endswith("030.txt"):
            raise KeyboardInterrupt
        yield from real(document, chunk_bytes)

    monkeypatch.setattr(split_module, "read_units", dies_after_a_while)
    with pytest.raises(KeyboardInterrupt):
        prepare_corpus(tmp_path / "text")
    assert list(cache.iterdir()) == []  # neither an entry nor a temporary folder
    monkeypatch.setattr(split_module, "read_units", real)
    assert len(prepare_corpus(tmp_path / "text").train) > 0


def test_a_killed_prepare_is_cleaned_up_and_never_trusted(tmp_path: Path, cache: Path) -> None:
    many_small(tmp_path / "text", 50)
    key = prepare_corpus(tmp_path / "text").key
    shutil.rmtree(cache / key)
    # What a prepare killed by SIGKILL leaves: its half-written temporary folder.
    stale = cache / f".tmp-{key}-{socket.gethostname()}-4194305"  # above any Linux pid
    stale.mkdir()
    (stale / "train.bin").write_bytes(b"half")
    corpus = prepare_corpus(tmp_path / "text")
    assert not stale.exists() and corpus.path == cache / key
    # A damaged entry (a file cut short) is rebuilt, not trusted.
    with open(corpus.path / "valid.bin", "r+b") as file:
        file.truncate(10)
    again = prepare_corpus(tmp_path / "text")
    assert len(again.valid) == len(corpus.valid) == (again.path / "valid.bin").stat().st_size


def test_an_unusable_cache_folder_is_a_clear_error(tmp_path: Path) -> None:
    many_small(tmp_path / "text", 50)
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(PosencValueError, match=r"cache .*a-file.*POSENC_CACHE_DIR"):
        prepare_corpus(tmp_path / "text", cache=tmp_path / "a-file")


def test_a_full_disk_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    many_small(tmp_path / "text", 50)
    monkeypatch.setattr(
        corpus_module.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(1, 1, 0)
    )
    with pytest.raises(PosencValueError, match=r"bytes free.*POSENC_CACHE_DIR"):
        prepare_corpus(tmp_path / "text")
