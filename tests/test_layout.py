"""The package's layers (README, "How a query is answered"): every import points down.

errors → sql → policy → mechanisms → analysis → budget → backends → the top modules
(options, prepare, release, accuracy, bias, suggest, notes, explain, result, connection, ...)
→ server, shell and cli. An import under ``if TYPE_CHECKING:`` names a type only and runs
nothing, so it may point anywhere (analysis names the ``Backend`` protocol that way).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "dpsql"
LAYERS = ["errors", "sql", "policy", "mechanisms", "analysis", "budget", "backends", None, "server|shell|cli|__main__"]
"""Bottom to top; ``None`` is every other top-level module."""
KNOWN_UPWARD = {("dpsql.answer.result", "dpsql.shell.render")}
"""Imports that still point up, each a known debt: DPResult borrows the shell's pure table text."""


def layer_of(module: str) -> int:
    parts = module.split(".")
    head = parts[1] if len(parts) > 1 else ""
    for index, names in enumerate(LAYERS):
        if names is not None and head in names.split("|"):
            return index
    return LAYERS.index(None)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(path: Path) -> set[str]:
    """The dpsql modules ``path`` imports when it runs (``TYPE_CHECKING`` blocks left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
               and "TYPE_CHECKING" in ast.unparse(block.test) for node in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dpsql"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names
                         if (PACKAGE.parent / f"{node.module}.{alias.name}".replace(".", "/")).exists()
                         or (PACKAGE.parent / (f"{node.module}.{alias.name}".replace(".", "/") + ".py")).exists())
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("dpsql"))
    return found


def test_every_import_points_down_the_layers():
    upward = set()
    for path in PACKAGE.rglob("*.py"):
        module = module_name(path)
        for imported in runtime_imports(path):
            if imported != "dpsql" and layer_of(imported) > layer_of(module):
                upward.add((module, imported))
    assert upward == KNOWN_UPWARD


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
