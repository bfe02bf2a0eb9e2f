"""The alert and obligation states (deadline_pipeline.states): the enums hold exactly the states the
store and its migrations use, the named sets mean what their docstrings say, the members print and
compare as the stored strings, and no other module defines a set of states of its own (two copies
of "open" with different members is how the states drifted before)."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

from sqlalchemy import CheckConstraint
from sqlalchemy.dialects import postgresql, sqlite

import deadline_pipeline
from deadline_pipeline import states
from deadline_pipeline.states import (
    CLAIMABLE,
    HANDLED,
    OPEN,
    PLANNED,
    RETRYABLE,
    REVISABLE,
    AlertState,
    ObligationState,
)
from deadline_pipeline.store import schema

PACKAGE = Path(deadline_pipeline.__file__).resolve().parent
MIGRATIONS = PACKAGE / "store" / "migrations" / "versions"
ALERT_VALUES = {s.value for s in AlertState}
OBLIGATION_VALUES = {s.value for s in ObligationState}


def _column_comment(table: str, column: str) -> set[str]:
    """The ``a | b | c`` states written in schema.py's comment on (or just above) ``table.column``."""
    text = Path(schema.__file__).read_text()
    block = text[text.index(f'"{table}",'):]
    line_no = next(i for i, line in enumerate(block.splitlines()) if line.strip().startswith(f'Column("{column}"'))
    lines = block.splitlines()
    for candidate in (lines[line_no], lines[line_no - 1], lines[line_no - 2]):
        found = re.search(r"#\s*(\w+(?:\s*\|\s*\w+)+)", candidate)
        if found:
            return {w.strip() for w in found.group(1).split("|")}
    raise AssertionError(f"no state comment on {table}.{column} in schema.py")


def test_enums_hold_the_states_the_schema_documents():
    assert ALERT_VALUES == _column_comment("alerts", "status")
    assert OBLIGATION_VALUES == _column_comment("obligations", "status")
    # The defaults a row gets without a status.
    assert schema.alerts.c.status.default.arg == AlertState.PENDING
    assert schema.obligations.c.status.default.arg == ObligationState.ACTIVE


def test_every_check_on_a_status_allows_exactly_the_enum():
    """A CHECK on a status column (none today: the column is a plain string) must allow exactly the
    enum's values, so a state added to one and not the other fails here."""
    for table, values in ((schema.alerts, ALERT_VALUES), (schema.obligations, OBLIGATION_VALUES)):
        for constraint in table.constraints:
            if isinstance(constraint, CheckConstraint) and "status" in str(constraint.sqltext):
                assert set(re.findall(r"'(\w+)'", str(constraint.sqltext))) == values, constraint.name


