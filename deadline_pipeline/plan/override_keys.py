"""Which rules plan an occurrence a RECURRENCE-ID override (RFC 5545 §3.8.4.4) replaced, and the
re-keying of override obligations stored under the identity overrides had before.

An override is keyed as the occurrence of its master it replaces (the master's UID and that
occurrence's period: :func:`~deadline_pipeline.plan.planner.occurrence_identity`). Before, it was keyed
on its own rule id (``UID#<RECURRENCE-ID>``) and the period ``once``. A store planned then holds an
active obligation of each override under that key, often beside the master's occurrence, withdrawn,
under the new one. Planned under the new key without more, the override's obligation was new (its
past reminders folded and the latest sent again) and the stored one was withdrawn with a cancellation
notice where a reminder had been delivered: "Cancelled" for a deadline that stands. Re-keyed in place
before planning compares, it is the same obligation with its alerts, and nothing is sent.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from deadline_pipeline.plan.keys import retired_key
from deadline_pipeline.plan.planner import PlannedObligation, Target, plan_obligations
from deadline_pipeline.plan.recurrence import REPLACES
from deadline_pipeline.plan.scope import series_of
from deadline_pipeline.store import unplanned

if TYPE_CHECKING:
    from deadline_pipeline.plan.outcome import PlanOutcome

log = logging.getLogger(__name__)


def replanned(target: Target, match: list[tuple], lo: datetime, horizon_end: datetime,
              lineage: dict[str, str] | None) -> list[PlannedObligation]:
    """The obligations (no alert rows) ``target`` has of the rules ``match`` (``(version, record)``
    pairs) due from ten years before ``lo`` through ``horizon_end`` (aware UTC); ``[]`` for none.
    ``lineage``: rule id → the id obligations are keyed on."""
    if not match:
        return []
    long_ago = timedelta(days=3660)
    obs, _problems = plan_obligations(target, match, lo - long_ago, long_ago + (horizon_end - lo),
                                      before=horizon_end + timedelta(microseconds=1), lineage=lineage)
    return obs


def series_claimants(r, rules: list[tuple]) -> list[tuple]:
    """The ``(version, record)`` pairs of ``rules`` that plan the occurrences of the series of stored
    obligation ``r`` (its ``rule_id``: the master's, or an override's) that overrides replaced: the
    series' overrides that replace an occurrence (``extra[REPLACES]``) with their master (whose
    occurrences decide the form of the key); empty when the series has no such override."""
    series = series_of(r.rule_id)
    overrides = [(v, rule) for v, rule in rules if REPLACES in rule.extra and series_of(rule.rule_id) == series]
    if not overrides:
        return []
    return [(v, rule) for v, rule in rules if rule.rule_id == series] + overrides


def rekey_legacy_overrides(conn, targets: list[Target], rules_cache: dict, lineage: dict[int, dict[str, str]],
                           lo: datetime, horizon_end: datetime, out: PlanOutcome) -> None:
    """Re-key each active obligation of an override in force stored under the override's own id and
    the period ``once`` (the module docstring) to the key planning now gives it, before planning
    compares. The obligation keeps its id, alerts and due instant; a withdrawn obligation holding the
    new key (the master's occurrence the override replaced) is given a retired key
    (:func:`~deadline_pipeline.plan.keys.retired_key`) and keeps its history. Counted in
    ``out.obligations_rekeyed`` and logged; one whose new key an active obligation holds is left to
    planning (logged). ``rules_cache``: source id → (``(version, record)`` pairs in force, withdrawn
    ids); ``lineage``: source id → rule id → the id obligations are keyed on; ``lo``,
    ``horizon_end``: the run's window start and the planning horizon's end (aware UTC)."""
    overrides = {sid: sorted(rule.rule_id for _, rule in rules if REPLACES in rule.extra)
                 for sid, (rules, _withdrawn) in rules_cache.items()}
    legacy = unplanned.override_obligations_keyed_once(conn, {sid: ids for sid, ids in overrides.items() if ids})
    if not legacy:
        return
    subscribed = {(t.subscriber_id, t.source_id): t for t in targets}
    plans: dict[tuple, dict[str, PlannedObligation]] = {}
    for r in legacy:
        target = subscribed.get((r.subscriber_id, r.source_id))
        if target is None:
            continue
        memo = (r.subscriber_id, r.source_id, series_of(r.rule_id))
        if memo not in plans:
            obs = replanned(target, series_claimants(r, rules_cache[r.source_id][0]), lo, horizon_end,
                            lineage.get(r.source_id))
            plans[memo] = {o.rule_id: o for o in obs}
        ob = plans[memo].get(r.rule_id)
        if ob is None or ob.key == r.obligation_key:
            continue
        if unplanned.rekey_obligation(conn, r.id, ob.key, ob.period, retired_key(ob.key, r.id)):
            out.obligations_rekeyed += 1
        else:
            log.warning("planning: obligation %s of override %s not re-keyed: an active obligation holds its key %s",
                        r.id, r.rule_id, ob.key)
    if out.obligations_rekeyed:
        log.warning("planning: %d obligation(s) of RECURRENCE-ID overrides keyed on their own id re-keyed as the "
                    "occurrence they replace (nothing sent)", out.obligations_rekeyed)
