"""The RoPE census: every rotary embedding of the installed transformers, rotated by its own code
and by ``posenc.RotaryEmbedding.from_hf_config``.

What is swept is found from transformers' source, not from a list: every
``transformers/models/*/modeling_*.py`` defining a ``class *RotaryEmbedding(``, every such class,
and every config class its folder builds it from (the ``config`` annotation of the class whose
``__init__`` instantiates it, or ``config.text_config`` of it where the call says so). For each
(rotary class, config class), and per layer type where the config nests its RoPE parameters by
layer type:

1. the config class with its defaults (every RoPE field as the class sets it; only the rotary
   module is built, so no size needs shrinking), with :data:`CONFIG_FIXES` where the defaults
   do not run in transformers' own code, plus the :data:`CONFIG_VARIANTS` that checkpoints use
   where the defaults describe no RoPE;
2. the family's own rotary module gives its tables for positions 100..131 (row 0) and 0..31
   (row 1), as ``(b, n)`` position ids, or for multimodal RoPE as ``(rows, b, n)`` with rows
   that all differ (:func:`multimodal_positions`; the rows as the rotary module expands them);
3. random q (4 heads) and k (2 heads) are rotated with the folder's own apply function, the way
   its attention calls it (an :class:`Adapter`: :data:`ADAPTERS` names the families that do not
   call ``apply_rotary_pos_emb(query_states, key_states, cos, sin)`` on whole ``(b, h, n, d)``
   heads; each adapter names the call it reproduces, and that call must be in the modeling
   source, so a family whose attention changes is noticed);
4. ``RotaryEmbedding.from_hf_config(config, layer_type=...)`` rotates the same q, k by the
   same positions (the same ``(rows, b, n)`` tensor for multimodal RoPE);
5. the family is classified (:class:`Result`): ``exact`` (``max|a - b| / max|b| <= 2e-5`` over
   the whole q and k), ``refused`` (posenc raised ``PosencValueError``/``PosencTypeError``),
   ``not a sequence`` (on the caller's list: vision towers, image matching, ...), ``wrong``
   (posenc built a module whose rotation differs, or that cannot take these q, k) or
   ``crashed`` (posenc or the harness raised something else).

``tests/hf/test_rope_census.py`` holds the expectations (which families are refused, and
why; which are not a sequence) and checks them; ``python -m tests.hf.census`` prints the
per-family table as Markdown.

Dimension legend: ``b`` batch (2), ``h`` heads (4 for q, 2 for k), ``n`` positions (32),
``d`` the head (or rotated slice) the family's apply function receives.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from posenc import RotaryEmbedding
from posenc.errors import PosencError, PosencTypeError, PosencValueError

#: The transformers release the expectations were last checked against.
PINNED_TRANSFORMERS = "5.24.0"

#: ``max|posenc - family| / max|family|`` over the whole q and k: transformers forms its angles
#: in float32 (position * inv_freq), posenc in float64; at positions ~130 they differ by
#: ~130 * 2**-24 ~ 8e-6 rad.
TOLERANCE = 2e-5

EXACT, NO_ROPE, REFUSED, NOT_SEQUENCE, WRONG, CRASHED = (  # the classes
    "exact",
    "no rotation",  # the config's attention does not rotate, and posenc says so
    "refused",
    "not a sequence",
    "wrong",
    "crashed",
)
KINDS = (EXACT, NO_ROPE, REFUSED, NOT_SEQUENCE, WRONG, CRASHED)
#: What posenc's refusal says when a config describes no rotation at all (as opposed to one
#: posenc cannot express).
NO_ROTATION_WORDS = ("describes no rotary embedding", "not rotary embeddings")

HEADS_Q, HEADS_K, LENGTH = 4, 2, 32
#: (b=2, n=32): one row at an offset of 100, one from 0
POSITIONS = torch.stack((torch.arange(100, 100 + LENGTH), torch.arange(LENGTH)))


def multimodal_positions(rows: int) -> Tensor:
    """``(rows, b, n)`` position ids: row 0 is :data:`POSITIONS` (t), each later row (h, w,
    ...) another pattern below 127, so that a reading that used one row for every axis, or
    swapped two, cannot match."""
    later = [(POSITIONS * (2 * row + 1) + 5 * row) % 127 for row in range(1, rows)]
    return torch.stack([POSITIONS, *later])


# --------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class Site:
    """One rotary class of one modeling file, and a config class its folder builds it from."""

    folder: str  # "llama"
    module: ModuleType  # transformers.models.llama.modeling_llama
    rotary: str  # "LlamaRotaryEmbedding"
    config_class: type


ROTARY_CLASS = re.compile(r"^class (\w+RotaryEmbedding)\(", re.M)
_CLASS = re.compile(r"^class (\w+)\(", re.M)


def _config_annotation(function: Any) -> type | None:
    """The annotation of the first parameter after ``self`` of ``function`` (``config``,
    ``atom_config``, ...), when it is one config class."""
    from transformers import PretrainedConfig

    try:
        parameters = list(inspect.signature(function).parameters.values())[1:2]
    except (TypeError, ValueError):
        return None
    annotation = parameters[0].annotation if parameters else None
    is_config = isinstance(annotation, type) and issubclass(annotation, PretrainedConfig)
    return annotation if is_config else None


@functools.cache
def modeling_files() -> list[Path]:
    """Every ``modeling_*.py`` of the installed transformers that defines a rotary class."""
    import transformers

    models = Path(transformers.__file__).parent / "models"
    return [
        path
        for path in sorted(models.glob("*/modeling_*.py"))
        if ROTARY_CLASS.search(path.read_text())
    ]


def discover(
    paths: Iterable[Path] | None = None, failed: dict[str, str] | None = None
) -> list[Site]:
    """The (rotary class, config class) pairs of ``paths`` (default: :func:`modeling_files`),
    read from where the modeling code instantiates each rotary class: the config class is the
    instantiating class's ``config`` annotation (the class of its attribute where the call
    passes ``config.text_config``), else (another argument, an annotation that is no config
    class) the rotary class's own annotation; :data:`CONFIG_CLASSES` overrides. A modeling
    module that does not import is left out, and named in ``failed`` (folder -> error)."""
    sites: dict[tuple[str, type], Site] = {}
    for path in modeling_files() if paths is None else paths:
        source = path.read_text()
        try:
            module = importlib.import_module(f"transformers.models.{path.parent.name}.{path.stem}")
        except Exception as error:  # a missing optional dependency, say
            if failed is None:
                raise
            failed[path.parent.name] = _short(error)
            continue
        classes = [(m.start(), m.group(1)) for m in _CLASS.finditer(source)]
        for rotary in ROTARY_CLASS.findall(source):
            own = _config_annotation(getattr(module, rotary).__init__)
            call = re.compile(rf"\b{rotary}\((?:config=)?(self\.config|config)?([.\w]*)")
            for found in call.finditer(source):
                owner = [name for start, name in classes if start < found.start()][-1]
                if owner == rotary:
                    continue
                annotated = _config_annotation(getattr(module, owner).__init__)
                if found.group(1) is None or annotated is None:
                    config_class, attribute = own, ""  # atom_config, theta_config, ...
                else:
                    config_class, attribute = annotated, found.group(2).lstrip(".")
                if config_class is None:
                    continue
                if attribute:
                    config_class = type(getattr(config_class(), attribute))
                for built_from in _overridden(module, rotary, config_class):
                    site = Site(path.parent.name, module, rotary, built_from)
                    sites.setdefault((rotary, built_from), site)
    return list(sites.values())


def _overridden(module: ModuleType, rotary: str, config_class: type) -> list[type]:
    """``config_class`` and its subclasses of the same folder with a model type of their own
    (Mimi's encoder and decoder configs build the same transformer), or the classes
    :data:`CONFIG_CLASSES` names for ``rotary``."""
    package = module.__name__.rsplit(".", 1)[0]
    if rotary in CONFIG_CLASSES:
        return [getattr(importlib.import_module(package), n) for n in CONFIG_CLASSES[rotary]]
    subclasses = [
        sub
        for sub in config_class.__subclasses__()
        if sub.__module__.startswith(package + ".") and sub.model_type != config_class.model_type
    ]
    return [config_class, *subclasses]


# --------------------------------------------------------------------------- adapters

Tables = Any  # what a rotary module returns: (cos, sin), GPT-J's (sin, cos), or complex freqs
Rotate = Callable[[ModuleType, Any, Tables, Tensor, Tensor], tuple[Tensor, Tensor]]


def attention_head_dim(config: Any, layer_type: str | None) -> int:
    """The head size most attentions use: ``config.head_dim``, else hidden / heads; for a
    config with a head size per layer (Gemma 4: ``per_layer_config``), that of the first layer
    of ``layer_type``."""
    per_layer = getattr(config, "per_layer_config", None)
    if per_layer is not None and layer_type in (getattr(config, "layer_types", None) or ()):
        config = per_layer[list(config.layer_types).index(layer_type)]
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rope_head_dim(config: Any, layer_type: str | None) -> int:
    """Multi-head latent attention: the rotated slice of each head, ``qk_rope_head_dim``."""
    return config.qk_rope_head_dim


def _always(config: Any) -> bool:
    return True


def _never(config: Any) -> bool:
    return False


@dataclass(frozen=True)
class Adapter:
    """How a family's attention applies its rotary tables to q and k."""

    #: the apply function and how it is called, as shown in the census table
    name: str
    #: a pattern the modeling source must contain: the attention's own call
    call: str
    #: (modeling module, config, tables, q, k) -> rotated (q, k), q and k as (b, h, n, d)
    rotate: Rotate
    #: (config, layer_type) -> the width of q and k the apply function receives
    head_dim: Callable[[Any, str | None], int] = attention_head_dim
    #: whether the family writes interleaved pairs de-interleaved (posenc rotates them in
    #: place: its output is compared after ``deinterleave``)
    deinterleaved: Callable[[Any], bool] = _never
    #: whether the attention rotates at all under this config (False: q, k pass unchanged)
    rotates: Callable[[Any], bool] = _always


def deinterleave(x: Tensor) -> Tensor:
    """Channels ``(0, 2, 4, ..., 1, 3, 5, ...)``: an in-place interleaved rotation in the order
    of transformers' ``apply_rotary_pos_emb_interleave``."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def _pair(q: Tensor, k: Tensor, one: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor]:
    return one(q), one(k)


def _whole(m: ModuleType, config: Any, tables: Tables, q: Tensor, k: Tensor) -> tuple:
    cos, sin = tables  # (b, n, r) each
    return m.apply_rotary_pos_emb(q, k, cos, sin)


def _first_slice(m: ModuleType, config: Any, tables: Tables, q: Tensor, k: Tensor) -> tuple:
    """Phi, StableLM, Persimmon, GPT-NeoX-Japanese: the attention cuts the first
    ``rotary_ndims`` (= the tables' width) channels, rotates them and puts the rest back."""
    cos, sin = tables
    r = cos.shape[-1]
    q_rot, k_rot = m.apply_rotary_pos_emb(q[..., :r], k[..., :r], cos, sin)
    return torch.cat((q_rot, q[..., r:]), dim=-1), torch.cat((k_rot, k[..., r:]), dim=-1)


def _heads_third(m: ModuleType, config: Any, tables: Tables, q: Tensor, k: Tensor) -> tuple:
    """Gemma 3n / Gemma 4: one tensor at a time, as (b, n, h, d), ``unsqueeze_dim=2``."""
    cos, sin = tables

    def one(x: Tensor) -> Tensor:
        rotated = m.apply_rotary_pos_emb(x.transpose(1, 2), cos, sin, unsqueeze_dim=2)
        return rotated.transpose(1, 2)

    return _pair(q, k, one)


def _one_at_a_time(m: ModuleType, config: Any, tables: Tables, q: Tensor, k: Tensor) -> tuple:
    """DeepSeek-V4: ``apply_rotary_pos_emb(x, cos, sin)`` on q and on the shared kv; it turns
    the trailing ``2 * cos.shape[-1]`` channels, here all of the rope slice it is given."""
    cos, sin = tables
    return _pair(q, k, lambda x: m.apply_rotary_pos_emb(x, cos, sin))


def _interleave(m: ModuleType, config: Any, tables: Tables, q: Tensor, k: Tensor) -> tuple:
    cos, sin = tables
    return m.apply_rotary_pos_emb_interleave(q, k, cos, sin)


def _interleave_if_flag(m: ModuleType, config: Any, tables: Tables, q: Tensor, k: Tensor) -> tuple:
    """DeepSeek-V3 and its kin: ``apply_rotary_pos_emb_interleave`` if
    ``config.rope_interleave``, else ``apply_rotary_pos_emb``."""
    rotate = _interleave if config.rope_interleave else _whole
    return rotate(m, config, tables, q, k)


def _complex(m: ModuleType, config: Any, tables: Tables, q: Tensor, k: Tensor) -> tuple:
    """DeepSeek-V2: ``apply_rotary_emb(q, k, freqs_cis)`` on (b, h, n, d)."""
    return m.apply_rotary_emb(q, k, tables)


def _complex_heads_third(m: ModuleType, config: Any, tables: Tables, q: Tensor, k: Tensor) -> tuple:
    """Llama 4: ``apply_rotary_emb(q, k, freqs_cis)`` on (b, n, h, d)."""
    q_out, k_out = m.apply_rotary_emb(q.transpose(1, 2), k.transpose(1, 2), tables)
    return q_out.transpose(1, 2), k_out.transpose(1, 2)


def _gptj(m: ModuleType, config: Any, tables: Tables, q: Tensor, k: Tensor) -> tuple:
    """GPT-J / CodeGen: ``sin, cos`` tables, ``apply_rotary_pos_emb(x, sin, cos)`` on the first
    ``rotary_dim`` channels of (b, n, h, d), or on the whole head when it is None."""
    sin, cos = tables
    r = config.rotary_dim or q.shape[-1]

    def one(x: Tensor) -> Tensor:
        x = x.transpose(1, 2)  # (b, n, h, d)
        rotated = m.apply_rotary_pos_emb(x[..., :r], sin, cos)
        return torch.cat((rotated, x[..., r:]), dim=-1).transpose(1, 2)

    return _pair(q, k, one)


def _first_head_deinterleaved(
    m: ModuleType, config: Any, tables: Tables, q: Tensor, k: Tensor
) -> tuple:
    """Qwen2.5-Omni's DiT: only head 0 turns, its channels first de-interleaved."""
    cos, sin = tables
    q, k = q.clone(), k.clone()
    q[:, :1], k[:, :1] = m.apply_rotary_pos_emb(
        m.deinterleave_head_dim(q[:, :1]), m.deinterleave_head_dim(k[:, :1]), cos, sin
    )
    return q, k


def _rope_interleave(config: Any) -> bool:
    return bool(config.rope_interleave)


_QK = r"(query_states|query_layer|query|q), (key_states|key_layer|key|k)"
_CALL = r"= apply_rotary_pos_emb"  # an assignment: never the function's own def line

#: Query and key states rotated whole, as ``(b, h, n, d)``: the Llama pattern.
WHOLE = Adapter(
    "apply_rotary_pos_emb(q, k, cos, sin)",
    rf"{_CALL}\({_QK}, cos, sin(, unsqueeze_dim=1)?\)",
    _whole,
)
FIRST_SLICE = Adapter(
    "apply_rotary_pos_emb(q[..., :r], k[..., :r], cos, sin)",
    rf"{_CALL}\(query_rot, key_rot, cos, sin\)",
    _first_slice,
)
HEADS_THIRD = Adapter(
    "apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=2), (b, n, h, d)",
    rf"{_CALL}\(query_states, cos, sin, unsqueeze_dim=2\)",
    _heads_third,
)
MLA = Adapter(  # the rotated slice of each head, plain or interleaved by rope_interleave
    "MLA: apply_rotary_pos_emb[_interleave](q_rot, k_rot, cos, sin)",
    r"if self\.config\.rope_interleave:.*\n\s+q_rot, k_rot = apply_rotary_pos_emb_interleave"
    r"\(q_rot, k_rot, cos, sin\)\s+else:\s+q_rot, k_rot = apply_rotary_pos_emb\(q_rot, k_rot, "
    r"cos, sin\)",
    _interleave_if_flag,
    head_dim=rope_head_dim,
    deinterleaved=_rope_interleave,
)
MLA_INTERLEAVED = Adapter(
    "MLA: apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)",
    r"q_rot, k_rot = apply_rotary_pos_emb_interleave\(q_rot, k_rot, cos, sin\)",
    _interleave,
    head_dim=rope_head_dim,
    deinterleaved=_always,
)
MLA_HALF = Adapter(
    "MLA: apply_rotary_pos_emb(q_rot, k_rot, cos, sin)",
    r"q_rot, k_rot = apply_rotary_pos_emb\(q_rot, k_rot, cos, sin\)",
    _whole,
    head_dim=rope_head_dim,
)

#: The families whose attention applies its tables otherwise than :data:`WHOLE`, by rotary
#: class; each is checked against the call in its modeling source.
ADAPTERS: dict[str, Adapter] = {
    **dict.fromkeys(
        (
            "PhiRotaryEmbedding",
            "StableLmRotaryEmbedding",
            "PersimmonRotaryEmbedding",
            "GPTNeoXJapaneseRotaryEmbedding",
        ),
        FIRST_SLICE,
    ),
    **dict.fromkeys(
        (
            "Gemma3nRotaryEmbedding",
            "Gemma4TextRotaryEmbedding",
            "Gemma4UnifiedTextRotaryEmbedding",
            "DiffusionGemmaTextRotaryEmbedding",
        ),
        HEADS_THIRD,
    ),
    **dict.fromkeys(
        (
            "DeepseekV3RotaryEmbedding",
            "AXK1RotaryEmbedding",
            "Glm4MoeLiteRotaryEmbedding",
            "YoutuRotaryEmbedding",
            "Mistral4RotaryEmbedding",
        ),
        MLA,
    ),
    **dict.fromkeys(
        (
            "AXK2RotaryEmbedding",
            "BailingHybridRotaryEmbedding",
            "DeepseekV32RotaryEmbedding",
            "GlmMoeDsaRotaryEmbedding",
            "LongcatFlashRotaryEmbedding",
            "Dots3NoteTextRotaryEmbedding",
            "MistralLarge4TextRotaryEmbedding",
        ),
        MLA_INTERLEAVED,
    ),
    **dict.fromkeys(
        ("MiniCPM3RotaryEmbedding", "HYV4RotaryEmbedding", "HYV4VLRotaryEmbedding"), MLA_HALF
    ),
    "DeepseekV2RotaryEmbedding": Adapter(
        "MLA: apply_rotary_emb(q_pe, k_pe, freqs_cis), complex",
        r"q_pe, k_pe = apply_rotary_emb\(q_pe, k_pe, position_embeddings",
        _complex,
        head_dim=rope_head_dim,
    ),
    "Llama4TextRotaryEmbedding": Adapter(
        "apply_rotary_emb(q, k, freqs_cis), complex, (b, n, h, d)",
        r"= apply_rotary_emb\(\s*query_states, key_states, position_embeddings",
        _complex_heads_third,
    ),
    "DeepseekV4RotaryEmbedding": Adapter(  # rotates the trailing qk_rope_head_dim channels
        "apply_rotary_pos_emb(x, cos, sin) on the trailing rope slice",
        r"q = apply_rotary_pos_emb\(q, cos, sin\)",
        _one_at_a_time,
        head_dim=rope_head_dim,
    ),
    **dict.fromkeys(
        ("GPTJRotaryEmbedding", "CodeGenRotaryEmbedding"),
        Adapter(
            "apply_rotary_pos_emb(x[..., :rotary_dim], sin, cos), (b, n, h, d)",
            r"q_rot = apply_rotary_pos_emb\(q_rot, sin, cos\)",
            _gptj,
        ),
    ),
    "Qwen2_5OmniDiTRotaryEmbedding": Adapter(
        "apply_rotary_pos_emb(deinterleave_head_dim(q[:, :1]), ...): head 0 only",
        r"query\[:, :1\], key\[:, :1\] = apply_rotary_pos_emb\(",
        _first_head_deinterleaved,
    ),
    # no RoPE unless the config asks for it (the attention skips the rotation otherwise)
    "GraniteMoeHybridRotaryEmbedding": Adapter(
        WHOLE.name + " if position_embedding_type == 'rope'",
        r'if config\.position_embedding_type == "rope" else None',
        _whole,
        rotates=lambda config: config.position_embedding_type == "rope",
    ),
    "Zamba2RotaryEmbedding": Adapter(
        WHOLE.name + " if use_mem_rope",
        r"if self\.config\.use_mem_rope:\s+cos, sin = position_embeddings",
        _whole,
        rotates=lambda config: bool(config.use_mem_rope),
    ),
    "EsmRotaryEmbedding": Adapter(
        WHOLE.name + " if position_embedding_type == 'rotary'",
        r"if self\.position_embedding_type == \"rotary\":",
        _whole,
        rotates=lambda config: config.position_embedding_type == "rotary",
    ),
}

# --------------------------------------------------------------------------- configs

#: Rotary classes whose model builds them from other config classes than the annotations say
#: (rotary class -> config class names).
CONFIG_CLASSES: dict[str, tuple[str, ...]] = {
    # T5GemmaEncoder/Decoder are annotated T5GemmaConfig but built from its encoder/decoder
    "T5GemmaRotaryEmbedding": ("T5GemmaModuleConfig",),
}

#: Config classes whose defaults do not make a rotary module that runs in transformers' own
#: code (class name -> the fields set instead, as the family's checkpoints set them).
CONFIG_FIXES: dict[str, dict[str, Any]] = {
    # no RoPE parameters at all by default (KeyError 'full_attention' in the rotary module)
    "CohereCompassTextConfig": {
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    },
    # the default mrope_section [8, 12, 12] covers 64 of the 128 channels: GLM-4.1V rotates half
    "Glm4vTextConfig": {"rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
    "GlmImageTextConfig": {
        "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    },
    # 4096 / 96 heads is no whole head (42.67); GLM-4.5V sets head_dim=128
    "Glm4vMoeTextConfig": {"head_dim": 128},
    # no mrope_section by default; four axes (position, width, height, image index)
    "HunYuanVLTextConfig": {
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [16, 16, 16, 16],
        }
    },
    # 2048 / 28 heads is no whole head (73.14); Qwen3-Omni sets head_dim=128
    "Qwen3OmniMoeTextConfig": {"head_dim": 128},
}

#: Configs checked besides each class's defaults, where the defaults leave out (or describe no)
#: RoPE that the family's checkpoints use (class name -> {label: fields}); the family is
#: ``model_type+label``.
CONFIG_VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "EsmConfig": {"rotary": {"position_embedding_type": "rotary"}},  # ESM-2
    "GraniteMoeHybridConfig": {"rope": {"position_embedding_type": "rope"}},
    "Zamba2Config": {"mem_rope": {"use_mem_rope": True}},
    "Glm4MoeConfig": {"head_dim_128": {"head_dim": 128}},  # GLM-4.5: 4096 / 96 is no head size
    # 1024 / 16 heads = 64 is narrower than the default mrope_section [24, 20, 20] (64 pairs)
    "Qwen3OmniMoeTalkerTextConfig": {"head_dim_128": {"head_dim": 128}},
}

#: Multimodal RoPE: how many rows of position ids the rotary module takes, by rotary class,
#: where its source does not say (``position_ids.expand(N, ...)``, ``mrope_section``).
MROPE_ROWS: dict[str, int] = {}

_EXPAND = re.compile(r"position_ids\.expand\((\d+),")


def _rows(site: Site, rotary: Any) -> int:
    """1 for sequence positions ``(b, n)``; else the rows of multimodal RoPE the rotary module
    expands its position ids to (``expand(N, ...)``, or one per ``mrope_section`` entry)."""
    if site.rotary in MROPE_ROWS:
        return MROPE_ROWS[site.rotary]
    source = _class_source(site)
    if found := _EXPAND.search(source):
        return int(found.group(1))
    section = getattr(rotary, "mrope_section", None)
    if isinstance(section, Mapping):  # per layer type (Cohere Compass)
        section = next(iter(section.values()), None)
    return len(section) if "mrope" in source and section else 1


@functools.cache
def _source(module: ModuleType) -> str:
    return Path(module.__file__ or "").read_text()


def _class_source(site: Site) -> str:
    """The text of the rotary class's definition (up to the next top-level statement)."""
    source = _source(site.module)
    start = source.index(f"class {site.rotary}(")
    end = re.compile(r"^\S", re.M).search(source, source.index("\n", start))
    return source[start : end.start() if end else len(source)]


# --------------------------------------------------------------------------- one family


@dataclass(frozen=True)
class Result:
    """One family's classification."""

    family: str  # model_type[+variant][/layer_type]
    model_type: str
    layer_type: str | None
    folder: str
    rotary: str
    config_class: str
    apply: str
    kind: str
    #: max|posenc - family| / max|family| over q and k (exact and wrong families)
    error: float | None = None
    #: posenc's message (refused), what differs (wrong), where it broke (crashed)
    detail: str = ""
    #: "posenc" or "harness" for a crash
    side: str = ""


def _qk(head_dim: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(POSITIONS.shape[0], HEADS_Q, LENGTH, head_dim, generator=gen)
    k = torch.randn(POSITIONS.shape[0], HEADS_K, LENGTH, head_dim, generator=gen)
    return q, k


def _layer_types(config: Any) -> list[str | None]:
    """The layer types a config nests its RoPE parameters by (those its layers use, with
    parameters), or ``[None]``."""
    params = getattr(config, "rope_parameters", None)
    if not (
        isinstance(params, Mapping)
        and params
        and all(v is None or isinstance(v, Mapping) for v in params.values())
    ):
        return [None]
    nested = [name for name, value in params.items() if value is not None]
    # the types its layers use, where the keys are layer types (DeepSeek-V4 keys its own labels)
    used = [name for name in nested if name in (getattr(config, "layer_types", None) or ())]
    return list(used or nested)


def _short(error: BaseException) -> str:
    """The exception and the innermost frame it came from, on one line."""
    frame = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    where = f" ({Path(frame.filename).name}:{frame.lineno})" if frame else ""
    return f"{type(error).__name__}: {error}{where}".replace("\n", " ")


def relative_error(got: tuple[Tensor, Tensor], want: tuple[Tensor, Tensor]) -> float:
    """``max|got - want| / max|want|`` over q and k together."""
    diff = max((g.double() - w.double()).abs().max().item() for g, w in zip(got, want, strict=True))
    scale = max(w.double().abs().max().item() for w in want)
    return diff / scale


def model_type_of(config: Any) -> str:
    """The config's ``model_type``, or its class name where it has none (Evolla's SaProt)."""
    return getattr(config, "model_type", "") or type(config).__name__


def _family(config: Any, label: str, layer_type: str | None) -> str:
    name = model_type_of(config) + (f"+{label}" if label else "")
    return name if layer_type is None else f"{name}/{layer_type}"


def _theirs(
    site: Site, adapter: Adapter, config: Any, layer_type: str | None
) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor]]:
    """q, k, the positions, and q, k rotated by the family's own code."""
    if not re.search(adapter.call, _source(site.module)):
        raise LookupError(f"the attention call {adapter.call!r} is not in the modeling source")
    rotary = getattr(site.module, site.rotary)(config)
    rows = _rows(site, rotary)
    positions = POSITIONS if rows == 1 else multimodal_positions(rows)
    q, k = _qk(adapter.head_dim(config, layer_type))
    if not adapter.rotates(config):
        return q, k, positions, (q, k)
    extra = {} if layer_type is None else {"layer_type": layer_type}
    with torch.no_grad():
        tables = rotary(q, positions, **extra)
        return q, k, positions, adapter.rotate(site.module, config, tables, q, k)


def classify(
    site: Site,
    config: Any,
    layer_type: str | None = None,
    *,
    label: str = "",
    read: Callable[..., Any] = RotaryEmbedding.from_hf_config,
    adapter: Adapter | None = None,
) -> Result:
    """Rotate with the family's code (through ``adapter``, by default its entry of
    :data:`ADAPTERS` or :data:`WHOLE`) and with ``read(config, layer_type=...)`` (posenc's
    reader, by default), and classify the family."""
    adapter = adapter or ADAPTERS.get(site.rotary, WHOLE)
    result = dict(
        family=_family(config, label, layer_type),
        model_type=model_type_of(config),
        layer_type=layer_type,
        folder=site.folder,
        rotary=site.rotary,
        config_class=type(config).__name__,
        apply=adapter.name,
    )
    try:
        q, k, positions, want = _theirs(site, adapter, config, layer_type)
    except Exception as error:
        return Result(**result, kind=CRASHED, detail=_short(error), side="harness")

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unchecked model types: the census checks them
            rope = read(config, layer_type=layer_type)
    except (PosencValueError, PosencTypeError) as error:
        detail = str(error).replace("\n", " ")
        kind = NO_ROPE if any(words in detail for words in NO_ROTATION_WORDS) else REFUSED
        return Result(**result, kind=kind, detail=detail)
    except Exception as error:
        return Result(**result, kind=CRASHED, detail=_short(error), side="posenc")
    try:
        with torch.no_grad():
            got = rope(q, k, positions)  # (rows, b, n) positions for multimodal RoPE
    except PosencError as error:
        detail = f"{rope!r} does not take q, k {tuple(q.shape[-1:])} at these positions: {error}"
        return Result(**result, kind=WRONG, detail=detail)
    except Exception as error:
        return Result(**result, kind=CRASHED, detail=_short(error), side="posenc")
    if adapter.deinterleaved(config):
        got = tuple(deinterleave(x) for x in got)
    error = relative_error(got, want)
    if error <= TOLERANCE:
        return Result(**result, kind=EXACT, error=error)
    rotated = "rotates" if adapter.rotates(config) else "does not rotate"
    detail = f"posenc read {rope!r}; the family's attention {rotated} under this config"
    return Result(**result, kind=WRONG, error=error, detail=detail)


def configs_of(config_class: type) -> list[tuple[str, Any]]:
    """(label, config): the class's defaults (with :data:`CONFIG_FIXES`), and its
    :data:`CONFIG_VARIANTS`."""
    name = config_class.__name__
    base = CONFIG_FIXES.get(name, {})
    variants = {
        "": base,
        **{label: {**base, **v} for label, v in CONFIG_VARIANTS.get(name, {}).items()},
    }
    return [(label, config_class(**fields)) for label, fields in variants.items()]


def census_of(site: Site, not_sequence: Mapping[str, str]) -> list[Result]:
    """Every family of one site: each of its configs, per nested layer type, classified;
    a model type on ``not_sequence`` (model type -> reason) is not compared."""
    name = site.config_class.__name__
    about = dict(folder=site.folder, rotary=site.rotary, config_class=name)
    try:
        configs = configs_of(site.config_class)
    except Exception as error:
        detail = f"the config class's defaults: {_short(error)}"
        return [
            Result(name, name, None, **about, apply="", kind=CRASHED, detail=detail, side="harness")
        ]
    results = []
    for label, config in configs:
        model_type = model_type_of(config)
        if model_type in not_sequence:
            family = _family(config, label, None)
            reason = not_sequence[model_type]
            results.append(
                Result(
                    family, model_type, None, **about, apply="", kind=NOT_SEQUENCE, detail=reason
                )
            )
            continue
        results += [classify(site, config, layer, label=label) for layer in _layer_types(config)]
    return results


@dataclass
class Census:
    """Every family's result, and the transformers version they were found in."""

    version: str
    results: list[Result] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[Result]:
        return [r for r in self.results if r.kind == kind]

    def counts(self) -> Counter[str]:
        return Counter(r.kind for r in self.results)

    def summary(self) -> str:
        """The counts by class, as a small table (for assertion messages), headed by the
        transformers version (and the pinned one, where they differ)."""
        counts = self.counts()
        pinned = "" if self.version == PINNED_TRANSFORMERS else f", pinned {PINNED_TRANSFORMERS}"
        lines = [f"RoPE census, transformers {self.version}{pinned}: {len(self.results)} families"]
        lines += [f"  {kind:<15}{counts.get(kind, 0):>4}" for kind in KINDS]
        return "\n".join(lines)


def run_census(not_sequence: Mapping[str, str], sites: Iterable[Site] | None = None) -> Census:
    """Classify every family of ``sites`` (default: all of the installed transformers)."""
    import transformers

    transformers.logging.set_verbosity_error()
    census = Census(transformers.__version__)
    failed: dict[str, str] = {}
    for site in discover(failed=failed) if sites is None else sites:
        census.results.extend(census_of(site, not_sequence))
    for folder, error in failed.items():
        detail = f"modeling module does not import: {error}"
        census.results.append(
            Result(folder, folder, None, folder, "?", "?", "", CRASHED, None, detail, "harness")
        )
    census.results.sort(key=lambda r: (r.family, r.rotary))
    return census


# --------------------------------------------------------------------------- the table


def markdown(
    census: Census,
    refused_reasons: Mapping[str, str],
    wrong_reasons: Mapping[str, str] | None = None,
) -> str:
    """The counts by class; the refused, wrong, crashed and not-a-sequence families with their
    reasons (``refused_reasons``, ``wrong_reasons``: the test's words); the per-family table."""
    wrong_reasons = wrong_reasons or {}
    counts = census.counts()
    folders = len({r.folder for r in census.results})
    lines = [
        f"transformers {census.version}: {len(census.results)} families from {folders} "
        "modeling files.",
        "",
        "| class | families |",
        "| --- | ---: |",
        *(f"| {kind} | {counts.get(kind, 0)} |" for kind in KINDS),
    ]
    sections = (
        (REFUSED, "Refused, and why", lambda r: refused_reasons.get(r.family, "(not expected)")),
        (NO_ROPE, "No rotation in the config (refused as such)", lambda r: r.detail),
        (WRONG, "Wrong", lambda r: f"{wrong_reasons.get(r.family, '')} ({r.detail})".strip()),
        (CRASHED, "Crashed", lambda r: f"{r.side}: {r.detail}"),
        (NOT_SEQUENCE, "Not a sequence", lambda r: r.detail),
    )
    for kind, title, why in sections:
        if census.of_kind(kind):
            lines += ["", f"{title}:", ""]
            lines += [f"- `{r.family}`: {why(r)}" for r in census.of_kind(kind)]
    lines += [
        "",
        "| model type | rotary class | apply function | class | max relative error |",
        "| --- | --- | --- | --- | ---: |",
    ]
    for r in census.results:
        error = "" if r.error is None else f"{r.error:.1e}"
        kind = f"{r.kind} ({r.side})" if r.side else r.kind
        apply = "" if r.kind == NOT_SEQUENCE else f"`{r.apply}`"
        lines.append(f"| `{r.family}` | `{r.rotary}` | {apply} | {kind} | {error} |")
    return "\n".join(lines)


def main() -> None:
    """Print the census table (``python -m tests.hf.census``)."""
    from tests.hf import test_rope_census as expected

    torch.set_num_threads(1)  # tiny tensors: more threads only cost time
    census = run_census(expected.NOT_SEQUENCE)
    print(markdown(census, expected.REFUSED, expected.WRONG_NOW))


if __name__ == "__main__":
    main()
