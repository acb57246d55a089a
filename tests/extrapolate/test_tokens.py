"""posenc.extrapolate.tokens: tokenizer specs, and a byte-level BPE trained on the training
text only that counts bytes exactly.

Every test works in ``tmp_path``; the cache is pointed there through ``POSENC_CACHE_DIR``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from posenc.errors import PosencValueError
from posenc.extrapolate import corpus as corpus_module
from posenc.extrapolate.corpus import prepare_corpus
from posenc.extrapolate.tokens import byte_level_alphabet, parse_tokenizer
from tests.extrapolate.corpora import many_small, own_cache


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's cache is its own folder; the real ~/.cache is never touched."""
    return own_cache(tmp_path, monkeypatch)


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
    assert set(byte_level_alphabet()) == set(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    assert prepare_corpus(tmp_path / "text", tokenizer="bpe:0300").key == corpus.key
    # Deterministic: a fresh prepare elsewhere gives the same tokens.
    monkeypatch.setattr(corpus_module, "train_bpe", real)
    again = prepare_corpus(tmp_path / "text", tokenizer="bpe:300", cache=tmp_path / "other")
    np.testing.assert_array_equal(again.train, corpus.train)
    np.testing.assert_array_equal(again.valid, corpus.valid)
    assert json.loads((again.path / "meta.json").read_text())["vocab_size"] == corpus.vocab_size
