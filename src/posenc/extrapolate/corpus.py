"""The prepared corpus of ``posenc extrapolate``: tokens split once into a cache entry of
memory-mapped files, and opened at once the next time.

Cache
    Entries live in ``$POSENC_CACHE_DIR/extrapolate`` if ``POSENC_CACHE_DIR`` is set, else
    ``$XDG_CACHE_HOME/posenc/extrapolate``, else ``~/.cache/posenc/extrapolate``
    (:func:`cache_dir`); delete that folder to clear it. One entry is one folder named by
    the *key*, the sha256 of the cache format, the corpus digest (:attr:`Corpus.sha256`:
    every document's relative path, size and content sha256, and the relative paths of the
    skipped files), the tokenizer spec and the split rule (fraction, 200 units, chunk
    bounds)::

        <key>/meta.json           counts, dtype, vocabulary size, names
        <key>/train.bin           the training tokens, raw (numpy.memmap)
        <key>/valid.bin           the validation tokens, raw
        <key>/units.jsonl         one line per unit: path, unit, split, bytes, tokens
        <key>/token_bytes.npy     bytes per token id
        <key>/tokenizer.json      the trained BPE (bpe:N only)

    An entry is built in ``.tmp-<key>-<host>-<pid>`` next to it and renamed into place
    with :func:`os.replace`, so a prepare that is killed never leaves a half entry that a
    later run trusts (it leaves that temporary folder, which the next prepare of the same
    key on the same host removes). The files are read twice (once to hash and check them,
    once to write the tokens; ``bpe:N`` once more to train), block by block: a corpus never
    has to fit in memory. A second prepare of the same text hashes it again and then opens
    the entry at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PosencValueError
from .split import (
    MAX_CHUNK_BYTES,
    MIN_CHUNK_BYTES,
    MIN_UNITS,
    check_fraction,
    chunk_size,
    iter_units,
    plan_split,
)
from .text import Document, TextScan, reason, scan_text
from .tokens import (
    Encoder,
    bpe_encoder,
    bpe_token_table,
    encode_bytes,
    import_tokenizers,
    parse_tokenizer,
    token_dtype,
    train_bpe,
)
from .windows import eval_windows, train_batch

CACHE_FORMAT = 1  # bump when the layout or the meaning of an entry changes
DEFAULT_VALID_FRACTION = 0.05
BPE_ENCODE_BATCH_BYTES = 8 << 20  # text handed to the BPE encoder at a time
_COUNTS = ("tokens", "bytes", "units")  # what meta.json counts for each split


def cache_dir() -> Path:
    """The folder that holds prepared corpora (see the module docstring); delete it to clear.

    ``POSENC_CACHE_DIR`` and ``XDG_CACHE_HOME`` name posenc's cache root as in
    posenc's other caches; the corpora go in its ``extrapolate`` folder.
    """
    explicit = os.environ.get("POSENC_CACHE_DIR")
    if explicit:
        root = Path(explicit)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg) if xdg else Path.home() / ".cache") / "posenc"
    return root / "extrapolate"


@dataclass(frozen=True, eq=False)
class Corpus:
    """A prepared corpus: the two token arrays (read-only :class:`numpy.memmap`) and what
    a trainer and an evaluator need to know about them. Made by :func:`prepare_corpus`."""

    name: str  # the text's folder or file name, or "python3.X-stdlib"
    sha256: str  # the corpus digest (TextScan.sha256), before splitting and tokenizing
    tokenizer: str  # the spec: "bytes" or "bpe:N"
    vocab_size: int  # token ids are < vocab_size (for bpe:N, at most N)
    train: np.memmap  # (train tokens,)
    valid: np.memmap  # (validation tokens,)
    train_bytes: int  # bytes of text behind the training tokens
    valid_bytes: int
    documents: int
    skipped: int  # files that are not text (not UTF-8, NUL bytes, not regular files)
    chunk_bytes: int  # C, the most bytes in one unit
    valid_fraction: float
    path: Path  # the cache entry
    token_bytes: np.ndarray = field(repr=False)  # (vocab_size,) bytes each token stands for

    @property
    def key(self) -> str:
        """The cache key (the entry's folder name)."""
        return self.path.name

    @property
    def valid_bytes_per_token(self) -> float:
        return self.valid_bytes / len(self.valid)

    @property
    def tokenizer_file(self) -> Path | None:
        """The trained BPE as ``tokenizers`` saves it (``Tokenizer.from_file``); None for bytes."""
        path = self.path / "tokenizer.json"
        return path if path.exists() else None

    def count_bytes(self, tokens: np.ndarray) -> int:
        """The bytes of text that ``tokens`` stand for (exact, for any tokenizer)."""
        return int(self.token_bytes[np.asarray(tokens)].sum(dtype=np.int64))

    def decode(self, tokens: np.ndarray) -> bytes:
        """The bytes ``tokens`` stand for."""
        tokens = np.asarray(tokens)
        if self.tokenizer == "bytes":
            return tokens.astype(np.uint8).tobytes()
        table = self._token_table
        return b"".join(table[token] for token in tokens.tolist())

    @cached_property
    def _token_table(self) -> list[bytes]:
        return bpe_token_table(self.path / "tokenizer.json")

    def units(self) -> Iterator[dict[str, Any]]:
        """One dict per unit in order: ``path``, ``unit``, ``split`` ("train"/"valid"),
        ``bytes``, ``tokens``."""
        with open(self.path / "units.jsonl", encoding="utf-8") as file:
            for line in file:
                yield json.loads(line)

    def batch(self, step: int, batch_size: int, length: int, seed: int) -> np.ndarray:
        """:func:`train_batch` on the training tokens: ``(batch_size, length + 1)`` int64."""
        return train_batch(self.train, step, batch_size, length, seed)

    def eval_windows(self, length: int, num_tokens: int) -> np.ndarray:
        """:func:`eval_windows` on the validation tokens."""
        return eval_windows(self.valid, length, num_tokens)


def prepare_corpus(
    text: str | os.PathLike[str] | None = None,
    *,
    tokenizer: str = "bytes",
    valid_fraction: float = DEFAULT_VALID_FRACTION,
    cache: str | os.PathLike[str] | None = None,
) -> Corpus:
    """Split and tokenize ``text`` into a cache entry, or open the entry made before.

    Args:
        text: a UTF-8 file or a folder; None for the standard library (:data:`STDLIB_FILTER`).
        tokenizer: ``"bytes"`` or ``"bpe:N"`` (needs ``pip install tokenizers``).
        valid_fraction: the share of units that go to validation, in (0, 1).
        cache: the folder that holds the entries; default :func:`cache_dir`.
    """
    kind, vocab_size = parse_tokenizer(tokenizer)
    tokenizer = "bytes" if kind == "bytes" else f"bpe:{vocab_size}"  # one spelling per spec
    check_fraction(valid_fraction)
    key_fields: dict[str, Any] = {"format": CACHE_FORMAT, "tokenizer": tokenizer}
    if kind == "bpe":  # fail before reading the text; another version may train other merges
        key_fields["tokenizers"] = import_tokenizers(tokenizer).__version__
    scan = scan_text(text)
    chunk_bytes = chunk_size(scan.total_bytes)
    key_fields.update(
        corpus=scan.sha256,
        valid_fraction=float(valid_fraction),
        min_units=MIN_UNITS,
        min_chunk_bytes=MIN_CHUNK_BYTES,
        max_chunk_bytes=MAX_CHUNK_BYTES,
    )
    key = hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode()).hexdigest()
    folder = Path(cache).expanduser() if cache is not None else cache_dir()
    entry = folder / key

    meta = _read_meta(entry)
    if meta is None:
        _build_entry(entry, scan, chunk_bytes, valid_fraction, tokenizer)
        meta = _read_meta(entry)
        if meta is None:  # pragma: no cover - only if the entry is damaged at once
            raise PosencValueError(f"cache {str(entry)!r}: the entry just written is unreadable")
    return _open_entry(entry, meta, scan.name)


