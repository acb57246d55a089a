"""Real text for ``posenc extrapolate``: find it, split it, tokenize it once, serve windows.

"Train short, test long" (Press et al. 2022, Fig. 1) trains a small causal language model on
windows of length ``L`` and scores bits per byte on windows of ``2L, 4L, ... 16L``. This module
is the data path only: :func:`prepare_corpus` turns a file, a folder or (by default) the
running Python's standard library into two token arrays on disk, ``train`` and ``valid``;
:meth:`Corpus.batch` draws training windows; :func:`eval_windows` cuts the validation tokens
so that every evaluation length scores the same tokens.

Text
    ``text`` is a UTF-8 file or a folder searched recursively; a document is one file, and
    documents are taken in the order of their sorted relative paths (``/``-separated).
    Names starting with ``.`` (``.git``, ``.cache``, ...) are never looked at. A file is
    *skipped*, and counted in :attr:`Corpus.skipped`, when it is not text: it is not UTF-8,
    contains a NUL byte, or is not a regular file. Empty files add nothing and are not
    counted. A missing or unreadable path (the text path or any file under it), or a path
    with no usable text at all, raises :class:`~posenc.errors.PosencValueError` naming it.

Default text (no ``text``)
    The ``.py`` files under ``sysconfig.get_paths()["stdlib"]`` of the running Python,
    except those with a folder in :data:`STDLIB_EXCLUDED_DIRS` anywhere on their relative
    path (``test``, ``tests``, ``idle_test``, ``site-packages``, ``dist-packages``,
    ``__pycache__``). That drops ``test/``, ``unittest/test/``, ``ctypes/test/``,
    ``distutils/tests/``, ``idlelib/idle_test/``, ``lib2to3/tests/``, ``tkinter/test/``
    and any installed packages; :data:`STDLIB_FILTER` says it in one sentence. About
    12 MB of code in 730 files on CPython 3.11.

The split (train/validation)
    Each document of ``nbytes`` bytes is cut into ``ceil(nbytes / C)`` *units* of at most
    ``C`` bytes, every cut moved back to the start of the UTF-8 character it falls in, with
    ``C = clip(ceil(total_bytes / 200), 1 KiB, 1 MiB)``, so a corpus of more than 200 KiB has
    at least 200 units whatever its documents look like: many small files are split by
    document (each fits in one unit), few or huge files by chunk. Unit ``i`` of the
    document at relative path ``p`` goes to validation when
    ``u = int(sha256(fsencode(p) + b"\\0" + str(i)).digest()[:8], big-endian) / 2**64``
    is below ``valid_fraction`` (default 0.05). The assignment is independent of the
    tokenizer and of the other documents' contents (only ``C`` depends on the total size).
    Both splits are made non-empty: if no unit hashed into validation, the first unit of
    the document with the smallest ``u`` moves there; if every unit did, the first unit of
    the document with the largest ``u`` moves to training. Each split is its units
    concatenated in (path, unit) order, without separators.

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

Dimension legend: ``b`` batch, ``n`` window length, ``w`` windows.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import os
import shutil
import socket
import stat
import sys
import sysconfig
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PosencTypeError, PosencValueError, check_bytes

__all__ = [
    "DEFAULT_VALID_FRACTION",
    "STDLIB_EXCLUDED_DIRS",
    "STDLIB_FILTER",
    "Corpus",
    "Document",
    "TextScan",
    "bits_per_byte",
    "byte_level_alphabet",
    "cache_dir",
    "check_lengths",
    "chunk_size",
    "eval_budget",
    "eval_windows",
    "is_stdlib_source",
    "parse_tokenizer",
    "plan_split",
    "prepare_corpus",
    "read_units",
    "scan_text",
    "stdlib_root",
    "train_batch",
    "unit_score",
]

CACHE_FORMAT = 1  # bump when the layout or the meaning of an entry changes
DEFAULT_VALID_FRACTION = 0.05
MIN_UNITS = 200  # the chunk size is chosen so that a corpus has at least this many units
MIN_CHUNK_BYTES = 1 << 10
MAX_CHUNK_BYTES = 1 << 20
READ_BLOCK_BYTES = 1 << 20  # how much of a file is read at a time while hashing
BPE_MAX_VOCAB = 1 << 20
BPE_ENCODE_BATCH_BYTES = 8 << 20  # text handed to the BPE encoder at a time
_COUNTS = ("tokens", "bytes", "units")  # what meta.json counts for each split

Encoder = Callable[[list[bytes]], list[np.ndarray]]  # units' bytes -> their token ids

STDLIB_EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
)
STDLIB_FILTER = (
    'the .py files under sysconfig.get_paths()["stdlib"], except those with a folder named '
    + ", ".join(sorted(STDLIB_EXCLUDED_DIRS))
    + " anywhere on their path"
)


# --------------------------------------------------------------------------- where things are


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


def stdlib_root() -> Path:
    """The running Python's standard library folder, the default corpus's root."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_stdlib_source(relpath: str) -> bool:
    """Whether a file at ``relpath`` (``/``-separated, relative to :func:`stdlib_root`) is
    in the default corpus: a ``.py`` file with no folder of :data:`STDLIB_EXCLUDED_DIRS` on
    its path.

    >>> is_stdlib_source("asyncio/events.py"), is_stdlib_source("unittest/test/test_case.py")
    (True, False)
    """
    *folders, name = relpath.split("/")
    return name.endswith(".py") and not STDLIB_EXCLUDED_DIRS.intersection(folders)


