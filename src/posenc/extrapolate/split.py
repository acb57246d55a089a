"""The train/validation split of ``posenc extrapolate``: by document, and by chunk within
documents when there are few or very large ones.

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
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence

import numpy as np

from ..errors import PosencTypeError, PosencValueError
from .text import Document, TextScan, reason
from .windows import check_int

MIN_UNITS = 200  # the chunk size is chosen so that a corpus has at least this many units
MIN_CHUNK_BYTES = 1 << 10
MAX_CHUNK_BYTES = 1 << 20


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
    check_fraction(valid_fraction)
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


def check_fraction(valid_fraction: float) -> None:
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
    chunk_bytes = check_int("chunk_bytes", chunk_bytes, 4)  # a character has <= 4 bytes
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
        raise PosencValueError(f"text path {str(document.path)!r}: {reason(error)}") from None
    if digest.hexdigest() != document.sha256:
        raise _changed(document)


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def _changed(document: Document) -> PosencValueError:
    return PosencValueError(
        f"text path {str(document.path)!r} changed while the corpus was being prepared"
    )


def iter_units(
    scan: TextScan, chunk_bytes: int, plan: list[np.ndarray]
) -> Iterator[tuple[Document, int, bool, bytes]]:
    """Every unit in (path, unit) order: ``(document, unit index, is validation, bytes)``."""
    for document, in_valid in zip(scan.documents, plan, strict=True):
        for unit, data in enumerate(read_units(document, chunk_bytes)):
            yield document, unit, bool(in_valid[unit]), data
