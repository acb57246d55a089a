"""The model: encoder and language model, their layers, generation."""
