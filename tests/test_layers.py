"""Layers point down only: every import inside the ``posenc`` package goes from a module to one
in its own layer or a lower one, and no modules import each other in a circle.

The imports are read from the source with ``ast``: module-level imports and those inside
functions, relative and absolute, and the module names a module hands to
``importlib.import_module``. The layers, lowest first, are data (:data:`LAYERS`); a new module
must be placed in one.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

import posenc

PACKAGE = "posenc"
ROOT = Path(posenc.__file__).parent

#: Lowest first. A module belongs to the entry that names it or a package holding it; the
#: package's own ``__init__`` (its public face, ``posenc``) has its own layer, and every
#: ``__main__`` module (an entry point) sits on top. Modules in one layer may import each
#: other, as long as no circle forms.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("posenc.errors",),
    ("posenc.encodings",),
    ("posenc.sequence",),
    ("posenc.attention",),
    ("posenc.model",),
    ("posenc.hf",),
    ("posenc.analysis", "posenc.probe"),
    ("posenc.plots",),
    ("posenc.notebook",),
    ("posenc.runs",),
    ("posenc.vision",),
    ("posenc",),
    ("posenc.bench", "posenc.extrapolate", "posenc.lengthgen"),
    ("posenc.app",),
    ("__main__",),
)

#: The sanctioned upward calls: the public ``from_hf_config`` constructors of the model and of
#: the rotary module stay where users find them and import :mod:`posenc.hf` inside the call
#: (``module -> imported module``). Every other import points down.
UPWARD_CALLS = frozenset(
    {
        ("posenc.model.encoder", "posenc.hf.schedule"),
        ("posenc.model.transformer", "posenc.hf.schedule"),
        ("posenc.encodings.rotary.rope_build", "posenc.hf.config"),
    }
)

#: Packages of one layer that share only what lies below them: neither imports the other
#: (the two experiments meet in ``posenc.runs``, their training kit).
APART = (("posenc.lengthgen", "posenc.extrapolate"),)

#: Within ``encodings``: the family protocol and its helpers (with ``state``, the per-forward
#: position state, where present) import none of the scheme files.
ENCODINGS_GROUND = frozenset(
    f"posenc.encodings.{name}" for name in ("base", "checks", "registry", "tiles", "state")
)

#: The folders of ``encodings``, lowest first, as :data:`LAYERS` orders the package: the ground
#: (the family protocol and its helpers); the rotation kernels, M-RoPE's layouts, the rope
#: types, the additive tables, the conditional encodings and per-layer schedules, which need
#: only the ground; the bias schemes (Transformer-XL's sinusoids are the additive table); the
#: rotary schemes, which stand on kernels and rope types; and the package itself, whose
#: imports register every scheme.
ENCODINGS_LAYERS: tuple[tuple[str, ...], ...] = (
    tuple(sorted(ENCODINGS_GROUND)),
    (
        "posenc.encodings.rotary.kernels",
        "posenc.encodings.rotary.mrope_layouts",
        "posenc.encodings.rope_types",
        "posenc.encodings.absolute",
        "posenc.encodings.conditional",
        "posenc.encodings.schedule",
    ),
    ("posenc.encodings.bias",),
    ("posenc.encodings.rotary",),
    ("posenc.encodings",),
)

Graph = Mapping[str, Mapping[str, int]]  # module -> imported module -> line of the import


def module_files(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its own name)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _targets(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: Iterable[str]
) -> list[str]:
    """The package modules an import statement loads (``from a import b`` loads ``a.b`` when
    that is a module, ``a`` otherwise)."""
    known = set(known)
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".")
            if not is_package:
                base.pop()
            base = base[: len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        names = []
        for alias in node.names:
            candidate = f"{source}.{alias.name}"
            names.append(candidate if candidate in known else source)
    return [n for n in names if n == PACKAGE or n.startswith(PACKAGE + ".")]


def _dynamic_targets(tree: ast.AST, known: Iterable[str]) -> list[tuple[str, int]]:
    """Module names written as strings in a module that calls ``import_module``/``__import__``."""
    calls_importer = any(
        isinstance(node, (ast.Name, ast.Attribute))
        and (getattr(node, "id", None) or getattr(node, "attr", None))
        in ("import_module", "__import__")
        for node in ast.walk(tree)
    )
    if not calls_importer:
        return []
    known = set(known)
    return [
        (node.value, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known
    ]


def import_graph(modules: Mapping[str, Path]) -> dict[str, dict[str, int]]:
    """``module -> {imported module: line}`` for every import inside the package."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: dict[str, int] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(node, module, _is_package(path), modules):
                    edges.setdefault(target, node.lineno)
        for target, line in _dynamic_targets(tree, modules):
            edges.setdefault(target, line)
        edges.pop(module, None)
        graph[module] = edges
    return graph


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> int:
    """The index of ``module``'s layer; raises for a module no layer names."""
    if module.rsplit(".", 1)[-1] == "__main__":
        return next(i for i, names in enumerate(layers) if "__main__" in names)
    best: tuple[int, int] | None = None  # (length of the matching name, layer)
    for index, names in enumerate(layers):
        for name in names:
            exact = module == name
            inside = name != PACKAGE and module.startswith(name + ".")
            if (exact or inside) and (best is None or len(name) > best[0]):
                best = (len(name), index)
    if best is None:
        raise AssertionError(f"module {module} is in no layer: add it to LAYERS in {__file__}")
    return best[1]


