"""The docs stay true: docs/architecture.md's "add a scheme" example runs, in order, and the
scheme it registers appears in every surface it names; docs/multimodal.md's examples run as
written. The README, the docs and the benchmark notes name modules and files that exist, and so
do the package's docstrings' cross-references."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from posenc.app import cli
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


#: The current text (not the records: CHANGELOG, dated benchmark logs) that names modules
#: and files.
CURRENT = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CURRENT += sorted((ROOT / "benchmarks").glob("*.md"))
#: Where a path written in them may start: the repository, the package, its encodings.
PATH_ROOTS = (ROOT, ROOT / "src", ROOT / "src" / "posenc", ROOT / "src" / "posenc" / "encodings")


def resolves(dotted: str) -> bool:
    """Whether ``posenc.a.b.c`` is a module, or an attribute of one (an enum's member
    attribute counts: ``Route.eager``)."""
    import enum
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if isinstance(obj, enum.EnumMeta) and not hasattr(obj, name):
                obj = next(iter(obj))  # type: ignore[call-overload]
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_the_docs_name_modules_and_files_that_exist() -> None:
    """Every ``posenc.x.y`` and every path of the package or the repository (``src/...``,
    ``encodings/kernels/select.py``, ``benchmarks/gpu_scale.sh``) in backticks exists, so a
    move cannot leave the README and the docs pointing at nothing."""
    missing = []
    for doc in CURRENT:
        for code in re.findall(r"`([^`\n]+)`", doc.read_text()):
            for dotted in re.findall(r"\bposenc(?:\.[A-Za-z_]\w*)+", code):
                if not resolves(dotted):
                    missing.append(f"{doc.name}: {dotted}")
            for path in re.findall(r"(?<![\w./$~-])((?:[\w-]+/)+[\w.-]*\.(?:py|c|h|sh|md))", code):
                if not any((base / path).exists() for base in PATH_ROOTS):
                    missing.append(f"{doc.name}: {path}")
    assert not missing, missing


def test_docstrings_refer_to_what_exists() -> None:
    """Every ``:mod:``, ``:func:``, ``:class:``, ``:meth:``, ``:data:`` and ``:attr:`` of the
    package's docstrings that names a ``posenc`` object (absolutely or relative to its
    module) names one that exists."""
    package = ROOT / "src" / "posenc"
    missing = []
    for path in sorted(package.rglob("*.py")):
        parts = ["posenc", *path.relative_to(package).with_suffix("").parts]
        here = parts[:-1]  # the package a relative name starts from
        text = path.read_text()
        for target in re.findall(r":(?:mod|func|class|meth|data|attr):`~?([^`<>]+)`", text):
            if target.startswith("."):
                dots = len(target) - len(target.lstrip("."))
                target = ".".join([*here[: len(here) - dots + 1], target[dots:]])
            if target.startswith("posenc.") and not resolves(target):
                missing.append(f"{path.relative_to(package)}: {target}")
    assert not missing, missing


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
