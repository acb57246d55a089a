"""Synthetic tasks for measuring length generalization.

A task is any object with a ``name``, a ``vocab_size`` (its tokens are ``0 .. vocab_size-1``),
a ``kind`` and a ``sample(length, rng) -> (input, answer)`` method (the :class:`Task`
protocol). The harness adds its own special tokens (see :mod:`posenc.lengthgen.data`):

- ``kind="decoder"``: trained as ``BOS input SEP answer EOS`` with a causal model and the
  loss on ``answer EOS``; scored by greedy decoding (Kazemnejad et al. 2023).
- ``kind="encoder"``: ``input`` followed by one blank per answer token, bidirectional
  attention, the answer read off at the blanks (Delétang et al. 2023; Ruoss et al. 2023).

Shipped tasks:

=================  =======  ============================================================
name               kind     what the answer is
=================  =======  ============================================================
copy-v1            decoder  one symbol repeated n times, copied (Kazemnejad 2023, Copy V1)
copy-v2            decoder  each token mapped to its partner token (Kazemnejad, Copy V2)
copy-v3            decoder  random tokens, copied (Kazemnejad, Copy V3)
reverse-v1         decoder  random tokens, reversed (Kazemnejad, Reverse V1)
bucket-sort        encoder  the tokens sorted (Delétang 2023 / Ruoss 2023, Bucket Sort)
reverse-string     encoder  a binary string reversed (Reverse String)
missing-duplicate  encoder  the bit hidden in ``w w`` (Missing Duplicate)
even-pairs         encoder  parity of the number of ``01``/``10`` pairs (Even Pairs)
add                decoder  the sum of two reversed n-digit numbers (McLeish 2024)
=================  =======  ============================================================

A user task lives in any Python file and is named ``path/to/file.py:ClassName``; the class
is instantiated without arguments and checked against the protocol.

A decoder task whose answer tokens each come from one input token may also define
``answer_sources(length) -> list[int]`` (the input index behind each answer token) to allow
coupled positions (``NAME+coupled``; see :func:`posenc.lengthgen.data.coupled_positions`).
The copy tasks and Reverse V1 define it.

A task whose ``length`` counts something other than input tokens (``add``: digits per
operand) defines ``input_length(length) -> int``, the input tokens of such an example; a task
with digits defines ``digit_tokens`` (which Abacus positions index; ``NAME+abacus``).
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from ..errors import PosencTypeError, PosencValueError

TaskKind = Literal["decoder", "encoder"]
KINDS: tuple[str, ...] = ("decoder", "encoder")


@runtime_checkable
class Task(Protocol):
    """What the harness needs from a task."""

    name: str
    vocab_size: int  # task tokens are 0 .. vocab_size-1
    kind: TaskKind

    def sample(self, length: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        """One example whose input has ``length`` tokens: ``(input, answer)``."""
        ...


# --------------------------------------------------------------------------- registry

_TASKS: dict[str, tuple[Callable[[], Task], str]] = {}


def register_task(name: str, summary: str) -> Callable[[type], type]:
    """Class decorator: make a task class (constructible without arguments) available by
    ``name`` to :func:`get_task` and ``posenc lengthgen --task NAME``."""

    def wrap(cls: type) -> type:
        if name in _TASKS and _TASKS[name][0] is not cls:
            raise PosencValueError(f"task name {name!r} is already registered")
        _TASKS[name] = (cls, summary)
        return cls

    return wrap


def available_tasks() -> list[str]:
    """Names of every registered task, sorted."""
    return sorted(_TASKS)


def task_summary(name: str) -> str:
    """The one-line summary a task was registered with."""
    return _TASKS[name][1]


def get_task(spec: str) -> Task:
    """A task from a registry name or from ``path/to/file.py:ClassName``.

    >>> get_task("copy-v3").sample(3, np.random.default_rng(0))
    ([13, 10, 8], [13, 10, 8])
    """
    if not isinstance(spec, str):
        raise PosencTypeError(
            f"task must be a str (a name or path.py:Class), got {type(spec).__name__}"
        )
    if spec in _TASKS:
        return check_task(_TASKS[spec][0](), spec)
    if ":" in spec and spec.rsplit(":", 1)[0].endswith(".py"):
        return load_task_from_file(spec)
    raise PosencValueError(
        f"unknown task {spec!r}; known: {', '.join(available_tasks())} "
        "(or give path/to/file.py:ClassName)"
    )


def load_task_from_file(spec: str) -> Task:
    """Import the file of ``path/to/file.py:ClassName`` and instantiate ``ClassName``."""
    path_text, _, class_name = spec.rpartition(":")
    path = Path(path_text)
    if not class_name.isidentifier():
        raise PosencValueError(f"task {spec!r}: {class_name!r} is not a class name")
    if not path.is_file():
        raise PosencValueError(f"task {spec!r}: file {str(path)!r} does not exist")
    # One module per file, under a name that cannot clash with a real package.
    module_name = "posenc_user_task_" + re.sub(r"\W", "_", str(path.resolve()))
    module = sys.modules.get(module_name)
    if module is None:
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise PosencValueError(f"task {spec!r}: cannot import {str(path)!r}")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
    cls = getattr(module, class_name, None)
    if cls is None:
        raise PosencValueError(f"task {spec!r}: {str(path)!r} defines no {class_name!r}")
    if not callable(cls):
        raise PosencTypeError(f"task {spec!r}: {class_name!r} is not a class")
    return check_task(cls(), spec)


def check_task(task: object, spec: str = "task") -> Task:
    """Check that ``task`` has the attributes of the :class:`Task` protocol with sane values."""
    missing = [a for a in ("name", "vocab_size", "kind", "sample") if not hasattr(task, a)]
    if missing:
        raise PosencTypeError(
            f"task {spec!r} ({type(task).__name__}) lacks {', '.join(missing)}: a task needs "
            "name, vocab_size, kind and sample(length, rng)"
        )
    name, vocab, kind = task.name, task.vocab_size, task.kind  # type: ignore[attr-defined]
    if not isinstance(name, str) or not name:
        raise PosencTypeError(f"task {spec!r}: name must be a non-empty str, got {name!r}")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise PosencTypeError(f"task {spec!r}: vocab_size must be an int >= 1, got {vocab!r}")
    if kind not in KINDS:
        raise PosencValueError(f"task {spec!r}: kind must be 'decoder' or 'encoder', got {kind!r}")
    if not callable(task.sample):  # type: ignore[attr-defined]
        raise PosencTypeError(f"task {spec!r}: sample must be a method")
    return task  # type: ignore[return-value]


# --------------------------------------------------------------------------- helpers


def _check_length(length: int) -> None:
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
        raise PosencValueError(f"length must be an int >= 1, got {length!r}")


def _random_tokens(rng: np.random.Generator, length: int, vocab: int) -> list[int]:
    return [int(t) for t in rng.integers(0, vocab, size=length)]


# --------------------------------------------------------------------------- Kazemnejad 2023


@register_task("copy-v1", "copy one symbol repeated n times (Kazemnejad 2023, Copy V1)")
class CopyV1:
    """Copy V1 of Kazemnejad et al. 2023 (appendix F): the input is one symbol, drawn
    uniformly, repeated ``length`` times; the answer is the same sequence.

    >>> CopyV1().sample(4, np.random.default_rng(0))
    ([13, 13, 13, 13], [13, 13, 13, 13])
    """

    name = "copy-v1"
    kind: TaskKind = "decoder"

    def __init__(self, vocab_size: int = 16) -> None:
        self.vocab_size = vocab_size

    def sample(self, length: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        _check_length(length)
        symbol = int(rng.integers(0, self.vocab_size))
        return [symbol] * length, [symbol] * length

    def answer_sources(self, length: int) -> list[int]:
        """Answer token ``j`` is (derived from) input token ``j``."""
        return list(range(length))


@register_task("copy-v2", "map each token to its partner token (Kazemnejad 2023, Copy V2)")
class CopyV2:
    """Copy V2 of Kazemnejad et al. 2023: copy, but every token is replaced by a fixed partner.

    The vocabulary is split in two halves of ``k`` tokens; the input holds random tokens of
    the first half and the answer maps each ``t`` to ``t + k`` in the second half (a fixed
    one-to-one map the model has to learn alongside the copying).

    >>> CopyV2(vocab_size=8).sample(3, np.random.default_rng(0))
    ([3, 2, 2], [7, 6, 6])
    """

    name = "copy-v2"
    kind: TaskKind = "decoder"

    def __init__(self, vocab_size: int = 16) -> None:
        if vocab_size < 2 or vocab_size % 2:
            raise PosencValueError(f"vocab_size must be an even int >= 2, got {vocab_size}")
        self.vocab_size = vocab_size

    def sample(self, length: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        _check_length(length)
        half = self.vocab_size // 2
        tokens = _random_tokens(rng, length, half)
        return tokens, [t + half for t in tokens]

    def answer_sources(self, length: int) -> list[int]:
        """Answer token ``j`` is (derived from) input token ``j``."""
        return list(range(length))


@register_task("copy-v3", "copy random tokens (Kazemnejad 2023, Copy V3)")
class CopyV3:
    """Copy V3 of Kazemnejad et al. 2023: random tokens, answer = input."""

    name = "copy-v3"
    kind: TaskKind = "decoder"

    def __init__(self, vocab_size: int = 16) -> None:
        self.vocab_size = vocab_size

    def sample(self, length: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        _check_length(length)
        tokens = _random_tokens(rng, length, self.vocab_size)
        return tokens, list(tokens)

    def answer_sources(self, length: int) -> list[int]:
        """Answer token ``j`` is (derived from) input token ``j``."""
        return list(range(length))


@register_task("reverse-v1", "reverse random tokens (Kazemnejad 2023, Reverse V1)")
class ReverseV1:
    """Reverse V1 of Kazemnejad et al. 2023: random tokens, answer = input reversed.

    >>> ReverseV1().sample(3, np.random.default_rng(0))
    ([13, 10, 8], [8, 10, 13])
    """

    name = "reverse-v1"
    kind: TaskKind = "decoder"

    def __init__(self, vocab_size: int = 16) -> None:
        self.vocab_size = vocab_size

    def sample(self, length: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        _check_length(length)
        tokens = _random_tokens(rng, length, self.vocab_size)
        return tokens, tokens[::-1]

    def answer_sources(self, length: int) -> list[int]:
        """Answer token ``j`` is input token ``length - 1 - j``."""
        return list(range(length - 1, -1, -1))


# --------------------------------------------------------------------------- Ruoss 2023


@register_task("bucket-sort", "sort tokens of a 5-symbol alphabet (Ruoss 2023, Bucket Sort)")
class BucketSort:
    """Bucket Sort (Delétang et al. 2023, used by Ruoss et al. 2023): tokens of a fixed
    alphabet (5 symbols), answer = the tokens in increasing order.

    >>> BucketSort().sample(5, np.random.default_rng(1))
    ([2, 2, 3, 4, 0], [0, 2, 2, 3, 4])
    """

    name = "bucket-sort"
    kind: TaskKind = "encoder"

    def __init__(self, vocab_size: int = 5) -> None:
        self.vocab_size = vocab_size

    def sample(self, length: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        _check_length(length)
        tokens = _random_tokens(rng, length, self.vocab_size)
        return tokens, sorted(tokens)


@register_task("reverse-string", "reverse a binary string (Ruoss 2023, Reverse String)")
class ReverseString:
    """Reverse String (Delétang et al. 2023; Ruoss et al. 2023): a binary string, reversed."""

    name = "reverse-string"
    kind: TaskKind = "encoder"
    vocab_size = 2

    def sample(self, length: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        _check_length(length)
        tokens = _random_tokens(rng, length, 2)
        return tokens, tokens[::-1]


@register_task("missing-duplicate", "find the bit hidden in w w (Ruoss 2023, Missing Duplicate)")
class MissingDuplicate:
    """Missing Duplicate (Delétang et al. 2023; Ruoss et al. 2023).

    A binary string ``w`` of ``length // 2`` bits is written twice, one position of ``w w``
    is replaced by the placeholder ``2``, and the answer is the bit that was there. An odd
    ``length`` ends with the filler token ``3``. ``length == 1`` has no room for ``w``; as in
    the reference implementation the example is then ``[1] -> [1]``.

    Tokens: ``0``, ``1`` (bits), ``2`` (missing), ``3`` (filler).

    >>> MissingDuplicate().sample(7, np.random.default_rng(0))
    ([1, 2, 1, 1, 1, 1, 3], [1])
    """

    name = "missing-duplicate"
    kind: TaskKind = "encoder"
    vocab_size = 4
    MISSING, FILLER = 2, 3

    def sample(self, length: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        _check_length(length)
        if length == 1:
            return [1], [1]
        word = _random_tokens(rng, length // 2, 2)
        doubled = word + word
        hole = int(rng.integers(0, len(doubled)))
        answer = doubled[hole]
        doubled[hole] = self.MISSING
        return doubled + [self.FILLER] * (length % 2), [answer]


@register_task("even-pairs", "parity of the count of 01 and 10 pairs (Ruoss 2023, Even Pairs)")
class EvenPairs:
    """Even Pairs (Delétang et al. 2023; Ruoss et al. 2023): a binary string; the answer is
    ``1`` when the number of unequal neighbours (``01`` or ``10``) is odd, else ``0``.

    >>> EvenPairs().sample(6, np.random.default_rng(0))
    ([1, 1, 1, 0, 0, 0], [1])
    """

    name = "even-pairs"
    kind: TaskKind = "encoder"
    vocab_size = 2

    def sample(self, length: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        _check_length(length)
        tokens = _random_tokens(rng, length, 2)
        changes = sum(a != b for a, b in itertools.pairwise(tokens))
        return tokens, [changes % 2]


# --------------------------------------------------------------------------- McLeish 2024


@register_task("add", "add two n-digit numbers, digits reversed (McLeish 2024, Abacus)")
class AddReversed:
    """Addition in the format of McLeish et al. 2024: two ``length``-digit numbers ``a`` and
    ``b`` written least-significant digit first and joined by ``+``; the answer is ``a + b``,
    least-significant digit first (``length`` or ``length + 1`` digits). A number of more than
    one digit has a non-zero leading (last written) digit. The input has ``2 * length + 1``
    tokens (:meth:`input_length`); the harness's ``SEP`` plays ``=``.

    Tokens: ``0``-``9`` the digits (:attr:`digit_tokens`), ``10`` the ``+``.

    >>> AddReversed().sample(2, np.random.default_rng(0))
    ([8, 5, 10, 2, 1], [0, 7])
    """

    name = "add"
    kind: TaskKind = "decoder"
    vocab_size = 11
    PLUS = 10
    #: The tokens that are digits (what Abacus embeddings index).
    digit_tokens: tuple[int, ...] = tuple(range(10))

    def input_length(self, length: int) -> int:
        """Input tokens of an example of ``length``-digit operands."""
        return 2 * length + 1

    def _number(self, length: int, rng: np.random.Generator) -> list[int]:
        """``length`` digits, least significant first, the last non-zero unless alone."""
        digits = [int(d) for d in rng.integers(0, 10, size=length)]
        if length > 1:
            digits[-1] = int(rng.integers(1, 10))
        return digits

    def sample(self, length: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
        _check_length(length)
        a, b = self._number(length, rng), self._number(length, rng)
        answer, carry = [], 0
        for x, y in zip(a, b, strict=True):  # schoolbook addition, least significant first
            carry, digit = divmod(x + y + carry, 10)
            answer.append(digit)
        if carry:
            answer.append(carry)
        return [*a, self.PLUS, *b], answer
