"""``posenc conformance --out DIR``: float64 RoPE tables that other runtimes test themselves
against (``docs/conformance.md``).

:func:`write_conformance` writes each case of
:func:`~posenc.app.conformance_cases.conformance_cases`
as ``NAME.safetensors`` (``inv_freq``, ``cos``, ``sin``, ``attention_factor`` in float64,
``positions`` in int64; the attention factor folded into cos and sin) and ``index.json`` (the
format's version, posenc's, the transformers release the cases were checked against, and per
case its settings, positions, layout, notes and the file's sha256). It writes the safetensors
format itself (:func:`safetensors_bytes`), so that ``safetensors`` is no dependency; the same
cases give the same bytes on every run.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

import posenc

from ..errors import PosencTypeError, PosencValueError
from ..hf.model_types import CHECKED_TRANSFORMERS_VERSION
from .conformance_cases import ConformanceCase, conformance_cases

__all__ = [
    "FORMAT_VERSION",
    "add_subcommand",
    "safetensors_bytes",
    "write_conformance",
]

#: The version of the file layout below (``index.json``'s ``version``).
FORMAT_VERSION = 1


# --------------------------------------------------------------------------- safetensors

_DTYPES = {torch.float64: ("F64", "<f8"), torch.int64: ("I64", "<i8")}


def safetensors_bytes(tensors: Mapping[str, Tensor], metadata: Mapping[str, str]) -> bytes:
    """``tensors`` (float64 or int64) as a safetensors file: an 8-byte little-endian header
    length, a JSON header (``dtype``, ``shape``, ``data_offsets`` per tensor, sorted by name,
    and ``__metadata__``) padded with spaces to a multiple of 8, then the little-endian bytes.
    The same input always gives the same bytes.

    >>> blob = safetensors_bytes({"x": torch.ones(2, dtype=torch.float64)}, {})
    >>> len(blob), blob[8:9]
    (80, b'{')
    """
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    chunks, offset = [], 0
    for name in sorted(tensors):
        tensor = tensors[name]
        if tensor.dtype not in _DTYPES:
            raise PosencTypeError(
                f"tensor {name!r}: dtype must be float64 or int64, got {tensor.dtype}"
            )
        code, layout = _DTYPES[tensor.dtype]
        data = np.ascontiguousarray(tensor.detach().cpu().numpy(), dtype=layout).tobytes()
        header[name] = {
            "dtype": code,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


# --------------------------------------------------------------------------- writing


def _select(names: Iterable[str] | None) -> list[ConformanceCase]:
    cases = conformance_cases()
    if names is None:
        return cases
    known = {case.name: case for case in cases}
    names = list(names)
    unknown = [name for name in names if name not in known]
    if unknown:
        raise PosencValueError(
            f"unknown conformance case(s) {', '.join(map(repr, unknown))}; known: "
            f"{', '.join(known)}"
        )
    wanted = set(names)
    return [case for case in cases if case.name in wanted]


def write_conformance(out: str | Path, names: Sequence[str] | None = None) -> dict[str, Any]:
    """Write the cases (``names``: those only, default all) to the folder ``out`` (made if
    missing): ``NAME.safetensors`` each, and ``index.json``. Returns the index. Raises
    :class:`~posenc.PosencValueError` for an unknown name or an ``out`` that is a file, before
    writing anything."""
    out = Path(out)
    cases = _select(names)
    if out.exists() and not out.is_dir():
        raise PosencValueError(f"out (--out) {str(out)!r} is a file, not a folder")
    built = [(case, case.tables()) for case in cases]  # every case is valid before any write
    out.mkdir(parents=True, exist_ok=True)
    entries = {}
    for case, tables in built:
        entry = case.entry(tables)
        metadata = {
            "format": "posenc-rope-conformance",
            "case": case.name,
            "layout": case.layout,
            "attention_factor": repr(entry["attention_factor"]),
            "attention_factor_folded": "true",
        }
        blob = safetensors_bytes(tables, metadata)
        (out / f"{case.name}.safetensors").write_bytes(blob)
        entries[case.name] = {
            "file": f"{case.name}.safetensors",
            "sha256": hashlib.sha256(blob).hexdigest(),
            **entry,
        }
    index = {
        "format": "posenc-rope-conformance",
        "version": FORMAT_VERSION,
        "posenc_version": posenc.__version__,
        "transformers_version": CHECKED_TRANSFORMERS_VERSION,
        "tables": "inv_freq (r/2,), cos and sin (n, r/2) = attention_factor * cos|sin(positions "
        "* inv_freq) in float64 (multimodal: each pair with its mrope_section row), "
        "attention_factor (), positions int64 (n,) or (3, n)",
        "cases": entries,
    }
    (out / "index.json").write_text(json.dumps(index, indent=2, ensure_ascii=False) + "\n")
    return index


# --------------------------------------------------------------------------- the command


def cmd_conformance(args: Any) -> int:
    if args.list:
        cases = _select(args.cases)
        width = max(len(case.name) for case in cases)
        for case in cases:
            print(f"{case.name:<{width}}  {case.note}")
        return 0
    if args.out is None:
        raise PosencValueError("posenc conformance needs --out DIR (or --list)")
    index = write_conformance(args.out, args.cases)
    print(f"wrote {len(index['cases'])} cases and index.json to {args.out}")
    return 0


def add_subcommand(sub: Any) -> None:
    p = sub.add_parser(
        "conformance",
        help="write float64 RoPE cos/sin tables that other runtimes can test against",
        description="For every registered rope type and the edges runtimes get wrong: "
        "inv_freq, cos, sin (attention factor folded in) and the attention factor in float64, "
        "one safetensors file per case, and DIR/index.json. See docs/conformance.md.",
    )
    p.add_argument("--out", metavar="DIR", default=None, help="folder to write (made if missing)")
    p.add_argument("--cases", nargs="+", metavar="NAME", default=None, help="only these cases")
    p.add_argument("--list", action="store_true", help="print the cases and what each checks")
    p.set_defaults(func=cmd_conformance)
