"""The package is layered and imports only downward: every import in tensor_graphs/ goes to
its own layer or one listed before it in LAYERS, so no two layers import each other and the
import graph between layers has no circle. The order is written out in docs/ARCHITECTURE.md
("Layers"), which the last test keeps equal to LAYERS.

Every import counts: at module level or inside a function, ``import a.b``, ``from a import b``
(``b`` a module or a name), relative ``from . import x`` / ``from ..c import y``, and
``__import__("...")`` / ``importlib.import_module("...")`` of a literal name. The parent
packages Python runs first (``tensor_graphs/__init__.py`` before any submodule) are not
counted: the root is the public namespace, which imports everything.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tensor_graphs"
ARCHITECTURE = PACKAGE.parent / "docs" / "ARCHITECTURE.md"

# The layers, lowest first: (name, the modules and packages in it, relative to tensor_graphs;
# "" is tensor_graphs/__init__.py alone). A module may import its own layer and those before it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # knows no graph: the exception tree, how files are trusted and read, error norms, threads,
    # progress bars
    ("base", ("errors", "files", "numerics", "progress", "threads")),
    # nodes, ops and their table, shapes, dtypes, patterns as data, the reference interpreter
    ("ir", ("ir",)),
    # matching, rule tables, canonical form and digests, simplify, recompose, sink, blocks
    ("rewrite", ("rewrite",)),
    # verified implementations per backend, and devices (Device.backends asks the registry)
    ("kernels", ("kernels", "devices")),
    # the SQLite measurements, a call's features and the cost model answering from them
    ("db", ("db",)),
    # options per slot, the search within tolerance, plans, the plan cache and lock files
    ("planner", ("planner",)),
    # measuring the kernel calls a plan's options lack (compile's profile="missing")
    ("profiler", ("profiler",)),
    # liveness of a plan's values and their arena offsets
    ("memory", ("memory",)),
    # programs that run plans: instructions, kept state, weights, the native loop
    ("runtime", ("runtime",)),
    # tg.compile, tg.paths: graph -> plan -> program
    ("compiler", ("compiler",)),
    # whole models as graphs: our layers (tg.nn, tg.generate), PyTorch import, optimizers, training
    ("models", ("nn", "frontend", "optim", "train")),
    # the public namespace tg.*
    ("api", ("",)),
    # the tg command, its subcommands and jobs, and tools run by hand (python -m)
    ("commands", ("cli", "cli_args", "demo", "jobs", "commands", "tools")),
)
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}


def layer_of(module: str) -> str | None:
    """The layer of a dotted module name (``tensor_graphs.db.cost`` -> "db"): the longest
    entry of LAYERS that is the module or a package holding it; None when none is."""
    rel = module.removeprefix("tensor_graphs").removeprefix(".")
    best, length = None, -1
    for name, members in LAYERS:
        for m in members:
            if (rel == m or (m and rel.startswith(m + "."))) and len(m) > length:
                best, length = name, len(m)
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    """Whether ``name`` (dotted, under tensor_graphs) is a module or package of the tree."""
    base = PACKAGE.parent.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module imported) for every import of a tensor_graphs module in ``source``."""
    found = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                found.append((node.lineno, sub if _is_module(sub) else target))
        elif isinstance(node, ast.Call) and node.args \
                and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and (
                    (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                    or (isinstance(node.func, ast.Attribute)
                        and node.func.attr == "import_module")):
            found.append((node.lineno, node.args[0].value))
    return [(line, name) for line, name in dict.fromkeys(found)
            if name == "tensor_graphs" or name.startswith("tensor_graphs.")]


def violations(module: str, source: str, path: str, is_package: bool = False) -> list[str]:
    """One line per import of ``source`` (module ``module``, file ``path``) into a layer above
    the module's own."""
    own = layer_of(module)
    out = []
    for line, target in imports(module, source, is_package):
        theirs = layer_of(target)
        if theirs is not None and own is not None and RANK[theirs] > RANK[own]:
            out.append(f"{path}:{line}: {module} ({own}) imports {target} ({theirs}), a "
                       f"layer above it")
    return out


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, module_name(path)


def test_every_module_has_a_layer():
    lost = [str(path.relative_to(PACKAGE.parent)) for path, name in _sources()
            if layer_of(name) is None]
    assert not lost, f"modules in no layer (add them to LAYERS and docs/ARCHITECTURE.md): {lost}"
    stale = [m for _, members in LAYERS for m in members
             if m and not _is_module(f"tensor_graphs.{m}")]
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


def test_imports_go_down_the_layers():
    found = []
    for path, name in _sources():
        found += violations(name, path.read_text(encoding="utf-8"),
                            str(path.relative_to(PACKAGE.parent)), path.name == "__init__.py")
    order = " <- ".join(name for name, _ in LAYERS)
    assert not found, (f"imports against the layer order ({order}):\n" + "\n".join(found))


@pytest.mark.parametrize("source,line", [
    ("from tensor_graphs.compiler import compile\n", 1),
    ("import numpy as np\n\n\ndef dispatch():\n    from tensor_graphs.compiler import compile\n"
     "    return compile\n", 5),
    ("from ..compiler import compile\n", 1),
    ("from .. import compiler\n", 1),
    ("import tensor_graphs.compiler\n", 1),
    ("x = __import__('tensor_graphs.compiler')\n", 1),
])
def test_an_import_of_the_compiler_in_db_is_refused(source, line):
    """What the check finds, on made-up sources of tensor_graphs/db/cost.py."""
    found = violations("tensor_graphs.db.cost", source, "tensor_graphs/db/cost.py")
    assert found == [f"tensor_graphs/db/cost.py:{line}: tensor_graphs.db.cost (db) imports "
                     "tensor_graphs.compiler (compiler), a layer above it"]


@pytest.mark.parametrize("module,source", [
    ("tensor_graphs.db.cost", "from tensor_graphs.db.features import Features\n"),
    ("tensor_graphs.db.cost", "from . import features\nfrom .store import Database\n"),
    ("tensor_graphs.db", "from .hardware import current\n"),
    ("tensor_graphs.db.cost", "from tensor_graphs.ir.ops import OPS\nimport numpy\n"),
    ("tensor_graphs.cli", "import tensor_graphs as tg\nfrom tensor_graphs import compiler\n"),
])
def test_imports_of_the_same_layer_or_below_pass(module, source):
    assert violations(module, source, "x.py", is_package=module == "tensor_graphs.db") == []


def test_the_root_package_is_the_api_layer():
    """``import tensor_graphs`` from inside a lower layer imports everything: refused."""
    assert layer_of("tensor_graphs") == "api" and layer_of("tensor_graphs.ir.api") == "ir"
    assert violations("tensor_graphs.kernels.loading", "import tensor_graphs as tg\n",
                      "loading.py") == ["loading.py:1: tensor_graphs.kernels.loading (kernels) "
                                        "imports tensor_graphs (api), a layer above it"]


def test_architecture_lists_the_layers_in_order():
    """docs/ARCHITECTURE.md's "Layers" block (highest first, a layer's modules after its name)
    says what LAYERS says."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = re.search(r"^## Layers\n(.*?)^## ", text, re.S | re.M)
    assert section, "docs/ARCHITECTURE.md has no '## Layers' section"
    block = re.search(r"```text\n(.*?)```", section.group(1), re.S)
    assert block, "the Layers section has no ```text block listing the layers"
    written = []
    for row in block.group(1).splitlines():
        words = row.split()
        if words:
            written.append((words[0], tuple(sorted(
                "" if w == "__init__.py" else w.removesuffix("/").removesuffix(".py")
                for w in words[1:] if w.endswith((".py", "/"))))))
    assert written == [(name, tuple(sorted(members))) for name, members in reversed(LAYERS)]
