"""How a :class:`~posenc.RotaryEmbedding` is built from elsewhere: a transformers config
(:func:`rotary_from_hf_config`, behind :meth:`~posenc.RotaryEmbedding.from_hf_config`) and
another module with a new context extension (:func:`rope_with_scaling`, behind
:meth:`~posenc.RotaryEmbedding.with_scaling`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import PosencTypeError, PosencValueError

__all__ = ["HF_CLASSES", "rope_with_scaling", "rotary_from_hf_config"]

#: The classes :meth:`~posenc.RotaryEmbedding.from_hf_config` builds besides its own:
#: ``"mrope"``, for a multimodal-RoPE config (arguments naming ``mrope_section``), registered
#: by :mod:`~.multimodal`, which derives it from :class:`~posenc.RotaryEmbedding`.
HF_CLASSES: dict[str, type[Any]] = {}


def _hf_class(cls: type[Any], arguments: Mapping[str, Any]) -> type[Any]:
    """The class to build ``arguments`` read from a config with: ``cls``, or the multimodal
    class where they name ``mrope_section`` and ``cls`` is not one already."""
    multimodal = HF_CLASSES.get("mrope")
    if "mrope_section" in arguments and multimodal and not issubclass(cls, multimodal):
        return multimodal
    return cls


def rotary_from_hf_config(
    cls: type[Any],
    config: Any,
    *,
    layer_type: str | None = None,
    strict: bool = False,
    **kwargs: Any,
) -> Any:
    """:meth:`RotaryEmbedding.from_hf_config`: ``config`` (a ``PretrainedConfig`` or a
    ``config.json`` dict) read as :mod:`posenc.hf.config` tabulates; per-layer RoPE (Gemma 3)
    needs ``layer_type``. A ``model_type`` outside ``KNOWN_MODEL_TYPES`` (each checked against
    its own transformers code) is read from the generic fields with a one-time
    ``UserWarning``, or refused with ``strict=True``. Where transformers writes an interleaved
    rotation de-interleaved (``rope_interleave=True``, DeepSeek-V3 family,
    ``DEINTERLEAVED_MODEL_TYPES``) the module rotates the same pairs in place: ``q @ k^T`` is
    equal. For multi-head latent attention ``head_dim`` is ``qk_rope_head_dim``. A
    multimodal-RoPE config (Qwen2-VL, Qwen3-VL, GLM-4V, ...) gives a
    :class:`~posenc.MultimodalRotaryEmbedding`.

    Raises :class:`~posenc.errors.PosencValueError` naming the field and its value for a
    config it cannot map exactly (no rotary embedding, contradicting fields, an odd or
    oversized rotary dimension, an unknown ``rope_type`` or key). Where the rotary config
    changes the attention's softmax scale (DeepSeek-V2/V3 and their kin: YaRN with
    ``mscale_all_dim`` multiplies ``qk_head_dim ** -0.5`` by ``yarn_get_mscale(factor,
    mscale_all_dim) ** 2``), the module's :attr:`~RotaryEmbedding.softmax_scale` holds that
    scale; elsewhere it is ``None``.
    """
    from ...hf.config import (  # the one call up to posenc.hf
        rotary_arguments_from_hf_config,
        softmax_scale_from_hf_config,
    )

    arguments = rotary_arguments_from_hf_config(config, layer_type=layer_type, strict=strict)
    softmax_scale = softmax_scale_from_hf_config(config, layer_type=layer_type)
    arguments.update(kwargs)
    head_dim = arguments.pop("head_dim")
    module = _hf_class(cls, arguments)(head_dim, **arguments)
    module.softmax_scale = softmax_scale
    return module


def rope_with_scaling(
    rope: Any, scaling: Mapping[str, Any] | None, original: int | None, plain: tuple[type, ...]
) -> Any:
    """:meth:`RotaryEmbedding.with_scaling`: a new module with ``rope``'s ``head_dim``,
    ``base``, ``rotary_dim``, layout, ``clockwise``, ``max_position_embeddings``, device and
    training flag, and ``scaling`` in place of its own (``None``: plain RoPE); ``rope`` is left
    as it is. ``original``: the context the model was trained at, filled in where the new type
    needs an original context and ``scaling`` lacks one. This is how a RoPE model trained at
    length ``L`` is evaluated with a context extension (position interpolation, dynamic NTK,
    YaRN) without retraining; for a whole model see :meth:`posenc.Encoder.with_rope_scaling`.
    Refused for subclasses with settings of their own (any class but ``plain``, whose first
    class is built), for learned frequencies and for frequencies given as ``inv_freq``."""
    if type(rope) not in plain:
        raise PosencTypeError(
            f"with_scaling rebuilds a RotaryEmbedding; {type(rope).__name__} has settings "
            "of its own that it would lose"
        )
    if rope.learned_freq:
        raise PosencValueError(
            "with_scaling: learned_freq=True frequencies are trained, not derived from a scaling"
        )
    if rope._given is not None:
        raise PosencValueError(
            "with_scaling: frequencies given as inv_freq are not derived from a base"
        )
    spec = rope.spec.with_scaling(scaling, original=original)
    arguments = spec.arguments()
    if rope.bases is not None:
        arguments["base"] = rope.bases
    new = plain[0](
        **arguments,
        rotary_heads=rope.rotary_heads,
        rotary_heads_at=rope.rotary_heads_at,
        device=rope.inv_freq.device,
    )
    return new.train(rope.training)
