"""RoPE's frequency rules: the registry of rope types (:mod:`.registry`, what a transformers
``rope_scaling``/``rope_parameters`` dict names) and the built-in types (:mod:`.builtin`). A new
rope type is one :func:`~posenc.register_rope_type` call."""
