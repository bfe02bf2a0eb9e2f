"""Every SQL statement lives in ``deadline_pipeline/store/`` (migrations included), one named function
per statement: no module outside it imports the schema's tables, builds a statement or runs one.
The stages and the commands call the store's functions, so each query is read, reviewed and
changed in one place."""

from __future__ import annotations

import ast
from pathlib import Path

import deadline_pipeline

PACKAGE = Path(deadline_pipeline.__file__).parent
STORE = PACKAGE / "store"

# Calls that run SQL on a connection or an engine. ``scalar`` / ``scalars`` only with an argument:
# ``Connection.scalar(statement)`` runs one, ``Result.scalar()`` only reads a result.
_RUNS = {"execute", "exec_driver_sql"}
_RUNS_WITH_ARGUMENT = {"scalar", "scalars"}
# What builds a statement; the rest of SQLAlchemy (Engine, Connection, errors, URLs, inspect) is
# wiring the stages may use.
_BUILDERS = {"select", "insert", "update", "delete", "text", "func", "exists", "and_", "or_", "not_",
             "literal", "literal_column", "case", "cast", "union", "union_all", "table", "column", "Table"}
_SCHEMA = "deadline_pipeline.store.schema"


def _sql_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each import of the schema or of a statement builder, and each call that runs
    SQL, in a parsed module."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, f"import {a.name}") for a in node.names
                    if a.name == _SCHEMA or a.name.startswith(("sqlalchemy.sql", "sqlalchemy.dialects"))]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = {a.name for a in node.names}
            if (node.module == _SCHEMA or (node.module == "deadline_pipeline.store" and "schema" in names)
                    or node.module.startswith(("sqlalchemy.sql", "sqlalchemy.dialects"))
                    or (node.module == "sqlalchemy" and names & _BUILDERS)):
                out.append((node.lineno, f"from {node.module} import {', '.join(sorted(names))}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            if attr in _RUNS or (attr in _RUNS_WITH_ARGUMENT and (node.args or node.keywords)):
                out.append((node.lineno, ast.unparse(node)[:120]))
    return sorted(out)


def test_the_detector_finds_sql_outside_the_store():
    """The check below would have caught each form that stood outside the store, and leaves alone
    what only looks like it (a Dagster job's ``execute_in_process``, a dict's ``update``)."""
    found = _sql_uses(ast.parse(
        "from deadline_pipeline.store.schema import alerts\n"
        "from sqlalchemy import Engine, func, select\n"
        "n = conn.execute(select(func.count()).select_from(alerts)).scalar_one()\n"
        "conn.exec_driver_sql('ANALYZE')\n"
        "first = conn.scalar(stmt)\n"
        "from deadline_pipeline.store import schema\n"
        "import deadline_pipeline.store.schema\n"
        "from sqlalchemy.dialects.postgresql import insert\n"
        "from sqlalchemy import Engine, inspect\n"
        "from deadline_pipeline.store.health import read_heartbeats\n"
        "job.execute_in_process(run_config={})\n"
        "meta.update(rules=1)\n"
        "value = result.scalar()\n"))
    assert [line for line, _ in found] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_no_module_outside_the_store_reads_or_writes_sql():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if STORE in path.parents:
            continue
        for line, what in _sql_uses(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {what}")
    assert not offenders, ("SQL belongs in deadline_pipeline/store/ (a named function in the stage's module, "
                           "store/operations.py for the commands), called from here:\n" + "\n".join(offenders))