def upward_imports(graph: Graph, layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """Every import from a module to one in a higher layer, as readable lines."""
    found = []
    for module, edges in sorted(graph.items()):
        for target, line in sorted(edges.items()):
            low, high = layer_of(module, layers), layer_of(target, layers)
            if high > low and (module, target) not in UPWARD_CALLS:
                found.append(
                    f"{module} (layer {low}: {', '.join(layers[low])}) imports {target} "
                    f"(layer {high}: {', '.join(layers[high])}) at line {line}"
                )
    return found


def cycles(graph: Graph) -> list[list[str]]:
    """Every circle of imports: for each strongly connected component of more than one
    module, one closed path through it (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    nodes = sorted(set(graph) | {t for edges in graph.values() for t in edges})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, {})))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return [_closed_path(graph, component) for component in components]


def _closed_path(graph: Graph, component: list[str]) -> list[str]:
    """A path ``a -> b -> ... -> a`` inside ``component`` (breadth-first from its first
    module back to itself)."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, {})):
                if child not in members:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no circle through {component}")  # a component always has one


def _describe(graph: Graph, path: list[str]) -> str:
    return (
        " -> ".join(f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(path))
        + f" -> {path[-1]}"
    )


# --------------------------------------------------------------------------- the package


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, int]]:
    return import_graph(module_files())


def test_the_walk_sees_every_module_and_every_kind_of_import(graph: Graph) -> None:
    modules = module_files()
    assert set(graph) == set(modules)
    assert {
        "posenc",
        "posenc.encodings.base",
        "posenc.app.cli",
        "posenc.lengthgen.__main__",
    } <= set(graph)
    # a relative import at module level, one inside a function, and a string import_module
    assert "posenc.encodings.registry" in graph["posenc.encodings.base"]
    assert "posenc.plots.diagnostics" in graph["posenc.notebook"]  # inside a function
    assert (
        "posenc.app.report" in graph["posenc.app.cli"]
    )  # importlib.import_module("posenc.app.report")
    assert "posenc" in graph["posenc.app.report"]  # from . import __version__


def test_every_module_has_a_layer(graph: Graph) -> None:
    for module in graph:
        layer_of(module)


