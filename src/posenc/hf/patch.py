"""posenc's exact rotation inside a loaded transformers model: :func:`patch`, :func:`unpatch`.

Two kinds of module of the given instance change, and nothing else (not their classes, not
the modeling modules):

* the family's rotary module (``LlamaRotaryEmbedding``, ...): its ``forward`` returns posenc's
  float32 tables, made from float64 angles by ``RotaryEmbedding.from_hf_config(its config)``
  (every rope type posenc reads: YaRN, Llama 3, LongRoPE, dynamic NTK following the length as
  transformers' ``dynamic_rope_update`` does; multimodal RoPE from position ids of several
  rows, ``(rows, b, n)``), in the form the family's apply function reads
  (:mod:`~.rotations`: ``cat(freqs, freqs)`` or each frequency twice; GPT-J's sine and cosine
  per pair; Llama 4's complex ``cos + i sin``), not cast to the model's dtype. A rotary module
  that keeps no config (GPT-J, CodeGen) is read from the model's;
* every attention whose ``forward`` calls its modeling file's ``apply_rotary_pos_emb``,
  ``apply_rotary_pos_emb_interleave`` (multi-head latent attention) or ``apply_rotary_emb``
  (complex rotation): its ``forward`` becomes the same code with that function read from a
  copy of the modeling module's globals where it is posenc's kernel (C on CPU, Triton on
  CUDA), rotating in the projection's own storage where autograd allows (no grad, or no tensor
  that needs one), in float32 and rounded once to the model's dtype.

Before anything changes, each family is probed: its own tables and apply function rotate
random q, k (positions 100..131 and 0..31, with rows that differ for multimodal RoPE; a few
channels past the tables' width) and posenc's must agree (``max|a - b| / max|b| <= 2e-5``).
A family posenc cannot read, whose attention rotates by other code (an inline ``rotate_half``,
a multimodal layout whose pair's two channels take different rows), or whose probe differs
is refused with a :class:`~posenc.errors.PosencValueError` naming the family and why, the
model unchanged.

transformers is imported by the calls, never by ``import posenc``.
"""

from __future__ import annotations

import copy
import inspect
import re
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..encodings.rotary.kernels.select import eager_plain
from ..encodings.rotary.multimodal import MultimodalRotaryEmbedding
from ..encodings.rotary.rope import RotaryEmbedding
from ..errors import PosencError, PosencTypeError, PosencValueError
from .rebind import rebound
from .rotations import form_of, prepare, rotation
from .rows import gathered, lean, read
from .towers import in_tower, is_vision_tower

#: The instance attribute that marks a patched module: its ``forward`` before the patch (None
#: where it had none of its own, the class's then being used).
MARK = "_posenc_unpatched_forward"
#: The instance attribute of a patched rotary module holding its :class:`_Tables` (in the
#: module's own ``__dict__``, so that ``copy.deepcopy`` copies them with the module: dynamic
#: NTK's state is the module's own, not shared with the model it was copied from).
TABLES = "_posenc_tables"
#: The modeling file's function the patched attentions call.
APPLY = "apply_rotary_pos_emb"
#: Multi-head latent attention's (DeepSeek-V3 family): interleaved pairs, written de-interleaved.
INTERLEAVE = "apply_rotary_pos_emb_interleave"
#: Complex rotation (Llama 4, DeepSeek-V2): ``(xq, xk, freqs_cis)``.
COMPLEX = "apply_rotary_emb"
#: ``max|posenc - family| / max|family|`` the probe allows (float32 angles against float64 at
#: positions ~130: ~130 * 2**-24).
PROBE_TOLERANCE = 2e-5

_ROTATION_NAME = re.compile(r"^(apply_\w*(rotary|rope|rotate)\w*|rotate_half)$")
_PROBE_POSITIONS = (100, 0)  # first positions of the two probe rows
_PROBE_LENGTH = 32


# --------------------------------------------------------------------------- the public calls


