"""Reading transformers configs: which fields a family keeps its rotation in (:mod:`.fields`,
:mod:`.families`, :mod:`.model_types`), the multimodal layouts (:mod:`.mrope_layouts`), the
reading itself (:mod:`.config`), and how a ``config.json`` dict is read first: built into its
transformers config class (:mod:`.route`) or, without one, by posenc's own rules
(:mod:`.legacy`). A new transformers family goes here.

:func:`posenc.hf.patch` / :func:`posenc.hf.unpatch` (defined in :mod:`.patch`, which imports
transformers only when called) put posenc's exact rotation inside a loaded transformers
model."""

from posenc.hf.patch import patch as patch
from posenc.hf.patch import unpatch as unpatch
