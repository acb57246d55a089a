"""``posenc conformance``: the float64 RoPE tables other runtimes test against.

Each case's frequencies and attention factor agree with transformers' own init function
(``ROPE_INIT_FUNCTIONS`` or the model's ``compute_default_rope_parameters``, at the recorded
length) and its cos/sin with the rotary module's forward on the same positions (so dynamic NTK
and LongRoPE switch where transformers switches); every case also agrees with an independent
float64 transcription of its formula. The files read back with the ``safetensors`` package equal
the tensors bit for bit, a second run writes the same bytes, and the command refuses bad input
with one line and status 2.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.testing import assert_close

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
from safetensors import safe_open  # noqa: E402
from transformers import Gemma3TextConfig, LlamaConfig, PhiConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding  # noqa: E402
from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions  # noqa: E402
from transformers.models.hunyuan_v1_dense.configuration_hunyuan_v1_dense import (  # noqa: E402
    HunYuanDenseV1Config,
)
from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import (  # noqa: E402
    HunYuanDenseV1RotaryEmbedding,
)
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402
from transformers.models.phi.modeling_phi import PhiRotaryEmbedding  # noqa: E402
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig  # noqa: E402
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding  # noqa: E402

import posenc  # noqa: E402
from posenc import ROPE_TYPES, PosencTypeError  # noqa: E402
from posenc.app import cli  # noqa: E402
from posenc.app.conformance import safetensors_bytes, write_conformance  # noqa: E402
from posenc.app.conformance_cases import (  # noqa: E402
    _MROPE,
    _NTK_ALPHA,
    ConformanceCase,
    conformance_cases,
)
from posenc.encodings.rope_types.builtin import default_inv_freq  # noqa: E402
from posenc.encodings.rope_types.registry import (  # noqa: E402
    _unregister_rope_type,
    register_rope_type,
)

transformers.logging.set_verbosity_error()

ROOT = Path(__file__).resolve().parents[2]
CASES = conformance_cases()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("conformance")
    write_conformance(out)
    return out


# --------------------------------------------------------------------------- the files


def test_the_files_read_back_bit_for_bit_and_the_index_describes_them(written: Path) -> None:
    index = json.loads((written / "index.json").read_text())
    assert index["version"] == 1
    assert index["posenc_version"] == posenc.__version__
    # the cases were checked (below) against the installed transformers: the index says which
    assert index["transformers_version"] == transformers.__version__
    assert list(index["cases"]) == [case.name for case in CASES]
    for case in CASES:
        entry = index["cases"][case.name]
        path = written / entry["file"]
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        loaded = safetensors_torch.load_file(path)
        tables = case.tables()
        assert set(loaded) == set(tables) == {
            "inv_freq", "cos", "sin", "attention_factor", "positions"
        }  # fmt: skip
        for name, tensor in tables.items():
            assert loaded[name].dtype == tensor.dtype
            assert torch.equal(loaded[name], tensor), (case.name, name)
        half = entry["rotary_dim"] // 2
        n = tables["positions"].shape[-1]
        assert tables["cos"].shape == tables["sin"].shape == (n, half)
        assert tables["inv_freq"].dtype == tables["cos"].dtype == torch.float64
        assert entry["attention_factor"] == float(tables["attention_factor"])
        assert entry["positions"] == tables["positions"].tolist()
        assert entry["seq_len"] == int(tables["positions"].max()) + 1
        assert entry["layout"] == case.layout and entry["attention_factor_folded"] is True
        assert entry["rope_parameters"] == json.loads(json.dumps(dict(case.rope_parameters)))
        with safe_open(str(path), "pt") as handle:
            metadata = handle.metadata()
        assert metadata["case"] == case.name and metadata["layout"] == case.layout
        assert float(metadata["attention_factor"]) == entry["attention_factor"]


def test_a_second_run_writes_the_same_bytes(written: Path, tmp_path: Path) -> None:
    write_conformance(tmp_path)
    names = sorted(p.name for p in written.iterdir())
    assert names == sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == len(CASES) + 1
    for name in names:
        assert (tmp_path / name).read_bytes() == (written / name).read_bytes(), name


def test_the_safetensors_writer_reads_back_on_odd_shapes(tmp_path: Path) -> None:
    tensors = {
        "b": torch.arange(-3, 4, dtype=torch.int64).reshape(7, 1),
        "a": torch.tensor(math.pi, dtype=torch.float64),  # 0-d
        "c": torch.linspace(-1e300, 1e-300, 5, dtype=torch.float64)[None],
    }
    blob = safetensors_bytes(tensors, {"k": "v"})
    assert (8 + int.from_bytes(blob[:8], "little")) % 8 == 0  # the data starts aligned
    loaded = safetensors_torch.load(blob)
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor)
    path = tmp_path / "odd.safetensors"
    path.write_bytes(blob)
    with safe_open(str(path), "pt") as handle:
        assert handle.metadata() == {"k": "v"}
        assert sorted(handle.keys()) == ["a", "b", "c"]
    with pytest.raises(PosencTypeError, match=r"'x'.*float32"):
        safetensors_bytes({"x": torch.zeros(2)}, {})


# --------------------------------------------------------------------------- coverage


def test_every_registered_rope_type_has_a_case() -> None:
    covered = {case.spec().rope_type for case in CASES}
    missing = set(ROPE_TYPES) - covered
    assert not missing, f"rope types without a conformance case: {sorted(missing)}"
    assert len({case.name for case in CASES}) == len(CASES)


def test_the_length_edges_fall_on_both_sides() -> None:
    """The at/past pairs test what their notes say: LongRoPE's short factors at the original
    length and long ones one past it; dynamic NTK's default base at, a larger one past."""
    by_name = {case.name: case for case in CASES}
    for side, key in (("at", "short_factor"), ("past", "long_factor")):
        case = by_name[f"longrope_{side}_original"]
        params = case.scaling()
        assert case.seq_len() == params["original_max_position_embeddings"] + (side == "past")
        inv_freq = case.tables()["inv_freq"]
        factors = torch.tensor(params[key], dtype=torch.float64)
        assert_close(inv_freq * factors, default_inv_freq(96, 10000.0), rtol=1e-15, atol=0)
    at, past = by_name["dynamic_at_original"], by_name["dynamic_past_original"]
    assert (at.seq_len(), past.seq_len()) == (2048, 2049)
    assert_close(at.tables()["inv_freq"], default_inv_freq(128, 10000.0), rtol=1e-15, atol=0)
    assert (past.tables()["inv_freq"][1:] < at.tables()["inv_freq"][1:]).all()