def patch(model: nn.Module) -> list[str]:
    """Rotate with posenc inside ``model`` (a loaded transformers model instance): its rotary
    modules give posenc's float32 tables and its attentions rotate q and k with posenc's
    kernels, one rounding to the model's dtype. Only this instance changes; a copy of it
    (``copy.deepcopy``) stays patched, with tables (and dynamic NTK's state) of its own; one
    pickled (``torch.save`` of the model) loads unpatched, to patch again. A vision tower's
    rotary module and the attentions it serves (a vision-language model's) stay as they are.

    Returns the paths (as ``named_modules`` names them) of the modules changed; ``[]`` when
    ``model`` is already patched. Raises :class:`~posenc.errors.PosencValueError` naming the
    family and the reason where posenc cannot rotate it exactly (the model is then unchanged),
    :class:`~posenc.errors.PosencTypeError` where ``model`` is no ``torch.nn.Module``.
    """
    _check_model(model)
    if any(_is_patched(m) for m in model.modules()):
        return []
    for module in model.modules():  # the marks of a patch that did not survive pickling
        if MARK in module.__dict__:
            _restore(module)
    family = _family(model)
    every = [(n, m) for n, m in model.named_modules() if _is_rotary(m)]
    towers = {n for n, m in every if is_vision_tower(m)}
    rotaries = [(n, m) for n, m in every if n not in towers]
    attentions = [
        (n, m)
        for n, m in model.named_modules()
        if _rotation_names(m) and not in_tower(n, [r for r, _ in every], towers)
    ]
    if not rotaries:
        raise PosencValueError(
            f"cannot patch {family} ({type(model).__name__}): it has no transformers rotary "
            "module (a class named *RotaryEmbedding)"
            + (f" but a vision tower's ({', '.join(sorted(towers))})" if towers else "")
        )
    if not attentions:
        raise PosencValueError(
            f"cannot patch {family}: none of its modules' forward calls {APPLY} (its "
            "rotary tables are applied elsewhere)"
        )
    config = getattr(model, "config", None)
    tables = {name: _Tables.of(family, m, config) for name, m in rotaries}
    layouts = {t.interleaved for t in tables.values()}
    if len(layouts) > 1:
        raise PosencValueError(f"cannot patch {family}: its rotary modules mix layouts")
    interleaved = layouts.pop()
    calls = {}  # (globals, name) -> the family's function
    for _, module in attentions:
        namespace = _innermost(type(module).forward).__globals__
        for called in _check_calls(family, module, _rotation_names(module)):
            calls[id(namespace), called] = (namespace, called)
    forms = {form_of(family, namespace.get(called), called) for namespace, called in calls.values()}
    if len(forms) > 1:
        raise PosencValueError(
            f"cannot patch {family}: its attentions' rotations read tables of different forms "
            f"({', '.join(sorted(forms))})"
        )
    form = forms.pop()
    for t in tables.values():
        t.form = form
        t.lean = form == "cos_sin" and not t.interleaved and not t.takes_layer_type
    rotations: dict[tuple[int, str], Callable[..., Any]] = {}  # (globals, name) -> posenc's
    for key, (namespace, called) in calls.items():
        # an MLA modeling file's apply_rotary_pos_emb is Llama's (half pairs: DeepSeek-V3.2's
        # indexer) beside its apply_rotary_pos_emb_interleave
        pairs = interleaved and not (called == APPLY and INTERLEAVE in namespace)
        rotations[key] = rotation(
            family,
            namespace[called],
            called,
            tables_interleaved=interleaved,
            pairs_interleaved=pairs,
        )
        for t in tables.values():
            t.probe(family, namespace[called], rotations[key], called == INTERLEAVE)
    forwards = {}
    # one rebuilt forward (one globals dict) per attention class and rotation: every layer
    # runs the same function, so torch.compile's code cache, kept per code object, finds
    # the compiled graph in the globals of whichever layer it compiled first
    rebuilt: dict[tuple[Any, frozenset[str]], Any] = {}
    for name, module in attentions:
        wrapper = type(module).forward
        used = frozenset(_check_calls(family, module, _rotation_names(module)))
        if (wrapper, used) not in rebuilt:
            function = _innermost(wrapper)
            namespace = function.__globals__
            replaced = {called: rotations[id(namespace), called] for called in used}
            rebuilt[wrapper, used] = rebound(wrapper, function, replaced)
        forwards[name] = rebuilt[wrapper, used]
    changed = []
    for name, module in rotaries:
        module.__dict__[TABLES] = tables[name]
        _replace(module, types.MethodType(_rotary_forward, module))
        changed.append(name)
    for name, module in attentions:
        _replace(module, types.MethodType(forwards[name], module))
        changed.append(name)
    return changed


def unpatch(model: nn.Module) -> list[str]:
    """Undo :func:`patch` on ``model``: every module it changed gets its ``forward`` back.
    Returns the paths restored (``[]`` where nothing was patched)."""
    _check_model(model)
    restored = []
    for name, module in model.named_modules():
        if MARK not in module.__dict__:
            continue
        if _is_patched(module):
            restored.append(name)
        _restore(module)
    return restored


