"""Small text corpora written into ``tmp_path`` for the ``posenc.extrapolate`` data tests,
and the cache folder those tests point ``POSENC_CACHE_DIR`` at."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from posenc.extrapolate.corpus import Corpus

WORDS = ["def", "return", "self", "value", "élan", "naïve", "€uro", "😀", "x", "\n", "    "]


def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the cache at ``tmp_path / "cache"`` so that the real ~/.cache is never touched;
    return the folder the entries go to."""
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


def word_files(root: Path, files: int = 40, words: int = 400) -> Path:
    """``files`` text files of ``words`` words of code drawn with seed 1 into ``root``: a
    corpus with repeats for the end-to-end runs of the command."""
    rng = np.random.default_rng(1)
    vocabulary = ["def", "return", "value", "naïve", "x", "\n", "    ", "(", ")", ":"]
    root.mkdir(parents=True)
    for i in range(files):
        (root / f"{i:02d}.txt").write_text(" ".join(rng.choice(vocabulary, size=words)), "utf-8")
    return root


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