# --------------------------------------------------------------------------- transformers


def _llama_like(config_class: type, case: ConformanceCase, params: Any) -> Any:
    return config_class(
        hidden_size=2 * case.head_dim,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=case.head_dim,
        max_position_embeddings=case.max_position_embeddings,
        rope_parameters=copy.deepcopy(params),
    )


def _hf(case: ConformanceCase) -> tuple[torch.Tensor, float, torch.Tensor, torch.Tensor]:
    """transformers' ``(inv_freq, attention_factor)`` from its init function at the case's
    length, and ``cos, sin (n, r/2)`` from its rotary module's forward on the positions."""
    params = case.rope_parameters
    rope_type = case.scaling()["rope_type"]
    seq_len = case.seq_len()
    positions = torch.tensor(case.positions)
    x = torch.zeros(1)
    half = case.spec().rotary_dim // 2
    if case.hf_reference == "GPT-J create_sinusoidal_positions":
        table = create_sinusoidal_positions(case.max_position_embeddings, 2 * half)  # sin | cos
        first = table[1]  # position 1: the angle is the frequency itself
        inv_freq = torch.atan2(first[:half], first[half:])
        return inv_freq, 1.0, table[positions, half:], table[positions, :half]
    if case.hf_reference == "Gemma3RotaryEmbedding":
        config = _llama_like(Gemma3TextConfig, case, params)
        module = Gemma3RotaryEmbedding(config)
        if rope_type == "default":
            init = Gemma3RotaryEmbedding.compute_default_rope_parameters(
                config, layer_type=case.layer_type
            )
        else:
            init = ROPE_INIT_FUNCTIONS[rope_type](
                config, None, seq_len=seq_len, layer_type=case.layer_type
            )
        cos, sin = module(x, positions[None], case.layer_type)
    elif case.hf_reference == "Qwen2VLRotaryEmbedding":
        config = _llama_like(Qwen2VLTextConfig, case, params)
        module = Qwen2VLRotaryEmbedding(config)
        init = Qwen2VLRotaryEmbedding.compute_default_rope_parameters(config)
        cos, sin = module(x, positions[:, None, :])  # (3, b, n) positions
    elif case.hf_reference == "HunYuanDenseV1RotaryEmbedding":
        # the checkpoints' spelling: "dynamic" with an alpha
        checkpoint = {**params, "rope_type": "dynamic", "factor": 1.0}
        config = _llama_like(HunYuanDenseV1Config, case, checkpoint)
        module = HunYuanDenseV1RotaryEmbedding(config)
        assert module.rope_type == "ntk_alpha"
        init = HunYuanDenseV1RotaryEmbedding.compute_ntk_alpha_rope_parameters(config)
        cos, sin = module(x, positions[None])
    else:
        config_class, module_class = {
            "LlamaRotaryEmbedding": (LlamaConfig, LlamaRotaryEmbedding),
            "PhiRotaryEmbedding": (PhiConfig, PhiRotaryEmbedding),
        }[case.hf_reference]
        config = _llama_like(config_class, case, params)
        module = module_class(config)
        if rope_type == "default":
            init = module_class.compute_default_rope_parameters(config)
        else:
            init = ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)
        cos, sin = module(x, positions[None])
    inv_freq, factor = init
    return inv_freq, float(factor), cos[0, :, :half], sin[0, :, :half]


