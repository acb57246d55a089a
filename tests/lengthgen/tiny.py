"""A tiny ``posenc lengthgen`` configuration (a few seconds per run on a shared 2-core CPU),
and the subcommand run in-process."""

from __future__ import annotations

import argparse
from typing import Any

from posenc.lengthgen import cli as lg_cli

SHIPPED = [
    "bucket-sort",
    "copy-v1",
    "copy-v2",
    "copy-v3",
    "even-pairs",
    "missing-duplicate",
    "reverse-string",
    "reverse-v1",
]

# A tiny configuration: a few seconds per run on a shared 2-core CPU.
TINY: dict[str, Any] = dict(
    dim=16,
    depth=1,
    heads=2,
    batch_size=8,
    steps=6,
    train_min_length=1,
    train_max_length=5,
    test_min_length=6,
    test_max_length=7,
    test_samples=4,
    eval_samples=2,
    eval_every=0,
    checkpoint_every=0,
)


def run_cli(argv: list[str]) -> int:
    """Parse as `posenc lengthgen ...` would and run."""
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    lg_cli.add_subcommand(sub)
    args = parser.parse_args(["lengthgen", *argv])
    return args.func(args)


TINY_CLI = [
    "--dim",
    "16",
    "--depth",
    "1",
    "--heads",
    "2",
    "--batch-size",
    "8",
    "--steps",
    "6",
    "--train-lengths",
    "1-5",
    "--test-lengths",
    "6-7",
    "--test-samples",
    "4",
    "--eval-every",
    "0",
    "--threads",
    "1",
    "--no-progress",
]
