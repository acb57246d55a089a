"""Reading transformers configs: which fields a family keeps its rotation in (:mod:`.fields`,
:mod:`.families`, :mod:`.model_types`), the multimodal layouts (:mod:`.mrope_layouts`), the
reading itself (:mod:`.config`), and how a ``config.json`` dict is read first: built into its
transformers config class (:mod:`.route`) or, without one, by posenc's own rules
(:mod:`.legacy`). A new transformers family goes here."""
