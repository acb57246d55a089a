"""``python -m posenc.lengthgen ...``: the ``posenc lengthgen`` command on its own, also the
entry point for ``torchrun`` (``python -m torch.distributed.run --nproc_per_node 2 -m
posenc.lengthgen ...``). Errors end as one line and exit status 2, as in ``posenc``."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from .cli import add_subcommand


def main(argv: Sequence[str] | None = None) -> int:
    from posenc.cli import UsageError, _Parser

    parser = _Parser(prog="python -m posenc.lengthgen")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    add_subcommand(sub)
    try:
        args = parser.parse_args(["lengthgen", *(sys.argv[1:] if argv is None else argv)])
        return int(args.func(args) or 0)
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 2
    except UsageError as exc:  # a bad argument: one line, as in `posenc`
        print(str(exc), file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError) as exc:
        if os.environ.get("POSENC_DEBUG"):
            raise
        text = str(exc).strip()
        first_line = text.splitlines()[0] if text else type(exc).__name__
        print(f"posenc lengthgen: error: {first_line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
