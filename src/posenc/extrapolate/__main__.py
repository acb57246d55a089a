"""``python -m posenc.extrapolate ...``: ``posenc extrapolate`` on its own, and the entry point for
``torchrun`` (see :func:`posenc.app.cli.run_alone`)."""

import sys

from ..app.cli import run_alone
from .cli import add_subcommand

if __name__ == "__main__":
    sys.exit(run_alone("extrapolate", add_subcommand, None))
