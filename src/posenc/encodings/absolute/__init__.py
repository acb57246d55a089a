"""Additive encodings: a table of positions added to the token embeddings before the first layer
(sinusoidal, scaled, N-D, learned)."""
