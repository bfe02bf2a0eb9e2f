"""SQL of the rule versions a revision re-plan follows: the newest ``rule_versions`` id, the versions
stored between two ids, and the due instants of the stored obligations of the sources they touch.

Separate because a revision re-plan reads these to decide its scope (which rules, which months)
before any planning transaction begins; nothing here reads or writes a plan's staging tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import (
    Connection,
    func,
    select,
)

from deadline_pipeline.store.schema import (
    obligations,
    rule_versions,
)


def max_rule_version_id(conn: Connection) -> int:
    """The highest ``rule_versions.id`` so far (0 when there is none): a version stored later has a
    higher id, so it marks where "new" versions begin."""
    return conn.execute(select(func.coalesce(func.max(rule_versions.c.id), 0))).scalar_one()


def rule_versions_between(conn: Connection, since_id: int, until_id: int | None = None) -> list:
    """The rule versions with ``since_id < id <= until_id`` (no upper bound when ``until_id`` is
    None), in no set order, as rows of ``(source_id, rule_id, withdrawn, payload)``; ``payload`` is
    the rule record as stored (dict)."""
    return conn.execute(
        select(rule_versions.c.source_id, rule_versions.c.rule_id, rule_versions.c.withdrawn,
               rule_versions.c.payload).where(
            rule_versions.c.id > since_id,
            *([rule_versions.c.id <= until_id] if until_id is not None else []))
    ).all()


def obligation_dues(conn: Connection, source_ids: Iterable[int], lo: datetime, hi: datetime) -> list:
    """``(source_id, rule_id, due_at)`` of every obligation of ``source_ids``, whatever its status,
    due in ``[lo, hi]`` (aware UTC), in no set order."""
    return conn.execute(
        select(obligations.c.source_id, obligations.c.rule_id, obligations.c.due_at).where(
            obligations.c.source_id.in_(source_ids), obligations.c.due_at >= lo, obligations.c.due_at <= hi)
    ).all()