def open_corpus(entry: str | os.PathLike[str]) -> Corpus:
    """Open the cache entry at ``entry`` (a :attr:`Corpus.path`) without reading the text
    again, as a worker process does with the corpus its parent prepared."""
    entry = Path(entry)
    meta = _read_meta(entry)
    if meta is None:
        raise PosencValueError(
            f"cache entry {str(entry)!r} is missing or incomplete: prepare the corpus again"
        )
    return _open_entry(entry, meta, meta["name"])


def _read_meta(entry: Path) -> dict[str, Any] | None:
    """The entry's metadata if it is complete and its files have the recorded sizes, else
    None (then a damaged entry is removed so that it can be built again)."""
    if not entry.is_dir():
        return None
    try:
        meta = json.loads((entry / "meta.json").read_text("utf-8"))
        itemsize = np.dtype(meta["dtype"]).itemsize
        complete = (
            meta["format"] == CACHE_FORMAT
            and (entry / "train.bin").stat().st_size == meta["train_tokens"] * itemsize
            and (entry / "valid.bin").stat().st_size == meta["valid_tokens"] * itemsize
            and (entry / "token_bytes.npy").is_file()
        )
    except (OSError, ValueError, KeyError, TypeError):
        complete = False
    if complete:
        return meta
    shutil.rmtree(entry, ignore_errors=True)
    return None


