"""Every positional encoding, one module per family; importing this package registers them."""

from .alibi import ALiBi, alibi_slopes
from .base import (
    FAMILIES,
    AdditiveEncoding,
    BiasEncoding,
    Entry,
    NoPE,
    PositionalEncoding,
    RotaryEncoding,
    available,
    build,
    build_for_model,
    entry,
    register,
)
from .cope import CoPE
from .learned import LearnedPositionalEncoding
from .mrope_positions import continue_multimodal_positions, multimodal_positions
from .relative import FIRE, KERPLE, DynamicPositionBias
from .relative_qk import ShawRelativeBias, TransformerXLRelativeBias
from .rope_scaling import (
    ROPE_TYPES,
    RopeType,
    register_rope_type,
    rope_parameters,
    validate_rope_scaling,
)
from .rotary import (
    AxialRotaryEmbedding,
    InterleavedRotaryEmbedding,
    Rotary2DEmbedding,
    Rotary3DEmbedding,
    RotaryEmbedding,
    XPos,
    apply_rotary,
    apply_rotary_,
    set_rotary_compile,
)
from .rotary_multimodal import MultimodalRotaryEmbedding
from .sinusoidal import (
    ScaledSinusoidalPositionalEncoding,
    Sinusoidal2DPositionalEncoding,
    Sinusoidal3DPositionalEncoding,
    SinusoidalNDPositionalEncoding,
    SinusoidalPositionalEncoding,
    sinusoidal_encode,
    sinusoidal_nd_table,
    sinusoidal_table,
    sinusoidal_table_np,
)
from .state import BiasState, PositionState, RotaryState
from .t5 import T5RelativeBias, t5_relative_position_bucket

__all__ = [
    "FAMILIES",
    "FIRE",
    "KERPLE",
    "ROPE_TYPES",
    "ALiBi",
    "AdditiveEncoding",
    "AxialRotaryEmbedding",
    "BiasEncoding",
    "BiasState",
    "CoPE",
    "DynamicPositionBias",
    "Entry",
    "InterleavedRotaryEmbedding",
    "LearnedPositionalEncoding",
    "MultimodalRotaryEmbedding",
    "NoPE",
    "PositionState",
    "PositionalEncoding",
    "RopeType",
    "Rotary2DEmbedding",
    "Rotary3DEmbedding",
    "RotaryEmbedding",
    "RotaryEncoding",
    "RotaryState",
    "ScaledSinusoidalPositionalEncoding",
    "ShawRelativeBias",
    "Sinusoidal2DPositionalEncoding",
    "Sinusoidal3DPositionalEncoding",
    "SinusoidalNDPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "T5RelativeBias",
    "TransformerXLRelativeBias",
    "XPos",
    "alibi_slopes",
    "apply_rotary",
    "apply_rotary_",
    "available",
    "build",
    "build_for_model",
    "continue_multimodal_positions",
    "entry",
    "multimodal_positions",
    "register",
    "register_rope_type",
    "rope_parameters",
    "set_rotary_compile",
    "sinusoidal_encode",
    "sinusoidal_nd_table",
    "sinusoidal_table",
    "sinusoidal_table_np",
    "t5_relative_position_bucket",
    "validate_rope_scaling",
]
