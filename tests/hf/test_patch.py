"""``posenc.hf.patch(model)`` / ``unpatch(model)``: the patched transformers model is the same
model (logits within 2e-5 of the unpatched model's in float32, the same greedy tokens), only
the given instance changes, and in bfloat16 its rotated q and k are closer to the float64
rotation.

The family sweep (:func:`test_every_census_family_patches_exactly_or_is_refused_by_name`)
takes every modeling file the RoPE census reads (``tests/hf/census.py``), builds each of its
text families tiny (``tests/hf/tiny.py``) and compares; a family that does not build tiny, or
whose model does not run on token ids alone, is skipped with the reason. Most folders are
``slow`` (about 3 minutes for all on a shared CPU); :data:`FAST` run always.
``python -m tests.hf.test_patch`` prints the sweep as the Markdown table of ``docs/patch.md``.

Dimension legend: ``b`` batch, ``h`` heads, ``n`` positions, ``d`` head size.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

transformers = pytest.importorskip("transformers")

import posenc.hf  # noqa: E402
from posenc.errors import PosencError, PosencTypeError, PosencValueError  # noqa: E402
from posenc.hf.patch import MARK  # noqa: E402
from tests.hf import census, tiny  # noqa: E402
from tests.hf import test_rope_census as expected  # noqa: E402
from tests.native import NEEDS_KERNEL  # noqa: E402

#: ``max|patched - unpatched| / max|unpatched|`` over the logits, float32.
TOLERANCE = 2e-5
#: Folders of the sweep that run without ``-m slow``.
FAST = (
    "llama",
    "qwen3",
    "gemma3",
    "phi",
    "cohere",
    "gpt_oss",
    "llama4",
    "olmo2",
    "gptj",
    "deepseek_v2",
    "deepseek_v32",
    "qwen2_vl",
    "qwen3_vl",
)

SIZES = dict(
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=100,
    max_position_embeddings=256,
)


def _llama(**fields: object) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**SIZES, **fields})
    return transformers.LlamaForCausalLM(config).eval()


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


IDS = torch.randint(3, 100, (2, 32), generator=torch.Generator().manual_seed(1))


# --------------------------------------------------------------------------- the contract


def test_import_posenc_imports_no_transformers() -> None:
    code = (
        "import sys, posenc, posenc.hf; assert 'transformers' not in sys.modules; "
        "assert callable(posenc.hf.patch) and callable(posenc.hf.unpatch)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_patched_llama_gives_the_same_logits_and_a_second_instance_is_unchanged() -> None:
    modeling = transformers.models.llama.modeling_llama
    forward, apply = modeling.LlamaAttention.forward, modeling.apply_rotary_pos_emb
    model, other = _llama(), _llama()
    want = _logits(model, IDS)
    changed = posenc.hf.patch(model)
    assert changed == [
        "model.rotary_emb",
        "model.layers.0.self_attn",
        "model.layers.1.self_attn",
    ]
    assert _relative(_logits(model, IDS), want) <= TOLERANCE
    # the class, the modeling module and the other instance are as they were
    assert not any("forward" in m.__dict__ for m in other.modules())
    assert modeling.LlamaAttention.forward is forward
    assert modeling.apply_rotary_pos_emb is apply
    torch.testing.assert_close(_logits(other, IDS), want, rtol=0, atol=0)


def test_patch_twice_changes_nothing_and_unpatch_restores() -> None:
    model = _llama()
    want = _logits(model, IDS)
    changed = posenc.hf.patch(model)
    assert posenc.hf.patch(model) == []
    assert sorted(posenc.hf.unpatch(model)) == sorted(changed)
    assert posenc.hf.unpatch(model) == []
    assert not any("forward" in m.__dict__ for m in model.modules())
    torch.testing.assert_close(_logits(model, IDS), want, rtol=0, atol=0)


@pytest.mark.parametrize(
    "prepared", [pytest.param(True, marks=NEEDS_KERNEL), False], ids=["prepared", "selected"]
)
def test_the_patched_attention_rotates_with_posencs_kernel(
    monkeypatch: pytest.MonkeyPatch, prepared: bool
) -> None:
    """The equality above must not come from the patch doing nothing: the patched forward
    calls posenc's kernel on q and k together (under no_grad), the unpatched one does not;
    by the tables the rotary module prepared for the C kernel, or (tables not prepared) by
    the selector's plan."""
    rotations = importlib.import_module("posenc.hf.rotations")
    name = "turn_prepared_pair" if prepared else "rotate_both"
    calls = []
    inner = getattr(rotations, name)

    def counted(*args: object, **kwargs: object) -> object:
        out = inner(*args, **kwargs)
        calls.append(out)
        return out

    monkeypatch.setattr(rotations, name, counted)
    if not prepared:
        monkeypatch.setattr(rotations, "prepare_tables", lambda cos, sin: None)
    model = _llama()
    want = _logits(model, IDS)
    assert calls == []
    posenc.hf.patch(model)
    calls.clear()  # the patch's probe rotated too
    assert _relative(_logits(model, IDS), want) <= TOLERANCE
    assert len(calls) == 2  # q and k together, in each of 2 layers
    if prepared:
        assert calls == [True, True]  # both turned by the prepared call


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "dynamic", "factor": 2.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
        {
            "rope_type": "longrope",
            "short_factor": [1.0 + i / 8 for i in range(8)],
            "long_factor": [2.0 + i / 4 for i in range(8)],
            "original_max_position_embeddings": 16,
        },
    ],
    ids=lambda r: r["rope_type"],
)
def test_every_rope_type_matches_past_the_original_context(rope: dict) -> None:
    """Dynamic NTK and LongRoPE follow the length (32 tokens past 16), as transformers'
    ``dynamic_rope_update`` does; the others are fixed scalings."""
    model = _llama(max_position_embeddings=16, rope_parameters={"rope_theta": 10000.0, **rope})
    short = IDS[:, :8]
    want_short, want = _logits(model, short), _logits(model, IDS)
    model = _llama(max_position_embeddings=16, rope_parameters={"rope_theta": 10000.0, **rope})
    posenc.hf.patch(model)
    assert _relative(_logits(model, short), want_short) <= TOLERANCE
    assert _relative(_logits(model, IDS), want) <= TOLERANCE