def test_no_module_imports_a_higher_layer(graph: Graph) -> None:
    upward = upward_imports(graph)
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def test_no_import_cycles(graph: Graph) -> None:
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(_describe(graph, c) for c in found)


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def imports_between(graph: Graph, a: str, b: str) -> list[str]:
    """Every import from a module of package ``a`` to one of package ``b``, as lines."""
    return [
        f"{module} imports {target} at line {line}"
        for module, edges in sorted(graph.items())
        if _inside(module, a)
        for target, line in sorted(edges.items())
        if _inside(target, b)
    ]


def test_the_experiments_import_each_other_not(graph: Graph) -> None:
    assert {"posenc.runs.trainer", "posenc.lengthgen.train", "posenc.extrapolate.train"} <= set(
        graph
    )
    for a, b in APART:
        for one, other in ((a, b), (b, a)):
            found = imports_between(graph, one, other)
            assert not found, f"{one} must not import {other}:\n" + "\n".join(found)
    # what both train with comes from the kit below them
    assert "posenc.runs.trainer" in graph["posenc.lengthgen.train"]
    assert "posenc.runs.trainer" in graph["posenc.extrapolate.train"]


def test_encodings_import_nothing_above_them(graph: Graph) -> None:
    allowed = {"posenc.errors"}
    for module, edges in graph.items():
        if module == "posenc.encodings" or module.startswith("posenc.encodings."):
            outside = {
                t
                for t in edges
                if t not in allowed
                and not t.startswith("posenc.encodings")
                and (module, t) not in UPWARD_CALLS
            }
            assert not outside, f"{module} imports {sorted(outside)}"


def test_the_family_protocol_imports_no_scheme(graph: Graph) -> None:
    present = ENCODINGS_GROUND & set(graph)
    assert {f"posenc.encodings.{n}" for n in ("base", "checks", "registry", "tiles")} <= present
    for module in present:
        others = set(graph[module]) - ENCODINGS_GROUND - {"posenc.errors"}
        assert not others, f"{module} imports {sorted(others)}"


def test_the_encodings_folders_point_down(graph: Graph) -> None:
    """Inside ``encodings`` the folders are layers of their own: every module sits in one
    (only the package's ``__init__`` in the top one), and no import points up."""
    inner = {m: edges for m, edges in graph.items() if _inside(m, "posenc.encodings")}
    assert {
        f"posenc.encodings.{n}" for n in ("rotary.kernels.select", "rotary.rope", "schedule")
    } <= (set(inner))
    top = len(ENCODINGS_LAYERS) - 1
    placed = {m: layer_of(m, ENCODINGS_LAYERS) for m in inner}
    assert [m for m, layer in placed.items() if layer == top] == ["posenc.encodings"]
    within = {
        m: {t: line for t, line in edges.items() if _inside(t, "posenc.encodings")}
        for m, edges in inner.items()
    }
    upward = upward_imports(within, ENCODINGS_LAYERS)
    assert not upward, "imports that point up inside encodings:\n" + "\n".join(upward)


# --------------------------------------------------------------------------- the checker


