"""posenc's core needs torch alone (issue #44 item 7): with the ``app`` extra's packages (and
transformers) unimportable, ``import posenc`` and every path a model walks still run, and the
commands that need the extra say in one line what to install (status 2, no traceback)."""

from __future__ import annotations

import subprocess
import sys

from tests.commands import SUBPROCESS_ENV

BLOCK = """
import sys
import warnings
warnings.simplefilter("ignore")  # torch warns that numpy is absent
for name in ("numpy", "matplotlib", "rich", "markdown", "transformers"):
    sys.modules[name] = None
"""

MODEL_PATHS = (
    BLOCK
    + """
import torch
import posenc
torch.manual_seed(0)
x = torch.randn(2, 8, 32)
padding = torch.zeros(2, 8, dtype=torch.bool)
padding[1, :2] = True
for pe in posenc.available():
    if posenc.entry(pe).cls.axes > 1:
        continue  # they take coordinates, not a sequence
    enc = posenc.Encoder(32, 2, 4, pe=pe, causal=True)
    enc(x, key_padding_mask=padding)
model = posenc.TransformerModel(50, 32, 2, 4, pe="rope", causal=True, window=4)
model.generate(torch.randint(0, 50, (2, 5)), 4)
cache = posenc.KVCache()
model(torch.randint(0, 50, (1, 3)), cache=cache)
model(torch.randint(0, 50, (1, 1)), cache=cache)
loaded = sorted(name for name in ("numpy", "matplotlib", "rich", "markdown", "transformers")
                if sys.modules.get(name) is not None)
print("loaded:", loaded)
"""
)

COMMANDS = (
    BLOCK
    + """
from posenc.app.cli import main
for argv in (["plot", "rope", "-o", "x.png"], ["tour"], ["lengthgen", "--task", "copy-v1"],
             ["report", "-o", "r.html"], ["analyze", "rope"], ["list"]):
    print(argv[0], main(argv))
"""
)


def _run(code: str, tmp_path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        cwd=tmp_path,
        timeout=300,
    )


def test_models_need_torch_alone(tmp_path) -> None:
    done = _run(MODEL_PATHS, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "loaded: []"


def test_commands_name_the_missing_extra(tmp_path) -> None:
    done = _run(COMMANDS, tmp_path)
    assert done.returncode == 0, done.stderr
    status = dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)
    assert status == {"plot": "2", "tour": "2", "lengthgen": "2", "report": "2",
                      "analyze": "2", "list": "0"}  # fmt: skip
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 5, done.stderr  # one line each, no traceback
    for command, line in zip(
        ("plot", "tour", "lengthgen", "report", "analyze"), errors, strict=True
    ):
        assert line.startswith(f"posenc: error: posenc {command} needs "), line
        assert line.endswith("pip install 'posenc[app]'"), line