def _check_against_transformers(case: ConformanceCase) -> None:
    tables = case.tables()
    inv_freq, factor, cos, sin = _hf(case)
    # transformers' float32 frequencies against ours in float64
    assert_close(tables["inv_freq"], inv_freq.double(), rtol=1e-6, atol=0.0)
    assert float(tables["attention_factor"]) == pytest.approx(factor, rel=1e-12)
    _within_float32(case, tables, cos, sin)


@pytest.mark.parametrize("case", [c for c in CASES if c.hf_reference], ids=lambda c: c.name)
def test_each_case_agrees_with_transformers(case: ConformanceCase) -> None:
    _check_against_transformers(case)


def _within_float32(
    case: ConformanceCase, tables: dict, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    """cos/sin from a float32 path equal the float64 tables up to the float32 angle error."""
    if case.mrope_section is None:
        angle = tables["positions"].double()[:, None] * tables["inv_freq"]
    else:
        angle = torch.as_tensor(_formula_angles(case, tables["inv_freq"].numpy()))
    bound = 1e-6 + 4e-7 * angle.abs()  # float32 angles: off by about |angle| * 2^-23
    for name, theirs in (("cos", cos), ("sin", sin)):
        error = (tables[name] - theirs.double()).abs()
        assert (error <= bound).all(), f"{case.name} {name}: worst {(error / bound).max():.3g}x"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_case_agrees_with_posencs_own_module(
    case: ConformanceCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The module a user builds from the same settings turns by these tables: its cos/sin
    at the same positions, given as floats (evaluated in float64, no table grown to the far
    positions), after following the length as its forward would."""
    monkeypatch.setattr(posenc.RotaryEmbedding, "initial_table_size", 16)  # unused: be quick
    tables = case.tables()
    arguments = case.spec().arguments()
    positions = tables["positions"].double()
    if case.mrope_section is None:
        module = posenc.RotaryEmbedding(**arguments)
    else:
        module = posenc.MultimodalRotaryEmbedding(mrope_section=case.mrope_section, **arguments)
        positions = positions[:, None, :]  # (3, b, n)
    cos, sin = module.cos_sin(positions, positions.shape[-1], dtype=torch.float64)
    half = tables["inv_freq"].numel()
    assert_close(module.inv_freq, tables["inv_freq"], rtol=0, atol=0)
    assert module.attention_factor == float(tables["attention_factor"])
    assert_close(cos.reshape(-1, half), tables["cos"], rtol=0, atol=1e-12)
    assert_close(sin.reshape(-1, half), tables["sin"], rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- the formulas


def _formula(case: ConformanceCase) -> tuple[np.ndarray, float]:
    """``(inv_freq, attention_factor)`` transcribed in float64 from the papers and
    transformers' modeling_rope_utils, without posenc."""
    params = case.scaling()
    kind, base = params["rope_type"], float(params["rope_theta"])
    d = case.head_dim
    if kind != "proportional":
        d = int(d * params.get("partial_rotary_factor", 1.0))

    def plain(theta: float) -> np.ndarray:
        return theta ** -(np.arange(0, d, 2, dtype=np.float64) / d)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    seq_len, original = case.seq_len(), params.get("original_max_position_embeddings")
    if kind == "default":
        return plain(base), 1.0
    if kind == "linear":
        return plain(base) / params["factor"], 1.0
    if kind == "ntk":
        return plain(base * params["factor"] ** (d / (d - 2))), 1.0
    if kind == "ntk_alpha":
        return plain(base * params["alpha"] ** (d / (d - 2))), 1.0
    if kind == "dynamic":
        f, length0 = params["factor"], case.max_position_embeddings
        length = max(seq_len, length0)
        return plain(base * (f * length / length0 - (f - 1)) ** (d / (d - 2))), 1.0
    if kind == "proportional":
        kept = int(params.get("partial_rotary_factor", 1.0) * d // 2)
        inv_freq = plain(base)
        inv_freq[kept:] = 0.0
        return inv_freq / params.get("factor", 1.0), 1.0
    if kind == "yarn":
        s = params["factor"]

        def dim_of(rotations: float) -> float:  # Peng et al. 2023, eq. 17 solved for the index
            return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = dim_of(params.get("beta_fast", 32)), dim_of(params.get("beta_slow", 1))
        if params.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0.0, 1.0)
        inv_freq = plain(base) * (1 - ramp) + plain(base) / s * ramp
        if params.get("attention_factor") is not None:
            return inv_freq, params["attention_factor"]
        if params.get("mscale") and params.get("mscale_all_dim"):
            return inv_freq, mscale(s, params["mscale"]) / mscale(s, params["mscale_all_dim"])
        return inv_freq, mscale(s)
    if kind == "longrope":
        key = "long_factor" if seq_len > original else "short_factor"
        factor = math.sqrt(1 + math.log(params["factor"]) / math.log(original))
        return plain(base) / np.array(params[key], dtype=np.float64), factor
    if kind == "llama3":
        f, low_f, high_f = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        inv_freq = plain(base)
        wavelength = 2 * math.pi / inv_freq
        smooth = (original / wavelength - low_f) / (high_f - low_f)
        blended = (1 - smooth) * inv_freq / f + smooth * inv_freq
        out = np.where(wavelength > original / low_f, inv_freq / f, inv_freq)
        middle = (wavelength >= original / high_f) & (wavelength <= original / low_f)
        return np.where(middle, blended, out), 1.0
    raise AssertionError(f"no formula for rope_type {kind!r}: add one")


def _formula_angles(case: ConformanceCase, inv_freq: np.ndarray) -> np.ndarray:
    positions = np.array(case.positions, dtype=np.float64)
    if case.mrope_section is None:
        return positions[:, None] * inv_freq  # (n, r/2)
    rows = np.repeat(np.arange(len(case.mrope_section)), case.mrope_section)  # pair -> t/h/w
    return positions[rows].T * inv_freq  # (n, r/2): pair i with its row's positions


def _check_against_the_formula(case: ConformanceCase) -> None:
    tables = case.tables()
    inv_freq, factor = _formula(case)
    assert_close(tables["inv_freq"], torch.from_numpy(inv_freq), rtol=1e-13, atol=0.0)
    assert float(tables["attention_factor"]) == pytest.approx(factor, rel=1e-14)
    angles = _formula_angles(case, inv_freq)
    # float64 angles up to ~1.6e5 rad: a last-bit difference in inv_freq moves them ~1e-10
    assert_close(tables["cos"], torch.from_numpy(factor * np.cos(angles)), rtol=0, atol=1e-9)
    assert_close(tables["sin"], torch.from_numpy(factor * np.sin(angles)), rtol=0, atol=1e-9)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_case_agrees_with_the_float64_formula(case: ConformanceCase) -> None:
    _check_against_the_formula(case)


# --------------------------------------------------------------------------- later cases


def _ntk_alpha(
    dim: int,
    base: float,
    params: Any,
    *,
    max_position_embeddings: int | None = None,
    seq_len: float | None = None,
) -> tuple[torch.Tensor, float]:
    return default_inv_freq(dim, base * float(params["alpha"]) ** (dim / (dim - 2))), 1.0


@pytest.fixture
def later_cases(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``ntk_alpha`` and multimodal RoPE present: posenc's own once they exist, else a
    stand-in (the HunYuan formula; a placeholder attribute) for this test only."""
    registered = "ntk_alpha" not in ROPE_TYPES
    if registered:
        register_rope_type("ntk_alpha", _ntk_alpha, keys=("alpha",))
    if not hasattr(posenc, "MultimodalRotaryEmbedding"):
        monkeypatch.setattr(posenc, "MultimodalRotaryEmbedding", object, raising=False)
    try:
        yield
    finally:
        if registered:
            _unregister_rope_type("ntk_alpha")


@pytest.mark.usefixtures("later_cases")
def test_ntk_alpha_and_multimodal_cases_join_when_available(tmp_path: Path) -> None:
    names = [case.name for case in conformance_cases()]
    assert names[names.index("ntk") + 1] == "ntk_alpha" and names[-1] == "mrope"
    for case in (_NTK_ALPHA, _MROPE):
        _check_against_transformers(case)
        _check_against_the_formula(case)
    index = write_conformance(tmp_path, ["mrope"])
    entry = index["cases"]["mrope"]
    assert entry["mrope_section"] == [16, 24, 24] and len(entry["positions"]) == 3
    loaded = safetensors_torch.load_file(tmp_path / "mrope.safetensors")
    assert loaded["positions"].shape == (3, 13) and loaded["cos"].shape == (13, 64)


def test_the_later_cases_follow_what_posenc_has() -> None:
    names = [case.name for case in conformance_cases()]
    assert ("ntk_alpha" in names) == ("ntk_alpha" in ROPE_TYPES)
    assert ("mrope" in names) == hasattr(posenc, "MultimodalRotaryEmbedding")


# --------------------------------------------------------------------------- the command


def test_the_command_writes_the_chosen_cases(tmp_path: Path, capsys) -> None:
    out = tmp_path / "new" / "dir"
    assert cli.main(["conformance", "--out", str(out), "--cases", "yarn", "default"]) == 0
    assert "wrote 2 cases" in capsys.readouterr().out
    index = json.loads((out / "index.json").read_text())
    assert list(index["cases"]) == ["default", "yarn"]  # the list's order
    assert sorted(p.name for p in out.iterdir()) == [
        "default.safetensors", "index.json", "yarn.safetensors"
    ]  # fmt: skip
    assert cli.main(["conformance", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [case.name for case in CASES]
    assert "not >=" in next(line for line in lines if line.startswith("longrope_at_original"))


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--cases", "yarn", "nope"], r"unknown conformance case\(s\) 'nope'; known: default"),
        (["--list", "--cases", "nope"], r"unknown conformance case"),
        ([], r"needs --out DIR"),
        (["--out", "FILE"], r"is a file, not a folder"),
    ],
)
def test_bad_input_is_one_line_and_status_2(
    args: list[str], match: str, tmp_path: Path, capsys
) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    args = [str(file) if a == "FILE" else a for a in args]
    if "--out" not in args and "--list" not in args and args:
        args += ["--out", str(tmp_path / "out")]
    assert cli.main(["conformance", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert re.search(match, captured.err), captured.err
    assert not (tmp_path / "out").exists()  # nothing written
    assert file.read_text() == "x"


# --------------------------------------------------------------------------- the doc


def test_the_documented_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "docs" / "conformance.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["conformance", "--out", "conformance"]) == 0  # as the doc says to run it
    namespace: dict[str, Any] = {}
    exec(compile(block, "docs/conformance.md", "exec"), namespace)
    assert namespace["case"]["rope_type"] == "longrope"
    # the doc's tables list every case, with its note, the later ones too
    for case in (*CASES, _NTK_ALPHA, _MROPE):
        assert (
            f"| `{case.name}` | {case.scaling()['rope_type']} | {case.head_dim} | {case.note} |"
            in text
        )
