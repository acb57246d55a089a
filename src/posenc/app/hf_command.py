"""``posenc hf CONFIG.json``: a model's position schedule as a table, read from its transformers
``config.json`` without allocating a weight (the rotary modules are made on the ``meta``
device). What a person porting a model needs to see first: which layers rotate, with which θ
and scaling, over how many dimensions and in which layout, which read a window or a chunk,
which scale their queries, and what each attention does to its scores: learned sinks,
soft-capping, the softmax scale.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from ..errors import PosencValueError
from ..hf.schedule import ModelSchedule, build_from_schedule, read_schedule
from ..model.encoder import Encoder

__all__ = ["add_subcommand", "schedule_table"]

COLUMNS = (
    "layer",
    "attention",
    "window/chunk",
    "rope",
    "θ",
    "factor",
    "rotated",
    "layout",
    "temperature",
    "sinks",
    "softcap",
    "scale",
)


def _scores(layer: Any, head_dim: int) -> list[str]:
    """The sinks, soft-cap and softmax scale columns (``1/√d`` where the scale is the
    default)."""
    scale = f"1/√{head_dim}" if layer.softmax_scale is None else f"{layer.softmax_scale:.6g}"
    softcap = "-" if layer.softcap is None else f"{layer.softcap:g}"
    return ["yes" if layer.sinks else "-", softcap, scale]


def _row(index: int, layer: Any, head_dim: int) -> list[str]:
    return _positions(index, layer) + _scores(layer, head_dim)


def _positions(index: int, layer: Any) -> list[str]:
    pe = layer.pe
    reach = (
        f"window {layer.window}"
        if layer.window is not None
        else f"chunk {layer.chunk}"
        if layer.chunk is not None
        else "-"
    )
    temperature = "-"
    if layer.query_scale is not None:
        s = layer.query_scale
        temperature = f"1+{s.scale:g}·log(1+⌊(p+{s.offset:g})/{s.floor:g}⌋)"
    if pe is None:
        return [str(index), layer.kind, reach, "none (NoPE)", "-", "-", "-", "-", temperature]
    scaling = dict(getattr(pe, "scaling", {}) or {})
    factor = scaling.get("factor")
    head_dim = getattr(pe, "head_dim", None)
    rotated = f"{pe.rotary_dim}/{head_dim}" if head_dim else str(pe.rotary_dim)
    layout = "interleaved" if getattr(pe, "interleaved", False) else "half"
    if getattr(pe, "mrope_section", None):  # multimodal RoPE: the pairs each position row takes
        layout += f", M-RoPE {pe.mrope_layout} {list(pe.mrope_section)}"
    if factor is None and scaling.get("alpha") is not None:  # NTK-alpha (HunYuan)
        factor = f"α {scaling['alpha']:g}"
    elif factor is not None:
        factor = f"{factor:g}"
    return [
        str(index),
        layer.kind,
        reach,
        str(scaling.get("rope_type", "default")),
        f"{pe.base:g}",
        "-" if factor is None else factor,
        rotated,
        layout,
        temperature,
    ]


def schedule_table(schedule: ModelSchedule) -> str:
    """The schedule as a Markdown table, under a line naming the model's sizes (and whether
    it attends both ways) and one saying how the config was read: the transformers config
    class and version (and the sizes its defaults gave), or posenc's own rules and why."""
    rows = [list(COLUMNS)]
    rows += [_row(i, layer, schedule.head_dim) for i, layer in enumerate(schedule.layers)]
    widths = [max(len(row[c]) for row in rows) for c in range(len(COLUMNS))]

    def line(row: list[str]) -> str:
        return "| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |"

    head = (
        f"{schedule.model_type or 'model'}: {len(schedule.layers)} layers, hidden "
        f"{schedule.hidden_size}, {schedule.num_heads} heads ({schedule.num_kv_heads} "
        f"key/value) of {schedule.head_dim}{'' if schedule.causal else ', bidirectional'}"
    )
    via = f"read through {schedule.via}" if schedule.via else ""
    if schedule.defaulted:  # sizes the file leaves out, as transformers fills them
        via += f"; its defaults give {', '.join(schedule.defaulted)}"
    rule = "| " + " | ".join("-" * w for w in widths) + " |"
    lines = [head, *([via] if via else []), "", line(rows[0]), rule]
    return "\n".join([*lines, *(line(row) for row in rows[1:])])


def cmd_hf(args: argparse.Namespace) -> int:
    path = Path(args.config)
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise PosencValueError(f"{path} is not JSON: {error}") from error
    if not isinstance(config, dict):
        raise PosencValueError(f"{path} must hold a JSON object, got {type(config).__name__}")
    with torch.device("meta"):  # tables shaped, nothing allocated
        schedule = read_schedule(config)
    # the encoder that from_hf_config would build: what it refuses is refused here too
    build_from_schedule(Encoder, schedule, device="meta")
    print(schedule_table(schedule))
    return 0


def add_subcommand(sub: Any) -> None:
    p = sub.add_parser(
        "hf",
        help="print a transformers model's position schedule from its config.json",
        description="Each layer's attention kind, window or chunk, RoPE type, θ, scaling "
        "factor, rotated dimensions, layout, query temperature, sinks, soft-cap and softmax "
        "scale, read from a transformers "
        "config.json as posenc's Encoder.from_hf_config builds it: through the config class "
        "transformers has for its model_type, so that derived fields and defaults are "
        "transformers' own (POSENC_HF_CONFIG_CLASS=0: posenc's own rules). Allocates no "
        "weights.",
    )
    p.add_argument("config", metavar="CONFIG.json", help="a transformers config.json")
    p.set_defaults(func=cmd_hf)
