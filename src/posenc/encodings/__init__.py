"""Every positional encoding, in a folder per family: the family protocol (:mod:`.base`), the
registry (:mod:`.registry`), the per-forward state (:mod:`.state`) and argument checks
(:mod:`.checks`) here at the top; ``absolute/`` (tables added to the embeddings), ``bias/``
(terms added to the attention logits), ``rotary/`` (rotations of queries and keys, and in
``rotary/kernels/`` where a rotation runs), ``conditional/`` (computed from the hidden
states between two blocks), ``rope_types/`` (RoPE's frequency rules and context
extensions), and per-layer schedules (:mod:`.schedule`). Importing this package registers every
built-in scheme (in the order they were registered before the folders); the public names are
re-exported by :mod:`posenc` alone.
"""

from . import base  # noqa: F401
from .absolute import (
    abacus,  # noqa: F401
    learned,  # noqa: F401
    sinusoidal,  # noqa: F401
)
from .bias import (  # noqa: F401
    alibi,
    cope,
    deberta,
    fox,
    inkling,
    relative,
    relative_qk,
    sandwich,
    t5,
)
from .conditional import peg  # noqa: F401
from .rotary import dinov3, fope, mixed, multimodal, pope, rope  # noqa: F401
