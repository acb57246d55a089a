"""Tokens of ``posenc extrapolate``: bytes, or a byte-level BPE from ``tokenizers``.

Tokens
    ``tokenizer="bytes"`` (default): one token per byte, vocabulary 256, ``uint8``.
    ``tokenizer="bpe:N"``: a byte-level BPE with at most ``N`` tokens (``257 <= N <=
    2**20``) from the optional ``tokenizers`` package (``pip install tokenizers`` or
    ``pip install posenc[extrapolate]``), trained
    on the training units only, with the 256 byte symbols as its initial alphabet (so no
    text is ever unknown); ``uint16`` up to 65536 tokens, else ``uint32``. Each unit is
    encoded on its own. Every token stands for a known number of bytes
    (:attr:`Corpus.token_bytes`), so a loss in nats per token converts exactly to bits per
    byte (:func:`bits_per_byte`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PosencTypeError, PosencValueError

BPE_MAX_VOCAB = 1 << 20

Encoder = Callable[[list[bytes]], list[np.ndarray]]  # units' bytes -> their token ids


def parse_tokenizer(spec: str) -> tuple[str, int]:
    """``"bytes"`` -> ``("bytes", 256)``; ``"bpe:4096"`` -> ``("bpe", 4096)``."""
    if not isinstance(spec, str):
        raise PosencTypeError(f"tokenizer must be a str, got {type(spec).__name__}")
    if spec == "bytes":
        return "bytes", 256
    kind, _, size = spec.partition(":")
    if kind == "bpe" and size.isdigit() and 257 <= int(size) <= BPE_MAX_VOCAB:
        return "bpe", int(size)
    raise PosencValueError(
        f"tokenizer must be 'bytes' or 'bpe:N' with 257 <= N <= {BPE_MAX_VOCAB}, got {spec!r}"
    )


def import_tokenizers(spec: str) -> Any:
    try:
        import tokenizers
    except ImportError:
        raise PosencValueError(
            f"tokenizer={spec!r} needs the tokenizers package: pip install tokenizers"
        ) from None
    return tokenizers


def train_bpe(texts: Iterable[str], vocab_size: int, spec: str) -> Any:
    """A byte-level BPE (the 256 byte symbols plus merges) trained on ``texts``."""
    tokenizers = import_tokenizers(spec)
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def byte_level_alphabet() -> dict[str, int]:
    """The printable character a byte-level BPE writes for each byte (GPT-2's mapping):
    printable Latin-1 bytes stand for themselves, the other bytes for ``chr(256 + k)``, in
    byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(byte): byte for byte in printable}
    others = sorted(set(range(256)) - set(printable))
    table.update({chr(256 + k): byte for k, byte in enumerate(others)})
    return table


def bpe_token_table(tokenizer_json: Path) -> list[bytes]:
    """The bytes each token id of a saved byte-level BPE stands for."""
    vocab: dict[str, int] = json.loads(tokenizer_json.read_text("utf-8"))["model"]["vocab"]
    alphabet = byte_level_alphabet()
    table = [b""] * len(vocab)
    for token, index in vocab.items():
        table[index] = bytes(alphabet[char] for char in token)
    return table


def token_dtype(kind: str, vocab_size: int) -> np.dtype:
    if kind == "bytes":
        return np.dtype(np.uint8)
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def encode_bytes(units: list[bytes]) -> list[np.ndarray]:
    return [np.frombuffer(data, dtype=np.uint8) for data in units]


def bpe_encoder(bpe: Any) -> Encoder:
    def encode(units: list[bytes]) -> list[np.ndarray]:
        encodings = bpe.encode_batch([data.decode("utf-8") for data in units])
        return [np.array(encoding.ids, dtype=np.int64) for encoding in encodings]

    return encode