@pytest.mark.parametrize("family", ["llama", "phi", "gemma2", "gptj", "deepseek_v2"])
def test_greedy_generation_is_the_same(family: str) -> None:
    config_class = transformers.CONFIG_MAPPING[family]
    model = tiny.tiny_model(config_class)
    prompt = IDS[:1, :8]
    kwargs = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(prompt, **kwargs)
        posenc.hf.patch(model)
        got = model.generate(prompt, **kwargs)
    assert want.shape == (1, 24)
    assert torch.equal(got, want)


def test_patched_training_gives_the_same_gradients() -> None:
    """Under autograd the rotation is out of place and differentiable."""
    grads = []
    for patched in (False, True):
        model = _llama().train()
        if patched:
            posenc.hf.patch(model)
        model(input_ids=IDS, labels=IDS).loss.backward()
        grads.append(model.model.layers[0].self_attn.q_proj.weight.grad)
    assert _relative(grads[1], grads[0]) <= 1e-4


def _rotation_float64(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """The half-layout rotation (RoFormer eq. 34, GPT-NeoX layout) of ``x`` ``(b, h, n, d)`` at
    positions ``0..n-1``, in float64."""
    d, n = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq  # (n, d/2)
    cos, sin = angle.cos(), angle.sin()
    x = x.double()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)


