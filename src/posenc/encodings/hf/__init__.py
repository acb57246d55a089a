"""Reading transformers configs: which fields a family keeps its rotation in (:mod:`.fields`,
:mod:`.families`, :mod:`.model_types`), the multimodal layouts (:mod:`.mrope_layouts`), and the
reading itself (:mod:`.config`). A new transformers family goes here."""
