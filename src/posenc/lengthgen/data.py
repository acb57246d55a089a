"""Turning task examples into model batches, with the harness's special tokens.

A task's own tokens are ``0 .. V-1``; the harness appends five of its own:

=====  =========  =============================================================
token  name       role
=====  =========  =============================================================
V      ``PAD``    fills a batch to one length; never attended to, never scored
V+1    ``BOS``    starts a decoder sequence
V+2    ``SEP``    ends the input of a decoder sequence
V+3    ``EOS``    ends the answer of a decoder sequence (scored)
V+4    ``BLANK``  one per answer token after an encoder input; predicted there
=====  =========  =============================================================

Decoder layout (Kazemnejad et al. 2023): ``BOS x SEP y EOS``, fed shifted by one; the loss
covers the predictions of ``y EOS``. Encoder layout (Delétang et al. 2023): ``x BLANK*|y|``
with the targets ``y`` at the blanks.

Randomized positions (Ruoss et al. 2023, §3): instead of ``0 .. n-1`` a sequence of ``n``
tokens gets ``n`` positions drawn without replacement from ``[0, L)`` and sorted, resampled
for every sequence, in training and in testing alike.

Coupled positions (Cho et al. 2024, "Position Coupling"): each answer token gets the position
of the input token it comes from, so that with a relative encoding every step of the answer
looks the same at every length (see :func:`coupled_positions`). It uses the task's structure
(``answer_sources``), so it is a task-aware baseline, not a general-purpose encoding.

Dimension legend: ``b`` batch, ``n`` sequence.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..errors import PosencTypeError, PosencValueError
from ..sequence.positions import randomize_positions
from .tasks import Task

NUM_SPECIAL = 5


@dataclass(frozen=True)
class Vocab:
    """Token ids of a task's vocabulary extended with the harness's special tokens."""

    task_size: int

    @property
    def pad(self) -> int:
        return self.task_size

    @property
    def bos(self) -> int:
        return self.task_size + 1

    @property
    def sep(self) -> int:
        return self.task_size + 2

    @property
    def eos(self) -> int:
        return self.task_size + 3

    @property
    def blank(self) -> int:
        return self.task_size + 4

    @property
    def size(self) -> int:
        """The model's vocabulary: task tokens and special tokens."""
        return self.task_size + NUM_SPECIAL


Example = tuple[list[int], list[int]]


def input_length(task: Task, length: int) -> int:
    """The input tokens of ``task``'s examples at ``length``: ``length``, or what the task's
    ``input_length(length)`` says (``add`` counts digits per operand)."""
    own = getattr(task, "input_length", None)
    return length if own is None else int(own(length))


def checked_sample(task: Task, length: int, rng: np.random.Generator) -> Example:
    """``task.sample(length, rng)``, checked: input of :func:`input_length` tokens, a non-empty
    answer,
    every token an int in ``[0, vocab_size)``."""
    inp, ans = task.sample(length, rng)
    inp, ans = list(inp), list(ans)
    expected = input_length(task, length)
    if len(inp) != expected:
        raise PosencValueError(
            f"task {task.name!r}: sample({length}) returned an input of {len(inp)} tokens, "
            f"not {expected}"
        )
    if not ans:
        raise PosencValueError(f"task {task.name!r}: sample({length}) returned an empty answer")
    for part, tokens in (("input", inp), ("answer", ans)):
        for t in tokens:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise PosencTypeError(f"task {task.name!r}: {part} token {t!r} is not an int")
            if not 0 <= t < task.vocab_size:
                raise PosencValueError(
                    f"task {task.name!r}: {part} token {int(t)} is outside "
                    f"[0, vocab_size={task.vocab_size})"
                )
    return [int(t) for t in inp], [int(t) for t in ans]


def model_length(kind: str, input_length: int, answer_length: int) -> int:
    """Tokens the model sees for one example (decoder: ``BOS x SEP y`` fed, EOS predicted)."""
    if kind == "decoder":
        return input_length + answer_length + 2
    return input_length + answer_length