def _is_patched(module: nn.Module) -> bool:
    """Whether ``module`` runs a forward :func:`patch` put in: a copy (``copy.deepcopy``)
    does; a pickled one does not, though it keeps the mark (pickle stores a bound method as
    ``getattr(module, "forward")``, read back as the class's own)."""
    forward = module.__dict__.get("forward")
    if MARK not in module.__dict__ or forward is None:
        return False
    return getattr(forward, "__func__", None) is not getattr(type(module), "forward", None)


def _restore(module: nn.Module) -> None:
    """``module``'s ``forward`` before the patch, and no mark left."""
    original = module.__dict__.pop(MARK)
    module.__dict__.pop(TABLES, None)
    if original is None:
        module.__dict__.pop("forward", None)
    else:
        module.forward = original


# --------------------------------------------------------------------------- finding modules


def _check_model(model: object) -> None:
    if not isinstance(model, nn.Module):
        raise PosencTypeError(
            f"model must be a torch.nn.Module (a loaded transformers model), got "
            f"{type(model).__name__}"
        )


def _family(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    return f"'{model_type}'" if model_type else type(model).__name__


def _is_rotary(module: nn.Module) -> bool:
    cls = type(module)
    return cls.__name__.endswith("RotaryEmbedding") and cls.__module__.startswith("transformers.")


def _innermost(function: Any) -> types.FunctionType:
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return function


def _rotation_names(module: nn.Module) -> set[str]:
    """The rotation functions (``apply_*rotary*``, ``rotate_half``, ...) a transformers
    module's own ``forward`` reads from its modeling module's globals."""
    if not type(module).__module__.startswith("transformers.") or _is_rotary(module):
        return set()
    function = _innermost(type(module).forward)
    code = getattr(function, "__code__", None)
    if code is None:
        return set()
    return {name for name in code.co_names if _ROTATION_NAME.match(name)}


def _check_calls(family: str, module: nn.Module, names: set[str]) -> set[str]:
    """The rotation functions ``module``'s forward calls under its config (``names`` less a
    branch its config does not take), or raise naming those posenc does not replace."""
    others = names - {APPLY, INTERLEAVE, COMPLEX}
    if others:
        raise PosencValueError(
            f"cannot patch {family}: {type(module).__name__}.forward rotates with "
            f"{', '.join(sorted(others))} (not {APPLY}, {INTERLEAVE} or {COMPLEX} on whole "
            "q and k), which posenc does not replace"
        )
    if names == {APPLY, INTERLEAVE}:  # MLA: ``if self.config.rope_interleave: ... else: ...``
        config = getattr(module, "config", None)
        if config is None or not hasattr(config, "rope_interleave"):
            raise PosencValueError(
                f"cannot patch {family}: {type(module).__name__}.forward calls {APPLY} and "
                f"{INTERLEAVE}, and its config says no rope_interleave to choose between them"
            )
        return {INTERLEAVE if config.rope_interleave else APPLY}
    return names


def _rotary_forward(module: nn.Module, x: Tensor, position_ids: Tensor, *args: Any, **kw: Any):
    """The patched rotary module's ``forward``: its own :class:`_Tables`'."""
    return module.__dict__[TABLES].forward(module, x, position_ids, *args, **kw)


# pickle stores a bound method as ``getattr(its object, its name)``: named ``forward``, a
# pickled patched model loads (as the class's forward: see :func:`_is_patched`)
_rotary_forward.__name__ = "forward"


def _replace(module: nn.Module, forward: Any) -> None:
    module.__dict__[MARK] = module.__dict__.get("forward")
    module.forward = forward


# --------------------------------------------------------------------------- the tables


@dataclass
class _Tables:
    """posenc's rotary embedding(s) standing in for one transformers rotary module."""

    module: nn.Module
    ropes: dict[str | None, RotaryEmbedding]  # layer type (None: the only one) -> posenc's
    takes_layer_type: bool
    form: str = "cos_sin"  # of :data:`~.rotations.FORMS`: what the attentions' function reads
    interleaved: bool = field(init=False)  # the tables' layout: each frequency twice
    #: layer type -> (the rope's cos table, the joint table :func:`~.rows.gathered` reads)
    joints: dict[str | None, tuple[Tensor, Tensor]] = field(default_factory=dict, repr=False)
    #: ``forward`` first tries :func:`~.rows.lean` (one rope, full-width ``cat(freqs, freqs)``)
    lean: bool = False

    def __post_init__(self) -> None:
        self.interleaved = next(iter(self.ropes.values())).interleaved

    @classmethod
    def of(cls, family: str, module: nn.Module, model_config: Any = None) -> _Tables:
        """posenc's embeddings for ``module``, read from its config, else (GPT-J, CodeGen:
        a module built from the config that keeps none) from the model's."""
        config = getattr(module, "config", None) or model_config
        if config is None:
            raise PosencValueError(
                f"cannot patch {family}: {type(module).__name__} keeps no config to read"
            )
        learned = [n for n, _ in module.named_parameters()]
        if learned:  # Mistral Large 4's exp(alpha) on its frequencies: not in the config
            raise PosencValueError(
                f"cannot patch {family}: its rotary module {type(module).__name__} has learned "
                f"parameters {learned} that posenc's tables, read from the config, would drop"
            )
        takes = "layer_type" in inspect.signature(type(module).forward).parameters
        types_ = sorted(set(getattr(config, "layer_types", None) or ())) if takes else []
        served = {n.removesuffix("_inv_freq") for n, _ in module.named_buffers(recurse=False)}
        if types_ and served & set(types_):  # NoPE, convolution, ... layer types have none
            types_ = [t for t in types_ if t in served]
        ropes = {}
        for layer_type in types_ or [None]:
            ropes[layer_type] = _read(family, config, layer_type)
        if len({r.interleaved for r in ropes.values()}) > 1:
            raise PosencValueError(f"cannot patch {family}: its layer types mix layouts")
        return cls(module, ropes, takes)

    def tables(self, position_ids: Tensor, layer_type: str | None) -> tuple[Tensor, Tensor]:
        """float32 tables in the family's form and layout (attention factor in): ``(b, n,
        r)`` cos and sin; for the ``"sin_cos"`` form ``(b, n, r/2)`` sin and cos; for
        ``"complex"`` one ``(b, n, r/2)`` complex64 tensor, ``cos + i sin``. Full-width
        tables of the half layout are marked for the C kernel (:func:`~.rotations.prepare`)."""
        key = layer_type if self.takes_layer_type else None
        rope = self.ropes[key]
        if position_ids.dim() == 1:
            position_ids = position_ids[None]
        plain = eager_plain(position_ids)
        full = self.form == "cos_sin" and not self.interleaved  # cat(freqs, freqs)
        rows = gathered(rope, position_ids, self.joints, key, full) if plain else None
        if rows is not None:
            cos, sin = rows
        else:
            with torch.no_grad():
                cos, sin = read(rope, position_ids)
            if full:
                cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        if full:
            if plain:
                prepare(cos, sin)
            return cos, sin
        if self.form == "sin_cos":
            return sin, cos
        if self.form == "complex":
            return torch.complex(cos, sin)
        return cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)  # (interleaved)

    def forward(self, module: nn.Module, x: Tensor, position_ids: Tensor, *args: Any, **kw: Any):
        """The patched rotary module's ``forward(x, position_ids[, layer_type])``."""
        if self.lean and not args and not kw:
            rows = lean(self.ropes[None], position_ids, self.joints.get(None))
            if rows is not None:
                return rows
        layer_type = kw.get("layer_type", args[0] if args else None)
        return self.tables(position_ids, layer_type)

    def probe(
        self,
        family: str,
        theirs: Callable[..., Any],
        ours: Callable[..., Any],
        deinterleaved: bool = False,
    ) -> None:
        """Raise naming ``family`` unless the module's own tables rotated by its own
        ``theirs`` equal posenc's tables rotated by ``ours`` (see the module docstring);
        ``deinterleaved``: ``theirs`` writes the pairs de-interleaved (``(x0, x2, ..., x1,
        x3, ...)``), so ours are compared in that order."""
        device = next(iter(self.module.buffers()), torch.empty(0)).device
        if device.type == "meta":
            raise PosencValueError(f"cannot patch {family}: its rotary module is on 'meta'")
        original = _fresh(self.module)
        start = torch.tensor(_PROBE_POSITIONS, device=device)[:, None]
        positions = start + torch.arange(_PROBE_LENGTH, device=device)  # (b, n)
        generator = torch.Generator().manual_seed(0)
        for layer_type in self.ropes:
            rope = copy.deepcopy(self.ropes[layer_type])
            mine = _Tables(self.module, {layer_type: rope}, True, self.form)
            kwargs = {"layer_type": layer_type} if self.takes_layer_type else {}
            rows = getattr(self.ropes[layer_type], "rows", 0)
            # M-RoPE: rows that differ (a grid's time, height, width), (rows, b, n)
            ids = _grid_positions(positions, rows) if rows else positions
            x = torch.zeros(2, _PROBE_LENGTH, 1, device=device)
            with torch.no_grad():
                their_tables = type(self.module).forward(original, x, ids, **kwargs)
                our_tables = mine.tables(ids, layer_type)
                first = their_tables if isinstance(their_tables, Tensor) else their_tables[0]
                width = first.shape[-1]
                bshd = getattr(ours, "layout", "bhsd") == "bshd"
                got = want = None
                # a few channels past the tables' width, where the family's apply takes them;
                # twice the width where its tables hold one value per pair (GPT-OSS)
                for channels in (width + 6, width, 2 * width + 6, 2 * width):
                    qk = [
                        torch.randn(2, h, _PROBE_LENGTH, channels, generator=generator).to(device)
                        for h in (4, 2)
                    ]
                    qk = [t.transpose(1, 2).contiguous() for t in qk] if bshd else qk
                    try:
                        want = _call(theirs, qk, their_tables)
                    except RuntimeError:
                        continue
                    got = _call(ours, [t.clone() for t in qk], our_tables)
                    if deinterleaved:
                        got = [torch.cat((g[..., 0::2], g[..., 1::2]), -1) for g in got]
                    break
            where = f"{family}" + (f" (layer type {layer_type!r})" if layer_type else "")
            if want is None or got is None:
                raise PosencValueError(
                    f"cannot patch {where}: its {APPLY} takes none of the widths posenc "
                    f"probes ({width} channels and more) with its own tables"
                )
            error = max(
                float((g.float() - w.float()).abs().max() / w.float().abs().max().clamp_min(1e-30))
                for g, w in zip(got, want, strict=True)
            )
            if not error <= PROBE_TOLERANCE:
                raise PosencValueError(
                    f"cannot patch {where}: its own tables and {APPLY} rotate differently "
                    f"from posenc's reading of its config (relative error {error:.1e})"
                )


