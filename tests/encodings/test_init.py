"""posenc.encodings, the package ``__init__``: importing it registers every built-in scheme, and
it re-exports nothing (``posenc`` is the one facade). Every class the registry builds is
exported by ``posenc`` under its own name, as the object its family module defines, and every
name ``posenc`` takes from ``encodings`` is defined where it is imported from."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import posenc
import posenc.encodings as encodings


def test_the_package_registers_and_reexports_nothing() -> None:
    assert not hasattr(encodings, "__all__")
    names = {n for n in vars(encodings) if not n.startswith("_")}
    modules = {n for n in names if inspect.ismodule(getattr(encodings, n))}
    assert names == modules, sorted(names - modules)  # submodules only, no classes or functions
    assert {"rope", "alibi", "sinusoidal", "t5"} <= set(posenc.available())


def test_posenc_exports_each_encoding_name_from_its_home_module() -> None:
    for name in posenc.__all__:
        obj = getattr(posenc, name)
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__.startswith(
            "posenc.encodings."
        ):
            assert getattr(importlib.import_module(obj.__module__), obj.__name__) is obj, name


@pytest.mark.parametrize("name", posenc.available())
def test_every_registered_class_is_exported_under_its_name(name: str) -> None:
    cls = posenc.entry(name).cls
    assert cls.__name__ in posenc.__all__
    assert getattr(posenc, cls.__name__) is cls


def test_no_encodings_module_reexports() -> None:
    """A module's ``__all__`` lists only what it defines: an imported name in it would make the
    module a second facade beside ``posenc``."""
    root = Path(encodings.__file__).parent
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        defined: set[str] = set()
        listed: list[str] = []
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        defined.add(target.id)
                        if target.id == "__all__" and isinstance(node.value, ast.List | ast.Tuple):
                            listed = [e.value for e in node.value.elts]  # type: ignore[attr-defined]
        foreign = [name for name in listed if name not in defined]
        assert not foreign, f"{path.relative_to(root)} re-exports {foreign}"