def _open_entry(entry: Path, meta: dict[str, Any], name: str) -> Corpus:
    dtype = np.dtype(meta["dtype"])

    def tokens(split: str) -> np.memmap:
        shape = (meta[f"{split}_tokens"],)
        return np.memmap(entry / f"{split}.bin", dtype=dtype, mode="r", shape=shape)

    return Corpus(
        name=name,
        sha256=meta["sha256"],
        tokenizer=meta["tokenizer"],
        vocab_size=meta["vocab_size"],
        train=tokens("train"),
        valid=tokens("valid"),
        train_bytes=meta["train_bytes"],
        valid_bytes=meta["valid_bytes"],
        documents=meta["documents"],
        skipped=meta["skipped"],
        chunk_bytes=meta["chunk_bytes"],
        valid_fraction=meta["valid_fraction"],
        path=entry,
        token_bytes=np.load(entry / "token_bytes.npy"),
    )


def _build_entry(
    entry: Path, scan: TextScan, chunk_bytes: int, valid_fraction: float, spec: str
) -> None:
    """Write the entry in a temporary folder beside it, then rename it into place."""
    plan = plan_split(scan.documents, chunk_bytes, valid_fraction)
    tmp = _build_folder(entry)
    try:
        free = shutil.disk_usage(entry.parent).free
        if free < scan.total_bytes:
            raise PosencValueError(
                f"cache {str(entry.parent)!r} has {free} bytes free; the corpus needs about "
                f"{scan.total_bytes} (set POSENC_CACHE_DIR to a bigger disk)"
            )
        meta = _tokenize(tmp, scan, chunk_bytes, plan, spec)
        meta.update(
            format=CACHE_FORMAT,
            name=scan.name,
            root=str(scan.root),
            sha256=scan.sha256,
            tokenizer=spec,
            documents=len(scan.documents),
            skipped=len(scan.skipped),
            chunk_bytes=chunk_bytes,
            valid_fraction=float(valid_fraction),
        )
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", "utf-8")
        try:
            os.replace(tmp, entry)
        except OSError:
            if _read_meta(entry) is None:  # not another process's finished entry
                raise
    except OSError as error:  # reading the text raises PosencValueError: this is the cache
        raise PosencValueError(f"cache {str(entry.parent)!r}: {reason(error)}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _build_folder(entry: Path) -> Path:
    """A new empty temporary folder beside ``entry``, after removing stale ones."""
    host = socket.gethostname()
    tmp = entry.parent / f".tmp-{entry.name}-{host}-{os.getpid()}"
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_builds(entry, host)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as error:
        raise PosencValueError(
            f"cache {str(entry.parent)!r}: {reason(error)} (set POSENC_CACHE_DIR to a "
            "writable folder)"
        ) from None
    return tmp


def _tokenize(
    folder: Path, scan: TextScan, chunk_bytes: int, plan: list[np.ndarray], spec: str
) -> dict[str, Any]:
    """Write the tokens, ``token_bytes.npy`` and (BPE) ``tokenizer.json`` into ``folder``;
    return the vocabulary, dtype and counts for ``meta.json``."""
    kind, vocab_size = parse_tokenizer(spec)
    if kind == "bytes":
        encode: Encoder = encode_bytes
        token_bytes = np.ones(vocab_size, dtype=np.int64)
    else:
        train_texts = (
            data.decode("utf-8")
            for _, _, in_valid, data in iter_units(scan, chunk_bytes, plan)
            if not in_valid
        )
        bpe = train_bpe(train_texts, vocab_size, spec)
        bpe.save(str(folder / "tokenizer.json"))
        vocab_size = bpe.get_vocab_size()
        encode = bpe_encoder(bpe)
        table = bpe_token_table(folder / "tokenizer.json")
        token_bytes = np.array([len(token) for token in table], dtype=np.int64)
    dtype = token_dtype(kind, vocab_size)
    counts = _write_tokens(folder, scan, chunk_bytes, plan, encode, dtype)
    np.save(folder / "token_bytes.npy", token_bytes)
    return {"vocab_size": vocab_size, "dtype": dtype.name, **counts}


def _remove_stale_builds(entry: Path, host: str) -> None:
    """Remove temporary folders of this entry left by killed prepares on this host."""
    for stale in entry.parent.glob(f".tmp-{entry.name}-{host}-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _batched(
    units: Iterable[tuple[Document, int, bool, bytes]], max_bytes: int
) -> Iterator[list[tuple[Document, int, bool, bytes]]]:
    """Consecutive units grouped up to about ``max_bytes`` of text per group."""
    group: list[tuple[Document, int, bool, bytes]] = []
    size = 0
    for unit in units:
        group.append(unit)
        size += len(unit[3])
        if size >= max_bytes:
            yield group
            group, size = [], 0
    if group:
        yield group


def _write_tokens(
    folder: Path,
    scan: TextScan,
    chunk_bytes: int,
    plan: list[np.ndarray],
    encode: Encoder,
    dtype: np.dtype,
) -> dict[str, int]:
    """Stream every unit's tokens onto the end of ``train.bin`` or ``valid.bin`` and a line
    into ``units.jsonl``; return the token, byte and unit counts of both splits."""
    counts = {f"{split}_{what}": 0 for split in ("train", "valid") for what in _COUNTS}
    with (
        open(folder / "train.bin", "wb") as train,
        open(folder / "valid.bin", "wb") as valid,
        open(folder / "units.jsonl", "w", encoding="utf-8") as listing,
    ):
        for group in _batched(iter_units(scan, chunk_bytes, plan), BPE_ENCODE_BATCH_BYTES):
            for (document, unit, in_valid, data), tokens in zip(
                group, encode([data for *_, data in group]), strict=True
            ):
                split = "valid" if in_valid else "train"
                tokens.astype(dtype, copy=False).tofile(valid if in_valid else train)
                counts[f"{split}_tokens"] += len(tokens)
                counts[f"{split}_bytes"] += len(data)
                counts[f"{split}_units"] += 1
                line = {"path": document.relpath, "unit": unit, "split": split}
                line.update(bytes=len(data), tokens=len(tokens))
                listing.write(json.dumps(line) + "\n")
    for split in ("train", "valid"):
        if counts[f"{split}_tokens"] == 0:  # pragma: no cover - plan_split prevents it
            raise PosencValueError(f"text path {str(scan.root)!r}: the {split} split is empty")
    return counts
