"""SQL of what one planning run plans from: the active targets (subscription × subscriber × source,
streamed), each source's active and withdrawn rules, and the lineage of renamed rules with every
claim resolved.

Separate because these reads are shared: the planning service plans from them, and the checks
that recompute planning (``watch.planned``) and the rename check (``store.health``) read the same
functions, so planning and its checks cannot drift apart. Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import (
    Connection,
    RowMapping,
    select,
)

from deadline_pipeline.rules import RuleRecord, rule_kinds
from deadline_pipeline.store.schema import (
    sources,
    subscribers,
    subscriptions,
)
from deadline_pipeline.store.sources import latest_versions

#: Rows of :func:`active_targets` read from the cursor at a time.
TARGET_PAGE = 1_000


def active_targets(conn: Connection) -> Iterator[RowMapping]:
    """Rows of active subscriptions joined with their active subscriber and source, streamed: read
    a page of :data:`TARGET_PAGE` rows at a time (a server-side cursor on PostgreSQL), once, when
    the caller iterates. Read whole, 20,000 subscriptions' rows lifted a plan's memory by 15 MiB,
    which it kept for the rest of the run."""
    result = conn.execute(
        select(subscriptions.c.name, subscriptions.c.rule_patterns, subscriptions.c.offsets,
               subscriptions.c.channels, subscriptions.c.late_policy, subscriptions.c.kinds,
               subscriptions.c.exclude_kinds, subscribers.c.id.label("subscriber_id"), subscribers.c.external_id,
               subscribers.c.tenant,
               subscribers.c.timezone, subscribers.c.email, subscribers.c.webhook_url, subscribers.c.quiet_hours,
               subscribers.c.caldav_url,
               sources.c.id.label("source_id"), sources.c.name.label("source"))
        .join(subscribers, subscribers.c.id == subscriptions.c.subscriber_id)
        .join(sources, sources.c.id == subscriptions.c.source_id)
        .where(subscriptions.c.active.is_(True), subscribers.c.active.is_(True))
        # Deterministic order: a subscriber's several subscriptions to one source merge the same way
        # on every run, so the merged fingerprint is stable.
        .order_by(subscribers.c.external_id, sources.c.name, subscriptions.c.id)
        .execution_options(yield_per=TARGET_PAGE)
    ).mappings()
    try:
        yield from result
    finally:
        result.close()  # a caller that stops early must not leave the cursor open on the connection


def active_rules(conn: Connection, source_id: int) -> tuple[list[tuple[int, RuleRecord]], dict[str, frozenset[str]]]:
    """The latest active version of each rule of a source (``(version, record)``, by rule id), and
    each withdrawn rule's id → its kinds (:func:`~deadline_pipeline.rules.rule_kinds` of the record it
    last had: a withdrawal keeps that payload), so a subscription's ``kinds`` that only a withdrawn
    rule had are not judged a typo."""
    return _active_of(latest_versions(conn, source_id))


@dataclass(frozen=True)
class SourceRules:
    """What planning reads of one source's rules, all from one read of their latest versions.

    ``active`` and ``withdrawn``: as :func:`active_rules` returns them. ``lineage``: rule id → lineage
    (the id its obligations are keyed on) of the active rules that were renamed, each claim resolved
    (see :func:`claimed_lineage`). ``recorded_lineage``: rule id → the lineage its latest version
    records, active or withdrawn, for every rule that was ever renamed, no claim resolved (what a
    scoped re-plan widens over)."""

    active: list[tuple[int, RuleRecord]]
    withdrawn: dict[str, frozenset[str]]
    lineage: dict[str, str]
    recorded_lineage: dict[str, str]


def source_rules(conn: Connection, source_id: int) -> SourceRules:
    """The :class:`SourceRules` of a source: one query, so the active rules, their lineage and the
    recorded lineage all describe the same versions (three reads could each see another ingest's
    commit under PostgreSQL's READ COMMITTED)."""
    latest = latest_versions(conn, source_id)
    active, withdrawn = _active_of(latest)
    recorded = {rid: v["lineage"] for rid, v in latest.items() if v.get("lineage") and v["lineage"] != rid}
    return SourceRules(active, withdrawn, claimed_lineage(latest), recorded)


def _active_of(latest: dict[str, dict]) -> tuple[list[tuple[int, RuleRecord]], dict[str, frozenset[str]]]:
    rules = [(v["version"], RuleRecord.from_payload(v["payload"])) for v in latest.values() if not v["withdrawn"]]
    withdrawn = {rid: frozenset(rule_kinds(v["payload"] or {})) for rid, v in latest.items() if v["withdrawn"]}
    return sorted(rules, key=lambda r: r[1].rule_id), withdrawn


def claimed_lineage(latest: dict[str, dict]) -> dict[str, str]:
    """rule_id → lineage of the active rules in ``latest`` (:func:`latest_versions` rows) that were
    renamed. Two active rules claiming one lineage (an old id back next to its new one) keep it only
    for the rule that owns the id; the other is keyed on its own id — never two rules on one
    obligation, which would silently drop one of them."""
    claims: dict[str, list[str]] = {}
    for rid, v in latest.items():
        if not v["withdrawn"]:
            claims.setdefault(v.get("lineage") or rid, []).append(rid)
    out: dict[str, str] = {}
    for lineage, rids in claims.items():
        for rid in rids:
            if rid != lineage and (len(rids) == 1 or lineage not in rids):
                out[rid] = lineage
    # Several renamed rules on one lineage without its owner: only the first (by id) keeps it.
    seen: set[str] = set()
    for rid in sorted(out):
        if out[rid] in seen:
            del out[rid]
        else:
            seen.add(out[rid])
    return out
