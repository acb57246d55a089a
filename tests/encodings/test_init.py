"""posenc.encodings, the package ``__init__``: every name in ``__all__`` is there, once, and is
the object its family module defines; every class the registry builds is exported under its
own name, and ``posenc`` re-exports the package's names as the same objects."""

from __future__ import annotations

import importlib
import inspect

import pytest

import posenc
import posenc.encodings as encodings


def test_all_names_exist_once_and_come_from_a_family_module() -> None:
    assert len(set(encodings.__all__)) == len(encodings.__all__)
    for name in encodings.__all__:
        obj = getattr(encodings, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            module = importlib.import_module(obj.__module__)
            assert obj.__module__.startswith("posenc.encodings."), name
            assert getattr(module, obj.__name__) is obj, name


@pytest.mark.parametrize("name", posenc.available())
def test_every_registered_class_is_exported_under_its_name(name: str) -> None:
    cls = posenc.entry(name).cls
    assert cls.__name__ in encodings.__all__
    assert getattr(encodings, cls.__name__) is cls


def test_posenc_reexports_the_same_objects() -> None:
    shared = [name for name in encodings.__all__ if hasattr(posenc, name)]
    assert {"RotaryEmbedding", "ALiBi", "build", "available", "PositionalEncoding"} <= set(shared)
    for name in shared:
        assert getattr(posenc, name) is getattr(encodings, name), name
