"""posenc's exact rotation inside a loaded transformers model: :func:`patch`, :func:`unpatch`.

Two kinds of module of the given instance change, and nothing else (not their classes, not
the modeling modules):

* the family's rotary module (``LlamaRotaryEmbedding``, ...): its ``forward`` returns posenc's
  float32 tables, made from float64 angles by ``RotaryEmbedding.from_hf_config(its config)``
  (every rope type posenc reads: YaRN, Llama 3, LongRoPE, dynamic NTK following the length as
  transformers' ``dynamic_rope_update`` does), laid out as the family's own tables
  (``cat(freqs, freqs)``, or each frequency twice for an interleaved family), not cast to the
  model's dtype;
* every attention whose ``forward`` calls its modeling file's ``apply_rotary_pos_emb``: its
  ``forward`` becomes the same code with ``apply_rotary_pos_emb`` read from a copy of the
  modeling module's globals where it is posenc's kernel (C on CPU, Triton on CUDA), rotating
  in the projection's own storage where autograd allows (no grad, or no tensor that needs
  one), in float32 and rounded once to the model's dtype.

Before anything changes, each family is probed: its own tables and ``apply_rotary_pos_emb``
rotate random q, k (positions 100..131 and 0..31, a few channels past the tables' width) and
posenc's must agree (``max|a - b| / max|b| <= 2e-5``). A family posenc cannot read, whose
attention rotates by other code (complex products, M-RoPE, interleaved MLA, inline
``rotate_half``) or whose probe differs is refused with a
:class:`~posenc.errors.PosencValueError` naming the family and why, the model unchanged.

transformers is imported by the calls, never by ``import posenc``.
"""

from __future__ import annotations

import copy
import inspect
import re
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..encodings.rotary.kernels.rotate import apply_rotary, apply_rotary_
from ..encodings.rotary.kernels.rotate import run_plan_pair as rotate_both
from ..encodings.rotary.kernels.select import select
from ..encodings.rotary.multimodal import MultimodalRotaryEmbedding
from ..encodings.rotary.rope import RotaryEmbedding
from ..errors import PosencError, PosencTypeError, PosencValueError

