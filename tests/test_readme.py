"""README.md stays true: its Python blocks run, CI runs its test command verbatim, and the
numbers it gives for posenc's rotation against transformers' are measured."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)
SHELL = re.findall(r"```bash\n(.*?)```", README, flags=re.S)


def test_readme_has_code() -> None:
    assert len(BLOCKS) >= 2
    assert len(SHELL) == 2, "exactly two set-up commands"


def test_the_test_command_installs_the_pinned_versions() -> None:
    """The test extras come from constraints.txt, which pins every one of them (and what they
    bring) with ``==``, so the suite gives the same answer on any day."""
    assert "-c constraints.txt" in SHELL[1]
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not pinned with =="
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    pyproject = (ROOT / "pyproject.toml").read_text()
    extras = re.search(r"^peers = \[(.*?)^\]", pyproject, flags=re.S | re.M)
    tools = re.search(r"^test = \[(.*?)^\]", pyproject, flags=re.S | re.M)
    assert extras and tools
    named = re.findall(r'^\s*"([A-Za-z0-9_.-]+)', extras[1] + tools[1], flags=re.M)
    wanted = {re.sub(r"[-_.]+", "-", n).lower() for n in named} - {"posenc"}
    assert wanted and wanted <= set(pins), sorted(wanted - set(pins))
    assert pins["transformers"].startswith("5.24."), pins["transformers"]


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_python_block_runs(index: int) -> None:
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), {})


def test_ci_runs_the_readme_test_command() -> None:
    test_command = SHELL[1].strip()
    assert "pytest" in test_command
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()


def test_main_command_runs_the_tour() -> None:
    assert SHELL[0].strip().endswith("posenc tour")


def test_pictures_exist() -> None:
    for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README):
        assert (ROOT / target).is_file(), target


def _rounding_against_transformers() -> dict[str, str]:
    """The README's "what exact means" numbers, measured on its setup: Llama's rotary
    (head_dim 128, theta 10,000), 8 heads, positions 0-2047, q and k ~ N(0, 1) (seed 0);
    errors against the rotation in float64 (float64 angles and arithmetic)."""
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama

    import posenc

    h, n, d = 8, 2048, 128
    config = LlamaConfig(hidden_size=h * d, num_attention_heads=h, head_dim=d)
    peer = modeling_llama.LlamaRotaryEmbedding(config)
    angles = torch.arange(n, dtype=torch.float64)[:, None] / 10000.0 ** (
        torch.arange(0, d, 2, dtype=torch.float64) / d
    )
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

    def truth(x: torch.Tensor) -> torch.Tensor:  # the half layout in float64
        x = x.double()
        return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin

    def steps(x: torch.Tensor) -> torch.Tensor:  # bfloat16 bits in the order of the values
        i = x.view(torch.int16).int()
        return torch.where(i < 0, -(i & 0x7FFF), i)

    torch.manual_seed(0)
    q32, k32 = torch.randn(2, 1, h, n, d).unbind(0)
    found: dict[str, str] = {}
    for dtype in (torch.float32, torch.bfloat16):
        q, k = q32.to(dtype), k32.to(dtype)
        ours = torch.cat([t.flatten() for t in posenc.RotaryEmbedding(d)(q, k, torch.arange(n))])
        cos_sin = peer(q, torch.arange(n)[None])  # in q's dtype, as the model passes them
        theirs = torch.cat(
            [t.flatten() for t in modeling_llama.apply_rotary_pos_emb(q, k, *cos_sin)]
        )
        exact = torch.cat([truth(q).flatten(), truth(k).flatten()])
        name = "fp32" if dtype == torch.float32 else "bf16"
        for who, got in (("posenc", ours), ("transformers", theirs)):
            error = (got.double() - exact).abs()
            found[f"{name} {who} max"] = f"{error.max().item():.2g}"
            found[f"{name} {who} mean"] = f"{error.mean().item():.1e}"
            # the share of elements that are not the float64 value rounded once to dtype
            missed = (got != exact.to(dtype)).double().mean().item()
            found[f"{name} {who} missed"] = f"{100 * missed:.2g}%"
        found[f"{name} differ"] = f"{100 * (ours != theirs).double().mean().item():.0f}%"
        if dtype == torch.bfloat16:
            apart = (steps(ours) - steps(theirs)).abs()
            share = ((apart == 1).sum() / (apart > 0).sum()).item()
            found["bf16 one ulp"] = f"{100 * share:.0f}%"
    return found


def test_what_exact_means_in_bfloat16_is_measured() -> None:
    """The numbers the README gives for posenc's rotation against transformers' are the
    ones measured here (posenc rounds once, so in bfloat16 it is nearly always the float64
    value correctly rounded; transformers rounds cos, sin and each product)."""
    found = _rounding_against_transformers()
    paragraph = README.split("**What exact means.**")[1].split("\n\n")[0]
    text = " ".join(paragraph.split())
    wanted = (
        f"differ in {found['bf16 differ']} of the elements ({found['bf16 one ulp']} of "
        "those by one unit in the last place",
        f"max error {found['bf16 posenc max']} against transformers' "
        f"{found['bf16 transformers max']}",
        f"mean {found['bf16 posenc mean']} against {found['bf16 transformers mean']}",
        f"in all but {found['bf16 posenc missed']} of the elements (transformers: "
        f"{found['bf16 transformers missed']} not)",
        f"max error {found['fp32 posenc max']} against transformers' "
        f"{found['fp32 transformers max']}",
    )
    for fragment in wanted:
        assert fragment in text, (fragment, found)
