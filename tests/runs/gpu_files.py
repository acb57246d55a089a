"""Checkpoint files as a run on a GPU writes them, made on a machine that may have none."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path


def as_if_written_on_a_gpu(path: Path) -> None:
    """Rewrite the checkpoint at ``path`` so that its tensors say they were saved from
    ``cuda:0``, as a checkpoint written by a run on a GPU does: ``torch.save`` records each
    storage's device as a string in the pickle (``'cpu'``, memoised once), which is
    replaced."""
    archive = zipfile.ZipFile(io.BytesIO(path.read_bytes()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as rewritten:
        for info in archive.infolist():
            data = archive.read(info)
            if info.filename.endswith("/data.pkl"):
                assert data.count(b"X\x03\x00\x00\x00cpu") == 1, "one memoised 'cpu'"
                data = data.replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
            rewritten.writestr(info, data)
    path.write_bytes(out.getvalue())
