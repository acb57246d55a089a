"""README.md stays true: its Python blocks run, and CI runs its test command verbatim."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)
SHELL = re.findall(r"```bash\n(.*?)```", README, flags=re.S)


def test_readme_has_code() -> None:
    assert len(BLOCKS) >= 2
    assert len(SHELL) == 2, "exactly two set-up commands"


def test_the_test_command_installs_the_pinned_versions() -> None:
    """The test extras come from constraints.txt, which pins every one of them (and what they
    bring) with ``==``, so the suite gives the same answer on any day."""
    assert "-c constraints.txt" in SHELL[1]
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not pinned with =="
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    pyproject = (ROOT / "pyproject.toml").read_text()
    extras = re.search(r"^peers = \[(.*?)^\]", pyproject, flags=re.S | re.M)
    tools = re.search(r"^test = \[(.*?)^\]", pyproject, flags=re.S | re.M)
    assert extras and tools
    named = re.findall(r'^\s*"([A-Za-z0-9_.-]+)', extras[1] + tools[1], flags=re.M)
    wanted = {re.sub(r"[-_.]+", "-", n).lower() for n in named} - {"posenc"}
    assert wanted and wanted <= set(pins), sorted(wanted - set(pins))
    assert pins["transformers"].startswith("5.24."), pins["transformers"]


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_python_block_runs(index: int) -> None:
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), {})


def test_ci_runs_the_readme_test_command() -> None:
    test_command = SHELL[1].strip()
    assert "pytest" in test_command
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()


def test_main_command_runs_the_tour() -> None:
    assert SHELL[0].strip().endswith("posenc tour")


def test_pictures_exist() -> None:
    for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README):
        assert (ROOT / target).is_file(), target
