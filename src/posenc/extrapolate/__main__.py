"""``python -m posenc.extrapolate ...``: the ``posenc extrapolate`` command on its own, also the
entry point for ``torchrun`` (``python -m torch.distributed.run --nproc_per_node 2 -m
posenc.extrapolate ...``). A bad argument ends as one line and exit status 2, a bug as a
traceback, as in ``posenc``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .cli import add_subcommand


def main(argv: Sequence[str] | None = None) -> int:
    from posenc.cli import run_alone

    return run_alone("extrapolate", add_subcommand, argv)


if __name__ == "__main__":
    sys.exit(main())