#: The instance attribute that marks a patched module: its ``forward`` before the patch (None
#: where it had none of its own, the class's then being used).
MARK = "_posenc_unpatched_forward"
#: The modeling file's function the patched attentions call.
APPLY = "apply_rotary_pos_emb"
#: Multi-head latent attention's (DeepSeek-V3 family): interleaved pairs, written de-interleaved.
INTERLEAVE = "apply_rotary_pos_emb_interleave"
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
    kernels, one rounding to the model's dtype. Only this instance changes.

    Returns the paths (as ``named_modules`` names them) of the modules changed; ``[]`` when
    ``model`` is already patched. Raises :class:`~posenc.errors.PosencValueError` naming the
    family and the reason where posenc cannot rotate it exactly (the model is then unchanged),
    :class:`~posenc.errors.PosencTypeError` where ``model`` is no ``torch.nn.Module``.
    """
    _check_model(model)
    if any(MARK in m.__dict__ for m in model.modules()):
        return []
    family = _family(model)
    rotaries = [(n, m) for n, m in model.named_modules() if _is_rotary(m)]
    attentions = [(n, m) for n, m in model.named_modules() if _rotation_names(m)]
    if not rotaries:
        raise PosencValueError(
            f"cannot patch {family} ({type(model).__name__}): it has no transformers rotary "
            "module (a class named *RotaryEmbedding)"
        )
    if not attentions:
        raise PosencValueError(
            f"cannot patch {family}: none of its modules' forward calls {APPLY} (its "
            "rotary tables are applied elsewhere)"
        )
    tables = {name: _Tables.of(family, m) for name, m in rotaries}
    layouts = {t.interleaved for t in tables.values()}
    if len(layouts) > 1:
        raise PosencValueError(f"cannot patch {family}: its rotary modules mix layouts")
    interleaved = layouts.pop()
    rotations: dict[tuple[int, str], Callable[..., Any]] = {}  # (globals, name) -> posenc's
    forwards = {}
    for name, module in attentions:
        function = _innermost(type(module).forward)
        used = _check_calls(family, module, _rotation_names(module))
        namespace = function.__globals__
        for called in used:
            if (id(namespace), called) not in rotations:
                rotation = _rotation(family, namespace.get(called), interleaved, called)
                for t in tables.values():
                    t.probe(family, namespace[called], rotation, called == INTERLEAVE)
                rotations[id(namespace), called] = rotation
        replaced = {called: rotations[id(namespace), called] for called in used}
        forwards[name] = _rebound(type(module).forward, function, replaced)
    changed = []
    for name, module in rotaries:
        _replace(module, types.MethodType(tables[name].forward, module))
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
        original = module.__dict__.pop(MARK)
        if original is None:
            del module.forward
        else:
            module.forward = original
        restored.append(name)
    return restored


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
    others = names - {APPLY, INTERLEAVE}
    if others:
        raise PosencValueError(
            f"cannot patch {family}: {type(module).__name__}.forward rotates with "
            f"{', '.join(sorted(others))} (not {APPLY} on whole q and k), which posenc "
            "does not replace"
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


def _replace(module: nn.Module, forward: Any) -> None:
    module.__dict__[MARK] = module.__dict__.get("forward")
    module.forward = forward


def _rebound(
    wrapper: Any, function: types.FunctionType, rotations: dict[str, Callable[..., Any]]
) -> Any:
    """``wrapper`` (a method's function, maybe decorated) rebuilt so that its innermost
    ``function`` reads the rotation functions named in ``rotations`` from a copy of its
    globals holding posenc's; decorators are rebuilt around it (their closures point to the
    new one)."""
    if wrapper is function:
        namespace = dict(function.__globals__, **rotations)
        return _copy_function(function, namespace, function.__closure__)
    inner = wrapper.__wrapped__
    new_inner = _rebound(inner, function, rotations)
    cells = wrapper.__closure__ or ()
    if not any(c.cell_contents is inner for c in cells):
        raise PosencValueError(
            f"cannot patch {function.__qualname__}: its decorator keeps the function where "
            "posenc cannot replace it"
        )
    closure = tuple(
        types.CellType(new_inner if c.cell_contents is inner else c.cell_contents) for c in cells
    )
    new = _copy_function(wrapper, wrapper.__globals__, closure)
    new.__wrapped__ = new_inner
    return new


def _copy_function(
    function: types.FunctionType, namespace: dict[str, Any], closure: Any
) -> types.FunctionType:
    new = types.FunctionType(
        function.__code__, namespace, function.__name__, function.__defaults__, closure
    )
    new.__kwdefaults__ = function.__kwdefaults__
    new.__dict__.update(function.__dict__)
    new.__qualname__ = function.__qualname__
    return new


# --------------------------------------------------------------------------- the rotation


def _rotation(family: str, theirs: Any, interleaved: bool, name: str) -> Callable[..., Any]:
    """posenc's rotation with the signature of the family's function ``name`` (``theirs``):
    ``(q, k, cos, sin[, position_ids], unsqueeze_dim=1) -> (q, k)`` or
    ``(x, cos, sin, unsqueeze_dim=1) -> x``, reading the tables :class:`_Tables` gives. For
    :data:`INTERLEAVE` the pairs turn in place (posenc's reading of such a config is
    interleaved): transformers' channel order differs, q·k does not."""
    if theirs is None:
        raise PosencValueError(f"cannot patch {family}: its modeling module has no {name}")
    names = list(inspect.signature(theirs).parameters)
    if names[2:4] == ["cos", "sin"]:

        def rotate_pair(
            q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
        ) -> tuple[Tensor, Tensor]:
            c, s = _half(cos, unsqueeze_dim, interleaved), _half(sin, unsqueeze_dim, interleaved)
            done = _turn_pair(q, k, c, s, interleaved)
            if done is not None:
                return done
            q = _turn(q, c, s, interleaved, inplace=True)
            return q, _turn(k, c, s, interleaved, inplace=k.data_ptr() != q.data_ptr())

        if "position_ids" not in names:
            return rotate_pair

        def rotate_pair_ids(
            q: Tensor,
            k: Tensor,
            cos: Tensor,
            sin: Tensor,
            position_ids: Any = None,
            unsqueeze_dim: int = 1,
        ) -> tuple[Tensor, Tensor]:
            return rotate_pair(q, k, cos, sin, unsqueeze_dim)

        return rotate_pair_ids
    if names[1:3] == ["cos", "sin"] and len(names) <= 4:

        def rotate_one(x: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1) -> Tensor:
            c, s = _half(cos, unsqueeze_dim, interleaved), _half(sin, unsqueeze_dim, interleaved)
            return _turn(x, c, s, interleaved, inplace=True)

        return rotate_one
    raise PosencValueError(
        f"cannot patch {family}: its {name}{inspect.signature(theirs)} is not "
        "(q, k, cos, sin, ...) or (x, cos, sin, ...)"
    )


