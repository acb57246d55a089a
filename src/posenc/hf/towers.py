"""Which rotary modules and attentions of a transformers model are a vision tower's, which
:func:`~.patch.patch` leaves as they are: a vision-language model's text is patched alone."""

from __future__ import annotations

from torch import nn

__all__ = ["in_tower", "is_vision_tower"]


def is_vision_tower(module: nn.Module) -> bool:
    """Whether a rotary module is a vision tower's (transformers' ``rope_type`` ``"axial"``, or
    a class named ``*Vision*``): :func:`~.patch.patch` leaves it, and the attentions it serves, as
    they are."""
    config = getattr(module, "config", None)
    parameters = getattr(config, "rope_parameters", None)
    kind = parameters.get("rope_type") if isinstance(parameters, dict) else None
    return "axial" in (kind, getattr(module, "rope_type", None)) or (
        "Vision" in type(module).__name__
    )


def in_tower(path: str, rotaries: list[str], towers: set[str]) -> bool:
    """Whether the module at ``path`` sits in a vision tower: the nearest module above it that
    holds rotary modules (``rotaries``, their paths) holds only vision towers'."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, -1, -1):
        above = ".".join(parts[:cut])
        inside = [r for r in rotaries if not above or r.startswith(above + ".")]
        if inside:
            return all(r in towers for r in inside)
    return False
