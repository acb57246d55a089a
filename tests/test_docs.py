"""The docs stay true: docs/architecture.md's "add a scheme" example runs, in order, and the
scheme it registers appears in every surface it names; docs/multimodal.md's examples run as
written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from posenc import cli
from posenc.encodings.registry import _unregister, available

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", ARCHITECTURE, flags=re.S)
MULTIMODAL = (ROOT / "docs" / "multimodal.md").read_text()
MULTIMODAL_BLOCKS = re.findall(r"```python\n(.*?)```", MULTIMODAL, flags=re.S)


@pytest.mark.slow
def test_add_a_scheme_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert len(BLOCKS) == 2
    monkeypatch.chdir(tmp_path)
    statuses: list[int] = []
    original = cli.main

    def checked(argv: list[str]) -> int:  # the example's commands must all succeed
        statuses.append(original(argv))
        return statuses[-1]

    monkeypatch.setattr(cli, "main", checked)
    namespace: dict[str, object] = {}
    try:
        for index, block in enumerate(BLOCKS):
            exec(compile(block, f"docs/architecture.md block {index}", "exec"), namespace)
        assert statuses == [0, 0, 0, 0]
        assert "learned-slope" in available("bias")
        out = capsys.readouterr().out
        assert "torch.Size([2, 10, 32])" in out
        assert re.search(r"learned-slope\s+bias", out), out
        assert (tmp_path / "learned-slope.png").stat().st_size > 1000
        assert "learned-slope" in (tmp_path / "learned-slope.html").read_text()
    finally:
        if "learned-slope" in available():
            _unregister("learned-slope")


@pytest.mark.parametrize("index", range(len(MULTIMODAL_BLOCKS)))
def test_multimodal_block_runs(index: int) -> None:
    """Each block alone, as a reader pastes it (the padded-batch one passed ``attention_mask=``
    with ``cache_length=``, which is refused)."""
    assert len(MULTIMODAL_BLOCKS) == 3
    exec(compile(MULTIMODAL_BLOCKS[index], f"docs/multimodal.md block {index}", "exec"), {})


def test_multimodal_doc_says_what_is_refused() -> None:
    import torch

    import posenc

    assert "*instead of* `cache_length=` (the two together are refused)" in MULTIMODAL
    with pytest.raises(ValueError, match="exactly one of cache_length and attention_mask"):
        posenc.continue_multimodal_positions(
            torch.tensor([[-3]]), 1, cache_length=11, attention_mask=torch.ones(1, 12)
        )
