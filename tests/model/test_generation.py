"""``TransformerModel.generate``: greedy generation equals the argmax loop over full forwards
for every sequence scheme; a left-padded batch generates what each row generates alone;
seeded sampling repeats; ``eos_token_id`` ends rows; bad arguments are clear errors."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.model.generation import check_tokens, ids_checked
from posenc.model.sampling import sample_next
from tests.schemes import SEQUENCE

VOCAB, DIM, HEADS = 24, 16, 2


def _model(name: str = "rope", **kwargs) -> posenc.TransformerModel:
    torch.manual_seed(0)
    return posenc.TransformerModel(VOCAB, DIM, 2, HEADS, pe=name, causal=True, **kwargs).eval()


def _argmax_loop(model, prompt: torch.Tensor, steps: int, padding=None) -> torch.Tensor:
    """The reference: a full forward over the whole sequence at every step."""
    seq = prompt
    for _ in range(steps):
        mask = None
        if padding is not None:
            extra = torch.zeros(seq.shape[0], seq.shape[1] - padding.shape[1], dtype=torch.bool)
            mask = torch.cat([padding, extra], dim=1)
        positions = None if mask is None else posenc.positions_from_padding(mask)
        with torch.no_grad():
            logits = model(seq, positions=positions, key_padding_mask=mask)
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq


@pytest.mark.parametrize("name", SEQUENCE)
def test_greedy_generation_equals_the_argmax_loop(name: str) -> None:
    model = _model(name)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
    out = model.generate(prompt, 8)
    assert out.shape == (2, 13) and out.dtype == prompt.dtype
    assert torch.equal(out, _argmax_loop(model, prompt, 8))


@pytest.mark.parametrize("name", ["rope", "alibi", "learned", "cope"])
def test_a_left_padded_batch_generates_each_row_as_alone(name: str) -> None:
    model = _model(name)
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, VOCAB, (3, 6), generator=gen)
    padding = torch.zeros(3, 6, dtype=torch.bool)
    padding[1, :4] = True
    padding[2, :1] = True
    out = model.generate(prompt, 6, key_padding_mask=padding)
    assert torch.equal(out, _argmax_loop(model, prompt, 6, padding))
    for r in range(3):
        alone = model.generate(prompt[r : r + 1, int(padding[r].sum()) :], 6)
        assert torch.equal(out[r, -6:], alone[0, -6:]), r


def test_seeded_sampling_repeats_and_the_options_cut_the_distribution() -> None:
    model = _model()
    prompt = torch.randint(0, VOCAB, (4, 3), generator=torch.Generator().manual_seed(3))

    def sample(seed: int, **kwargs) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return model.generate(prompt, 10, temperature=1.5, generator=generator, **kwargs)

    assert torch.equal(sample(0), sample(0))
    assert not torch.equal(sample(0), sample(1))
    greedy = model.generate(prompt, 10)
    assert torch.equal(sample(0, top_k=1), greedy)  # one candidate left: the argmax
    assert torch.equal(sample(0, top_p=1e-6), greedy)  # the nucleus holds the top token only


def test_sample_next_keeps_only_the_top_k_and_the_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(2000, 4)
    gen = torch.Generator().manual_seed(0)
    drawn = sample_next(logits, temperature=1.0, top_k=2, generator=gen)
    assert set(drawn.tolist()) == {0, 1}
    drawn = sample_next(logits, temperature=1.0, top_p=0.7, generator=gen)
    assert set(drawn.tolist()) == {0, 1}  # 0.5 < 0.7 needs the second; 0.8 >= 0.7 stops
    counts = torch.bincount(drawn, minlength=4).float() / drawn.numel()
    assert abs(counts[0].item() - 0.5 / 0.8) < 0.05
    assert sample_next(logits[:1]).tolist() == [0]


def test_eos_ends_rows_and_generation() -> None:
    model = _model()
    prompt = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(4))
    free = model.generate(prompt, 12)
    eos = int(free[0, 6])  # row 0 emits it at its third new token
    out = model.generate(prompt, 12, eos_token_id=eos)
    first = (out[0, 4:] == eos).nonzero()[0].item()
    assert (out[0, 4 + first :] == eos).all()
    assert torch.equal(out[0, : 4 + first], free[0, : 4 + first])
    if (free[1, 4:] == eos).any():  # both rows finish: generation stops at the later one
        assert out.shape[1] < 16
    else:
        assert out.shape[1] == 16 and torch.equal(out[1], free[1])
    stop = model.generate(prompt[:1], 12, eos_token_id=eos)
    assert stop.shape[1] == 4 + first + 1  # one row that has finished stops everything


def test_no_new_tokens_returns_the_prompt() -> None:
    prompt = torch.ones(1, 3, dtype=torch.long)
    out = _model().generate(prompt, 0)
    assert torch.equal(out, prompt) and out is not prompt


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((torch.ones(1, 3), 2), {}, TypeError, "prompt must be an int64"),
        ((torch.ones(3, dtype=torch.long), 2), {}, ValueError, r"prompt must have shape"),
        ((torch.ones(1, 0, dtype=torch.long), 2), {}, ValueError, "at least one token"),
        ((torch.ones(1, 3, dtype=torch.long), -1), {}, ValueError, "max_new_tokens must be >= 0"),
        ((torch.ones(1, 3, dtype=torch.long), 2.0), {}, TypeError, "max_new_tokens must be an int"),
        ((torch.ones(1, 3, dtype=torch.long), 2), {"temperature": -1.0}, ValueError, "temperature"),
        ((torch.ones(1, 3, dtype=torch.long), 2), {"top_k": 0}, ValueError, "top_k must be >= 1"),
        ((torch.ones(1, 3, dtype=torch.long), 2), {"top_p": 1.5}, ValueError, r"top_p must be in"),
        ((torch.ones(1, 3, dtype=torch.long), 2), {"eos_token_id": 99}, ValueError, "eos_token_id"),
        ((torch.ones(1, 3, dtype=torch.long), 2), {"generator": 0}, TypeError, "generator"),
        (
            (torch.ones(1, 3, dtype=torch.long), 2),
            {"key_padding_mask": torch.tensor([[False, False, True]])},
            ValueError,
            "needs left padding",
        ),
    ],
)
def test_bad_arguments_are_clear_errors(args, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        _model().generate(*args, **kwargs)


def test_generation_needs_a_causal_model_over_its_vocabulary() -> None:
    prompt = torch.ones(1, 3, dtype=torch.long)
    bidirectional = posenc.TransformerModel(VOCAB, DIM, 1, HEADS, pe="rope")
    with pytest.raises(ValueError, match="needs a causal model"):
        bidirectional.generate(prompt, 2)
    classifier = posenc.TransformerModel(VOCAB, DIM, 1, HEADS, causal=True, num_outputs=3)
    with pytest.raises(ValueError, match="logits over the vocabulary"):
        classifier.generate(prompt, 2)


def test_a_tiny_temperature_is_greedy_not_nan() -> None:
    model = _model()
    prompt = torch.randint(0, VOCAB, (2, 3), generator=torch.Generator().manual_seed(5))
    generator = torch.Generator().manual_seed(0)
    sampled = model.generate(prompt, 5, temperature=1e-40, generator=generator)
    assert torch.equal(sampled, model.generate(prompt, 5))


def test_a_learned_table_too_short_for_the_generation_fails_before_any_work() -> None:
    model = posenc.TransformerModel(
        VOCAB, DIM, 1, HEADS, pe="learned", causal=True, pe_kwargs={"max_len": 8}
    ).eval()
    prompt = torch.ones(1, 4, dtype=torch.long)
    assert model.generate(prompt, 5).shape == (1, 9)  # positions up to 7
    with pytest.raises(ValueError, match=r"reaches position 8, past the learned table"):
        model.generate(prompt, 6)


def test_the_result_is_an_ordinary_tensor() -> None:
    """Generation runs in inference mode; what it returns can be written and used in autograd."""
    out = _model().generate(torch.ones(1, 3, dtype=torch.long), 3)
    assert not out.is_inference()
    out[0, 0] = 2  # an inference tensor would refuse this outside inference mode


def test_ids_checked_leaves_out_only_the_range() -> None:
    """Within ``ids_checked`` (a caller that checked the ids on the host) the range is not
    read from the tensor, so a GPU forward does not wait for the device; the dtype and shape
    are still checked, and outside it the range is checked again."""
    bad = torch.tensor([[0, 7]])
    with pytest.raises(ValueError, match=r"range \[0, 7\]"):
        check_tokens(bad, 5)
    with ids_checked():
        check_tokens(bad, 5)  # not read
        with pytest.raises(TypeError, match="int64 or int32"):
            check_tokens(bad.float(), 5)
        with pytest.raises(ValueError, match="shape"):
            check_tokens(bad[0], 5)
    with pytest.raises(ValueError, match=r"range \[0, 7\]"):
        check_tokens(bad, 5)
