"""No import cycles between the modules of ``src/neuronmm_compiler``.

The import graph is read from the source with :mod:`ast` (nothing is imported), over every ``.py``
file under the package as it is on disk, so modules added later are covered without listing them.
An edge ``a -> b`` is any ``import``/``from ... import`` statement in ``a`` that reaches ``b``,
wherever it stands: at module level, in a class body, in a ``try`` block, or inside a function (a
lazy import still makes the two modules depend on each other; it only postpones the failure).
Relative imports are resolved against the importing module's package; ``from p import x`` is an
edge to the module ``p.x`` when there is one and to ``p`` otherwise; importing ``a.b.c`` also
runs the ``__init__`` of every package on the way (``a.b``), so those are edges too, except for the
importer's own enclosing packages, which are always initialized before it.

Not counted: imports under ``if TYPE_CHECKING:``, which never run (two classes naming each other in
annotations is not an import cycle), and dynamic imports (``importlib.import_module``).

Module-level and function-level imports alike must be acyclic, without exception.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = ROOT / "src" / "neuronmm_compiler"

#: Cycles through a function-level import, each to be broken by its module's owner (then deleted here).


def _module_names(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under ``package_dir`` (a package's name is
    its directory's; its ``__init__.py`` is the package module)."""
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = (package_dir.name, *path.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, *, module_level_only: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of a module, skipping ``if TYPE_CHECKING:`` bodies (not their ``else``)."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.orelse:
                yield from _imports(ast.Module(body=[stmt], type_ignores=[]), module_level_only=module_level_only)
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif not (module_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))):
            yield from _imports(child, module_level_only=module_level_only)


def _enclosing_packages(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(package_dir: Path, *, module_level_only: bool = False) -> nx.DiGraph:
    """The import graph of the package in ``package_dir`` (see the module docstring for what counts)."""
    modules = _module_names(package_dir)

    def owner(name: str) -> str | None:
        """The module a dotted name lives in (``pkg.mod.func`` -> ``pkg.mod``); None outside the package."""
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for stmt in _imports(tree, module_level_only=module_level_only):
            if isinstance(stmt, ast.Import):
                reached = [owner(alias.name) for alias in stmt.names]
            else:
                base = stmt.module or ""
                if stmt.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - stmt.level + 1] + ([stmt.module] if stmt.module else []))
                reached = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else owner(base)
                           for alias in stmt.names]
            own_packages = set(_enclosing_packages(name))
            for target in filter(None, reached):
                initialized = [p for p in _enclosing_packages(target) if p in modules and p not in own_packages]
                graph.add_edges_from((name, t) for t in [target, *initialized] if t != name)
    return graph


def cycles(graph: nx.DiGraph) -> list[list[str]]:
    """Every elementary cycle, each rotated to start at its smallest module name, sorted."""
    found = []
    for cycle in nx.simple_cycles(graph):
        start = cycle.index(min(cycle))
        found.append(cycle[start:] + cycle[:start])
    return sorted(found, key=lambda c: (len(c), c))


def _describe(found: list[list[str]]) -> str:
    return "\n".join("  " + " -> ".join([*cycle, cycle[0]]) for cycle in found)


def test_the_scan_sees_the_package():
    graph = import_graph(PACKAGE_DIR)
    assert {"neuronmm_compiler", "neuronmm_compiler.cli", "neuronmm_compiler.targets"} <= set(graph)
    assert graph.has_edge("neuronmm_compiler.calibration.target_file", "neuronmm_compiler.targets")
    # a package __init__ runs on the way to its submodules
    assert graph.has_edge("neuronmm_compiler.calibration.target_file", "neuronmm_compiler.cost_model")


def test_no_import_cycles_at_module_level():
    found = cycles(import_graph(PACKAGE_DIR, module_level_only=True))
    assert not found, f"import cycles at module level:\n{_describe(found)}"


def test_no_import_cycles_counting_function_level_imports():
    found = cycles(import_graph(PACKAGE_DIR))
    assert not found, f"import cycles (a function-level import counts as much as any):\n{_describe(found)}"