def _grid_positions(positions: Tensor, rows: int) -> Tensor:
    """``rows`` different position rows ``(rows, b, n)`` from text positions ``(b, n)``: the
    first as given, the others walking a grid of 4 columns at its own offset."""
    step = torch.arange(positions.shape[-1], device=positions.device)
    others = [positions[:, :1] + 3 * r + (step // 4 if r % 2 else step % 4) for r in range(1, rows)]
    return torch.stack([positions, *others])


def _call(rotate: Callable[..., Any], qk: list[Tensor], tables: Any) -> tuple[Tensor, ...]:
    if isinstance(tables, Tensor):  # complex: (xq, xk, freqs_cis)
        return tuple(rotate(qk[0], qk[1], tables))
    cos, sin = tables  # (sin, cos) for the "sin_cos" form: passed on in their order
    if list(inspect.signature(rotate).parameters)[1] == "k":
        return tuple(rotate(qk[0], qk[1], cos, sin))
    return rotate(qk[0], cos, sin), rotate(qk[1], cos, sin)


def _fresh(module: nn.Module) -> nn.Module:
    """A float32 copy of a rotary module to probe (a dynamic type's state must not move): built
    anew from its config where its constructor takes it (a model cast to bfloat16 rounded the
    module's frequencies too), else copied."""
    device = next(iter(module.buffers()), torch.empty(0)).device
    try:
        return type(module)(module.config).to(device)
    except Exception:  # another constructor: the module as it is
        return copy.deepcopy(module).float()


def _read(family: str, config: Any, layer_type: str | None) -> RotaryEmbedding:
    where = family + (f" (layer type {layer_type!r})" if layer_type else "")
    try:
        rope = RotaryEmbedding.from_hf_config(config, layer_type=layer_type)
    except PosencError as error:
        raise PosencValueError(f"cannot patch {where}: {error}") from None
    if isinstance(rope, MultimodalRotaryEmbedding) and rope.split_pairs:
        raise PosencValueError(
            f"cannot patch {where}: its multimodal RoPE layout {rope.mrope_layout!r} turns "
            "the two channels of a pair by different rows' angles, which no table of one "
            "angle per pair holds"
        )
    return rope


def patched_modules(model: nn.Module) -> Iterator[str]:
    """The paths of ``model``'s modules :func:`patch` changed."""
    return (n for n, m in model.named_modules() if _is_patched(m))
