"""``deadline-pipeline preview``: what would fire when, for one subscriber, without writing anything."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta

import click

from deadline_pipeline.commands.common import config_option, option_instant, require_config
from deadline_pipeline.config import ConfigError, load_config
from deadline_pipeline.instants import instant_text
from deadline_pipeline.states import OPEN, UNSENT, AlertState


def planned_rows(cfg, conn, sub, now: datetime, until: datetime) -> tuple[dict[str, dict], dict[str, datetime],
                                                                           list[dict]]:
    """What a re-plan at ``now`` would produce for subscriber ``sub`` (a configuration entry), for
    obligations due up to ``until`` plus each subscription's largest lead: ``({alert dedup key: row},
    {obligation key: due_at}, problems)``. Reads only: the same target building, override folding
    and planner as planning, from the configuration and the rule versions in the store."""
    from deadline_pipeline.plan.planner import plan_target, subscription_selection_problems
    from deadline_pipeline.plan.service import (
        PlanOutcome,
        business_calendars,
        fold_overrides,
        offsets_seconds,
        subscribes,
        targets_from_rows,
    )
    from deadline_pipeline.store.plan_inputs import active_rules
    from deadline_pipeline.store.sources import all_sources
    from deadline_pipeline.wording import offset_text

    alerts_by_key: dict[str, dict] = {}
    due_by_obligation: dict[str, datetime] = {}
    problems: list[dict] = []
    source_ids = {s.name: s.id for s in all_sources(conn)}
    calendars = business_calendars(conn, cfg, PlanOutcome())
    for subscription in cfg.subscriptions:
        # (target, rules, withdrawn) per source: the subscription is judged once over all of them.
        selection = []
        for src_name in subscription.sources:
            src = cfg.source(src_name)
            if not subscribes(subscription, sub, src):
                continue
            if src_name not in source_ids:
                problems.append({"source": src_name, "problem": "never ingested: run `deadline-pipeline run` first"})
                continue
            plan_out = PlanOutcome()
            (target,) = targets_from_rows(cfg, [dict(
                subscriber_id=0, external_id=sub.id, tenant=sub.tenant, timezone=sub.timezone,
                email=sub.email, webhook_url=sub.webhook_url, quiet_hours=sub.quiet_hours,
                caldav_url=sub.caldav_url,
                source_id=source_ids[src_name], source=src_name, rule_patterns=list(subscription.rules),
                name=subscription.name, offsets=offsets_seconds(subscription),
                offset_durations=list(subscription.offsets), channels=list(subscription.channels),
                late_policy=subscription.late_policy, kinds=subscription.kinds,
                exclude_kinds=subscription.exclude_kinds)], plan_out, calendars)
            rules, withdrawn = active_rules(conn, source_ids[src_name])
            rules = fold_overrides(rules, src_name, plan_out)
            # A day of slack: calendar days across a DST change can be longer than their nominal length.
            lead = max((-o for o in target.offsets_seconds), default=0) + 86400
            selection.append((target, rules, withdrawn))
            obligations_, plan_problems = plan_target(target, rules, now,
                                                      max(until - now, timedelta(0)) + timedelta(seconds=lead))
            for pr in [*plan_out.problems, *plan_problems]:
                problems.append({"source": src_name, "rule": pr.rule_id, "problem": pr.message})
            for ob in obligations_:
                due_by_obligation[ob.key] = ob.due_at
                for a in ob.alerts:
                    alerts_by_key[a.dedup_key] = {
                        "send_at": a.send_at, "channel": a.channel, "status": a.status, "kind": a.kind,
                        "why": a.status_reason, "title": ob.title, "due_at": ob.due_at, "source": src_name,
                        "rule": ob.rule_id, "offset_seconds": a.offset_seconds, "subscription": subscription.name,
                        "offset": a.offset.text() if a.offset else offset_text(a.offset_seconds),
                        "offset_zone": ob.zone,
                    }
        for pr in subscription_selection_problems(selection):
            problems.append({"source": pr.source, "rule": pr.rule_id, "problem": pr.message})
    return alerts_by_key, due_by_obligation, problems


def _when(instant: datetime | None, zone) -> dict:
    """An instant as ``{"utc", "local"}`` ISO 8601 and ``"text"``: ``2027-01-14 13:00 CET (2027-01-14 12:00 UTC)``."""
    if instant is None:
        return {"utc": None, "local": None, "text": "-"}
    local, utc = instant.astimezone(zone), instant.astimezone(UTC)
    return {"utc": instant_text(instant), "local": instant_text(instant, zone),
            "text": f"{local:%Y-%m-%d %H:%M} {local.tzname() or ''} ({utc:%Y-%m-%d %H:%M} UTC)".replace("  ", " ")}


def _replan_note(stored: dict, planned: dict | None, planned_due: datetime | None, judged: bool) -> str:
    """What a re-plan would change for one stored alert, in words."""
    if stored["status"] == AlertState.DELIVERED:
        # Against the obligation's instant: once a re-plan moved it, the correction is written and a
        # further re-plan sends none, although the reminder's own (planned-for) instant differs.
        if planned_due is not None and planned_due != stored["obligation_due_at"]:
            return f"delivered; the deadline is now due {instant_text(planned_due)}: a re-plan sends a correction"
        return "delivered; a re-plan never resends it"
    if stored["status"] not in OPEN:
        return "no change (not open)"
    if planned is None:
        return ("a re-plan would cancel it (its rule no longer applies or the deadline moved)" if judged
                else "outside the re-plan window")
    if planned["send_at"] != stored["send_at"]:
        return f"a re-plan would move it to {instant_text(planned['send_at'])}"
    return "no change"


def _next_send(stored: dict, now: datetime) -> datetime | None:
    """When an open alert (:data:`~deadline_pipeline.states.OPEN`) goes out next, as far as ``now``
    (aware UTC) can tell: its ``send_at`` (``next_attempt_at`` while a retry waits), or ``now`` once
    that has passed (the next sweep takes it; a ``claimed`` one is being sent). ``None`` for an alert
    that is not open."""
    if stored["status"] not in OPEN:
        return None
    if stored["status"] == AlertState.CLAIMED:
        return now
    due = stored["next_attempt_at"] if stored["status"] == AlertState.RETRY_WAIT else None
    return max(due or stored["send_at"], now)


def _stored_in_window(stored: dict, start: datetime, end: datetime, now: datetime) -> bool:
    """Whether a stored alert belongs in the window ``[start, end)``: its ``send_at`` or its delivery
    lies in it, or (open) it goes out next within it (:func:`_next_send`): a backlog from before
    ``start`` when ``now`` is in the window, not one that ``now`` places elsewhere."""
    def inside(t: datetime | None) -> bool:
        return t is not None and start <= t < end

    return inside(stored["send_at"]) or inside(stored["delivered_at"]) or inside(_next_send(stored, now))


def preview_rows(cfg, engine, subscriber_id: str, start: datetime, end: datetime,
                 now: datetime | None = None) -> list[dict]:
    """Reminders of ``subscriber_id`` in the window ``[start, end)`` (aware UTC) as the store has them —
    delivered (with the delivery instant), pending and when, skipped, cancelled, escalated — each
    with what a re-plan at ``now`` (default: the current time) would change, followed by the
    reminders a re-plan would add. ``due_at`` is the due instant each reminder was planned for (a
    superseded or delivered one keeps the instant the deadline had then) and ``due_moved_to`` the
    deadline's instant in the store when it has moved since (else its fields are None). Times in
    the subscriber's zone and in UTC; offsets as ISO 8601
    and words as written (``-P7D, 7 days before``), with ``offset_zone``: the deadline's zone, whose
    calendar days the offset's days are counted in (RFC 5545 §3.3.6; None when no re-plan shows the
    row). Reads only. Raises ``KeyError`` for a subscriber not in the configuration.

    A reminder is in the window when its send instant or its delivery lies in it, or, still open,
    when it goes out next within it (a backlog past its time goes out at ``now``); a reminder a
    re-plan would add, when it would go out within it (at ``max(send_at, now)``). The state comes
    from the store, never from a fresh simulation: a reminder the store holds is shown in its stored
    state wherever its stored times lie (a delivered one is never "would add"), and listed only when
    those times, or the instant a re-plan would move it to, fall in the window.
    """
    from deadline_pipeline.plan.occurrences import GRACE
    from deadline_pipeline.store.operations import subscriber_alerts, subscriber_alerts_by_key
    from deadline_pipeline.timezones import resolve_zone
    from deadline_pipeline.wording import offset_text

    sub = next((s for s in cfg.subscribers if s.id == subscriber_id), None)
    if sub is None:
        raise KeyError(subscriber_id)
    now = now or datetime.now(UTC)
    zone = resolve_zone(sub.timezone)

    def planned_in_window(p: dict) -> bool:
        return start <= max(p["send_at"], now) < end or start <= p["send_at"] < end

    with engine.connect() as conn:
        # The store's query also returns every open alert from before ``start`` (a backlog); only
        # those going out within the window are kept (_stored_in_window).
        stored = [a for a in subscriber_alerts(conn, subscriber_id, start, end)
                  if _stored_in_window(a, start, end, now)]
        planned, planned_due, problems = planned_rows(cfg, conn, sub, now, max(end, now))
        listed = {a["dedup_key"] for a in stored}
        # A re-plan's reminder in the window that the window's query did not return may still be in
        # the store, outside the window (delivered before ``start``; pending after ``end``, which a
        # re-plan would move in): it was shown as "not in the store ... would add" although delivered.
        elsewhere = {a["dedup_key"]: a for a in subscriber_alerts_by_key(
            conn, subscriber_id, [k for k, p in planned.items() if k not in listed and planned_in_window(p)])}
    # Of those, one a re-plan would move into the window is listed (its stored state, "would move");
    # the others (delivered, cancelled, ...) lie outside the window in truth and are not.
    stored += [a for a in elsewhere.values() if a["status"] in UNSENT
               and planned[a["dedup_key"]]["send_at"] != a["send_at"]]
    stored.sort(key=lambda a: (a["send_at"], a["id"]))
    rows: list[dict] = []
    for a in stored:
        judged = now - GRACE <= a["obligation_due_at"]  # the re-plan only looks at deadlines still ahead
        # The store keeps an offset's length only; the re-plan knows it as written (-P7D vs -PT168H).
        twin = planned.get(a["dedup_key"])
        rows.append({
            "alert_id": a["id"], "status": a["status"], "kind": a["kind"], "channel": a["channel"],
            "send_at": _when(a["send_at"], zone), "delivered_at": _when(a["delivered_at"], zone),
            "next_attempt_at": _when(a["next_attempt_at"], zone), "title": a["title"],
            "due_at": _when(a["due_at"], zone),
            "due_moved_to": _when(a["obligation_due_at"] if a["obligation_due_at"] != a["due_at"] else None, zone),
            "offset": twin["offset"] if twin else offset_text(a["offset_seconds"]),
            "offset_zone": twin["offset_zone"] if twin else None,
            "offset_seconds": a["offset_seconds"], "source": a["source"], "rule": a["rule_id"],
            "why": a["status_reason"],
            # Why a retry is waiting (or why it was escalated): an operator reading the preview of a
            # reminder that did not arrive sees the receiver's answer without querying the store.
            "attempts": a["attempts"], "last_error": a["last_error"],
            "replan": _replan_note(a, planned.get(a["dedup_key"]), planned_due.get(a["obligation_key"]), judged),
        })
    for key, p in sorted(planned.items(), key=lambda kv: kv[1]["send_at"]):
        if key in listed or key in elsewhere or p["status"] != AlertState.PENDING or not planned_in_window(p):
            continue
        rows.append({
            "alert_id": None, "status": "not in the store", "kind": p["kind"], "channel": p["channel"],
            "send_at": _when(max(p["send_at"], now), zone),
            "delivered_at": _when(None, zone), "next_attempt_at": _when(None, zone), "title": p["title"],
            "due_at": _when(p["due_at"], zone), "due_moved_to": _when(None, zone),
            "offset": p["offset"], "offset_zone": p["offset_zone"],
            "offset_seconds": p["offset_seconds"], "source": p["source"], "rule": p["rule"], "why": p["why"],
            "attempts": 0, "last_error": None, "replan": "a re-plan would add it",
        })
    return rows + problems


#: How ``preview`` reads offsets, printed above its table (RFC 5545 §3.3.6, see plan.offsets).
OFFSET_NOTE = ("offsets: days and weeks are calendar days in the deadline's zone (the same wall time across a "
               "daylight-saving change); hours, minutes and seconds are exact")


def _offset_shown(row: dict) -> str:
    """``-P7D, 7 days before, calendar days in America/New_York`` when the offset has a day part."""
    date_part = row["offset"].split(",", 1)[0].split("T", 1)[0]  # "-P1W", "-P7D", "-P1D" of "-P1DT12H"
    if row.get("offset_zone") and ("D" in date_part or "W" in date_part):
        return f"{row['offset']}, calendar days in {row['offset_zone']}"
    return row["offset"]


def register(main: click.Group) -> None:
    @main.command()
    @click.option("--subscriber", required=True, help="Subscriber id from the configuration.")
    @click.option("--from", "start", required=True, help="Window start, ISO 8601 instant (e.g. 2027-01-01T00:00Z).")
    @click.option("--to", "end", required=True, help="Window end, ISO 8601 instant.")
    @click.option("--as-of", help="Compare with a re-plan as if now were this ISO 8601 instant (default: now).")
    @config_option
    @click.option("--db-url", envvar="DEADLINE_DB_URL", help="Store URL (default: the embedded SQLite file).")
    @click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
    def preview(subscriber, start, end, as_of, config, db_url, as_json):
        """Show SUBSCRIBER's reminders between --from and --to as the store has them: delivered (and
        when), pending and when (in the subscriber's zone and UTC), skipped, cancelled, escalated; and
        beside each, what a re-plan would change (moved, cancelled, added). Writes nothing: a store
        that does not exist or is not migrated is named (exit 2), never created."""
        from deadline_pipeline.commands.common import fail_input, open_store_read_only

        t0, t1 = option_instant(start, "--from"), option_instant(end, "--to")
        now = option_instant(as_of, "--as-of") if as_of is not None else None
        if t1 <= t0:
            click.echo("error: --to must be after --from", err=True)
            sys.exit(2)
        try:
            cfg, _ = load_config(require_config(config))
        except ConfigError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        # Read-only: opening the store the way `run` does applied the migrations, so a preview on a
        # new home created an empty store (and its folder) and then showed nothing wrong.
        engine, no_store = open_store_read_only(db_url, current=True)
        if no_store:
            fail_input(no_store)
        try:
            rows = preview_rows(cfg, engine, subscriber, t0, t1, now)
        except KeyError:
            known = ", ".join(s.id for s in cfg.subscribers[:20])
            click.echo(f"error: --subscriber: no subscriber {subscriber!r} in the configuration (known: {known})",
                       err=True)
            sys.exit(2)
        from deadline_pipeline.ingest.service import settings_pending

        with engine.connect() as conn:
            pending = [p for p in (settings_pending(conn, s) for s in cfg.sources) if p]
        # The rows are the store's reading of each source; after an edit of a source's `timezone:`
        # that reading is the old one until the next ingest, and "re-plan: no change" alone hid it.
        for line in pending:
            click.echo(f"note: {line}", err=True)
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        if not rows:
            click.echo(f"no reminders for {subscriber} between {instant_text(t0)} and {instant_text(t1)}")
            return
        click.echo(OFFSET_NOTE)
        for r in rows:
            if "problem" in r:
                click.echo(f"PROBLEM  {r['source']} {r.get('rule', '')}: {r['problem']}")
                continue
            when = r["delivered_at"]["text"] if r["status"] == AlertState.DELIVERED else r["send_at"]["text"]
            moved = f", moved to {r['due_moved_to']['text']}" if r["due_moved_to"]["utc"] else ""
            click.echo(f"{r['status']:<16} {when}  {r['channel']:<8} {r['title']} (due {r['due_at']['text']}{moved}; "
                       f"{_offset_shown(r)}; {r['source']}/{r['rule']})"
                       + (f" — {r['why']}" if r["why"] else "")
                       + (f" — attempt {r['attempts']} failed: {r['last_error']}"
                          if r["last_error"] and r["status"] != AlertState.DELIVERED else "")
                       + f"  | re-plan: {r['replan']}")
