"""Rotary encodings: queries and keys turned by their positions in every layer. RoPE
(:mod:`.rope`), xPos, axial and multimodal RoPE, with the pieces RoPE is made of: its
specification (:mod:`.spec`), cos/sin tables and position reader (:mod:`.tables`), argument
checks and the q/k rotation (:mod:`.common`). Where a rotation runs is :mod:`.kernels`."""
