"""Bias encodings: a term added to the attention logits in every layer (ALiBi, T5, KERPLE, FIRE,
dynamic position bias, Sandwich, Shaw, Transformer-XL, DeBERTa, CoPE, FoX, Inkling), and what
they share (:mod:`.common`)."""