def _half(table: Tensor, unsqueeze_dim: int, interleaved: bool) -> Tensor:
    """One value per pair from a full-width table ``(b, n, r)``, as the family's apply would
    broadcast it (``unsqueeze(unsqueeze_dim)``)."""
    half = table[..., 0::2] if interleaved else table[..., : table.shape[-1] // 2]
    return half.unsqueeze(unsqueeze_dim)


def _turn_pair(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool
) -> tuple[Tensor, Tensor] | None:
    """``q`` and ``k`` rotated in place in one kernel call where no autograd runs (a decode
    step above all, where checks and calls cost more than the arithmetic; q and k are fresh
    projections nothing else reads before the rotation); ``None`` where that does not apply."""
    if torch.is_grad_enabled() or k.data_ptr() == q.data_ptr():
        return None
    plan = select(q, (cos, sin), inplace=True, pair=k)
    return rotate_both(q, k, cos, sin, interleaved, True, plan)


def _turn(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, *, inplace: bool) -> Tensor:
    """``x`` rotated in its own storage where autograd and its memory allow, else into a new
    tensor; in the tables' float32, one rounding to ``x``'s dtype."""
    if inplace and not (torch.is_grad_enabled() and x.requires_grad):
        try:
            return apply_rotary_(x, cos, sin, interleaved=interleaved)
        except PosencValueError:
            pass  # an inference tensor, overlapping memory, ...: out of place
    return apply_rotary(x, cos, sin, interleaved=interleaved)


# --------------------------------------------------------------------------- the tables


@dataclass
class _Tables:
    """posenc's rotary embedding(s) standing in for one transformers rotary module."""

    module: nn.Module
    ropes: dict[str | None, RotaryEmbedding]  # layer type (None: the only one) -> posenc's
    takes_layer_type: bool

    @property
    def interleaved(self) -> bool:
        return next(iter(self.ropes.values())).interleaved

    @classmethod
    def of(cls, family: str, module: nn.Module) -> _Tables:
        config = getattr(module, "config", None)
        if config is None:
            raise PosencValueError(
                f"cannot patch {family}: {type(module).__name__} keeps no config to read"
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
        """float32 ``(b, n, r)`` cos and sin in the family's layout (attention factor in)."""
        rope = self.ropes[layer_type if self.takes_layer_type else None]
        device = position_ids.device
        if rope.inv_freq.device != device:
            rope.to(device)
        if position_ids.dim() == 1:
            position_ids = position_ids[None]
        cos, sin = rope.cos_sin(
            position_ids, position_ids.shape[-1], dtype=torch.float32, device=device
        )
        cos, sin = cos[:, 0], sin[:, 0]  # (b, 1, n, r/2) -> (b, n, r/2)
        if self.interleaved:
            return cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
        return torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)

    def forward(self, module: nn.Module, x: Tensor, position_ids: Tensor, *args: Any, **kw: Any):
        """The patched rotary module's ``forward(x, position_ids[, layer_type])``."""
        layer_type = kw.get("layer_type", args[0] if args else None)
        with torch.no_grad():
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
        positions = start + torch.arange(_PROBE_LENGTH, device=device)
        generator = torch.Generator().manual_seed(0)
        for layer_type in self.ropes:
            mine = _Tables(self.module, {layer_type: _copy_rope(self.ropes[layer_type])}, True)
            kwargs = {"layer_type": layer_type} if self.takes_layer_type else {}
            x = torch.zeros(2, _PROBE_LENGTH, 1, device=device)
            with torch.no_grad():
                their_tables = type(self.module).forward(original, x, positions, **kwargs)
                our_tables = mine.tables(positions, layer_type)
                width = their_tables[0].shape[-1]
                got = want = None
                # a few channels past the tables' width, where the family's apply takes them;
                # twice the width where its tables hold one value per pair (GPT-OSS)
                for channels in (width + 6, width, 2 * width + 6, 2 * width):
                    qk = [
                        torch.randn(2, h, _PROBE_LENGTH, channels, generator=generator).to(device)
                        for h in (4, 2)
                    ]
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


def _call(rotate: Callable[..., Any], qk: list[Tensor], tables: Any) -> tuple[Tensor, ...]:
    cos, sin = tables
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


def _copy_rope(rope: RotaryEmbedding) -> RotaryEmbedding:
    return copy.deepcopy(rope)


def _read(family: str, config: Any, layer_type: str | None) -> RotaryEmbedding:
    where = family + (f" (layer type {layer_type!r})" if layer_type else "")
    try:
        rope = RotaryEmbedding.from_hf_config(config, layer_type=layer_type)
    except PosencError as error:
        raise PosencValueError(f"cannot patch {where}: {error}") from None
    if isinstance(rope, MultimodalRotaryEmbedding):
        raise PosencValueError(
            f"cannot patch {where}: multimodal RoPE (M-RoPE: position ids of several rows) "
            "is not patched"
        )
    return rope


def patched_modules(model: nn.Module) -> Iterator[str]:
    """The paths of ``model``'s modules :func:`patch` changed."""
    return (n for n, m in model.named_modules() if MARK in m.__dict__)
