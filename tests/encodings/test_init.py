"""posenc.encodings, the package ``__init__``: importing it registers every built-in scheme, and
it re-exports nothing (``posenc`` is the one facade). Every class the registry builds is
exported by ``posenc`` under its own name, as the object its family module defines, and every
name ``posenc`` takes from ``encodings`` is defined where it is imported from (that no other
module re-exports is ``tests/test_layers.py``'s)."""

from __future__ import annotations

import importlib
import inspect

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
