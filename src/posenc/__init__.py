"""posenc: positional encodings for Transformers, behind one interface.

>>> import torch, posenc
>>> enc = posenc.Encoder(32, depth=2, num_heads=4, pe="sinusoidal")
>>> enc(torch.randn(1, 6, 32)).shape
torch.Size([1, 6, 32])
"""

from . import notebook  # noqa: F401  (installs the picture an encoding shows in Jupyter)
from .attention.backends import Backend
from .attention.config import AttentionConfig
from .attention.module import MultiHeadAttention
from .attention.query_scale import QueryScale
from .attention.sdpa import scaled_dot_product_attention
from .encodings.absolute.abacus import Abacus, abacus_positions
from .encodings.absolute.learned import LearnedPositionalEncoding
from .encodings.absolute.learned_2d import LearnedPositionalEncoding2D
from .encodings.absolute.sinusoidal import (
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
from .encodings.base import (
    FAMILIES,
    AdditiveEncoding,
    BiasEncoding,
    ConditionalEncoding,
    NoPE,
    PositionalEncoding,
    RotaryEncoding,
)
from .encodings.bias.alibi import ALiBi, alibi_slopes
from .encodings.bias.cope import CoPE
from .encodings.bias.deberta import DeBERTa
from .encodings.bias.fox import FoX
from .encodings.bias.inkling import Inkling
from .encodings.bias.relative import FIRE, KERPLE, DynamicPositionBias
from .encodings.bias.relative_qk import ShawRelativeBias, TransformerXLRelativeBias
from .encodings.bias.sandwich import Sandwich
from .encodings.bias.swin import SwinRelativeBias, SwinV2ContinuousBias
from .encodings.bias.t5 import T5RelativeBias, t5_relative_position_bucket
from .encodings.conditional.peg import PositionEncodingGenerator
from .encodings.registry import Entry, available, build, build_for_model, entry, register
from .encodings.rope_types.registry import (
    ROPE_TYPES,
    RopeType,
    register_rope_type,
    rope_parameters,
    validate_rope_scaling,
)
from .encodings.rotary.axial import AxialRotaryEmbedding, Rotary2DEmbedding, Rotary3DEmbedding
from .encodings.rotary.dinov3 import DINOv3RotaryEmbedding
from .encodings.rotary.fope import FoPE
from .encodings.rotary.functional import rotary_embedding, rotary_embedding_qk
from .encodings.rotary.grid import GridRotaryEmbedding
from .encodings.rotary.kernels.rotate import apply_rotary, apply_rotary_
from .encodings.rotary.mixed import RotaryMixed
from .encodings.rotary.multimodal import MultimodalRotaryEmbedding
from .encodings.rotary.multimodal_positions import (
    continue_multimodal_positions,
    multimodal_positions,
)
from .encodings.rotary.onnx import export_onnx
from .encodings.rotary.pope import PoPE
from .encodings.rotary.rope import InterleavedRotaryEmbedding, RotaryEmbedding
from .encodings.rotary.xpos import XPos
from .encodings.state import BiasState, PositionState, RotaryState
from .errors import (
    MemoryBudgetError,
    PosencError,
    PosencTypeError,
    PosencValueError,
    get_memory_budget,
    set_memory_budget,
)
from .model.config import EncoderConfig
from .model.encoder import Encoder
from .model.layers import EncoderLayer, FeedForward
from .model.sampling import SamplingConfig
from .model.transformer import TransformerModel
from .sequence.cache import KVCache
from .sequence.positions import positions_from_padding, randomize_positions
from .sequence.streaming import StreamingCache

__version__ = "0.1.0"

__all__ = [
    "FAMILIES",
    "FIRE",
    "KERPLE",
    "ROPE_TYPES",
    "ALiBi",
    "Abacus",
    "AdditiveEncoding",
    "AttentionConfig",
    "AxialRotaryEmbedding",
    "Backend",
    "BiasEncoding",
    "BiasState",
    "CoPE",
    "ConditionalEncoding",
    "DINOv3RotaryEmbedding",
    "DeBERTa",
    "DynamicPositionBias",
    "Encoder",
    "EncoderConfig",
    "EncoderLayer",
    "Entry",
    "FeedForward",
    "FoPE",
    "FoX",
    "GridRotaryEmbedding",
    "Inkling",
    "InterleavedRotaryEmbedding",
    "KVCache",
    "LearnedPositionalEncoding",
    "LearnedPositionalEncoding2D",
    "MemoryBudgetError",
    "MultiHeadAttention",
    "MultimodalRotaryEmbedding",
    "NoPE",
    "PoPE",
    "PosencError",
    "PosencTypeError",
    "PosencValueError",
    "PositionEncodingGenerator",
    "PositionState",
    "PositionalEncoding",
    "QueryScale",
    "RopeType",
    "Rotary2DEmbedding",
    "Rotary3DEmbedding",
    "RotaryEmbedding",
    "RotaryEncoding",
    "RotaryMixed",
    "RotaryState",
    "SamplingConfig",
    "Sandwich",
    "ScaledSinusoidalPositionalEncoding",
    "ShawRelativeBias",
    "Sinusoidal2DPositionalEncoding",
    "Sinusoidal3DPositionalEncoding",
    "SinusoidalNDPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "StreamingCache",
    "SwinRelativeBias",
    "SwinV2ContinuousBias",
    "T5RelativeBias",
    "TransformerModel",
    "TransformerXLRelativeBias",
    "XPos",
    "abacus_positions",
    "alibi_slopes",
    "apply_rotary",
    "apply_rotary_",
    "available",
    "build",
    "build_for_model",
    "continue_multimodal_positions",
    "entry",
    "export_onnx",
    "get_memory_budget",
    "multimodal_positions",
    "positions_from_padding",
    "randomize_positions",
    "register",
    "register_rope_type",
    "rope_parameters",
    "rotary_embedding",
    "rotary_embedding_qk",
    "scaled_dot_product_attention",
    "set_memory_budget",
    "sinusoidal_encode",
    "sinusoidal_nd_table",
    "sinusoidal_table",
    "sinusoidal_table_np",
    "t5_relative_position_bucket",
    "validate_rope_scaling",
]
