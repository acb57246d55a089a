"""Training the language models of ``posenc extrapolate`` (``posenc.extrapolate.train``) on a
tiny corpus: a step's loss is the cross-entropy of the model before the step on that step's
windows, computed here independently; a finished run reopens without training; the probe
refuses a window the encoding cannot reach; a fine-tune trains a scaled copy on the windows
after the training run's and leaves the trained model as it was; bf16 trains close to fp32,
and a resume may not change the precision."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.errors import PosencValueError
from posenc.extrapolate import train
from posenc.extrapolate.config import ExtrapolateConfig
from posenc.extrapolate.corpus import Corpus, prepare_corpus
from posenc.runs.checkpoint import CHECKPOINT, RESULT
from posenc.runs.trainer import optimizer_for
from tests.extrapolate.corpora import many_small, own_cache

TINY = {"dim": 16, "depth": 1, "heads": 2, "train_len": 8, "batch_size": 4, "steps": 3,
        "checkpoint_every": 2}  # fmt: skip


@pytest.fixture
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Corpus:
    own_cache(tmp_path, monkeypatch)
    many_small(tmp_path / "text", 40)
    return prepare_corpus(tmp_path / "text")


def test_the_model_is_causal_over_the_vocabulary() -> None:
    model = train.build_model(ExtrapolateConfig(pe="alibi", **TINY), 256)
    assert isinstance(model, posenc.TransformerModel) and model.encoder.causal
    assert model.trained_length == 8 and model.head.out_features == 256


def test_a_step_reports_the_loss_of_the_model_it_was_given(corpus: Corpus) -> None:
    config = ExtrapolateConfig(pe="rope", **TINY)
    torch.manual_seed(0)
    model = train.build_model(config, corpus.vocab_size)
    before = copy.deepcopy(model)
    optimizer, scheduler = optimizer_for(model, config)
    loss, accuracy = train.lm_step(
        model, optimizer, scheduler, corpus, 5, batch_size=4, length=8, seed=1, grad_clip=1.0
    )
    windows = torch.from_numpy(corpus.batch(5, 4, 8, 1))  # (b, n + 1)
    with torch.no_grad():
        logits = before(windows[:, :-1])
    want = F.cross_entropy(logits.reshape(32, -1), windows[:, 1:].reshape(-1))
    assert loss == pytest.approx(float(want), rel=1e-5)
    hits = (logits.argmax(-1) == windows[:, 1:]).float().mean()
    assert accuracy == pytest.approx(float(hits))
    assert not torch.equal(model.head.weight, before.head.weight)  # the step was taken


def test_a_finished_run_reopens_without_training(
    corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ExtrapolateConfig(pe="rope", **TINY)
    model, record = train.train_model(config, corpus, tmp_path / "run")
    assert record["steps"] == 3 and len(record["losses"]) == 3
    assert json.loads((tmp_path / "run" / RESULT).read_text()) == record
    assert (tmp_path / "run" / CHECKPOINT).exists()
    monkeypatch.setattr(train, "lm_step", lambda *a, **k: pytest.fail("trained again"))
    again, same = train.train_model(config, corpus, tmp_path / "run", resume=True)
    assert same == record
    for name, value in model.state_dict().items():
        assert torch.equal(value, again.state_dict()[name]), name


def test_the_probe_refuses_a_window_past_a_learned_table(corpus: Corpus) -> None:
    config = ExtrapolateConfig(pe="learned", pe_options={"max_len": 16}, **TINY)
    with pytest.raises(PosencValueError, match="'learned' cannot handle windows of 32"):
        train.train_model(config, corpus, probe_length=32)


def test_a_fine_tune_trains_a_scaled_copy(corpus: Corpus, monkeypatch: pytest.MonkeyPatch) -> None:
    config = ExtrapolateConfig(pe="rope", **TINY)
    model, _ = train.train_model(config, corpus)
    weights = copy.deepcopy(model.state_dict())
    steps_seen: list[int] = []
    real = train.lm_step

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        steps_seen.append(args[4])
        assert (kwargs["length"], kwargs["batch_size"]) == (32, 1)  # 4 x 8 tokens / 32
        return real(*args, **kwargs)

    monkeypatch.setattr(train, "lm_step", spy)
    tuned, scaling, record = train.finetune(
        model, config, corpus, "yarn", length=32, steps=2, lr=1e-3
    )
    assert scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    assert steps_seen == [3, 4] and record["steps"] == 2  # after the training run's 3 steps
    for name, value in model.state_dict().items():
        assert torch.equal(value, weights[name]), name  # the trained model is untouched
    assert not torch.equal(tuned.head.weight, model.head.weight)


@pytest.mark.filterwarnings("error::DeprecationWarning")  # the harness uses no old name
def test_bf16_trains_close_to_fp32_and_a_resume_keeps_the_precision(
    corpus: Corpus, tmp_path: Path
) -> None:
    """In bf16 the model trains (finite losses, slightly off fp32's), on the CPU here, and
    says where; a run resumed in the other precision is refused by name."""
    fp32 = ExtrapolateConfig(pe="rope", **TINY)
    _, full = train.train_model(fp32, corpus, tmp_path / "run", device="cpu")
    bf16 = ExtrapolateConfig(pe="rope", precision="bf16", **TINY)
    model, half = train.train_model(bf16, corpus, device="cpu")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert torch.isfinite(torch.tensor(half["losses"])).all()
    assert half["losses"] != full["losses"]
    torch.testing.assert_close(
        torch.tensor(half["losses"]), torch.tensor(full["losses"]), rtol=5e-3, atol=0
    )
    assert full["trained_on"] == half["trained_on"] == ["cpu"]
    with pytest.raises(PosencValueError, match=r"precision: 'fp32' -> 'bf16'"):
        train.train_model(bf16, corpus, tmp_path / "run", resume=True)


@pytest.mark.slow
def test_every_registered_sequence_scheme_trains_here(corpus: Corpus) -> None:
    """``posenc extrapolate`` builds its models through the registry: every sequence scheme
    (the 2024-26 ones included) takes a step whose reported loss is the cross-entropy of the
    model before the step, computed here."""
    from tests.schemes import SEQUENCE

    windows = torch.from_numpy(corpus.batch(5, 4, 8, 1))
    for name in SEQUENCE:
        config = ExtrapolateConfig(pe=name, **TINY)
        torch.manual_seed(0)
        model = train.build_model(config, corpus.vocab_size)
        before = copy.deepcopy(model)
        optimizer, scheduler = optimizer_for(model, config)
        loss, _ = train.lm_step(
            model, optimizer, scheduler, corpus, 5, batch_size=4, length=8, seed=1, grad_clip=1.0
        )
        before.train(model.training)
        torch.manual_seed(0)
        with torch.no_grad():
            logits = before(windows[:, :-1])
        want = F.cross_entropy(logits.reshape(32, -1), windows[:, 1:].reshape(-1))
        assert loss == pytest.approx(float(want), rel=1e-5), name