# ----------------------------------------------------------------------------- the scanner itself


def _write_package(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / "pkg" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


@pytest.mark.parametrize(("files", "expected"), [
    pytest.param({"__init__.py": "", "a.py": "from . import b\n", "b.py": "def f():\n    from .a import g\n"},
                 [["pkg.a", "pkg.b"]], id="function-level relative import"),
    pytest.param({"__init__.py": "", "a.py": "import pkg.sub.c\n", "sub/__init__.py": "from .c import x\n",
                  "sub/c.py": "from ..a import y\n"},
                 [["pkg.a", "pkg.sub.c"], ["pkg.a", "pkg.sub", "pkg.sub.c"]], id="absolute import through a package"),
    pytest.param({"__init__.py": "", "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                  "    from .b import B\n", "b.py": "from .a import A\n"}, [], id="type-checking only"),
    pytest.param({"__init__.py": "from .a import x\n", "a.py": "from . import b\n", "b.py": "x = 1\n"}, [],
                 id="a submodule's own package is not an edge"),
])
def test_the_scanner_finds_cycles(tmp_path, files, expected):
    assert cycles(import_graph(_write_package(tmp_path, files))) == expected


def test_module_level_only_ignores_function_bodies(tmp_path):
    package = _write_package(tmp_path, {"__init__.py": "", "a.py": "from . import b\n",
                                        "b.py": "def f():\n    from . import a\n"})
    assert cycles(import_graph(package, module_level_only=True)) == []
    assert cycles(import_graph(package)) == [["pkg.a", "pkg.b"]]


# -- the layout map of docs/architecture.md: what each package may import ------------------------------------------

ROOT_MODULES = ("targets", "support", "errors", "vocab", "io", "jobs")
COMPILER = ("frontends", "ir", "passes", "lowerings", "schedule", "kernel_ir", "cost_model", "search", "codegen")


def layout_map() -> dict[str, set[str]]:
    """Each top-level unit of the package (a package ``x``, or a root module ``x``) -> the units docs/architecture.md's
    '## Layout' table says it may import, its words expanded: ``root`` the root modules, ``the compiler`` its nine
    packages, ``everything`` every unit, ``(nothing)`` none."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = page.split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)(?:/|\.py)` \| .* \| ([^|]+) \|$", section, flags=re.M)
    units = {name for name, _ in rows}
    allowed: dict[str, set[str]] = {}
    for name, cell in rows:
        words = {w.strip() for w in cell.split(",")}
        out: set[str] = set()
        for word in words:
            if word == "root":
                out |= set(ROOT_MODULES)
            elif word == "the compiler":
                out |= set(COMPILER)
            elif word == "everything":
                out |= units
            elif word != "(nothing)":
                assert word in units, (name, word)
                out.add(word)
        allowed[name] = out
    return allowed


def _unit(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the package's own __init__ (its version)


def _outside_the_map(edges, allowed: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The (importer, imported) unit pairs of ``edges`` (module -> module) that the map does not allow."""
    return sorted({(_unit(a), _unit(b)) for a, b in edges
                   if _unit(a) and _unit(b) and _unit(a) != _unit(b) and _unit(b) not in allowed[_unit(a)]})


def test_every_import_stays_inside_the_layout_map():
    allowed = layout_map()
    assert set(allowed) >= set(ROOT_MODULES) | set(COMPILER) | {"driver", "cli", "export", "compression"}
    outside = _outside_the_map(import_graph(PACKAGE_DIR).edges(), allowed)
    assert not outside, f"imports the layout map does not allow (fix the code or the map): {outside}"


def test_the_layout_map_check_sees_a_forbidden_import():
    edges = [("neuronmm_compiler.ir.graph", "neuronmm_compiler.driver"),
             ("neuronmm_compiler.checkpoints.config", "neuronmm_compiler.compression.svd"),
             ("neuronmm_compiler.cli.compile", "neuronmm_compiler.driver"),
             ("neuronmm_compiler.ir.graph", "neuronmm_compiler")]
    assert _outside_the_map(edges, layout_map()) == [("checkpoints", "compression"), ("ir", "driver")]
