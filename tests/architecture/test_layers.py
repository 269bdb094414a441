"""The import graph of ``relaxweb/``: which package may import which, with no cycles, and
every import of a relaxweb module at the top of its module.

Each module belongs to a layer (its package under ``relaxweb/``, or its own name for the
top-level modules); :data:`MAY_IMPORT` lists, for each layer, the other layers it may
import.  A module may always import modules of its own layer.  The table reads bottom-up:
the IR knows nothing of ops, passes or backends; backends render the IR; the compile driver
and the bundle writer are separate; the Python runtime reads bundles, not the compiler.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "relaxweb"

MAY_IMPORT: dict[str, set[str]] = {
    "errors": set(),
    "ir": {"errors"},
    "library": {"ir", "errors"},  # library kernels as what they compute: buffers, dispatch, numpy references
    "ops": {"library", "ir", "errors"},  # registers ops: deduction, legalization, semantics
    "frontend": {"ops", "ir", "errors"},
    "passes": {"ops", "ir", "errors"},
    "wgsl": {"library", "ir", "errors"},  # library/: the facts of the library kernels it renders
    "wasm": {"ir", "errors"},
    "cpu": {"library", "ir", "errors"},  # the WebAssembly SIMD backend of every kernel (kernels.wasm)
    "bundle": {"wgsl", "wasm", "cpu", "ir", "errors"},  # compiled module -> dist/
    "tokenizer": {"errors"},  # the tokenizer a bundle carries: checked by the build, used by the runtimes
    "compiler": {"bundle", "frontend", "passes", "ops", "ir", "errors", "tokenizer"},  # model -> compiled module (-> dist/)
    "runtime": {"errors", "tokenizer"},
    "browser": {"runtime", "errors"},
    # relaxweb/__init__.py and api.py: the command line's commands as functions, so frontend
    # (``relaxweb.inspect(MODEL)``: op coverage, the imported IR), passes (the opt levels) and
    # browser (``relaxweb.run_in_browser``) as the command line has them.
    "api": {"compiler", "bundle", "runtime", "browser", "frontend", "passes", "ir", "errors", "tokenizer"},
    "cli": {"api", "compiler", "bundle", "runtime", "browser", "frontend", "passes", "ops", "ir", "errors", "tokenizer"},
}

SUBPACKAGE_LAYERS = {"ir", "library", "ops", "frontend", "passes", "wgsl", "wasm", "cpu", "runtime"}
MODULE_LAYERS = {"errors": "errors", "tokenizer": "tokenizer", "bundle": "bundle", "compiler": "compiler", "browser": "browser",
                 "api": "api", "cli": "cli", "__main__": "cli"}


@dataclass(frozen=True)
class Import:
    source: Path  # the importing file
    line: int
    module: str  # the imported module, absolute (``relaxweb.ir.expr``)
    top_level: bool  # a statement of the module's body (not in a function, class, if, try ...)
    names: tuple[str, ...] = ()  # the names ``from module import ...`` takes from it


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    assert parts[0] == "relaxweb", module
    if len(parts) == 1:
        return "api"
    if parts[1] in SUBPACKAGE_LAYERS:
        return parts[1]
    if parts[1] in MODULE_LAYERS:
        return MODULE_LAYERS[parts[1]]
    raise AssertionError(f"{module}: no layer; add it to tests/architecture/test_layers.py")


def is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def relaxweb_imports(path: Path, text: str | None = None) -> list[Import]:
    """Every import of a relaxweb module in the file (or in ``text`` as if it were the file's),
    relative ones resolved."""
    tree = ast.parse(path.read_text() if text is None else text, str(path))
    top_level = {id(statement) for statement in tree.body}
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            # ``from package import name``: the submodule when ``name`` is one, else the package
            targets = [f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base for a in node.names]
            names = tuple(a.name for a in node.names if not is_module(f"{base}.{a.name}"))
        else:
            continue
        for target in dict.fromkeys(targets):
            if target == "relaxweb" or target.startswith("relaxweb."):
                taken = names if isinstance(node, ast.ImportFrom) and target == base else ()
                found.append(Import(path, node.lineno, target, id(node) in top_level, taken))
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))
IMPORTS = [item for path in SOURCES for item in relaxweb_imports(path)]


def where(item: Import) -> str:
    return f"{item.source.relative_to(PACKAGE.parent)}:{item.line}"


def test_every_module_has_a_layer_of_the_table() -> None:
    assert SOURCES and IMPORTS
    assert set(MAY_IMPORT) == set(SUBPACKAGE_LAYERS) | set(MODULE_LAYERS.values()) | {"api"}
    for path in SOURCES:
        assert layer_of(module_name(path)) in MAY_IMPORT


def test_imports_follow_the_layers() -> None:
    wrong = []
    for item in IMPORTS:
        source, target = layer_of(module_name(item.source)), layer_of(item.module)
        if source != target and target not in MAY_IMPORT[source]:
            wrong.append(f"{where(item)}: {source} -> {target} (imports {item.module}); "
                         f"{source} may import {', '.join(sorted(MAY_IMPORT[source])) or 'nothing'}")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_the_layers_have_no_cycle() -> None:
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(layer: str, path: list[str]) -> None:
        if state.get(layer) == "done":
            return
        assert state.get(layer) != "visiting", f"the layers import each other: {' -> '.join([*path, layer])}"
        state[layer] = "visiting"
        for dependency in sorted(MAY_IMPORT[layer]):
            visit(dependency, [*path, layer])
        state[layer] = "done"
        order.append(layer)

    for layer in MAY_IMPORT:
        visit(layer, [])
    assert order.index("errors") < order.index("ir") < order.index("ops") < order.index("passes")


def test_the_backends_read_the_library_only_in_their_library_renderers() -> None:
    """``library/`` says what a library kernel computes and imports no backend; a backend
    renders it from ``wgsl/library/`` or ``cpu/library/`` (the builders' renderers), nowhere else."""
    renderers = {"wgsl": "relaxweb.wgsl.library", "cpu": "relaxweb.cpu.library"}
    stray = [f"{where(item)}: imports {item.module}" for item in IMPORTS
             if layer_of(item.module) == "library" and layer_of(module_name(item.source)) in renderers
             and not module_name(item.source).startswith(renderers[layer_of(module_name(item.source))])]
    assert not stray, "backend modules outside their library renderers import relaxweb.library:\n" + "\n".join(stray)


def test_relaxweb_modules_are_imported_at_the_top_level_only() -> None:
    """No import of a relaxweb module in a function, a class, an ``if TYPE_CHECKING:`` or a
    ``try`` block: a dependency is declared once, at the top, where the layering sees it."""
    nested = [f"{where(item)}: imports {item.module}" for item in IMPORTS if not item.top_level]
    assert not nested, "relaxweb imports below the top level:\n" + "\n".join(nested)


def test_no_module_imports_private_names_of_another() -> None:
    """A name with a leading underscore is private to its module: code in another file uses
    the public interface (the WGSL schedules drive ``Emitter``, not ``_Emitter``)."""
    private = [f"{where(item)}: imports {name} from {item.module}" for item in IMPORTS for name in item.names
               if name.startswith("_") and not (name.startswith("__") and name.endswith("__"))]
    assert not private, "imports of private names:\n" + "\n".join(private)


def test_modules_do_not_import_each_other() -> None:
    """No cycle between two relaxweb modules either (each would need the other half-imported)."""
    edges: dict[str, set[str]] = {}
    for item in IMPORTS:
        edges.setdefault(module_name(item.source), set()).add(item.module)
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in done:
            return
        assert module not in path, f"modules import each other: {' -> '.join([*path[path.index(module):], module])}"
        for dependency in sorted(edges.get(module, ())):
            visit(dependency, [*path, module])
        done.add(module)

    for module in sorted(edges):
        visit(module, [])


@pytest.mark.parametrize(("file", "text", "expected"), [
    ("wgsl/shader.py", "from ..ir.expr import Var", "relaxweb.ir.expr"),
    ("wgsl/shader.py", "from . import emit", "relaxweb.wgsl.emit"),
    ("wgsl/shader.py", "from .emit import Emitter", "relaxweb.wgsl.emit"),
    ("wgsl/__init__.py", "from .shader import emit_wgsl", "relaxweb.wgsl.shader"),
    ("frontend/converters/node.py", "from ...ops import call_op", "relaxweb.ops"),
    ("cli.py", "from . import __version__", "relaxweb"),
    ("cli.py", "import relaxweb.errors", "relaxweb.errors"),
])
def test_the_checker_resolves_relative_imports(file: str, text: str, expected: str) -> None:
    (item,) = relaxweb_imports(PACKAGE / file, text)
    assert (item.module, item.top_level, item.line) == (expected, True, 1)


@pytest.mark.parametrize("text", [
    "def f():\n    from .emit import Emitter\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .emit import Emitter\n",
    "try:\n    from .emit import Emitter\nexcept ImportError:\n    pass\n",
    "class C:\n    import relaxweb.errors\n",
])
def test_the_checker_finds_nested_imports(text: str) -> None:
    (item,) = relaxweb_imports(PACKAGE / "wgsl" / "shader.py", text)
    assert not item.top_level


def test_the_checker_sees_the_names_taken() -> None:
    (item,) = relaxweb_imports(PACKAGE / "wgsl" / "schedules.py", "from .emit import Emitter, _literal")
    assert item.names == ("Emitter", "_literal")
    (submodule, package) = relaxweb_imports(PACKAGE / "wgsl" / "schedules.py", "from . import emit, ShaderInfo")
    assert (submodule.module, submodule.names) == ("relaxweb.wgsl.emit", ())
    assert (package.module, package.names) == ("relaxweb.wgsl", ("ShaderInfo",))
