"""How each transformers family with multimodal RoPE (M-RoPE) states its layout in its config,
and the reading of those configs. The layouts themselves (which row turns which pair) are
:mod:`posenc.encodings.rotary.mrope_layouts`.

:data:`MROPE_LAYOUTS` records, for every ``model_type`` in
:data:`~.model_types.MROPE_MODEL_TYPES`, the layout its transformers code
uses, the ``mrope_section`` that code assumes where the config names none, whether its
channel pairs are interleaved, and how its config orders the sections;
:func:`read_multimodal` reads a config with it (checked against transformers 5.24,
``tests/encodings/rotary/test_multimodal.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..encodings.rope_types.registry import ntk_alpha_scaling
from ..encodings.rotary.mrope_layouts import check_mrope
from ..errors import PosencTypeError, PosencValueError

__all__ = ["MROPE_LAYOUTS", "MropeFamily", "read_multimodal"]


def _fixed(*section: int) -> Callable[[int], tuple[int, ...]]:
    return lambda rotary_dim: section


def _quarters(rotary_dim: int) -> tuple[int, ...]:
    return (rotary_dim // 4, rotary_dim // 4)


@dataclass(frozen=True)
class MropeFamily:
    """How one transformers family states its M-RoPE.

    Args:
        layout: the layout its ``recomposition_frequencies`` implements.
        default: the sections its code assumes where the config names none, from the rotary
            dim (``None``: its code needs the config's).
        interleaved: whether its channel pairs are ``(2i, 2i+1)`` (its ``rotate_half`` pairs
            ``x[0::2]`` with ``x[1::2]``); else the half layout.
        rows: how many position rows its code expands to (``None``: one per section).
        order: the config's ``mrope_section`` entry that each row takes (``None``: in order).
        keys: the keys of its RoPE dictionary that only M-RoPE reads (or that its code
            ignores); the rest of the dictionary is read as for any model.
        source: the modeling file checked.
        ntk_alpha: whether its rotary module reads ``dynamic`` with an ``alpha`` as NTK-alpha
            (HunYuan-VL, as the HunYuan text models do).
    """

    layout: str
    default: Callable[[int], tuple[int, ...]] | None
    interleaved: bool = False
    rows: int | None = 3
    order: tuple[int, ...] | None = None
    keys: frozenset[str] = field(default=frozenset({"mrope_section", "mrope_interleaved"}))
    source: str = ""
    ntk_alpha: bool = False


_QWEN2_VL = MropeFamily("blocked", _fixed(16, 24, 24), source="qwen2_vl/modeling_qwen2_vl.py")
_QWEN2_5_OMNI = MropeFamily(
    "blocked", _fixed(16, 24, 24), source="qwen2_5_omni/modeling_qwen2_5_omni.py"
)
_QWEN3_VL = MropeFamily("interleaved", _fixed(24, 20, 20), source="qwen3_vl/modeling_qwen3_vl.py")
_QWEN3_OMNI = MropeFamily(
    "interleaved",
    _fixed(24, 20, 20),
    keys=frozenset({"mrope_section", "mrope_interleaved", "interleaved"}),
    source="qwen3_omni_moe/modeling_qwen3_omni_moe.py",
)
_QWEN3_5 = MropeFamily("interleaved", _fixed(11, 11, 10), source="qwen3_5/modeling_qwen3_5.py")

#: Every ``model_type`` whose text rotary embedding is M-RoPE in transformers 5.24, with how
#: its code lays the sections out (read by :func:`read_multimodal`).
MROPE_LAYOUTS: dict[str, MropeFamily] = {
    "cohere_compass_text": MropeFamily(
        "interleaved", _fixed(24, 20, 20), source="cohere_compass/modeling_cohere_compass.py"
    ),
    "cosmos3_edge_text": MropeFamily(
        "interleaved", _fixed(24, 20, 20), source="cosmos3_edge/modeling_cosmos3_edge.py"
    ),
    # mrope_section is [h, w, t]; its frequencies are pre-permuted so that h and w alternate
    "ernie4_5_vl_moe_text": MropeFamily(
        "alternating",
        _fixed(22, 22, 20),
        interleaved=True,
        order=(2, 0, 1),
        source="ernie4_5_vl_moe/modeling_ernie4_5_vl_moe.py",
    ),
    "glm4v_moe_text": MropeFamily(
        "blocked", _fixed(8, 12, 12), source="glm4v_moe/modeling_glm4v_moe.py"
    ),
    "glm4v_text": MropeFamily(
        "blocked", _fixed(8, 12, 12), interleaved=True, source="glm4v/modeling_glm4v.py"
    ),
    "glm_image_text": MropeFamily(
        "blocked", _fixed(8, 12, 12), source="glm_image/modeling_glm_image.py"
    ),
    "glm_ocr_text": MropeFamily(
        "blocked", _fixed(8, 12, 12), interleaved=True, source="glm_ocr/modeling_glm_ocr.py"
    ),
    # any number of rows (the last three: width, height, image index); xdrope_section is the
    # checkpoints' old name, which its config class renames
    "hunyuan_vl_text": MropeFamily(
        "blocked-channels",
        None,
        rows=None,
        keys=frozenset({"mrope_section", "xdrope_section"}),
        source="hunyuan_vl/modeling_hunyuan_vl.py",
        ntk_alpha=True,
    ),
    "hy_v4_vl_text": MropeFamily(
        "interleaved",
        _fixed(24, 20, 20),
        interleaved=True,
        source="hy_v4_vl/modeling_hy_v4_vl.py",
    ),
    # two rows alternating over the pairs, [r/4, r/4]; no mrope_section key
    "neomme": MropeFamily(
        "interleaved", _quarters, rows=2, keys=frozenset(), source="neomme/modeling_neomme.py"
    ),
    "paddleocr_vl_text": MropeFamily(
        "blocked", _fixed(16, 24, 24), source="paddleocr_vl/modeling_paddleocr_vl.py"
    ),
    "qwen2_5_omni_talker": _QWEN2_5_OMNI,
    "qwen2_5_omni_text": _QWEN2_5_OMNI,
    "qwen2_5_omni_thinker": _QWEN2_5_OMNI,
    "qwen2_5_vl_text": MropeFamily(
        "blocked", _fixed(16, 24, 24), source="qwen2_5_vl/modeling_qwen2_5_vl.py"
    ),
    "qwen2_vl_text": _QWEN2_VL,
    "qwen3_5_moe_text": MropeFamily(
        "interleaved", _fixed(11, 11, 10), source="qwen3_5_moe/modeling_qwen3_5_moe.py"
    ),
    "qwen3_5_text": _QWEN3_5,
    "qwen3_omni_moe_talker_text": _QWEN3_OMNI,
    "qwen3_omni_moe_text": _QWEN3_OMNI,
    "qwen3_omni_moe_thinker": _QWEN3_OMNI,
    "qwen3_vl_moe_text": MropeFamily(
        "interleaved", _fixed(24, 20, 20), source="qwen3_vl_moe/modeling_qwen3_vl_moe.py"
    ),
    "qwen3_vl_text": _QWEN3_VL,
    "qwen4_exp_text": MropeFamily(
        "interleaved", _fixed(11, 11, 10), source="qwen4_exp/modeling_qwen4_exp.py"
    ),
}

#: Families whose config class renames ``rope_type="mrope"`` (plain frequencies) to
#: ``"default"`` on load.
_MROPE_TYPE_RENAMED = frozenset({"qwen2_vl_text", "qwen2_5_vl_text"})


def _text_view(raw: Any, family: MropeFamily, rename: bool) -> Any:
    """``raw`` as the generic RoPE reading of :mod:`~.config` is to see it: without the
    family's M-RoPE keys, ``model_type`` empty (no 1-D family's facts apply), the channel
    layout stated as ``rope_interleave``. A ``config.json`` dict gives a dict, a config
    object a :class:`_TextView` (whose per-layer views are views too)."""
    hidden: dict[str, Any] = {
        "model_type": "",
        "text_config": None,
        "rope_interleave": family.interleaved,
    }
    for name in ("rope_parameters", "rope_scaling"):
        value = _get(raw, name)
        if isinstance(value, Mapping):
            hidden[name] = _strip(value, family, rename)
    if isinstance(raw, Mapping):
        return {**raw, **hidden}
    return _TextView(raw, hidden, lambda inner: _text_view(inner, family, rename))


class _TextView:
    """A config object read through ``hidden`` (what :func:`_text_view` replaces); its
    ``per_layer_config[layer_type]`` (a heterogeneous config's view of one layer type) is
    given as ``view(that config)``."""

    def __init__(self, raw: Any, hidden: Mapping[str, Any], view: Callable[[Any], Any]) -> None:
        self._raw, self._hidden, self._view = raw, hidden, view

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._hidden:
            return self._hidden[name]
        value = getattr(self._raw, name, None)
        if name == "per_layer_config" and value is not None:
            return _PerLayer(value, self._view)
        return value


class _PerLayer:
    """``per_layer_config`` of a :class:`_TextView`: each layer type's config, viewed."""

    def __init__(self, inner: Any, view: Callable[[Any], Any]) -> None:
        self._inner, self._view = inner, view

    def __getitem__(self, layer_type: str) -> Any:
        return self._view(self._inner[layer_type])


def _strip(params: Mapping[str, Any], family: MropeFamily, rename: bool) -> dict[str, Any]:
    """``params`` without the family's M-RoPE keys (nested by layer type too)."""
    out = {}
    for key, value in params.items():
        if isinstance(value, Mapping):
            out[key] = _strip(value, family, rename)
        elif key not in family.keys:
            out[key] = value
    for key in ("rope_type", "type"):
        if rename and out.get(key) == "mrope":
            out[key] = "default"
    return ntk_alpha_scaling(out) if family.ntk_alpha else out


def _get(raw: Any, name: str) -> Any:
    return raw.get(name) if isinstance(raw, Mapping) else getattr(raw, name, None)


def _config_section(
    field_name: str, params: Mapping[str, Any], family: MropeFamily
) -> list[Any] | None:
    """The config's own sections (``None`` where it names none), in the family's order."""
    section = params.get("mrope_section") if "mrope_section" in family.keys else None
    legacy = params.get("xdrope_section") if "xdrope_section" in family.keys else None
    if section is not None and legacy is not None and list(section) != list(legacy):
        raise PosencValueError(
            f"config {field_name} has mrope_section={section!r} and xdrope_section={legacy!r}, "
            "which differ"
        )
    section = legacy if section is None else section
    if section is None:
        return None
    if isinstance(section, (str, bytes)) or not isinstance(section, Sequence):
        raise PosencTypeError(
            f"config {field_name}['mrope_section'] must be a list, got {section!r}"
        )
    values = [int(v) if isinstance(v, float) and v.is_integer() else v for v in section]
    if family.order is not None and len(values) != len(family.order):
        raise PosencValueError(
            f"config {field_name}['mrope_section'] must have {len(family.order)} entries, "
            f"got {section!r}"
        )
    return values


def read_multimodal(
    raw: Any, model_type: str, layer_type: str | None
) -> tuple[Any, Callable[[dict[str, Any]], dict[str, Any]]]:
    """Read a config of an M-RoPE ``model_type`` (a key of :data:`MROPE_LAYOUTS`).

    Returns a view of ``raw`` without its M-RoPE keys, whose shared fields (head and rotary
    dimensions, base, scaling) :func:`~.config.rotary_arguments_from_hf_config` reads as
    for any model, and a function completing those arguments with ``mrope_section`` (in row
    order, the family's default where the config names none) and ``mrope_layout``. Raises
    :class:`~posenc.errors.PosencValueError` naming the field for sections the family's code
    would not run with, or would run differently from what the sections say.
    """
    family = MROPE_LAYOUTS[model_type]
    field_name, params = "rope_parameters", {}
    for name in ("rope_parameters", "rope_scaling"):
        value = _get(raw, name)
        if isinstance(value, Mapping) and value and not params:
            field_name, params = name, value
    if layer_type is not None and isinstance(params.get(layer_type), Mapping):
        field_name, params = f"{field_name}[{layer_type!r}]", params[layer_type]
    section = _config_section(field_name, params, family)

    def complete(arguments: dict[str, Any]) -> dict[str, Any]:
        rotary_dim = arguments["rotary_dim"]
        chosen = section
        if chosen is None:
            if family.default is None:
                raise PosencValueError(
                    f"config of model_type {model_type!r} names no {field_name}['mrope_section'] "
                    f"(transformers' {family.source} needs it: one count per position row)"
                )
            chosen = family.default(rotary_dim)
        label = f"config {field_name}['mrope_section']"
        if family.order is not None:  # in row order
            if section is not None:
                label = f"{label} {list(chosen)!r} in row order"
            chosen = [chosen[i] for i in family.order]
        if family.rows is not None and len(chosen) != family.rows:
            raise PosencValueError(
                f"{label} must have {family.rows} entries for model_type {model_type!r} (its "
                f"code expands positions to {family.rows} rows), got {list(chosen)!r}"
            )
        if family.layout == "alternating" and arguments["scaling"] is not None:
            raise PosencValueError(
                f"config {field_name} of model_type {model_type!r} has rope_type "
                f"{arguments['scaling'].get('rope_type')!r}: its code ({family.source}) takes the "
                "default rope type only"
            )
        if family.default is _quarters and rotary_dim % 4:
            raise PosencValueError(
                f"config of model_type {model_type!r} has rotary_dim={rotary_dim}: its two "
                "alternating rows need a multiple of 4"
            )
        chosen = check_mrope(chosen, family.layout, rotary_dim, name=label)
        return {**arguments, "mrope_section": list(chosen), "mrope_layout": family.layout}

    return _text_view(raw, family, model_type in _MROPE_TYPE_RENAMED), complete