# --------------------------------------------------------------------------- finding the text


@dataclass(frozen=True)
class Document:
    """One usable text file."""

    relpath: str  # relative to the scanned root, "/"-separated; the file's name for a file
    path: Path
    nbytes: int
    sha256: str  # of the file's bytes


@dataclass(frozen=True)
class TextScan:
    """What :func:`scan_text` found: the documents in order, the skipped files, the digest."""

    name: str
    root: Path
    documents: tuple[Document, ...]
    skipped: tuple[str, ...]  # relative paths of the files that are not text
    sha256: str  # the corpus digest: paths, sizes and content hashes (module docstring)

    @property
    def total_bytes(self) -> int:
        return sum(document.nbytes for document in self.documents)


def scan_text(text: str | os.PathLike[str] | None = None) -> TextScan:
    """Find, check and hash the documents of ``text`` (a file or a folder; ``None``: the
    standard library, :data:`STDLIB_FILTER`). Reads every file once, a block at a time."""
    if text is None:
        root = stdlib_root()
        name = f"python{sys.version_info.major}.{sys.version_info.minor}-stdlib"
        candidates = _candidates(root, include=is_stdlib_source, prune=STDLIB_EXCLUDED_DIRS)
    else:
        if not isinstance(text, (str, os.PathLike)):
            raise PosencTypeError(f"text must be a path or None, got {type(text).__name__}")
        path = Path(text).expanduser()
        try:
            mode = path.stat().st_mode
        except OSError as error:
            raise PosencValueError(f"text path {str(path)!r}: {_reason(error)}") from None
        if stat.S_ISDIR(mode):
            root, candidates = path, _candidates(path)
        elif stat.S_ISREG(mode):
            root, candidates = path.parent, [(path.name, path)]
        else:
            raise PosencValueError(f"text path {str(path)!r} is neither a file nor a folder")
        name = path.resolve().name or str(path)

    documents: list[Document] = []
    skipped: list[str] = []
    digest = hashlib.sha256(b"posenc-corpus-1\n")
    for relpath, path in candidates:
        checked = _check_file(path)
        if checked is None:
            skipped.append(relpath)
            digest.update(b"S" + os.fsencode(relpath) + b"\n")
        elif checked[0] > 0:  # an empty file is neither a document nor skipped
            nbytes, sha = checked
            documents.append(Document(relpath, path, nbytes, sha))
            digest.update(b"D" + os.fsencode(relpath) + f"\0{nbytes}\0{sha}\n".encode())
    if not documents:
        where = f"text path {str(text)!r}" if text is not None else f"the stdlib at {root}"
        raise PosencValueError(
            f"{where} has no usable UTF-8 text: of {len(candidates)} files, {len(skipped)} "
            "are not text (not UTF-8, NUL bytes or not regular files) and the rest are empty"
        )
    return TextScan(name, root, tuple(documents), tuple(skipped), digest.hexdigest())


