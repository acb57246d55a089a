"""Conditional encodings: computed from the hidden states inside the stack (CPVT's PEG)."""