def coupled_positions(sources: list[int], input_length: int) -> np.ndarray:
    """Positions of the decoder tokens ``BOS x SEP y`` under position coupling.

    Input token ``i`` sits at ``i + 1``; answer token ``j`` at the position of its source
    input token, ``sources[j] + 1``. With ``step`` the direction of the answer through the
    input (+1 for a copy, -1 for a reversal), SEP sits one step before the first source and
    BOS one step after the last, so the token that predicts answer token ``j`` always sits
    one step before its source, and the last answer token one step before BOS (predict EOS):
    constant offsets at every length. Shifted so the smallest position is 0.

    >>> coupled_positions([0, 1, 2], 3)  # copy: BOS x x x SEP y y y
    array([4, 1, 2, 3, 0, 1, 2, 3])
    >>> coupled_positions([2, 1, 0], 3)  # reverse
    array([0, 1, 2, 3, 4, 3, 2, 1])
    """
    if not sources:
        raise PosencValueError("coupled positions need an answer of at least one token")
    if any(not 0 <= s < input_length for s in sources):
        raise PosencValueError(
            f"answer_sources must index the input (0..{input_length - 1}), got {sources}"
        )
    src = [s + 1 for s in sources]
    step = src[1] - src[0] if len(src) > 1 else 1
    positions = np.array([src[-1] + step, *range(1, input_length + 1), src[0] - step, *src])
    return positions - positions.min()


def check_coupling(task: Task) -> None:
    """Raise unless ``task`` can take coupled positions: a decoder task with
    ``answer_sources()``."""
    if task.kind != "decoder" or not callable(getattr(task, "answer_sources", None)):
        raise PosencValueError(
            f"coupled positions need a decoder task with answer_sources(); task "
            f"{task.name!r} ({task.kind}) has none"
        )


def example_positions(
    task: Task, example: Example, rng: np.random.Generator, *, random_max: int | None, coupled: bool
) -> np.ndarray | None:
    """One example's positions: randomized (``random_max``), coupled, both, or ``None``
    (arange). Both: the coupled positions ``0..m`` are mapped through ``m + 1`` sorted random
    positions from ``[0, random_max)``, so answer tokens still share their source's position
    and the order is kept, while distances are as varied as under randomized positions."""
    x, y = example
    if coupled:
        check_coupling(task)
        sources = [int(s) for s in task.answer_sources(len(x))]  # type: ignore[attr-defined]
        if len(sources) != len(y):
            raise PosencValueError(
                f"{task.name}.answer_sources({len(x)}) gave {len(sources)} sources for an "
                f"answer of {len(y)} tokens"
            )
        positions = coupled_positions(sources, len(x))
        if random_max is not None:
            positions = randomize_examples(positions, len(positions), random_max, rng)
        return positions
    if random_max is not None:
        return random_positions(model_length(task.kind, len(x), len(y)), random_max, rng)
    return None


def random_positions(length: int, max_positions: int, rng: np.random.Generator) -> np.ndarray:
    """``length`` distinct positions from ``[0, max_positions)``, sorted (Ruoss et al. 2023):
    :func:`posenc.randomize_positions`, the draw ``Encoder(random_positions=L)`` makes, with a
    generator seeded from ``rng`` so that a run's data stays a function of its seed.

    >>> random_positions(4, 10, np.random.default_rng(0))
    array([1, 4, 7, 9])
    """
    return randomize_examples(None, length, max_positions, rng)


def randomize_examples(
    positions: np.ndarray | None, length: int, max_positions: int, rng: np.random.Generator
) -> np.ndarray:
    """One example's ``positions`` (``None``: ``arange(length)``) mapped through sorted
    distinct draws from ``[0, max_positions)`` (:func:`posenc.randomize_positions`; ties and
    order kept), drawn with a torch generator seeded from ``rng``."""
    generator = torch.Generator().manual_seed(int(rng.integers(2**62)))
    given = None if positions is None else torch.as_tensor(positions)
    return randomize_positions(given, length, max_positions, generator=generator).numpy()


@dataclass
class Batch:
    """Model inputs and targets; every tensor is ``(b, n)``."""

    tokens: Tensor  # int64 token ids, PAD-filled
    targets: Tensor  # int64 target ids, PAD where not scored
    loss_mask: Tensor  # bool, True where the prediction is scored
    positions: Tensor | None  # int64 randomized positions, or None for arange
    key_padding_mask: Tensor | None  # bool, True = padding; None when nothing is padded

    def to(self, device: torch.device | str) -> Batch:
        """The same batch with every tensor on ``device``."""
        values = [getattr(self, f.name) for f in dataclasses.fields(self)]
        return Batch(*(None if v is None else v.to(device) for v in values))