def _migration(name: str):
    path = next(MIGRATIONS.glob(f"{name}_*.py"))
    spec = importlib.util.spec_from_file_location(f"_migration_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_migrations_name_only_known_states():
    """Every state a migration writes into SQL (``status = '…'``, ``status IN ('…', …)``, the
    ``:closed`` list of 0006) is an alert state: the migrations keep the stored values, and the enum
    must know each of them."""
    found: set[str] = set()
    for path in sorted(MIGRATIONS.glob("[0-9]*.py")):
        text = path.read_text()
        for sql in re.findall(r"status\s*(?:=\s*'\w+'|IN\s*\([^)]*\))", text, flags=re.IGNORECASE):
            found |= set(re.findall(r"'(\w+)'", sql))
    found |= set(_migration("0006").CLOSED)
    assert found, "the migrations' state literals were not found: the pattern above is out of date"
    assert found <= ALERT_VALUES, found - ALERT_VALUES


def test_claim_index_predicate_is_the_migrations():
    """The model's claim index renders exactly the predicate migration 0012 created (same states,
    same order), so the store and a fresh schema agree on which rows the index holds."""
    created = str(_migration("0012")._CLAIMABLE.text)
    assert created == "status IN ('pending', 'retry_wait', 'claimed')"
    (index,) = [ix for ix in schema.alerts.indexes if ix.name == "ix_alerts_claimable_send_at_id"]
    for dialect in (postgresql.dialect(), sqlite.dialect()):
        where = index.dialect_options[dialect.name]["where"]
        rendered = str(where.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
        assert rendered == "alerts." + created
    assert str(_migration("0013")._ESCALATED.text) == f"status = '{AlertState.ESCALATED}'"


def test_sets_partition_and_nest_as_documented():
    everything = set(AlertState)
    for named in (OPEN, CLAIMABLE, HANDLED, REVISABLE, PLANNED, RETRYABLE):
        assert isinstance(named, tuple) and len(set(named)) == len(named)
        assert set(named) <= everything
    # Open and handled split the states: an alert is either still owed a send or not.
    assert set(OPEN) | set(HANDLED) == everything and not set(OPEN) & set(HANDLED)
    # Every open alert is the claim's to take (a claimed one once its lease expires).
    assert set(CLAIMABLE) == set(OPEN)
    assert CLAIMABLE == (AlertState.PENDING, AlertState.RETRY_WAIT, AlertState.CLAIMED)
    # Revisable: nothing delivered, no sender holding it.
    assert AlertState.DELIVERED not in REVISABLE and AlertState.CLAIMED not in REVISABLE
    assert set(PLANNED) <= set(REVISABLE)
    # Queued again by hand: never a delivered alert, never one planned for an abandoned instant.
    assert set(RETRYABLE) <= set(HANDLED)
    assert AlertState.DELIVERED not in RETRYABLE and AlertState.SUPERSEDED not in RETRYABLE


def test_members_are_the_stored_strings():
    """Output and SQL stay exactly those of the plain strings."""
    for state in (*AlertState, *ObligationState):
        plain = state.value
        assert state == plain and hash(state) == hash(plain) and plain in {state}
        # %-formatting too: the logging calls format their arguments that way.
        assert str(state) == f"{state}" == "%s" % state == format(state, "") == plain  # noqa: UP031
        assert f"{state:<12}" == f"{plain:<12}"
        assert json.dumps({"status": state, state: 1}) == json.dumps({"status": plain, plain: 1})
    column = schema.alerts.c.status
    for dialect in (postgresql.dialect(), sqlite.dialect()):
        def sql(expr, dialect=dialect):
            return str(expr.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
        assert sql(column.in_(OPEN)) == sql(column.in_(["pending", "retry_wait", "claimed"]))
        assert sql(column == AlertState.DELIVERED) == sql(column == "delivered")


# Where a set of states may be written down: states.py, and the migrations, which are frozen history
# (a migration must keep the values it wrote then, not import today's code).
_ALLOWED = {PACKAGE / "states.py"}
_STATE_WORDS = ALERT_VALUES | OBLIGATION_VALUES
_ENUM_NAMES = {"AlertState", "ObligationState"}


def _state_collections(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, source)`` of each tuple, list or set display that lists two or more states (as
    strings or as enum members), and of each module-level name ending in ``_STATES``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            words = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in _STATE_WORDS]
            members = [e for e in node.elts if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name)
                       and e.value.id in _ENUM_NAMES]
            if len(words) >= 2 or len(members) >= 2:
                out.append((node.lineno, ast.unparse(node)))
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and t.id.endswith("_STATES"):
                    out.append((node.lineno, t.id))
    return sorted(out)


def test_the_detector_finds_the_old_copies():
    """The check below would have caught what drifted, and leaves other strings that happen to be
    state names alone."""
    found = _state_collections(ast.parse(
        'OPEN_STATES = ("pending", "claimed", "retry_wait")\n'
        'x = st in ["pending", "retry_wait", "skipped"]\n'
        'y = s in {AlertState.PENDING, AlertState.SKIPPED}\n'
        'HANDLED_STATES = HANDLED\n'
        'ok = parse_status in ("failed", "pending")\n'
        'ok = {"claimed": 1, "escalated": 2}\n'))
    assert [line for line, _ in found] == [1, 1, 2, 3, 4]


def test_no_module_outside_states_defines_a_set_of_states():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in _ALLOWED or MIGRATIONS in path.parents:
            continue
        for line, text in _state_collections(ast.parse(path.read_text(), filename=str(path))):
            offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {text}")
    assert not offenders, ("state sets belong in deadline_pipeline/states.py (name the set there and import it):\n"
                           + "\n".join(offenders))


def test_states_is_a_leaf_module():
    """Importable by the store and every stage without a cycle: it imports nothing of the package."""
    tree = ast.parse(Path(states.__file__).read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + [
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and m.startswith("deadline_pipeline")]
