"""The package's layers (README, "How a query is answered"): every import points down, and none
goes round in a circle.

errors → sql → policy → mechanisms → analysis → budget → backends → answer → query → curator →
calls → the top modules (connection, local; the package; demo) → server and shell → cli. Imports
within one layer may point either way, as long as no circle forms (``test_no_import_circles``).
An import under ``if TYPE_CHECKING:`` names a type only and runs nothing, so it may point
anywhere (analysis names the ``Backend`` protocol that way); an import inside a function runs
when the function does, so it counts.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "dpsql"
LAYERS = ("errors", "sql", "policy", "mechanisms", "analysis", "budget", "backends", "answer", "query", "curator",
          "calls", "connection|local", "__init__", "demo", "server|shell", "cli|__main__")
"""Bottom to top, by the first name under ``dpsql`` (``__init__``: the package itself)."""
KNOWN_UPWARD: set[tuple[str, str]] = set()
"""Imports that still point up, each a known debt (none left)."""

DUCKDB_HOME = PACKAGE / "backends" / "duckdb"
"""The one place that talks to DuckDB (STYLE 1: only the engine module talks to it)."""
IMPORTLIB_ALLOWED = {("cli.py", "importlib.metadata")}
"""Where a module may be imported by name at run time, and which: the package's version for
``dpsql --version``. Registries list their members in plain imports (``dpsql.calls.registry``)."""
PRIVATE_READ = re.compile(r"(connection|conn|db|self\._db|view)\._[a-z]")
"""A Connection's private attribute read from outside it: a missing interface (STYLE 16)."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    parts = module.split(".")
    head = parts[1] if len(parts) > 1 else "__init__"
    for index, names in enumerate(LAYERS):
        if head in names.split("|"):
            return index
    raise AssertionError(f"{module} is in no layer: add its name to LAYERS")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _run_time_nodes(tree: ast.Module) -> list[ast.AST]:
    """The nodes of ``tree`` that run, the bodies of ``if TYPE_CHECKING:`` left out (their ``else`` runs)."""
    skipped = {id(node) for block in ast.walk(tree)
               if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
               for statement in block.body for node in ast.walk(statement)}
    return [node for node in ast.walk(tree) if id(node) not in skipped]


def _resolved(name: str) -> str:
    """The module ``name`` is, or holds (``dpsql.x.Thing``: ``dpsql.x``)."""
    known = modules()
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def runtime_imports(path: Path) -> set[str]:
    """The dpsql modules ``path`` imports when it runs (``TYPE_CHECKING`` blocks left out).
    ``from dpsql.x import y`` imports the module ``dpsql.x.y`` when there is one, else ``dpsql.x``."""
    found = set()
    for node in _run_time_nodes(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "dpsql":
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules() else _resolved(node.module))
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            raise AssertionError(f"{path.relative_to(PACKAGE)} imports relatively: write dpsql.…")
        elif isinstance(node, ast.Import):
            found.update(_resolved(alias.name) for alias in node.names if alias.name.split(".")[0] == "dpsql")
    return found


def _imported_names(path: Path) -> set[str]:
    """Every module name ``path`` imports at run time, from any package."""
    found = set()
    for node in _run_time_nodes(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_every_module_has_a_layer():
    for module in modules():
        layer_of(module)


def test_every_import_points_down_the_layers():
    upward = set()
    for module, path in modules().items():
        for imported in runtime_imports(path):
            if layer_of(imported) > layer_of(module):
                upward.add((module, imported))
    assert upward == KNOWN_UPWARD


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one node (Tarjan), sorted.

    >>> strongly_connected({"a": {"b"}, "b": {"a", "c"}, "c": set()})
    [['a', 'b']]
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_import_circles():
    """No module reaches itself through its imports, at any layer (a package's ``__init__`` importing
    its own modules is not a circle: importing a module runs its package first, always)."""
    graph = {module: runtime_imports(path) - {module} for module, path in modules().items()}
    circles = strongly_connected(graph)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(circle) for circle in circles)


def test_only_the_duckdb_backend_imports_duckdb():
    offenders = sorted(str(path.relative_to(PACKAGE)) for path in modules().values()
                       if not path.is_relative_to(DUCKDB_HOME)
                       and any(name.split(".")[0] == "duckdb" for name in _imported_names(path)))
    assert not offenders, f"import duckdb outside dpsql/backends/duckdb/: {offenders}"


def test_no_module_imports_by_name_at_run_time():
    """``importlib`` (and ``__import__``) hide an import from readers and from these tests."""
    offenders = []
    for path in modules().values():
        where = str(path.relative_to(PACKAGE))
        offenders += [(where, name) for name in sorted(_imported_names(path))
                      if name.split(".")[0] == "importlib" and (where, name) not in IMPORTLIB_ALLOWED]
        offenders += [(where, "__import__") for node in _run_time_nodes(_tree(path)) if isinstance(node, ast.Call)
                      and isinstance(node.func, ast.Name) and node.func.id == "__import__"]
    assert not offenders, f"imports by name: {offenders}"


def test_no_module_reads_a_connections_private_attributes():
    offenders = [f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
                 for path in modules().values() if path != PACKAGE / "connection.py"
                 for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if PRIVATE_READ.search(line)]
    assert not offenders, "private attributes read from outside their Connection:\n" + "\n".join(offenders)


def test_analysis_and_below_write_no_engine_specific_sql():
    """The checks and the analysis build trees of plain sqlglot nodes and ``dpsql.sql.pieces``;
    an engine's own functions (DuckDB's TRY, encode, hash($salt), * EXCLUDE) are written by its
    backend alone."""
    engine_words = ('"TRY"', "'TRY'", '"encode"', "'encode'", "$salt", "EXCLUDE (", "exp.Try(")
    for folder in ("sql", "policy", "mechanisms", "analysis", "budget"):
        for path in (PACKAGE / folder).rglob("*.py"):
            if path.name == "pieces.py":
                continue  # the neutral pieces name what they stand for in their docstrings
            code = "\n".join(line for line in path.read_text(encoding="utf-8").splitlines()
                             if not line.lstrip().startswith(("#", ">>>", "...")))
            found = [word for word in engine_words if word in code]
            assert not found, f"{path.relative_to(PACKAGE)} writes {found}"