def _reason(error: OSError) -> str:
    return error.strerror or type(error).__name__


def _candidates(
    root: Path,
    include: Callable[[str], bool] | None = None,
    prune: frozenset[str] = frozenset(),
) -> list[tuple[str, Path]]:
    """``(relative path, path)`` of the files under ``root`` in sorted relative-path order,
    leaving out names that start with ``.``, folders named in ``prune`` (not even walked)
    and, with ``include``, relative paths it rejects. Symbolic links to folders are not
    followed (no cycles); links to files are files."""

    def fail(error: OSError) -> None:
        raise PosencValueError(f"text path {error.filename!r}: {_reason(error)}")

    found: list[tuple[str, Path]] = []
    for folder, subfolders, files in os.walk(root, onerror=fail):
        subfolders[:] = [
            name for name in subfolders if not name.startswith(".") and name not in prune
        ]
        base = Path(folder)
        for name in files:
            if name.startswith("."):
                continue
            relpath = (base / name).relative_to(root).as_posix()
            if include is None or include(relpath):
                found.append((relpath, base / name))
    found.sort(key=lambda item: item[0])
    return found


def _check_file(path: Path) -> tuple[int, str] | None:
    """``(bytes, sha256)`` of a UTF-8 text file (``bytes`` is 0 for an empty one); None for
    a file that is not text: not UTF-8, a NUL byte, or not a regular file."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return None
        decoder = codecs.getincrementaldecoder("utf-8")()
        digest = hashlib.sha256()
        nbytes = 0
        with open(path, "rb") as file:
            while block := file.read(READ_BLOCK_BYTES):
                if b"\0" in block:
                    return None
                decoder.decode(block)
                digest.update(block)
                nbytes += len(block)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return None
    except OSError as error:
        raise PosencValueError(f"text path {str(path)!r}: {_reason(error)}") from None
    return nbytes, digest.hexdigest()


# --------------------------------------------------------------------------- the split


def chunk_size(total_bytes: int) -> int:
    """``C``, the most bytes in one unit: ``clip(ceil(total / 200), 1 KiB, 1 MiB)``."""
    return min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, -(-total_bytes // MIN_UNITS)))


def unit_score(relpath: str, unit: int) -> float:
    """The stable number in ``[0, 1)`` that sends a unit to validation when it is below the
    validation fraction (sha256, never Python's salted ``hash``)."""
    digest = hashlib.sha256(os.fsencode(relpath) + b"\0" + str(unit).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def plan_split(
    documents: Sequence[Document], chunk_bytes: int, valid_fraction: float
) -> list[np.ndarray]:
    """For each document, a bool array over its ``ceil(nbytes / chunk_bytes)`` units, True
    for validation; both splits are non-empty when there are at least two units."""
    _check_fraction(valid_fraction)
    plan = []
    for document in documents:
        units = -(-document.nbytes // chunk_bytes)
        scores = [unit_score(document.relpath, unit) for unit in range(units)]
        plan.append(np.array(scores) < valid_fraction)
    if sum(len(units) for units in plan) < 2:
        raise PosencValueError(
            f"the text has {documents[0].nbytes} bytes in one document, too little to split "
            "into training and validation"
        )
    # Only a document's first unit is moved: it always holds at least one character.
    first = np.array([unit_score(document.relpath, 0) for document in documents])
    if not any(units.any() for units in plan):
        plan[int(first.argmin())][0] = True
    elif all(units.all() for units in plan):
        plan[int(first.argmax())][0] = False
    return plan


def _check_fraction(valid_fraction: float) -> None:
    if isinstance(valid_fraction, bool) or not isinstance(valid_fraction, (int, float)):
        raise PosencTypeError(
            f"valid_fraction must be a float, got {type(valid_fraction).__name__}"
        )
    if not 0.0 < valid_fraction < 1.0:
        raise PosencValueError(f"valid_fraction must be in (0, 1), got {valid_fraction!r}")


def read_units(document: Document, chunk_bytes: int) -> Iterator[bytes]:
    """The document's units in order: ``ceil(nbytes / chunk_bytes)`` pieces, the cut after
    unit ``i`` at byte ``(i + 1) * chunk_bytes`` moved back to the start of the UTF-8
    character there, so each unit is valid UTF-8 and none is empty. Raises if the file no
    longer matches the scan."""
    chunk_bytes = _check_int("chunk_bytes", chunk_bytes, 4)  # a character has <= 4 bytes
    units = -(-document.nbytes // chunk_bytes)
    digest = hashlib.sha256()
    try:
        with open(document.path, "rb") as file:
            carry = b""
            block = file.read(chunk_bytes)
            for unit in range(units):
                after = file.read(chunk_bytes) if unit + 1 < units else b""
                current = carry + block
                cut = len(current)
                if after and _is_continuation(after[0]):
                    while cut > 1 and _is_continuation(current[cut - 1]):
                        cut -= 1
                    cut -= 1  # the lead byte of the character that straddles the cut
                digest.update(current[:cut])
                yield current[:cut]
                carry, block = current[cut:], after
            if carry or file.read(1):
                raise _changed(document)
    except OSError as error:
        raise PosencValueError(f"text path {str(document.path)!r}: {_reason(error)}") from None
    if digest.hexdigest() != document.sha256:
        raise _changed(document)


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def _changed(document: Document) -> PosencValueError:
    return PosencValueError(
        f"text path {str(document.path)!r} changed while the corpus was being prepared"
    )


def _units(
    scan: TextScan, chunk_bytes: int, plan: list[np.ndarray]
) -> Iterator[tuple[Document, int, bool, bytes]]:
    """Every unit in (path, unit) order: ``(document, unit index, is validation, bytes)``."""
    for document, in_valid in zip(scan.documents, plan, strict=True):
        for unit, data in enumerate(read_units(document, chunk_bytes)):
            yield document, unit, bool(in_valid[unit]), data


# --------------------------------------------------------------------------- tokenizers


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


def _import_tokenizers(spec: str) -> Any:
    try:
        import tokenizers
    except ImportError:
        raise PosencValueError(
            f"tokenizer={spec!r} needs the tokenizers package: pip install tokenizers"
        ) from None
    return tokenizers


def _train_bpe(texts: Iterable[str], vocab_size: int, spec: str) -> Any:
    """A byte-level BPE (the 256 byte symbols plus merges) trained on ``texts``."""
    tokenizers = _import_tokenizers(spec)
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


def _bpe_token_table(tokenizer_json: Path) -> list[bytes]:
    """The bytes each token id of a saved byte-level BPE stands for."""
    vocab: dict[str, int] = json.loads(tokenizer_json.read_text("utf-8"))["model"]["vocab"]
    alphabet = byte_level_alphabet()
    table = [b""] * len(vocab)
    for token, index in vocab.items():
        table[index] = bytes(alphabet[char] for char in token)
    return table


def _token_dtype(kind: str, vocab_size: int) -> np.dtype:
    if kind == "bytes":
        return np.dtype(np.uint8)
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


# --------------------------------------------------------------------------- the corpus


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
    def train_bytes_per_token(self) -> float:
        return self.train_bytes / len(self.train)

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
        return _bpe_token_table(self.path / "tokenizer.json")

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
    _check_fraction(valid_fraction)
    key_fields: dict[str, Any] = {"format": CACHE_FORMAT, "tokenizer": tokenizer}
    if kind == "bpe":  # fail before reading the text; another version may train other merges
        key_fields["tokenizers"] = _import_tokenizers(tokenizer).__version__
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
        raise PosencValueError(f"cache {str(entry.parent)!r}: {_reason(error)}") from None
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
            f"cache {str(entry.parent)!r}: {_reason(error)} (set POSENC_CACHE_DIR to a "
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
        encode: Encoder = _encode_bytes
        token_bytes = np.ones(vocab_size, dtype=np.int64)
    else:
        train_texts = (
            data.decode("utf-8")
            for _, _, in_valid, data in _units(scan, chunk_bytes, plan)
            if not in_valid
        )
        bpe = _train_bpe(train_texts, vocab_size, spec)
        bpe.save(str(folder / "tokenizer.json"))
        vocab_size = bpe.get_vocab_size()
        encode = _bpe_encoder(bpe)
        table = _bpe_token_table(folder / "tokenizer.json")
        token_bytes = np.array([len(token) for token in table], dtype=np.int64)
    dtype = _token_dtype(kind, vocab_size)
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


def _encode_bytes(units: list[bytes]) -> list[np.ndarray]:
    return [np.frombuffer(data, dtype=np.uint8) for data in units]


def _bpe_encoder(bpe: Any) -> Encoder:
    def encode(units: list[bytes]) -> list[np.ndarray]:
        encodings = bpe.encode_batch([data.decode("utf-8") for data in units])
        return [np.array(encoding.ids, dtype=np.int64) for encoding in encodings]

    return encode


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
        for group in _batched(_units(scan, chunk_bytes, plan), BPE_ENCODE_BATCH_BYTES):
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


# --------------------------------------------------------------------------- windows


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PosencTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise PosencValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_lengths(name: str, lengths: Sequence[int]) -> list[int]:
    if isinstance(lengths, (int, np.integer)) or not isinstance(lengths, Sequence):
        raise PosencTypeError(f"{name} must be a sequence of ints, got {type(lengths).__name__}")
    if not lengths:
        raise PosencValueError(f"{name} must name at least one length, got {list(lengths)}")
    return [_check_int(name, length, 1) for length in lengths]


def train_batch(
    tokens: np.ndarray, step: int, batch_size: int, length: int, seed: int
) -> np.ndarray:
    """``batch_size`` windows of ``length + 1`` consecutive tokens at random starts, as int64
    ``(b, n + 1)``: inputs ``[:, :-1]``, targets ``[:, 1:]``.

    The starts are uniform over every window that fits and come from
    ``numpy.random.default_rng([seed, step])``, so the batch depends on its arguments only:
    a run resumed at ``step`` draws what it would have drawn (on the same numpy version).
    """
    step = _check_int("step", step, 0)
    batch_size = _check_int("batch_size", batch_size, 1)
    length = _check_int("length", length, 1)
    seed = _check_int("seed", seed, 0)
    if len(tokens) < length + 1:
        raise PosencValueError(
            f"length={length} needs at least {length + 1} tokens, the split has {len(tokens)}"
        )
    check_bytes("batch_size", batch_size, batch_size * (length + 1) * 8 * 2)
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(tokens) - length, size=batch_size)  # (b,)
    index = starts[:, None] + np.arange(length + 1)  # (b, n + 1)
    return np.asarray(tokens[index], dtype=np.int64)


def eval_budget(lengths: Sequence[int], available: int, *, max_tokens: int | None = None) -> int:
    """``T``, the number of validation tokens every length scores: the largest multiple of
    all ``lengths`` (of their least common multiple) with ``T + 1 <= available`` and, if
    given, ``T <= max_tokens``.

    >>> eval_budget([64, 128, 256], available=1000)
    768
    """
    lengths = _check_lengths("lengths", lengths)
    available = _check_int("available", available, 0)
    common = math.lcm(*lengths)
    limit = available - 1
    if max_tokens is not None:
        limit = min(limit, _check_int("max_tokens", max_tokens, 1))
    budget = max(limit, 0) // common * common
    if budget == 0:
        raise PosencValueError(
            f"lengths {lengths} share windows only in multiples of {common} tokens; "
            f"available={available} and max_tokens={max_tokens} leave room for none "
            f"(one needs {common + 1} tokens)"
        )
    return budget


def eval_windows(tokens: np.ndarray, length: int, num_tokens: int) -> np.ndarray:
    """The first ``num_tokens`` targets cut into non-overlapping windows of ``length``:
    ``(w, n + 1)`` with ``w = num_tokens / length``, row ``i`` = ``tokens[i*n : i*n + n + 1]``
    (inputs ``[:, :-1]``, targets ``[:, 1:]``).

    The targets of all rows together are ``tokens[1 : num_tokens + 1]`` for every length,
    so with ``num_tokens`` from :func:`eval_budget` every length scores the same tokens.
    Neighbouring rows share one token; the result is a read-only view (nothing is copied).
    """
    length = _check_int("length", length, 1)
    num_tokens = _check_int("num_tokens", num_tokens, 1)
    if num_tokens % length:
        raise PosencValueError(f"num_tokens ({num_tokens}) must be a multiple of length ({length})")
    if len(tokens) < num_tokens + 1:
        raise PosencValueError(
            f"num_tokens={num_tokens} needs {num_tokens + 1} tokens, the split has {len(tokens)}"
        )
    every_start = np.lib.stride_tricks.sliding_window_view(
        tokens[: num_tokens + 1], length + 1
    )  # (num_tokens - length + 1, n + 1), one row per start
    return every_start[::length]  # (w, n + 1), starts 0, n, 2n, ...


def check_lengths(
    corpus: Corpus, train_len: int, eval_lens: Sequence[int], *, min_eval_windows: int = 1
) -> None:
    """Raise :class:`~posenc.errors.PosencValueError` if ``corpus`` cannot train windows of
    ``train_len`` or score ``eval_lens`` on common tokens with at least ``min_eval_windows``
    windows of the longest length; the message says how many tokens are needed and how
    many there are."""
    train_len = _check_int("train_len", train_len, 1)
    eval_lens = _check_lengths("eval_lens", eval_lens)
    min_eval_windows = _check_int("min_eval_windows", min_eval_windows, 1)
    common = math.lcm(*eval_lens)
    scored = -(-min_eval_windows * max(eval_lens) // common) * common
    problems = []
    if len(corpus.train) < train_len + 1:
        problems.append(
            f"training at length {train_len} needs {train_len + 1} training tokens, "
            f"the training split has {len(corpus.train)}"
        )
    if len(corpus.valid) < scored + 1:
        problems.append(
            f"evaluating lengths {eval_lens} on the same {scored} tokens needs "
            f"{scored + 1} validation tokens, the validation split has {len(corpus.valid)}"
        )
    if problems:
        raise PosencValueError(
            f"corpus {corpus.name!r} ({corpus.tokenizer}) is too small: "
            + "; ".join(problems)
            + " (use more text, shorter lengths or a larger valid_fraction)"
        )


def bits_per_byte(loss_nats_per_token: float, num_tokens: int, num_bytes: int) -> float:
    """Convert a mean loss in nats per token over ``num_tokens`` tokens that stand for
    ``num_bytes`` bytes (:meth:`Corpus.count_bytes`) to bits per byte.

    >>> round(bits_per_byte(math.log(2), num_tokens=10, num_bytes=10), 6)
    1.0
    """
    if num_bytes <= 0:
        raise PosencValueError(f"num_bytes must be > 0, got {num_bytes}")
    return loss_nats_per_token / math.log(2) * num_tokens / num_bytes
