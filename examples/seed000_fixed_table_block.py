"""Seed 000: a Transformer block whose embeddings get the fixed sinusoidal table.

The tutorial built the table in NumPy, drew its heatmap and added it to word embeddings in
front of one attention block. Here the same system is three library calls; the table is the
exact one (float64 angles) and works for any width, odd included.

Run: python examples/seed000_fixed_table_block.py [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import posenc
from posenc.plots.absolute import heatmap


def main(out: Path) -> None:
    torch.manual_seed(0)
    vocab, dim, heads, seq = 1000, 64, 8, 10
    table = posenc.sinusoidal_table_np(seq, dim)  # the NumPy twin, as in the tutorial
    print(f"sinusoidal table: {table.shape}, first row {table[0, :4].round(3).tolist()}")

    out.mkdir(parents=True, exist_ok=True)
    fig = heatmap(posenc.sinusoidal_table(100, dim))
    fig.savefig(out / "seed000_heatmap.png", dpi=80)
    print(f"heatmap saved to {out / 'seed000_heatmap.png'}")

    # token embedding (scaled by sqrt(dim)), fixed table, one encoder layer, a head
    model = posenc.TransformerModel(vocab, dim, depth=1, num_heads=heads, pe="sinusoidal").eval()
    tokens = torch.randint(0, vocab, (2, seq))
    with torch.no_grad():
        logits = model(tokens)
    print(f"tokens {tuple(tokens.shape)} -> logits {tuple(logits.shape)}")

    # the odd width that broke the tutorial's code
    odd = posenc.SinusoidalPositionalEncoding(63)
    print(f"odd width works: {tuple(odd(torch.zeros(1, seq, 63)).shape)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("examples-out"))
    main(parser.parse_args().out)
