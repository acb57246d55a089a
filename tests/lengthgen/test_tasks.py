"""The synthetic tasks of ``posenc lengthgen`` (``posenc.lengthgen.tasks``) against independent
transcriptions of their definitions (Delétang et al. 2023), and tasks from a user's file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from posenc.lengthgen.data import (
    checked_sample,
)
from posenc.lengthgen.evaluate import (
    read_jsonl,
)
from posenc.lengthgen.tasks import available_tasks, get_task, load_task_from_file
from tests.lengthgen.tiny import SHIPPED, TINY_CLI, run_cli
from tests.misuse import Misuse, check


def test_registry_lists_the_eight_tasks() -> None:
    assert set(SHIPPED) <= set(available_tasks())
    kinds = {name: get_task(name).kind for name in SHIPPED}
    assert {n for n, k in kinds.items() if k == "decoder"} == {
        "copy-v1",
        "copy-v2",
        "copy-v3",
        "reverse-v1",
    }


def _missing_duplicate_oracle(inp: list[int]) -> int:
    """Independent solution: the hole's twin in the other half holds the answer."""
    body = inp[: len(inp) - len(inp) % 2]
    half = len(body) // 2
    hole = body.index(2)
    return body[hole + half] if hole < half else body[hole - half]


def _oracle(name: str, inp: list[int]) -> list[int]:
    """Independent transcription of each task's definition."""
    if name in ("copy-v1", "copy-v3"):
        return list(inp)
    if name == "copy-v2":
        return [t + 8 for t in inp]  # vocabulary 16 = two halves of 8
    if name in ("reverse-v1", "reverse-string"):
        return list(reversed(inp))
    if name == "bucket-sort":
        return sorted(inp)
    if name == "even-pairs":
        # The number of 01/10 boundaries is odd exactly when the ends differ.
        return [int(inp[0] != inp[-1])]
    if name == "missing-duplicate":
        return [1] if len(inp) == 1 else [_missing_duplicate_oracle(inp)]
    raise AssertionError(name)


@pytest.mark.parametrize("name", SHIPPED)
def test_generator_lengths_tokens_and_answers(name: str) -> None:
    task = get_task(name)
    rng = np.random.default_rng(123)
    for length in [*range(1, 25), 40, 57]:
        for _ in range(5):
            inp, ans = checked_sample(task, length, rng)
            assert len(inp) == length
            assert all(0 <= t < task.vocab_size for t in inp + ans)
            assert ans == _oracle(name, inp), (name, inp, ans)


@pytest.mark.parametrize(
    ("name", "length", "expected_answer_length"),
    [
        ("copy-v1", 7, 7),
        ("copy-v2", 7, 7),
        ("copy-v3", 7, 7),
        ("reverse-v1", 7, 7),
        ("bucket-sort", 7, 7),
        ("reverse-string", 7, 7),
        ("missing-duplicate", 7, 1),
        ("even-pairs", 7, 1),
    ],
)
def test_answer_lengths(name: str, length: int, expected_answer_length: int) -> None:
    _, ans = checked_sample(get_task(name), length, np.random.default_rng(0))
    assert len(ans) == expected_answer_length


def test_known_examples() -> None:
    # The reference implementation's documented examples (Delétang et al. 2023).
    assert _missing_duplicate_oracle([0, 1, 1, 0, 0, 2, 1, 0]) == 1
    assert _missing_duplicate_oracle([1, 0, 1, 1, 2, 1, 3]) == 0
    assert _oracle("even-pairs", [0, 0, 1, 1, 1, 0]) == [0]  # one 01 and one 10
    assert _oracle("even-pairs", [0, 1, 0, 1, 0, 0, 1]) == [1]  # 2 10s and 3 01s
    # Copy V1 is one symbol repeated; Copy V2 maps each token to its partner.
    inp, ans = get_task("copy-v1").sample(6, np.random.default_rng(4))
    assert len(set(inp)) == 1 and ans == inp
    inp, ans = get_task("copy-v2").sample(6, np.random.default_rng(4))
    assert all(t < 8 for t in inp) and ans == [t + 8 for t in inp]
    # Missing Duplicate: w w with one hole, an odd length ends on the filler 3.
    for length in (6, 9):
        inp, ans = get_task("missing-duplicate").sample(length, np.random.default_rng(5))
        assert inp.count(2) == 1
        assert (inp[-1] == 3) == (length % 2 == 1)
        body = [ans[0] if t == 2 else t for t in inp[: length - length % 2]]
        assert body[: length // 2] == body[length // 2 :]


def test_same_rng_same_examples() -> None:
    for name in SHIPPED:
        task = get_task(name)
        a = [task.sample(9, np.random.default_rng(7)) for _ in range(2)]
        assert a[0] == a[1]


USER_TASK = '''
import numpy as np

class Parity:
    """Decoder task: the parity of the number of ones."""
    name = "my-parity"
    vocab_size = 2
    kind = "decoder"

    def sample(self, length, rng):
        bits = [int(b) for b in rng.integers(0, 2, size=length)]
        return bits, [sum(bits) % 2]

class NoKind:
    name = "broken"
    vocab_size = 2

    def sample(self, length, rng):
        return [0] * length, [0]

class BadTokens:
    name = "bad-tokens"
    vocab_size = 2
    kind = "encoder"

    def sample(self, length, rng):
        return [5] * length, [0]
'''


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_tasks.py"
    path.write_text(USER_TASK)
    return path


def test_task_from_user_file(user_file: Path, tmp_path: Path) -> None:
    task = get_task(f"{user_file}:Parity")
    assert task.name == "my-parity" and task.kind == "decoder"
    inp, ans = task.sample(5, np.random.default_rng(0))
    assert ans == [sum(inp) % 2]
    out = tmp_path / "out"
    code = run_cli(["--task", f"{user_file}:Parity", "--pe", "none", "--out", str(out), *TINY_CLI])
    assert code == 0
    (record,) = read_jsonl(out / "results.jsonl")
    assert record["task"] == "my-parity"
    assert [r["length"] for r in record["lengths"]] == [1, 2, 3, 4, 5, 6, 7]
    assert (out / "my-parity" / "none" / "seed0" / "checkpoint.pt").exists()


def test_user_file_errors(user_file: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope.py"
    bad = get_task(f"{user_file}:BadTokens")
    for case in [
        Misuse("no-file", lambda: get_task(f"{missing}:Parity"), ValueError, "file", str(missing)),
        Misuse("no-class", lambda: load_task_from_file(f"{user_file}:Missing"), ValueError,
               "defines no", "Missing"),
        Misuse("no-kind", lambda: get_task(f"{user_file}:NoKind"), TypeError, "kind", "NoKind"),
        Misuse("unknown", lambda: get_task("nope"), ValueError, "task", "nope"),
        Misuse("token-outside", lambda: checked_sample(bad, 3, np.random.default_rng(0)),
               ValueError, "input token", 5),
    ]:  # fmt: skip
        check(case)
    with pytest.raises(ValueError, match="task") as info:
        get_task("nope")
    assert all(name in str(info.value) for name in SHIPPED)  # the known tasks are listed