def encode(kind: str, example: Example, vocab: Vocab) -> tuple[list[int], list[int], list[bool]]:
    """One example as (model tokens, targets, scored?) lists of equal length."""
    inp, ans = example
    if kind == "decoder":
        full = [vocab.bos, *inp, vocab.sep, *ans, vocab.eos]
        tokens, targets = full[:-1], full[1:]
        first = len(inp) + 1  # tokens[first] is SEP, whose prediction is the first answer token
        scored = [i >= first for i in range(len(tokens))]
        return tokens, targets, scored
    tokens = [*inp] + [vocab.blank] * len(ans)
    targets = [vocab.pad] * len(inp) + [*ans]
    scored = [False] * len(inp) + [True] * len(ans)
    return tokens, targets, scored


def collate(
    kind: str,
    examples: list[Example],
    vocab: Vocab,
    *,
    pad_to: int | None = None,
    positions: list[np.ndarray] | None = None,
) -> Batch:
    """Stack examples into a right-padded :class:`Batch`.

    ``pad_to`` fixes the padded length (so shards of one global batch have equal shapes);
    ``positions`` gives each example's randomized positions (at least as many as its tokens).
    Decoder batches need no padding mask: with causal attention and right padding no real
    token can see a pad.
    """
    encoded = [encode(kind, ex, vocab) for ex in examples]
    longest = max(len(t) for t, _, _ in encoded)
    n = longest if pad_to is None else pad_to
    if n < longest:
        raise PosencValueError(f"pad_to={pad_to} is shorter than the longest example ({longest})")
    b = len(encoded)
    tokens = torch.full((b, n), vocab.pad, dtype=torch.long)
    targets = torch.full((b, n), vocab.pad, dtype=torch.long)
    scored = torch.zeros((b, n), dtype=torch.bool)
    padding = torch.ones((b, n), dtype=torch.bool)
    for i, (tok, tgt, sc) in enumerate(encoded):
        m = len(tok)
        tokens[i, :m] = torch.tensor(tok)
        targets[i, :m] = torch.tensor(tgt)
        scored[i, :m] = torch.tensor(sc)
        padding[i, :m] = False
    pos = None
    if positions is not None:
        pos = torch.zeros((b, n), dtype=torch.long)
        for i, (tok, _, _) in enumerate(encoded):
            m = len(tok)
            pos[i, :m] = torch.from_numpy(np.asarray(positions[i][:m], dtype=np.int64))
            pos[i, m:] = pos[i, m - 1]  # pads repeat the last real position (never attended)
    key_padding_mask = padding if kind == "encoder" and bool(padding.any()) else None
    return Batch(tokens, targets, scored, pos, key_padding_mask)


def sample_batch(
    task: Task,
    batch_size: int,
    min_length: int,
    max_length: int,
    rng: np.random.Generator,
    *,
    random_max: int | None = None,
    coupled: bool = False,
) -> tuple[list[Example], list[np.ndarray] | None]:
    """``batch_size`` examples with input lengths uniform in ``[min_length, max_length]``, and
    their randomized positions when ``random_max`` (``L``) is given, or their coupled ones.

    The draw order is fixed (all lengths, then the examples in order, then the positions), so
    one seed always yields the same global batch, however it is later sharded.
    """
    lengths = rng.integers(min_length, max_length + 1, size=batch_size)
    examples = [checked_sample(task, int(n), rng) for n in lengths]
    if random_max is None and not coupled:
        return examples, None
    positions = [
        example_positions(task, ex, rng, random_max=random_max, coupled=coupled) for ex in examples
    ]
    return examples, positions  # type: ignore[return-value]


def longest_model_length(
    task: Task, lengths: list[int], rng: np.random.Generator, probes: int = 8
) -> int:
    """The longest sequence the model sees for inputs of the given lengths, estimated by
    sampling ``probes`` examples at each (exact for tasks whose answer length is fixed by the
    input length, as for every shipped task)."""
    longest = 0
    for n in lengths:
        for _ in range(probes):
            x, y = checked_sample(task, n, rng)
            longest = max(longest, model_length(task.kind, len(x), len(y)))
    return longest
