"""Per-layer position schedules as both training commands write them: ``--pe rope/rope/rope/none``.

A *schedule* is registry names joined by ``/``, one per layer of a pattern that is repeated to
the model's depth and cut there: ``rope/rope/rope/none`` is Llama 4's 3:1 interleave of RoPE
and NoPE layers (Meta 2025), and a depth of 8 gives two patterns; ``rope/rope/rope/none`` at
depth 3 is three RoPE layers. A NoPE entry may carry Llama 4's query temperature,
``none:temp`` (``attn_temperature_tuning``: queries at position ``p`` times ``1 + 0.1 ·
log(1 + floor((p + 1) / F))``, :meth:`posenc.QueryScale.llama4`), with its floor ``F`` the
training length rather than Llama 4's 8,192: at 8,192 the factor is exactly 1 at every
position below 8,191, so a model trained at L = 256 and scored to 16L would never see it.
The syntax uses none of ``+`` (the whole model's position modifiers, ``+random``,
``+coupled``, which follow the schedule), ``,`` (between the sweep's encodings) or ``/``.

A single name (``rope``) is no schedule: its ``pe_options`` are that encoding's keyword
arguments, as before. A schedule's ``pe_options`` are a table per entry name
(``{"rope": {"base": 500000.0}}``), applied to every entry of that name; equal names share one
module, as :func:`posenc.encodings.schedule.resolve_schedule` does. Additive encodings act on the
input,
not on a layer, so they cannot be entries of a schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..attention.query_scale import QueryScale
from ..errors import PosencTypeError, PosencValueError

#: Joins the entries of a schedule.
SEPARATOR = "/"
#: What a NoPE entry carries to have Llama 4's query temperature (``none:temp``).
TEMPERATURE = "temp"
#: Llama 4's ``attn_scale`` (its config's default, transformers' ``Llama4TextConfig``).
LLAMA4_ATTN_SCALE = 0.1


@dataclass(frozen=True)
class LayerEntry:
    """One entry of a schedule: a registry name and, on a NoPE entry, the temperature."""

    name: str
    tempered: bool = False


def is_schedule(pe: str) -> bool:
    """Whether ``pe`` is written as a schedule (entries, or a tempered NoPE), not one name."""
    return SEPARATOR in pe or ":" in pe


def parse_schedule(text: str) -> list[LayerEntry]:
    """``"rope/rope/rope/none:temp"`` -> its pattern's entries; each name checked against the
    registry. Errors name the entry at fault."""
    from ..encodings.registry import entry

    if not isinstance(text, str):
        raise PosencTypeError(f"pe must be a string, got {text!r}")
    entries = []
    parts = text.split(SEPARATOR)
    for i, raw in enumerate(parts):
        where = f"pe {text!r}" + (f", entry {i + 1} ({raw.strip()!r})" if len(parts) > 1 else "")
        name, colon, mark = raw.strip().partition(":")
        if not name:
            raise PosencValueError(f"{where}: an empty entry (write NAME/NAME/..., e.g. rope/none)")
        if colon and name != "none":
            raise PosencValueError(
                f"{where}: only a NoPE entry may carry Llama 4's query temperature, written "
                f"'none:{TEMPERATURE}'"
            )
        if colon and mark != TEMPERATURE:
            raise PosencValueError(
                f"{where}: unknown mark {colon + mark!r} (a NoPE entry takes only "
                f"':{TEMPERATURE}', Llama 4's query temperature)"
            )
        try:
            found = entry(name)
        except ValueError as exc:
            raise PosencValueError(f"{where}: {exc}") from None
        if is_schedule(text) and found.family == "additive":
            raise PosencValueError(
                f"{where}: {name!r} is additive (it acts on the input, not on a layer), so it "
                "can only be a model's single pe, not an entry of a schedule"
            )
        if getattr(found.cls, "axes", 1) != 1:
            raise PosencValueError(
                f"{where}: {name!r} encodes N-D coordinates, not sequence positions"
            )
        entries.append(LayerEntry(name, bool(colon)))
    return entries


def schedule_names(pe: str) -> list[str]:
    """The distinct registry names of ``pe`` (one name, or a schedule's), in order."""
    return list(dict.fromkeys(e.name for e in parse_schedule(pe)))


def layer_entries(pe: str, depth: int) -> list[LayerEntry]:
    """The entry of each of ``depth`` layers: the pattern repeated and cut at ``depth``."""
    pattern = parse_schedule(pe)
    return [pattern[i % len(pattern)] for i in range(depth)]


def entry_options(pe: str, options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Keyword arguments by entry name: a single name's ``options`` are its own, a
    schedule's are a table per name (see the module docstring)."""
    if not is_schedule(pe):
        return {pe: dict(options)}
    names = schedule_names(pe)
    for name, table in options.items():
        if name not in names:
            raise PosencValueError(f"pe {pe!r}: options for {name!r}, which it does not use")
        if not isinstance(table, dict):
            raise PosencTypeError(f"pe {pe!r}: options for {name!r} must be a table, got {table!r}")
    return {name: dict(options.get(name, {})) for name in names}


def query_temperature(trained_length: int) -> QueryScale:
    """Llama 4's NoPE-layer temperature with its floor at the training length."""
    return QueryScale.llama4(attn_scale=LLAMA4_ATTN_SCALE, floor_scale=trained_length)


def model_kwargs(
    pe: str,
    options: dict[str, Any],
    *,
    dim: int,
    heads: int,
    depth: int,
    causal: bool,
    trained_length: int | None,
) -> dict[str, Any]:
    """The ``pe``, ``pe_kwargs`` and ``query_scale`` keywords of ``TransformerModel`` for a
    run's ``pe`` (a name or a schedule) and its ``options``; a schedule's entries are built
    here, one module per distinct name (with the scheme's causal defaults when ``causal``);
    ``trained_length`` is the floor of a tempered entry's temperature."""
    if not is_schedule(pe):
        return {"pe": pe, "pe_kwargs": dict(options) or None}
    from ..encodings.schedule import resolve_pe

    by_name = entry_options(pe, options)
    modules = {
        name: resolve_pe(name, dim, heads, causal=causal, pe_kwargs=kwargs)
        for name, kwargs in by_name.items()
    }
    layers = layer_entries(pe, depth)
    tempered = any(e.tempered for e in layers)
    if tempered and trained_length is None:
        raise PosencValueError(f"pe {pe!r}: a tempered NoPE entry needs the training length")
    scale = query_temperature(trained_length) if tempered else None  # type: ignore[arg-type]
    return {
        "pe": [modules[e.name] for e in layers],
        "query_scale": [scale if e.tempered else None for e in layers],
    }
