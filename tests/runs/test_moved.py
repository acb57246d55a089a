"""What moved to ``posenc.runs`` stays importable from its old place until 0.3: each old
name warns with a ``DeprecationWarning`` naming both places and returns the very object
that lives in ``posenc.runs``; other names are still ``AttributeError``s; and the
experiments themselves import from the new places, so normal use warns nothing."""

from __future__ import annotations

import ast
import importlib
import warnings

import pytest

from posenc.runs.moved import REMOVED_IN, moved
from tests.test_layers import _targets, module_files

#: (old module, name, new module): every name the old modules offered.
MOVED = [
    *[("loop", name, "trainer") for name in (
        "DECAYS", "PeriodicFunction", "StepFunction", "Trainer", "lr_multiplier",
        "make_optimizer", "optimizer_for", "optimizer_step", "seed_everything")],
    *[("checkpoint", name, "checkpoint") for name in (
        "CHECKPOINT", "CHECKPOINT_VERSION", "RESULT", "check_resumable", "load_checkpoint",
        "prepare_run_dir", "rng_state", "save_checkpoint", "set_rng_state", "write_json")],
    ("checkpoint", "check_sweep_start", "sweep"),
    *[("distributed", name, "distributed") for name in (
        "all_reduce_sum", "barrier", "check_divisible", "close_distributed", "global_mean",
        "init_distributed", "torch_threads", "world")],
    ("progress", "Bar", "progress"),
    *[("pool", name, "pool") for name in (
        "exit_with_parent", "run_all", "run_in_processes", "slug", "threads_per_job")],
    *[("config", name, "config") for name in (
        "check_encoding", "check_fields", "check_type", "config_from_dict", "transformer_for")],
    *[("cli", name, "cli") for name in (
        "MAX_SEEDS", "MODEL_FLAGS", "POSITION_SUFFIXES", "add_field_flags", "parse_jobs",
        "parse_pe_list", "parse_pe_option", "parse_seeds", "read_field_flags", "sweep_options")],
    *[("train", name, "checkpoint") for name in (
        "CHECKPOINT", "CHECKPOINT_VERSION", "RESULT", "load_checkpoint", "save_checkpoint")],
    ("train", "DECAYS", "trainer"),
    ("train", "check_encoding", "config"),
    ("train", "slug", "pool"),
    # names the old modules re-exported from the ones they imported (issue #29's trial)
    *[("loop", name, "checkpoint") for name in (
        "CHECKPOINT_VERSION", "check_resumable", "load_checkpoint", "rng_state",
        "save_checkpoint", "set_rng_state")],
    ("loop", "barrier", "distributed"),
    ("loop", "Bar", "progress"),
    ("checkpoint", "world", "distributed"),
    ("config", "DECAYS", "config"),
    *[("train", name, new) for name, new in (
        ("transformer_for", "config"), ("run_all", "pool"), ("prepare_run_dir", "checkpoint"),
        ("write_json", "checkpoint"), ("optimizer_step", "trainer"),
        ("check_sweep_start", "sweep"), ("all_reduce_sum", "distributed"),
        ("global_mean", "distributed"))],
]  # fmt: skip


@pytest.mark.parametrize(("old", "name", "new"), MOVED, ids=[f"{o}.{n}" for o, n, _ in MOVED])
def test_an_old_name_warns_and_is_the_new_object(old: str, name: str, new: str) -> None:
    before = importlib.import_module(f"posenc.lengthgen.{old}")
    after = importlib.import_module(f"posenc.runs.{new}")
    message = (
        rf"posenc\.lengthgen\.{old}\.{name} moved to posenc\.runs\.{new}\.{name}; "
        rf"the old name is removed in {REMOVED_IN}"
    )
    with pytest.warns(DeprecationWarning, match=message):
        found = getattr(before, name)
    assert found is getattr(after, name)


def test_the_import_statement_warns_and_points_at_the_caller() -> None:
    with pytest.warns(DeprecationWarning, match="lengthgen.loop.Trainer moved") as caught:
        from posenc.lengthgen.loop import Trainer  # noqa: F401
    assert caught[0].filename == __file__  # stacklevel: the line that used the old name


def test_other_names_are_still_missing() -> None:
    import posenc.lengthgen.loop as loop

    with pytest.raises(AttributeError, match=r"'posenc\.lengthgen\.loop' has no attribute 'nope'"):
        _ = loop.nope
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from posenc.lengthgen.config import MAX_INPUT_LENGTH, TrainConfig  # stayed: no warning
        from posenc.lengthgen.train import build_model, run_sweep, train  # noqa: F401
    assert TrainConfig().precision == "fp32" and MAX_INPUT_LENGTH == 4096


def test_the_helper_maps_each_name_to_its_module() -> None:
    import posenc.runs.pool as pool

    lookup = moved("old.place", {"slug": pool})
    with pytest.warns(DeprecationWarning, match="old.place.slug moved to posenc.runs.pool.slug"):
        assert lookup("slug") is pool.slug
    with pytest.raises(AttributeError, match=r"'old\.place' has no attribute 'run_all'"):
        lookup("run_all")


def test_no_module_of_posenc_uses_an_old_name() -> None:
    """No import statement in ``src/posenc`` (the shims themselves aside) takes a moved name
    from its old module, or the old modules that are now shims at all, so normal use warns
    nothing (the training tests also run with deprecation warnings as errors)."""
    old_names = {(f"posenc.lengthgen.{old}", name) for old, name, _ in MOVED}
    shims = {f"posenc.lengthgen.{old}" for old in ("loop", "checkpoint", "distributed",
                                                   "progress", "pool")}  # fmt: skip
    found = []
    for module, path in module_files().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or module in shims:
                continue
            for alias in node.names:
                for target in _targets(node, module, path.name == "__init__.py", ()):
                    if (target, alias.name) in old_names or f"{target}.{alias.name}" in shims:
                        found.append(f"{module}:{node.lineno} {target}.{alias.name}")
                    elif target in shims:
                        found.append(f"{module}:{node.lineno} {target}")
    assert not found, found