def _rotation_errors(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> float:
    """max over layers of ``max|rotated q, k - float64 rotation of the same inputs|`` in units
    of the float64 values' max, for a bfloat16 Llama."""
    modeling = transformers.models.llama.modeling_llama
    before: dict[str, torch.Tensor] = {}
    errors = []
    heads = {"q_proj": SIZES["num_attention_heads"], "k_proj": SIZES["num_key_value_heads"]}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        for name, h in heads.items():

            def keep(module, args, out, i=i, name=name, h=h):
                b, n, _ = out.shape
                before[f"{i}{name}"] = out.detach().clone().view(b, n, h, -1).transpose(1, 2)

            hooks.append(getattr(layer.self_attn, name).register_forward_hook(keep))
    original = modeling.eager_attention_forward

    def recorded(module, query, key, value, *args, **kwargs):
        i = module.layer_idx
        for tag, got in (("q_proj", query), ("k_proj", key)):
            want = _rotation_float64(before[f"{i}{tag}"])
            errors.append(float((got.double() - want).abs().max() / want.abs().max()))
        return original(module, query, key, value, *args, **kwargs)

    monkeypatch.setattr(modeling, "eager_attention_forward", recorded)
    return errors, hooks


def test_bfloat16_rotation_is_closer_to_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positions 0..31 of a bfloat16 Llama: transformers casts cos and sin to bfloat16 and
    rounds after each product; posenc rotates in float32 and rounds once."""
    measured = {}
    for patched in (False, True):
        model = _llama(attn_implementation="eager").to(torch.bfloat16)
        errors, hooks = _rotation_errors(model, monkeypatch)  # before the patch: its globals
        if patched:
            posenc.hf.patch(model)
        _logits(model, IDS)
        for hook in hooks:
            hook.remove()
        assert len(errors) == 2 * 2
        measured[patched] = max(errors)
        monkeypatch.undo()
    print(
        f"bf16 rotation vs float64: unpatched {measured[False]:.2e}, patched {measured[True]:.2e}"
    )
    assert measured[True] < measured[False]
    assert measured[True] <= 2.0**-8  # one rounding to bfloat16: half an ulp of the largest


# --------------------------------------------------------------------------- refusals


def test_a_non_module_is_refused() -> None:
    with pytest.raises(PosencTypeError, match=r"model must be a torch\.nn\.Module"):
        posenc.hf.patch("llama")


def test_split_pair_mrope_is_refused_by_name_and_the_model_is_unchanged() -> None:
    fixes = census.CONFIG_FIXES.get("HunYuanVLTextConfig")
    model = tiny.tiny_model(transformers.HunYuanVLTextConfig, fixes)
    want = _logits(model, IDS)
    with pytest.raises(PosencValueError, match=r"'hunyuan_vl_text'.*'blocked-channels'"):
        posenc.hf.patch(model)
    assert not any("forward" in m.__dict__ for m in model.modules())
    torch.testing.assert_close(_logits(model, IDS), want, rtol=0, atol=0)


def test_an_unknown_rotation_signature_is_refused_by_name() -> None:
    """An apply function of none of the forms posenc reads: refused before any change."""
    from posenc.hf.rotations import form_of

    def apply_rotary_pos_emb(q, freqs):
        return q

    with pytest.raises(PosencValueError, match=r"'fam'.*apply_rotary_pos_emb\(q, freqs\)"):
        form_of("'fam'", apply_rotary_pos_emb, "apply_rotary_pos_emb")


def test_an_apply_whose_k_is_optional_rotates_q_alone_as_theirs_does() -> None:
    """Qwen4-Exp's apply takes ``k=None`` (its indexer rotates queries alone, ``bshd`` by
    ``unsqueeze_dim=2``, and pooled keys ``(g, 1, d)``): posenc's rotation takes the same
    calls and gives transformers' own results (partial: 16 of 24 channels turn)."""
    from posenc.hf.rotations import rotation

    theirs = importlib.import_module("transformers.models.qwen4_exp.modeling_qwen4_exp")
    theirs = theirs.apply_rotary_pos_emb
    ours = rotation("'fam'", theirs, "apply_rotary_pos_emb", **dict.fromkeys(_FLAGS, False))
    g = torch.Generator().manual_seed(3)
    freqs = torch.arange(7.0)[:, None] * 10000.0 ** (-torch.arange(8.0) / 8)
    cos, sin = torch.cat([freqs, freqs], -1).cos()[None], torch.cat([freqs, freqs], -1).sin()[None]
    for q, dim in ((torch.randn(1, 7, 3, 24, generator=g), 2), (torch.randn(7, 1, 24), 1)):
        tables = (cos, sin) if dim == 2 else (cos[0], sin[0])
        want = theirs(q.clone(), cos=tables[0], sin=tables[1], unsqueeze_dim=dim)
        got = ours(q.clone(), cos=tables[0], sin=tables[1], unsqueeze_dim=dim)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    q, k = torch.randn(1, 3, 7, 24, generator=g), torch.randn(1, 3, 7, 24, generator=g)
    for got, want in zip(ours(q.clone(), k.clone(), cos, sin), theirs(q, k, cos, sin), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


_FLAGS = ("tables_interleaved", "pairs_interleaved")


def test_a_rotary_module_with_learned_parameters_is_refused_by_name() -> None:
    """Mistral Large 4's rotary module scales its frequencies by a learned ``exp(alpha)``
    (zero at init): posenc's tables, read from the config, would drop it, and its logits
    differed (2.1e-4 at alpha ~ 0.02). Refused, the model unchanged, whatever alpha holds."""
    fixes = census.CONFIG_FIXES.get("MistralLarge4TextConfig")
    module = importlib.import_module("transformers.models.mistral_large4.modeling_mistral_large4")
    model = tiny.tiny_model(transformers.MistralLarge4TextConfig, fixes, module)
    want = _logits(model, IDS)
    with pytest.raises(PosencValueError, match=r"mistral_large4_text.*learned.*alpha"):
        posenc.hf.patch(model)
    assert not any(MARK in m.__dict__ for m in model.modules())
    torch.testing.assert_close(_logits(model, IDS), want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("config_class", "section"),
    [("Qwen2VLTextConfig", "blocked"), ("Qwen3VLTextConfig", "interleaved")],
)
def test_mrope_rows_that_differ_give_the_same_logits(config_class: str, section: str) -> None:
    """Multimodal positions ``(3, b, n)`` whose rows differ (an image's time, height and
    width): the patched text model equals the unpatched one, its sections laid out as its own
    code lays them (``section``: Qwen2-VL's blocked, Qwen3-VL's interleaved rows)."""
    model = tiny.tiny_model(getattr(transformers, config_class))
    n = IDS.shape[1]
    step = torch.arange(n)
    rows = torch.stack((step, 5 + step // 4, 9 + step % 4))[:, None].expand(3, 2, n)
    with torch.no_grad():
        want = model(input_ids=IDS, position_ids=rows, use_cache=False).last_hidden_state
        text = model(input_ids=IDS, use_cache=False).last_hidden_state
        posenc.hf.patch(model)
        got = model(input_ids=IDS, position_ids=rows, use_cache=False).last_hidden_state
    assert _relative(want, text) > 1e-3  # the rows matter
    assert _relative(got, want) <= TOLERANCE


def test_a_model_without_rotary_embedding_is_refused_by_name() -> None:
    model = tiny.tiny_model(transformers.GPT2Config)
    with pytest.raises(PosencValueError, match=r"'gpt2'.*no transformers rotary module"):
        posenc.hf.patch(model)


# --------------------------------------------------------------------------- the sweep


@dataclass
class Outcome:
    """One family of the sweep."""

    family: str  # model type (config class where it has none)
    config_class: str
    kind: str  # "patched", "refused", "not built"
    detail: str = ""  # the error (patched: the relative error; bf16 distances)


def sweep_folder(folder: str) -> list[Outcome]:
    """Every text family of one modeling folder: built tiny, patched, compared."""
    path = next(p for p in census.modeling_files() if p.parent.name == folder)
    outcomes = []
    seen = set()
    for site in census.discover([path], failed={}):
        if site.config_class in seen:
            continue
        seen.add(site.config_class)
        name = site.config_class.__name__
        fixes = census.CONFIG_FIXES.get(name, {})
        variants = {"": fixes}
        for label, fields in census.CONFIG_VARIANTS.get(name, {}).items():
            variants[label] = {**fixes, **fields}
        for label, fields in variants.items():
            outcomes.append(_one(site, fields, label))
    return [o for o in outcomes if o is not None]


def _one(site: census.Site, fields: dict, label: str) -> Outcome | None:
    name = site.config_class.__name__
    model_type = getattr(site.config_class, "model_type", "") or name
    if model_type in expected.NOT_SEQUENCE:
        return None
    try:
        model = tiny.tiny_model(site.config_class, fields, site.module)
    except Exception as error:
        return Outcome(name + label, name, "not built", census._short(error))
    family = (getattr(model.config, "model_type", "") or name) + (f"+{label}" if label else "")
    try:
        want = _logits(model, IDS)
    except Exception as error:
        return Outcome(
            family, name, "not built", f"does not run on token ids: {census._short(error)}"
        )
    try:
        posenc.hf.patch(model)
    except PosencError as error:
        assert isinstance(error, PosencValueError)
        assert str(model.config.model_type) in str(error) or type(model).__name__ in str(error)
        assert not any(MARK in m.__dict__ for m in model.modules())
        return Outcome(family, name, "refused", str(error).removeprefix("cannot patch "))
    got = _logits(model, IDS)
    error = _relative(got, want)
    assert error <= TOLERANCE, f"{family}: patched logits differ by {error:.1e}"
    # bfloat16: each model's distance to its float32 logits (reported, not asserted)
    patched_bf16 = _logits(model.to(torch.bfloat16), IDS)
    posenc.hf.unpatch(model)
    plain_bf16 = _logits(model, IDS)
    detail = (
        f"{error:.1e}; bf16 vs fp32: unpatched {_relative(plain_bf16, want):.1e}, "
        f"patched {_relative(patched_bf16, want):.1e}"
    )
    return Outcome(family, name, "patched", detail)


def _folders() -> list:
    folders = sorted({p.parent.name for p in census.modeling_files()})
    return [pytest.param(f, marks=() if f in FAST else pytest.mark.slow, id=f) for f in folders]


@pytest.mark.parametrize("folder", _folders())
def test_every_census_family_patches_exactly_or_is_refused_by_name(folder: str) -> None:
    transformers.logging.set_verbosity_error()
    outcomes = sweep_folder(folder)
    for o in outcomes:
        print(f"{o.family}: {o.kind} {o.detail}")
    if not any(o.kind in ("patched", "refused") for o in outcomes):
        pytest.skip("; ".join(f"{o.family}: {o.detail}" for o in outcomes) or "not a sequence")


def main() -> None:
    """Print the sweep as Markdown (``python -m tests.hf.test_patch [FIRST [LAST]]``: the
    folders from FIRST to LAST, alphabetically; rows as each folder finishes, then counts)."""
    import resource
    import warnings

    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # a family too big to be tiny
    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    first = sys.argv[1] if len(sys.argv) > 1 else ""
    last = sys.argv[2] if len(sys.argv) > 2 else "~"
    rows = []
    print("| family | config class | patch | detail |\n| --- | --- | --- | --- |", flush=True)
    for param in _folders():
        folder = param.values[0]
        if not first <= folder <= last:
            continue
        try:
            found = sweep_folder(folder)
        except AssertionError as error:
            found = [Outcome(folder, "", "WRONG", str(error))]
        for o in found:
            detail = o.detail.replace("|", "\\|").replace("\n", " ")
            print(f"| `{o.family}` | `{o.config_class}` | {o.kind} | {detail} |", flush=True)
        rows += found
    counts = {k: sum(o.kind == k for o in rows) for k in ("patched", "refused", "not built")}
    print(f"\ntransformers {transformers.__version__}: {counts}")


if __name__ == "__main__":
    main()