def _fake_package(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    root = tmp_path / PACKAGE
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return module_files(root)


def test_the_checker_finds_an_upward_import_inside_a_function(tmp_path: Path) -> None:
    modules = _fake_package(
        tmp_path,
        {
            "__init__.py": "",
            "errors.py": "",
            "encodings/__init__.py": "",
            "encodings/base.py": "def f():\n    from ..plots import diagnostics\n",
            "plots/__init__.py": "",
            "plots/diagnostics.py": "from ..encodings.base import f\n",
        },
    )
    graph = import_graph(modules)
    upward = upward_imports(graph)
    assert upward == [
        "posenc.encodings.base (layer 1: posenc.encodings) imports posenc.plots.diagnostics "
        "(layer 7: posenc.plots) at line 2"
    ]
    assert cycles(graph) == [
        ["posenc.encodings.base", "posenc.plots.diagnostics", "posenc.encodings.base"]
    ]


def test_the_checker_finds_a_cycle_within_a_layer_and_a_string_import(tmp_path: Path) -> None:
    modules = _fake_package(
        tmp_path,
        {
            "__init__.py": "",
            "bench/__init__.py": "",
            "bench/a.py": "import posenc.bench.b\n",
            "bench/b.py": "from . import c\n",
            "bench/c.py": (
                "import importlib\nM = ('posenc.bench.a',)\nimportlib.import_module(M[0])\n"
            ),
        },
    )
    graph = import_graph(modules)
    assert graph["posenc.bench.c"] == {"posenc.bench.a": 2}
    assert upward_imports(graph) == []
    (cycle,) = cycles(graph)
    assert cycle == ["posenc.bench.a", "posenc.bench.b", "posenc.bench.c", "posenc.bench.a"]


def test_the_checker_finds_an_import_between_packages_kept_apart(tmp_path: Path) -> None:
    modules = _fake_package(
        tmp_path,
        {
            "__init__.py": "",
            "lengthgen/__init__.py": "",
            "lengthgen/a.py": "def f():\n    from ..extrapolate import b\n",
            "extrapolate/__init__.py": "",
            "extrapolate/b.py": "",
        },
    )
    graph = import_graph(modules)
    assert imports_between(graph, "posenc.lengthgen", "posenc.extrapolate") == [
        "posenc.lengthgen.a imports posenc.extrapolate.b at line 2"
    ]
    assert imports_between(graph, "posenc.extrapolate", "posenc.lengthgen") == []


def test_a_module_outside_every_layer_is_named() -> None:
    with pytest.raises(AssertionError, match=r"posenc\.newthing is in no layer"):
        layer_of("posenc.newthing")
    assert layer_of("posenc.lengthgen.__main__") == len(LAYERS) - 1
    assert layer_of("posenc") == LAYERS.index(("posenc",))


def defined_names(tree: ast.Module) -> set[str]:
    """The names a module defines itself: functions, classes and assigned names at its top
    level, those under a top-level ``if``/``try`` included; imported names are not."""
    defined: set[str] = set()
    for node in tree.body:
        inner = ast.walk(node) if isinstance(node, ast.If | ast.Try) else [node]
        for item in inner:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(item.name)
            elif isinstance(item, ast.Assign | ast.AnnAssign):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                names = (n for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
                defined.update(n.id for n in names)  # (a, b = ... defines both)
    return defined


def test_only_posenc_reexports() -> None:
    """A module's ``__all__`` lists only what it defines (``posenc/__init__.py``, the one facade,
    aside): an imported name in it, or a ``*`` import, would make the module a second facade."""
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        listed: list[str] = []
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                assert isinstance(node.value, ast.List | ast.Tuple), path
                listed = [ast.unparse(e).strip("'\"") for e in node.value.elts]
            elif isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                listed.append("*")
        foreign = [name for name in listed if name not in defined_names(tree)]
        assert not foreign, f"{path.relative_to(ROOT)} re-exports {foreign}"


def test_names_are_imported_from_where_they_are_defined() -> None:
    """``from posenc.a import b`` (in the package, its tests, examples and benchmarks) takes a
    ``b`` that ``posenc.a`` defines, or its submodule ``posenc.a.b``: no import goes through a
    module that only imported the name itself, so none of them is a facade by use
    (``posenc`` itself aside)."""
    modules = module_files()
    defined = {name: defined_names(ast.parse(path.read_text())) for name, path in modules.items()}
    repository = ROOT.parents[1]
    sources = [*modules.items()]
    for folder in ("tests", "examples", "benchmarks"):
        sources += [("", path) for path in sorted((repository / folder).rglob("*.py"))]
    through = []
    for module, path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.module == PACKAGE:
                continue
            (source,) = set(_targets(node, module, _is_package(path), ())) or {None}
            if source is None or source == PACKAGE or source not in defined:
                continue
            for alias in node.names:
                if alias.name not in defined[source] and f"{source}.{alias.name}" not in modules:
                    through.append(f"{path.name}:{node.lineno} {source}.{alias.name}")
    assert not through, through
