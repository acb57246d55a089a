"""A ``posenc extrapolate`` sweep: for every (encoding, seed) train one model, evaluate it at
every length (and, for RoPE, with each zero-shot scaling and after each fine-tune), and
collect the runs of ``results.json``.

Folders under ``out``: ``<pe>/seed<k>/`` holds the trained model's ``checkpoint.pt``,
``result.json`` (the training record) and, once evaluated, ``evaluation.json`` (its runs
and timing, which ``resume`` reuses instead of evaluating again);
``<pe>/seed<k>/finetune-<type>-<length>/`` each fine-tune's. With ``jobs > 1`` the
(encoding, seed) pairs run in parallel processes; under
``torchrun`` they run one after another, each trained over every rank, evaluated on rank 0.
Every model trains and is evaluated on one device (``device``), in its config's precision.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..runs.device import autocast, model_device, placement
from ..runs.distributed import barrier, torch_threads, world
from ..runs.pool import slug
from ..runs.sweep import check_distinct, run_each
from .config import EvalSettings, ExtrapolateConfig
from .corpus import Corpus, open_corpus
from .evaluate import evaluate_model, rope_scalable, scaled_variants
from .measures import run_measures
from .retrieval import check_retrieval
from .train import RESUME_FREE, finetune, train_model
from .windows import check_lengths, eval_budget

#: A finished run's evaluation (``{"key": ..., "result": ...}``), reused by ``--resume``.
EVALUATION = "evaluation.json"


def run_dir_for(out: Path, config: ExtrapolateConfig) -> Path:
    """``out/<pe>/seed<k>``."""
    return Path(out) / slug(config.pe) / f"seed{config.seed}"


def finetune_dir(run_dir: Path, rope_type: str, length: int) -> Path:
    return run_dir / f"finetune-{rope_type}-{length}"


def eval_tokens(corpus: Corpus, lengths: list[int], settings: EvalSettings) -> int:
    """``T``: how many validation targets every length scores."""
    return eval_budget(lengths, len(corpus.valid), max_tokens=settings.eval_tokens)


def run_one(
    config: ExtrapolateConfig,
    corpus: Corpus,
    settings: EvalSettings,
    run_dir: Path | None,
    *,
    resume: bool = False,
    progress: bool = False,
    console: Any = None,
    device: str | torch.device = "auto",
) -> dict[str, Any]:
    """Train, evaluate and fine-tune one (encoding, seed) on ``device``. Returns
    ``{"runs": [...], "timing": {...}}`` on rank 0 (``runs`` as in ``results.json``), ``{}``
    on other ranks."""
    rank, world_size = world()
    table = config.validate()
    key = evaluation_key(config, corpus, settings)
    if resume and run_dir is not None:
        stored = read_evaluation(run_dir, key)
        if stored is not None:  # trained and evaluated by an earlier session
            return stored if rank == 0 else {}
    lengths = settings.lengths(config.train_len)
    usable = [n for n in lengths if table is None or n <= table]
    skipped = [n for n in lengths if n not in usable]
    num_tokens = eval_tokens(corpus, lengths, settings)
    model, record = train_model(
        config,
        corpus,
        run_dir,
        resume=resume,
        progress=progress,
        console=console,
        probe_length=max(usable, default=0),
        device=device,
    )
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()

    measure = run_measures(corpus, config, settings, usable, max_window=table)

    def add(
        scaling: dict[str, Any] | None, steps: int, rows: list[dict[str, Any]], more: dict[str, Any]
    ) -> None:
        runs.append(
            {
                "pe": config.pe,
                "scaling": scaling,
                "finetune_steps": steps,
                "seed": config.seed,
                "skipped_lengths": skipped,
                "eval": rows,
                **more,
            }
        )

    common = {
        "train_len": config.train_len,
        "batch_tokens": settings.batch_tokens,
        "sliding": settings.sliding,
    }
    scalable = rope_scalable(model)
    place = model_device(model)
    if rank == 0:
        with autocast(place, config.precision):  # evaluation in the training's precision
            rows = evaluate_model(model, corpus, usable, num_tokens, **common)
            add(None, 0, rows, measure(model))
            for scaling in scaled_variants(settings.scalings if scalable else [], config.train_len):
                rows = evaluate_model(model, corpus, usable, num_tokens, scaling=scaling, **common)
                add(scaling, 0, rows, measure(model, scaling))
    barrier(world_size)
    eval_seconds = time.perf_counter() - started
    finetune_seconds = 0.0
    length = settings.finetune_length(config.train_len)
    for rope_type in settings.finetune_scalings if settings.finetune_steps and scalable else []:
        tuned, scaling, tuned_record = finetune(
            model,
            config,
            corpus,
            rope_type,
            length=length,
            steps=settings.finetune_steps,
            lr=settings.finetune_lr,
            run_dir=None if run_dir is None else finetune_dir(run_dir, rope_type, length),
            resume=resume,
            progress=progress,
            console=console,
        )
        finetune_seconds += tuned_record["train_seconds"]
        started = time.perf_counter()
        if rank == 0:
            factor = scaling["factor"]
            with autocast(place, config.precision):
                rows = evaluate_model(tuned, corpus, usable, num_tokens, factor=factor, **common)
                add(scaling, settings.finetune_steps, rows, measure(tuned))
        barrier(world_size)
        eval_seconds += time.perf_counter() - started
    if rank != 0:
        return {}
    timing = {
        "pe": config.pe,
        "seed": config.seed,
        "train_seconds": record["train_seconds"],
        "finetune_seconds": round(finetune_seconds, 3),
        "eval_seconds": round(eval_seconds, 3),
        "final_loss": record["final_loss"],
        "parameters": record["parameters"],
        "world_size": world_size,
        "device": str(place),
    }
    result = {"runs": runs, "timing": timing}
    if run_dir is not None:
        path = Path(run_dir) / EVALUATION  # (keys in their order: buckets by position)
        tmp = path.with_name(f".{EVALUATION}.tmp")
        tmp.write_text(json.dumps({"key": key, "result": result}, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    return result


def evaluation_key(
    config: ExtrapolateConfig, corpus: Corpus, settings: EvalSettings
) -> dict[str, Any]:
    """What a stored evaluation must match to be reused: the run's configuration (less the
    fields a resume may change), the corpus and the evaluation settings."""
    recorded = {k: v for k, v in config.to_dict().items() if k not in RESUME_FREE}
    return {"config": recorded, "corpus": corpus.key, "settings": settings.to_dict()}


def read_evaluation(run_dir: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The result :func:`run_one` stored in ``run_dir`` for ``key``, else ``None``."""
    path = Path(run_dir) / EVALUATION
    if not path.exists():
        return None
    stored = json.loads(path.read_text("utf-8"))
    return stored["result"] if stored.get("key") == key else None


