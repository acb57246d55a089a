"""Peak resident memory and wall time of every ``posenc`` command a newcomer runs: the tour,
analyze, report, and ``plot`` of every registered scheme (its default kind). Each command is
its own process, measured with ``/usr/bin/time -v``; prints a markdown table.

    .venv/bin/python benchmarks/resources.py > benchmarks/resources.md
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import posenc

POSENC = str(Path(sys.executable).with_name("posenc"))


def measure(argv: list[str], cwd: str) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MiB, exit status) of ``posenc argv``."""
    done = subprocess.run(
        ["/usr/bin/time", "-v", POSENC, *argv], cwd=cwd, capture_output=True, text=True
    )
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", done.stderr)
    parts = [float(p) for p in wall.group(1).split(":")]
    seconds = sum(p * 60**i for i, p in enumerate(reversed(parts)))
    return seconds, rss / 1024, done.returncode


def main() -> None:
    commands = [["tour", "--out", "tour"], ["analyze"], ["report", "-o", "report.html"]]
    commands += [["plot", name, "-o", f"{name}.png"] for name in posenc.available()]
    print("| command | wall (s) | peak RSS (MiB) | status |")
    print("| --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as cwd:
        for argv in commands:
            seconds, rss, status = measure(argv, cwd)
            print(f"| `posenc {' '.join(argv)}` | {seconds:.1f} | {rss:.0f} | {status} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
