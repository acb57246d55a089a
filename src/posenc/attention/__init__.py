"""Attention: the module, its checks, the three backends (math, SDPA, flex) and their
choice, and query scales."""
