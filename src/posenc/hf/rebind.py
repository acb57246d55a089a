"""A method's function rebuilt to read some names from a copy of its globals: how
:func:`~.patch.patch` makes an attention's ``forward`` call posenc's rotation without changing
its class or its modeling module."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from ..errors import PosencValueError

__all__ = ["copy_function", "rebound"]


def rebound(
    wrapper: Any, function: types.FunctionType, rotations: dict[str, Callable[..., Any]]
) -> Any:
    """``wrapper`` (a method's function, maybe decorated) rebuilt so that its innermost
    ``function`` reads the rotation functions named in ``rotations`` from a copy of its
    globals holding posenc's; decorators are rebuilt around it (their closures point to the
    new one)."""
    if wrapper is function:
        namespace = dict(function.__globals__, **rotations)
        # a code object of its own: torch.compile keeps its compiled code per code object and
        # puts what that code calls in the globals of the frame it compiled, so code shared
        # with the unpatched function would look in the other globals
        code = function.__code__.replace()
        return copy_function(function, namespace, function.__closure__, code)
    inner = wrapper.__wrapped__
    new_inner = rebound(inner, function, rotations)
    cells = wrapper.__closure__ or ()
    if not any(c.cell_contents is inner for c in cells):
        raise PosencValueError(
            f"cannot patch {function.__qualname__}: its decorator keeps the function where "
            "posenc cannot replace it"
        )
    closure = tuple(
        types.CellType(new_inner if c.cell_contents is inner else c.cell_contents) for c in cells
    )
    new = copy_function(wrapper, wrapper.__globals__, closure)
    new.__wrapped__ = new_inner
    return new


def copy_function(
    function: types.FunctionType,
    namespace: dict[str, Any],
    closure: Any,
    code: types.CodeType | None = None,
) -> types.FunctionType:
    new = types.FunctionType(
        code or function.__code__, namespace, function.__name__, function.__defaults__, closure
    )
    new.__kwdefaults__ = function.__kwdefaults__
    new.__dict__.update(function.__dict__)
    new.__qualname__ = function.__qualname__
    return new