def _job(
    config: dict[str, Any],
    corpus_path: str,
    settings: dict[str, Any],
    run_dir: str,
    resume: bool,
    device: str,
    threads: int,
) -> dict[str, Any]:
    """Entry point of a ``--jobs`` worker process (spawned: a fresh interpreter)."""
    with torch_threads(threads):
        return run_one(
            ExtrapolateConfig.from_dict(config),
            open_corpus(corpus_path),
            EvalSettings(**settings),
            Path(run_dir),
            resume=resume,
            device=device,
        )


def run_sweep(
    configs: list[ExtrapolateConfig],
    corpus: Corpus,
    settings: EvalSettings,
    out: Path | str,
    *,
    jobs: int = 1,
    resume: bool = False,
    progress: bool = False,
    threads: int = 0,
    console: Any = None,
    device: str | torch.device = "auto",
    on_result: Callable[[int, dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """:func:`run_one` for every config on ``device`` (``jobs`` at a time in separate
    processes, each with ``threads`` torch threads, default the cores divided by ``jobs``);
    returns their results in the order of ``configs`` (empty dicts on ranks other than 0).
    ``on_result(i, result)`` is called as each result arrives (the results files are
    rewritten there), after the result is logged."""
    dirs = check_sweep(configs, corpus, settings, out)
    place = placement(device, [c.precision for c in configs])

    def here(i: int) -> dict[str, Any]:
        return run_one(
            configs[i],
            corpus,
            settings,
            dirs[i],
            resume=resume,
            progress=progress,
            console=console,
            device=place,
        )

    def done(i: int, result: dict[str, Any]) -> None:
        log_done(console, result)
        if on_result is not None:
            on_result(i, result)

    def job_args(i: int, each: int) -> tuple[Any, ...]:
        return (
            configs[i].to_dict(),
            str(corpus.path),
            settings.to_dict(),
            str(dirs[i]),
            resume,
            str(place),
            each,
        )

    return run_each(
        dirs,
        out,
        here,
        _job,
        job_args,
        jobs=jobs,
        resume=resume,
        threads=threads,
        on_done=lambda i, result: done(i, result),
    )


def check_sweep(
    configs: list[ExtrapolateConfig], corpus: Corpus, settings: EvalSettings, out: Path | str
) -> list[Path]:
    """The checks of a sweep's settings, before any work: the configs, the evaluation
    settings, the corpus's size and the folders (one per run). Returns the run folders; the
    caller then checks how they may start
    (:func:`~posenc.runs.sweep.check_sweep_start`)."""
    for config in configs:
        config.validate()
        settings.validate(config.train_len)
        check_lengths(corpus, config.train_len, settings.lengths(config.train_len))
        if settings.retrieval:
            check_retrieval(config.needle_len, settings.lengths(config.train_len))
    dirs = [run_dir_for(Path(out), c) for c in configs]
    check_distinct(dirs)
    return dirs


def log_done(console: Any, result: dict[str, Any]) -> None:
    if console is None or not result:  # not rank 0
        return
    timing = result["timing"]
    plain = result["runs"][0]["eval"]
    curve = ", ".join(f"{row['length']}: {row['bpb']:.3f}" for row in plain)
    console.log(
        f"done: {timing['pe']} seed {timing['seed']}: bits per byte {curve}; train "
        f"{timing['train_seconds']:.0f} s, eval {timing['eval_seconds']:.0f} s"
    )
