"""posenc: positional encodings for Transformers, behind one interface.

>>> import torch, posenc
>>> enc = posenc.Encoder(32, depth=2, num_heads=4, pe="sinusoidal")
>>> enc(torch.randn(1, 6, 32)).shape
torch.Size([1, 6, 32])
"""

from . import notebook  # noqa: F401  (installs the picture an encoding shows in Jupyter)
from .attention import Backend, MultiHeadAttention, scaled_dot_product_attention
from .cache import KVCache
from .encodings import *  # noqa: F403  (re-exported below through __all__)
from .encodings import __all__ as _encodings_all
from .errors import (
    MemoryBudgetError,
    PosencError,
    PosencTypeError,
    PosencValueError,
    get_memory_budget,
    set_memory_budget,
)
from .model import Encoder, EncoderLayer, FeedForward, TransformerModel
from .positions import positions_from_padding, randomize_positions
from .query_scale import QueryScale

__version__ = "0.1.0"

__all__ = [
    *_encodings_all,
    "Backend",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "KVCache",
    "MemoryBudgetError",
    "MultiHeadAttention",
    "PosencError",
    "PosencTypeError",
    "PosencValueError",
    "QueryScale",
    "TransformerModel",
    "get_memory_budget",
    "positions_from_padding",
    "randomize_positions",
    "scaled_dot_product_attention",
    "set_memory_budget",
]
