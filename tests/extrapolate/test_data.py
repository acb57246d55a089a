"""posenc.extrapolate.data: finding text, the split, the token cache, batches and windows.

Every test works in ``tmp_path``; the cache is pointed there through ``POSENC_CACHE_DIR``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.errors import PosencTypeError, PosencValueError
from posenc.extrapolate import corpus as corpus_module
from posenc.extrapolate import data
from posenc.extrapolate import split as split_module
from posenc.extrapolate import text as text_module
from posenc.extrapolate.data import (
    STDLIB_EXCLUDED_DIRS,
    Corpus,
    Document,
    bits_per_byte,
    cache_dir,
    check_lengths,
    chunk_size,
    eval_budget,
    eval_windows,
    is_stdlib_source,
    parse_tokenizer,
    plan_split,
    prepare_corpus,
    read_units,
    scan_text,
    train_batch,
)

WORDS = ["def", "return", "self", "value", "élan", "naïve", "€uro", "😀", "x", "\n", "    "]


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's cache is its own folder; the real ~/.cache is never touched."""
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    return tmp_path / "cache" / "extrapolate"


def some_text(seed: int, nbytes: int) -> bytes:
    """Deterministic UTF-8 text of about ``nbytes`` bytes, with multi-byte characters."""
    rng = np.random.default_rng(seed)
    words = rng.choice(WORDS, size=max(1, nbytes // 4))
    return " ".join(words).encode()[:nbytes].decode("utf-8", "ignore").encode()


def write_corpus(root: Path, sizes: dict[str, int]) -> dict[str, bytes]:
    """Write one text file per relative path; return path -> bytes."""
    texts = {}
    for index, (relpath, nbytes) in enumerate(sorted(sizes.items())):
        texts[relpath] = some_text(index, nbytes)
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_bytes(texts[relpath])
    return texts


def many_small(root: Path, count: int = 300) -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    sizes = {
        f"d{index // 50}/doc{index:03d}.txt": int(rng.integers(100, 600)) for index in range(count)
    }
    return write_corpus(root, sizes)


def split_streams(corpus: Corpus) -> dict[str, dict[str, list[bytes]]]:
    """split -> path -> the bytes of its units there, read back from the token arrays."""
    streams = {"train": corpus.decode(corpus.train), "valid": corpus.decode(corpus.valid)}
    offsets = {"train": 0, "valid": 0}
    out: dict[str, dict[str, list[bytes]]] = {"train": {}, "valid": {}}
    for unit in corpus.units():
        split, start = unit["split"], offsets[unit["split"]]
        out[split].setdefault(unit["path"], []).append(
            streams[split][start : start + unit["bytes"]]
        )
        offsets[split] += unit["bytes"]
    assert offsets == {"train": corpus.train_bytes, "valid": corpus.valid_bytes}
    return out


# --------------------------------------------------------------------------- where things are


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert cache_dir() == tmp_path / "cache" / "extrapolate"
    monkeypatch.delenv("POSENC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "posenc" / "extrapolate"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "posenc" / "extrapolate"


# --------------------------------------------------------------------------- the split


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


# --------------------------------------------------------------------------- finding the text


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


# --------------------------------------------------------------------------- the default corpus


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


# --------------------------------------------------------------------------- the cache


def test_tokens_are_a_read_only_memmap_of_the_file_bytes(tmp_path: Path) -> None:
    texts = write_corpus(tmp_path / "text", {"a.txt": 30_000, "b/c.txt": 20_000})
    corpus = prepare_corpus(tmp_path / "text")
    for split in ("train", "valid"):
        tokens = getattr(corpus, split)
        assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint8
        assert Path(tokens.filename) == corpus.path / f"{split}.bin"
        assert not tokens.flags.writeable
    assert corpus.path.parent == data.cache_dir() and corpus.vocab_size == 256
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
    real = data.read_units

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


# --------------------------------------------------------------------------- batches and windows


def test_batches_depend_only_on_step_and_seed() -> None:
    tokens = np.arange(1000)
    batch = train_batch(tokens, step=3, batch_size=8, length=16, seed=1)
    assert batch.shape == (8, 17) and batch.dtype == np.int64
    np.testing.assert_array_equal(batch, train_batch(tokens, 3, 8, 16, 1))
    assert not np.array_equal(batch, train_batch(tokens, 4, 8, 16, 1))
    assert not np.array_equal(batch, train_batch(tokens, 3, 8, 16, 2))
    # Each row is a window of consecutive tokens inside the array.
    np.testing.assert_array_equal(batch - batch[:, :1], np.broadcast_to(np.arange(17), (8, 17)))
    assert batch.min() >= 0 and batch.max() <= 999


def test_batches_reach_every_window_and_no_further() -> None:
    tokens = np.arange(18)  # windows of 17 can start at 0 or 1 only
    starts = {
        int(train_batch(tokens, step, 4, 16, 0)[row, 0]) for step in range(20) for row in range(4)
    }
    assert starts == {0, 1}
    np.testing.assert_array_equal(train_batch(tokens[:17], 0, 2, 16, 0), [tokens[:17]] * 2)


def test_a_corpus_batch_is_windows_of_its_training_tokens(tmp_path: Path) -> None:
    many_small(tmp_path / "text", 100)
    corpus = prepare_corpus(tmp_path / "text")
    batch = corpus.batch(step=0, batch_size=4, length=32, seed=0)
    train = corpus.train.tobytes()
    for row in batch:
        assert bytes(row.astype(np.uint8)) in train


def test_batch_arguments_are_checked() -> None:
    tokens = np.arange(10)
    with pytest.raises(
        PosencValueError, match="length=10 needs at least 11 tokens, the split has 10"
    ):
        train_batch(tokens, 0, 1, 10, 0)
    with pytest.raises(PosencValueError, match="step"):
        train_batch(tokens, -1, 1, 4, 0)
    with pytest.raises(PosencValueError, match="batch_size"):
        train_batch(tokens, 0, 0, 4, 0)
    with pytest.raises(PosencTypeError, match="seed"):
        train_batch(tokens, 0, 1, 4, True)


@pytest.mark.parametrize("lengths", [[16, 32, 64, 128], [3, 4], [5]])
def test_every_length_scores_the_same_tokens(lengths: list[int]) -> None:
    tokens = np.arange(2000)
    budget = eval_budget(lengths, len(tokens), max_tokens=1000)
    assert budget <= 1000 and all(budget % length == 0 for length in lengths)
    assert budget + math.lcm(*lengths) > 1000  # the largest that fits
    for length in lengths:
        windows = eval_windows(tokens, length, budget)  # (w, n + 1)
        assert windows.shape == (budget // length, length + 1)
        np.testing.assert_array_equal(windows[:, 1:].ravel(), tokens[1 : budget + 1])
        np.testing.assert_array_equal(windows[:, :-1].ravel(), tokens[:budget])
        assert np.shares_memory(windows, tokens)  # a view, nothing copied


def test_eval_windows_on_the_validation_memmap(tmp_path: Path) -> None:
    many_small(tmp_path / "text", 300)
    corpus = prepare_corpus(tmp_path / "text")
    budget = eval_budget([64, 128, 256], len(corpus.valid))
    windows = corpus.eval_windows(128, budget)
    assert windows.shape == (budget // 128, 129) and np.shares_memory(windows, corpus.valid)
    assert corpus.count_bytes(windows[:, 1:]) == budget  # bytes: one byte per token


def test_eval_budget_and_windows_check_their_arguments() -> None:
    with pytest.raises(PosencValueError, match=r"multiples of 12 tokens.*needs 13 tokens"):
        eval_budget([3, 4], available=12)
    with pytest.raises(PosencValueError, match="lengths"):
        eval_budget([], available=100)
    with pytest.raises(PosencValueError, match="multiple of length"):
        eval_windows(np.arange(100), 8, 50)
    with pytest.raises(PosencValueError, match="needs 65 tokens, the split has 64"):
        eval_windows(np.arange(64), 8, 64)


def test_check_lengths_says_what_is_needed_and_what_there_is(tmp_path: Path) -> None:
    many_small(tmp_path / "text", 100)
    corpus = prepare_corpus(tmp_path / "text")
    check_lengths(corpus, 64, [64, 128, 256])
    have = len(corpus.valid)
    with pytest.raises(
        PosencValueError, match=f"needs 65537 validation tokens, the validation split has {have}"
    ):
        check_lengths(corpus, 64, [64 << k for k in range(11)])
    with pytest.raises(
        PosencValueError,
        match=f"needs 1000001 training tokens, the training split has {len(corpus.train)}",
    ):
        check_lengths(corpus, 1_000_000, [64])
    with pytest.raises(PosencValueError, match="needs 3001 validation"):  # 3 windows of 1000
        check_lengths(corpus, 64, [500, 1000], min_eval_windows=3)


def test_bits_per_byte() -> None:
    assert bits_per_byte(math.log(2), 10, 10) == pytest.approx(1.0)
    assert bits_per_byte(2.0, num_tokens=100, num_bytes=350) == pytest.approx(
        2.0 / math.log(2) / 3.5
    )
    with pytest.raises(PosencValueError, match="num_bytes"):
        bits_per_byte(1.0, 1, 0)


# --------------------------------------------------------------------------- tokenizers


def test_tokenizer_specs() -> None:
    assert parse_tokenizer("bytes") == ("bytes", 256)
    assert parse_tokenizer("bpe:4096") == ("bpe", 4096)
    for bad in ("bpe:256", "bpe:", "bpe:4k", "words", "bpe:99999999"):
        with pytest.raises(PosencValueError, match="tokenizer"):
            parse_tokenizer(bad)


def test_bpe_without_the_tokenizers_package_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    with pytest.raises(PosencValueError, match="pip install tokenizers"):
        prepare_corpus(tmp_path, tokenizer="bpe:512")


def test_bpe_is_trained_on_training_text_and_counts_bytes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tokenizers")
    import tokenizers

    many_small(tmp_path / "text", 150)
    as_bytes = prepare_corpus(tmp_path / "text")
    seen: list[str] = []
    real = corpus_module.train_bpe

    def spy(texts, vocab_size, spec):  # type: ignore[no-untyped-def]
        texts = list(texts)
        seen.extend(texts)
        return real(texts, vocab_size, spec)

    monkeypatch.setattr(corpus_module, "train_bpe", spy)
    corpus = prepare_corpus(tmp_path / "text", tokenizer="bpe:300")
    assert "".join(seen).encode() == as_bytes.train.tobytes()  # training text only
    assert corpus.tokenizer == "bpe:300" and 256 < corpus.vocab_size <= 300
    assert corpus.train.dtype == np.uint16 and isinstance(corpus.train, np.memmap)
    assert corpus.key != as_bytes.key and corpus.sha256 == as_bytes.sha256
    # The same split as bytes, fewer tokens, and exact byte counts.
    assert [unit["split"] for unit in corpus.units()] == [
        unit["split"] for unit in as_bytes.units()
    ]
    assert corpus.decode(corpus.valid) == as_bytes.valid.tobytes()
    assert corpus.count_bytes(corpus.valid) == corpus.valid_bytes == as_bytes.valid_bytes
    assert corpus.count_bytes(corpus.train) == corpus.train_bytes
    assert len(corpus.train) < corpus.train_bytes and corpus.valid_bytes_per_token > 1
    # The saved tokenizer encodes as the cache did; the byte alphabet matches tokenizers'.
    assert corpus.tokenizer_file is not None and as_bytes.tokenizer_file is None
    saved = tokenizers.Tokenizer.from_file(str(corpus.tokenizer_file))
    first = next(corpus.units())
    text = (tmp_path / "text" / first["path"]).read_text("utf-8")
    assert len(saved.encode(text).ids) == first["tokens"]
    assert set(data.byte_level_alphabet()) == set(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    assert prepare_corpus(tmp_path / "text", tokenizer="bpe:0300").key == corpus.key
    # Deterministic: a fresh prepare elsewhere gives the same tokens.
    monkeypatch.setattr(corpus_module, "train_bpe", real)
    again = prepare_corpus(tmp_path / "text", tokenizer="bpe:300", cache=tmp_path / "other")
    np.testing.assert_array_equal(again.train, corpus.train)
    np.testing.assert_array_equal(again.valid, corpus.valid)
    assert json.loads((again.path / "meta.json").read_text())["vocab_size"] == corpus.vocab_size
