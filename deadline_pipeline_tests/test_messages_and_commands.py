"""What a recipient reads and what an operator types: reminder texts, the webhook envelope, mail
headers, subscription kinds, and the commands' output (preview from the store, one configuration
rule, humanised durations, did-you-mean, per-run summaries, alert actions, the occurrences cap,
--version, and a quiet local UI start)."""

from __future__ import annotations

import email
import email.policy
import json
import mailbox
import re
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select, update

from deadline_pipeline.cli import main
from deadline_pipeline.config import ConfigError, MaildirChannel, WebhookChannel, load_config
from deadline_pipeline.deliver.channels.registry import build_channel
from deadline_pipeline.deliver.notification import Notification
from deadline_pipeline.deliver.render import build_email, render
from deadline_pipeline.deliver.sweep import sweep
from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.plan.service import plan_all
from deadline_pipeline.store.schema import alerts, obligations
from deadline_pipeline_tests.factories import ai_deadlines, ics, loopback_policy, write_config

REPO = Path(__file__).resolve().parents[1]
KEY = "9b1c3e5f7a9d"
T0 = datetime(2027, 1, 10, tzinfo=UTC)
# 31 January 2027 is a Sunday: IRC §7503 (calendar US-IRS, following) moves it to Monday 1 February.
SUNDAY = {"uid": "form-941@test", "tzid": "America/New_York", "dtstart": "20270131T235900",
          "summary": "Form 941, Q4"}


def _notification(**changes) -> Notification:
    fields = {
        "dedup_key": KEY, "kind": "reminder", "subscriber_id": "ann", "email": "ann@example.org",
        "webhook_url": None, "subscriber_tz": "America/New_York", "source": "conferences",
        "rule_id": "neurips26/paper/Paper submission deadline", "title": "NeurIPS 2026 — Paper submission",
        "due_at": datetime(2026, 5, 7, 11, 59, 59, tzinfo=UTC), "offset_seconds": -7 * 86400, "rule_tz": "AoE",
        "planned_at": datetime(2026, 4, 30, 11, 59, 59, tzinfo=UTC),
        "sent_at": datetime(2026, 4, 30, 12, 0, tzinfo=UTC),
    }
    return Notification(**(fields | changes))


def _parse(raw: bytes):
    return email.message_from_bytes(raw, policy=email.policy.default)


def _mail_texts(folder: Path) -> list[str]:
    box = mailbox.Maildir(folder, create=False)
    return [_parse(box.get_bytes(k)).get_body(("plain",)).get_content() for k in box.iterkeys()]


def _store_with_sunday_deadline(tmp_path: Path, engine, subscriber_tz: str = "Europe/Berlin"):
    (tmp_path / "tax.ics").write_text(ics(SUNDAY), newline="")
    path = write_config(
        tmp_path,
        sources=[{"name": "tax", "format": "ics", "location": "tax.ics", "tenant": "t",
                  "business_days": {"calendar": "US-IRS", "convention": "following"}}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": subscriber_tz}],
        subscriptions=[{"name": "s", "sources": ["tax"], "offsets": ["-P7D", "-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir"), "sender": "tax@example.org"}},
    )
    cfg = load_config(path)[0]
    for s in cfg.sources:
        fetch_snapshot(engine, s, T0)
        apply_latest_snapshot(engine, s, T0)
    plan_all(engine, cfg, T0)
    return cfg, path


# ------------------------------------------------------------------------------------------ reminders


def test_reminder_says_which_one_shows_the_deadline_zone_and_when_it_is_late():
    on_time = render(_notification())
    # The deadline in its own zone beside the reader's, and which reminder this is.
    assert "Due: 2026-05-07 07:59 EDT (America/New_York, UTC-04:00) = 2026-05-07 11:59 UTC" in on_time.text
    assert "Deadline's own zone: 2026-05-06 23:59 AoE (UTC-12:00)" in on_time.text
    assert "This is the reminder 7 days before (-P7D)." in on_time.text
    assert "late" not in on_time.text.lower() and "late" not in on_time.subject
    late = render(_notification(sent_at=datetime(2026, 5, 1, 9, 0, tzinfo=UTC), earlier_attempts=2))
    assert ("Sent late: planned for 2026-04-30 07:59 EDT (2026-04-30 11:59 UTC), 2 earlier delivery attempts "
            "failed") in late.text
    assert late.subject.endswith(", sent late)") and "Sent late: planned for" in late.html
    folded = render(_notification(sent_at=datetime(2026, 5, 1, 9, 0, tzinfo=UTC),
                                  planned_reason="late at planning: reminder time … already past"))
    assert "its time had already passed when it was planned" in folded.text
    # Same wall clock in both zones: one line, no repetition.
    assert "own zone" not in render(_notification(rule_tz="America/New_York")).text


def test_business_day_roll_is_explained_in_the_delivered_mail(engine, tmp_path):
    cfg, _ = _store_with_sunday_deadline(tmp_path, engine)
    # The -P7D reminder of Monday 1 Feb 23:59 New York is planned for 26 Jan 04:59Z; deliver it late.
    out = sweep(engine, cfg, datetime(2027, 1, 26, 12, 0, tzinfo=UTC))
    assert out.delivered == 1, out
    (text,) = _mail_texts(tmp_path / "maildir")
    assert "Business-day rule: Sunday 31 Jan falls on a weekend; due Monday 1 Feb (IRC §7503 following)" in text
    assert "Deadline's own zone: 2027-02-01 23:59 America/New_York, EST (UTC-05:00)" in text
    assert "Due: 2027-02-02 05:59 CET (Europe/Berlin, UTC+01:00) = 2027-02-02 04:59 UTC" in text
    assert "This is the reminder 7 days before (-P7D)." in text
    assert "Sent late: planned for 2027-01-26 05:59 CET (2027-01-26 04:59 UTC)" in text


class _Receiver(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.server.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()


@pytest.fixture
def receiver():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.bodies = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


def test_webhook_body_is_a_standard_webhooks_envelope(receiver):
    server, url = receiver
    ch = build_channel("hook", WebhookChannel(type="webhook", timeout_seconds=5), network=loopback_policy())
    for kind in ("reminder", "correction", "cancellation", "escalation"):
        ch.send(_notification(kind=kind, webhook_url=url))
    ch.close()
    assert [b["type"] for b in server.bodies] == ["reminder.due", "reminder.corrected", "reminder.cancelled",
                                                  "reminder.escalated"]
    body = server.bodies[0]
    assert set(body) == {"type", "timestamp", "data"} and body["timestamp"] == "2026-04-30T12:00:00Z"
    data = body["data"]
    assert (data["id"], data["offset"], data["offset_seconds"], data["offset_words"]) == (
        KEY, "-P7D", -604800, "7 days before")
    assert (data["subscriber_timezone"], data["due_local"]) == ("America/New_York", "2026-05-07T07:59:59-04:00")
    assert (data["deadline_timezone"], data["due_in_deadline_timezone"]) == ("AoE", "2026-05-06T23:59:59-12:00")
    assert data["due_at"] == "2026-05-07T11:59:59Z" and data["late"] is False


def test_mail_headers_mime_version_once_sender_domain_and_list_unsubscribe(tmp_path):
    plain = build_email(_notification(), "Reminders <reminders@Example.ORG>")
    raw = plain.as_bytes()
    assert raw.count(b"MIME-Version:") == 1  # only on the top level (RFC 2045 §4)
    assert plain["Message-ID"] == f"<{KEY}@example.org>"  # the sender's domain, not a bare label
    assert plain["List-Unsubscribe"] is None and plain["List-Unsubscribe-Post"] is None
    # Configured on a channel: its own Message-ID domain and RFC 2369 / RFC 8058 headers.
    ch = build_channel("mail", MaildirChannel(
        type="maildir", path=str(tmp_path / "box"), sender="reminders@example.org",
        message_id_domain="mail.example.org", unsubscribe_url="https://example.org/unsubscribe?u=ann",
        unsubscribe_mailto="unsubscribe@example.org"))
    key = ch.send(_notification()).provider_message_id
    msg = _parse(mailbox.Maildir(tmp_path / "box", create=False).get_bytes(key))
    assert msg["Message-ID"] == f"<{KEY}@mail.example.org>"
    assert msg["List-Unsubscribe"].strip() == ("<https://example.org/unsubscribe?u=ann>, "
                                               "<mailto:unsubscribe@example.org>")
    assert msg["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    with pytest.raises(ValueError):  # not http(s): refused by the configuration
        MaildirChannel(type="maildir", path="x", unsubscribe_url="javascript:alert(1)")


def test_subscription_kinds_include_and_exclude(engine, tmp_path):
    edition = {"title": "CONF", "year": 2027, "id": "conf27", "deadlines": [
        {"type": "abstract", "label": "Abstract", "date": "2027-03-01 23:59:59", "timezone": "AoE"},
        {"type": "paper", "label": "Paper", "date": "2027-03-08 23:59:59", "timezone": "AoE"},
        {"type": "notification", "label": "Notification", "date": "2027-05-01 23:59:59", "timezone": "AoE"}]}
    (tmp_path / "conf.yml").write_text(ai_deadlines(edition))

    def plan_with(**subscription):
        path = write_config(
            tmp_path, sources=[{"name": "conf", "format": "ai-deadlines", "location": "conf.yml", "tenant": "t"}],
            subscribers=[{"id": "ann", "tenant": "t", "email": "a@example.org", "timezone": "UTC"}],
            subscriptions=[{"name": "s", "sources": ["conf"], "channels": ["mail"], **subscription}],
            channels={"mail": {"type": "maildir", "path": str(tmp_path / "m")}})
        cfg = load_config(path)[0]
        for s in cfg.sources:
            fetch_snapshot(engine, s, T0)
            apply_latest_snapshot(engine, s, T0)
        out = plan_all(engine, cfg, T0)
        with engine.connect() as conn:
            planned = conn.execute(select(obligations.c.rule_id).where(obligations.c.status == "active")
                                   .order_by(obligations.c.rule_id)).scalars().all()
        return out, [r.split("/")[1] for r in planned]

    _, kinds = plan_with()
    assert kinds == ["abstract", "notification", "paper"]
    with engine.begin() as conn:  # say the notification date's reminder already went out
        ob = conn.execute(select(obligations.c.id).where(obligations.c.rule_id.like("%/notification/%"))).scalar()
        conn.execute(update(alerts).where(alerts.c.obligation_id == ob).values(status="delivered", delivered_at=T0))
    out, kinds = plan_with(exclude_kinds=["notification"])
    assert kinds == ["abstract", "paper"] and not out.problems
    with engine.connect() as conn:  # the subscription's own filter: no "withdrawn by its source" notice
        assert conn.execute(select(alerts.c.id).where(alerts.c.kind == "cancellation")).all() == []
    from deadline_pipeline.watch.checks import fanout_complete

    assert fanout_complete(engine, T0, timedelta(days=366), {"mail": "maildir"}).passed
    _, kinds = plan_with(kinds=["abstract"])
    assert kinds == ["abstract"]
    # A misspelt kind matches nothing: reported, never silently an empty plan.
    out, _ = plan_with(kinds=["abstrakt"])
    assert any("match no rule" in p.message and "abstract" in p.message for p in out.problems)
    # Kinds are judged among the rules the patterns select: the paper rule is no abstract.
    out, kinds = plan_with(rules=["*/paper*"], kinds=["abstract"])
    assert kinds == []
    (problem,) = out.problems
    assert "kinds ['abstract'] match no rule" in problem.message and "paper" in problem.message, problem
    assert "notification" not in problem.message, problem


def test_kinds_of_a_withdrawn_rule_are_no_problem(engine, tmp_path):
    """``kinds: [paper]`` after the source dropped its only paper deadline (past, as feeds drop past
    conferences' dates): nothing is owed, so no problem — the withdrawn rule had that kind. A kind
    no rule ever had stays a problem."""
    dates = {"abstract": "2027-03-01 23:59:59", "paper": "2027-03-08 23:59:59", "notification": "2027-05-01 23:59:59"}

    def edition(*types):
        return ai_deadlines({"title": "CONF", "year": 2027, "id": "conf27", "deadlines": [
            {"type": t, "label": t.title(), "date": dates[t], "timezone": "AoE"} for t in types]})

    def plan_at(now, kinds):
        path = write_config(
            tmp_path, sources=[{"name": "conf", "format": "ai-deadlines", "location": "conf.yml", "tenant": "t"}],
            subscribers=[{"id": "ann", "tenant": "t", "email": "a@example.org", "timezone": "UTC"}],
            subscriptions=[{"name": "s", "sources": ["conf"], "channels": ["mail"], "kinds": kinds}],
            channels={"mail": {"type": "maildir", "path": str(tmp_path / "m")}})
        cfg = load_config(path)[0]
        for s in cfg.sources:
            fetch_snapshot(engine, s, now)
            apply_latest_snapshot(engine, s, now)
        return plan_all(engine, cfg, now)

    (tmp_path / "conf.yml").write_text(edition("abstract", "paper", "notification"))
    assert plan_at(T0, ["paper"]).problems == []
    later = datetime(2027, 3, 20, tzinfo=UTC)  # the paper date has passed: dropping it is no quarantine
    (tmp_path / "conf.yml").write_text(edition("abstract", "notification"))
    out = plan_at(later, ["paper"])
    assert out.problems == [], out.problems
    out = plan_at(later, ["papr"])
    assert [p.message for p in out.problems] == [
        "subscription 's': kinds ['papr'] match no rule of this source; its kinds are "
        "['abstract', 'deadline', 'notification']"], out.problems



# ------------------------------------------------------------------------------------------- commands


def test_preview_reads_the_store_and_never_calls_delivered_pending(engine, db_url, tmp_path):
    cfg, path = _store_with_sunday_deadline(tmp_path, engine)
    assert sweep(engine, cfg, datetime(2027, 1, 26, 12, 0, tzinfo=UTC)).delivered == 1

    def preview(as_of: str) -> list[dict]:
        res = CliRunner().invoke(main, ["preview", "--subscriber", "ann", "--from", "2027-01-20T00:00:00Z",
                                        "--to", "2027-02-05T00:00:00Z", "--as-of", as_of, "--config", str(path),
                                        "--db-url", db_url, "--json"])
        assert res.exit_code == 0, res.output
        return json.loads(res.output)

    rows = preview("2027-01-26T12:00:00Z")
    assert [(r["offset"], r["status"]) for r in rows] == [("-P7D, 7 days before", "delivered"),
                                                          ("-P1D, 1 day before", "pending")]
    delivered, pending = rows
    assert delivered["delivered_at"]["utc"] == "2027-01-26T12:00:00+00:00"
    assert delivered["replan"] == "delivered; a re-plan never resends it"
    assert pending["send_at"] == {"utc": "2027-02-01T04:59:00+00:00", "local": "2027-02-01T05:59:00+01:00",
                                  "text": "2027-02-01 05:59 CET (2027-02-01 04:59 UTC)"}
    assert pending["replan"] == "no change"
    assert (delivered["attempts"], delivered["last_error"], pending["attempts"], pending["last_error"]) == (
        1, None, 0, None)
    # A retry waiting: preview names the failed attempt and the receiver's answer (it showed neither).
    error = "channel 'mail' (smtp 127.0.0.1:1): 421 try again later"
    with engine.begin() as conn:
        conn.execute(alerts.update().where(alerts.c.id == pending["alert_id"]).values(
            status="retry_wait", attempts=1, last_error=error,
            next_attempt_at=datetime(2027, 2, 1, 5, 4, tzinfo=UTC)))
    waiting = preview("2027-02-01T05:00:00Z")[1]
    assert (waiting["status"], waiting["attempts"], waiting["last_error"]) == ("retry_wait", 1, error)
    table = CliRunner().invoke(main, ["preview", "--subscriber", "ann", "--from", "2027-01-20T00:00:00Z",
                                      "--to", "2027-02-05T00:00:00Z", "--as-of", "2027-02-01T05:00:00Z",
                                      "--config", str(path), "--db-url", db_url])
    assert table.exit_code == 0, table.output
    line = next(ln for ln in table.output.splitlines() if ln.startswith("retry_wait"))
    assert f"attempt 1 failed: {error}" in line
    with engine.begin() as conn:
        conn.execute(alerts.update().where(alerts.c.id == pending["alert_id"]).values(
            status="pending", attempts=0, last_error=None, next_attempt_at=None))
    # The source moves the deadline; before any re-plan, preview says what a re-plan would change.
    (tmp_path / "tax.ics").write_text(ics(dict(SUNDAY, dtstart="20270203T235900")), newline="")
    for s in cfg.sources:
        fetch_snapshot(engine, s, T0 + timedelta(days=17))
        apply_latest_snapshot(engine, s, T0 + timedelta(days=17))
    rows = preview("2027-01-27T00:00:00Z")
    stored = [r for r in rows if r["alert_id"] is not None]
    assert [r["status"] for r in stored] == ["delivered", "pending"]  # the store's truth, unchanged
    assert "correction" in stored[0]["replan"]
    assert stored[1]["replan"] != "no change"
    with engine.connect() as conn:  # preview wrote nothing
        assert conn.execute(select(alerts.c.status).order_by(alerts.c.id)).scalars().all()[:2] == [
            "delivered", "pending"]


def test_preview_lists_only_its_window_and_never_calls_a_delivered_reminder_new(engine, db_url, tmp_path):
    """-P7D goes out 26 Jan, -P1D is due 1 Feb 04:59Z. A window after the delivery listed the -P7D
    reminder as "not in the store ... a re-plan would add it" (the re-plan's twin of a reminder
    delivered before the window), and a window after 1 Feb listed -P1D, which goes out before it."""
    cfg, path = _store_with_sunday_deadline(tmp_path, engine)
    assert sweep(engine, cfg, datetime(2027, 1, 26, 12, 0, tzinfo=UTC)).delivered == 1

    def preview(start: str, end: str, as_of: str) -> list[tuple[str, str, str]]:
        res = CliRunner().invoke(main, ["preview", "--subscriber", "ann", "--from", start, "--to", end,
                                        "--as-of", as_of, "--config", str(path), "--db-url", db_url, "--json"])
        assert res.exit_code == 0, res.output
        return [(r["offset"].split(",")[0], r["status"], r["replan"]) for r in json.loads(res.output)]

    # After the delivery, before -P1D: nothing in the window (the delivered one is not "would add").
    assert preview("2027-01-27T00:00:00Z", "2027-01-31T00:00:00Z", "2027-01-28T00:00:00Z") == []
    # -P1D goes out 1 Feb, before this window: neither it nor the delivered one belong to it.
    assert preview("2027-02-02T00:00:00Z", "2027-02-05T00:00:00Z", "2027-01-28T00:00:00Z") == []
    assert preview("2027-01-31T00:00:00Z", "2027-02-02T00:00:00Z", "2027-01-28T00:00:00Z") == [
        ("-P1D", "pending", "no change")]
    # A backlog: -P1D past its time and not sent goes out at the next sweep, inside a window holding now.
    assert preview("2027-02-01T06:00:00Z", "2027-02-03T00:00:00Z", "2027-02-01T12:00:00Z") == [
        ("-P1D", "pending", "no change")]
    # The delivered reminder in its own window is shown as delivered.
    assert preview("2027-01-26T00:00:00Z", "2027-01-27T00:00:00Z", "2027-01-28T00:00:00Z") == [
        ("-P7D", "delivered", "delivered; a re-plan never resends it")]


def test_preview_shows_each_reminder_with_the_due_instant_it_was_planned_for(engine, db_url, tmp_path):
    """The deadline (Mon 1 Feb 23:59 New York = 2 Feb 04:59Z) moves to Wed 3 Feb 23:59 (4 Feb
    04:59Z) after -P7D was delivered, and a run re-plans. Preview showed the delivered and the
    superseded reminders "due" at the new instant - the obligation's - although each was planned,
    and the delivered one sent, for the old one."""
    cfg, path = _store_with_sunday_deadline(tmp_path, engine)
    assert sweep(engine, cfg, datetime(2027, 1, 26, 12, 0, tzinfo=UTC)).delivered == 1
    (tmp_path / "tax.ics").write_text(ics(dict(SUNDAY, dtstart="20270203T235900")), newline="")
    moved_at = datetime(2027, 1, 27, tzinfo=UTC)
    for s in cfg.sources:
        fetch_snapshot(engine, s, moved_at)
        apply_latest_snapshot(engine, s, moved_at)
    plan_all(engine, cfg, moved_at)
    args = ["preview", "--subscriber", "ann", "--from", "2027-01-20T00:00:00Z", "--to", "2027-02-05T00:00:00Z",
            "--as-of", "2027-01-27T00:00:00Z", "--config", str(path), "--db-url", db_url]
    res = CliRunner().invoke(main, [*args, "--json"])
    assert res.exit_code == 0, res.output
    rows = {(r["kind"], r["offset"].split(",")[0], r["status"]): r for r in json.loads(res.output)}
    old, new = "2027-02-02T04:59:00+00:00", "2027-02-04T04:59:00+00:00"
    assert {k: r["due_at"]["utc"] for k, r in rows.items()} == {
        ("reminder", "-P7D", "delivered"): old, ("reminder", "-P1D", "superseded"): old,
        ("correction", "PT0S", "pending"): new,  # a correction is planned for the new instant
        ("reminder", "-P7D", "pending"): new, ("reminder", "-P1D", "pending"): new,
    }
    assert {k: r["due_moved_to"]["utc"] for k, r in rows.items() if r["due_at"]["utc"] == old} == {
        ("reminder", "-P7D", "delivered"): new, ("reminder", "-P1D", "superseded"): new}
    assert {r["due_moved_to"]["utc"] for r in rows.values() if r["due_at"]["utc"] == new} == {None}
    # Delivered for the old instant, corrected by the correction above: a re-plan sends nothing more.
    assert rows[("reminder", "-P7D", "delivered")]["replan"] == "delivered; a re-plan never resends it"
    table = CliRunner().invoke(main, args)
    assert table.exit_code == 0, table.output
    line = next(ln for ln in table.output.splitlines() if ln.startswith("superseded"))
    assert ("(due 2027-02-02 05:59 CET (2027-02-02 04:59 UTC), moved to 2027-02-04 05:59 CET "
            "(2027-02-04 04:59 UTC);") in line, line


def test_preview_never_creates_or_migrates_the_store(tmp_path, monkeypatch):
    """A preview on a new home migrated an empty store into it (creating the folder) and printed
    only "never ingested"; a store at an older migration failed inside the SQL. Each is now named
    with the command that creates or migrates it, exit 2, and nothing is written."""
    from sqlalchemy import inspect

    from deadline_pipeline.store.db import get_engine, make_engine, migration_heads, upgrade

    _cfg, path = _store_with_sunday_deadline(tmp_path, get_engine(f"sqlite:///{tmp_path / 'seed.sqlite3'}"))
    home = tmp_path / "new-home"
    monkeypatch.setenv("DEADLINE_HOME", str(home))
    monkeypatch.delenv("DEADLINE_DB_URL", raising=False)
    args = ["preview", "--subscriber", "ann", "--from", "2027-01-26T00:00:00Z", "--to", "2027-02-05T00:00:00Z",
            "--config", str(path)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert res.output.strip() == (f"error: the store at sqlite:///{home / 'store.sqlite3'} has no schema yet: "
                                  "run `deadline-pipeline db upgrade` or `deadline-pipeline run` first")
    assert not home.exists(), "preview created the home folder or the store"
    # A store some migrations behind this release.
    old = f"sqlite:///{tmp_path / 'old.sqlite3'}"
    upgrade(old, revision="0015")
    res = CliRunner().invoke(main, [*args, "--db-url", old])
    assert res.exit_code == 2, res.output
    assert "is at migration 0015, not this release's latest" in res.output
    assert "run `deadline-pipeline db upgrade` first" in res.output
    engine = make_engine(old)
    assert migration_heads(engine) == ("0015",) and inspect(engine).has_table("sources")


def _config_options(group, prefix=()):
    import click

    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _config_options(cmd, (*prefix, name))
        for p in cmd.params:
            if p.name == "config":
                yield " ".join((*prefix, name)), p


def test_every_command_finds_the_configuration_by_one_rule(tmp_path, monkeypatch):
    from deadline_pipeline.commands.common import CONFIG_HELP

    found = dict(_config_options(main))
    assert {"run", "preview", "rules diff", "source accept", "watchdog", "status"} <= set(found)
    assert {p.help for p in found.values()} == {CONFIG_HELP}
    assert {p.envvar for p in found.values()} == {"DEADLINE_CONFIG"}
    # No silent fallback to the bundled examples: without a configuration, preview refuses.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DEADLINE_CONFIG", raising=False)
    res = CliRunner().invoke(main, ["preview", "--subscriber", "ops-new-york", "--from", "2027-01-01T00:00:00Z",
                                    "--to", "2027-01-02T00:00:00Z"])
    assert res.exit_code == 2 and "no configuration: pass --config FILE, set DEADLINE_CONFIG" in res.output
    res = CliRunner().invoke(main, ["source", "accept", "1"])
    assert res.exit_code == 2 and "no configuration" in res.output
    # ./deadlines.yaml is the third step of the rule for every command.
    (tmp_path / "deadlines.yaml").write_text("sorces: []\n")
    res = CliRunner().invoke(main, ["source", "accept", "1"])
    assert res.exit_code == 2 and "deadlines.yaml: sorces" in res.output


def test_durations_and_offsets_read_as_words():
    from deadline_pipeline.wording import human_duration, offset_text

    assert [human_duration(s) for s in (86400, 104, 7, 0.25, 5400, timedelta(days=1, hours=2, seconds=1))] == [
        "1 d 0 h", "1 min 44 s", "7 s", "0.25 s", "1 h 30 min", "1 d 2 h"]
    assert [offset_text(s) for s in (-604800, -5400, 0)] == [
        "-P7D, 7 days before", "-PT1H30M, 1 hour 30 minutes before", "PT0S, at the deadline"]


def test_status_shows_ages_without_timedelta_text(engine, db_url, tmp_path):
    _store_with_sunday_deadline(tmp_path, engine)
    res = CliRunner().invoke(main, ["status", "--db-url", db_url, "--as-of", "2027-01-11T01:02:03Z"])
    assert res.exit_code == 0, res.output
    assert "last fresh 1 d 1 h ago" in res.output
    body = res.output.split("status as of", 1)[1].split("\n", 1)[1]  # below the (ISO) heading
    assert not re.search(r"\d:\d\d:\d\d|\.\d{6}", body), res.output


def test_misspelt_configuration_key_gets_a_suggestion(tmp_path):
    path = write_config(tmp_path, sources=[{"name": "x", "format": "ics", "location": "a.ics", "tenat": "t"}],
                        subscribers=[], channels={"m": {"type": "smtp", "hots": "mail.example.org"}},
                        subscriptions=[{"name": "s", "sources": ["x"], "ofsets": ["-P1D"], "channels": ["m"]}])
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    assert "subscriptions[0].ofsets: unknown key; did you mean `offsets`?" in text
    assert "sources[0].tenat: unknown key; did you mean `tenant`?" in text
    assert "channels.m.hots: unknown key; did you mean `host`?" in text


def test_run_summary_says_what_this_run_did(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"} | {"DEADLINE_HOME": str(tmp_path / "h")}
    cmd = [sys.executable, "-m", "deadline_pipeline.cli", "demo", "--as-of", "2026-12-01T00:00:00Z"]
    first = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr + first.stdout
    sent = int(re.search(r"this run: sent (\d+)", first.stdout).group(1))
    assert sent > 0 and f"holds {sent} message(s), {sent} new this run" in first.stdout
    second = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "this run: sent 0, failed attempts 0, escalated 0\n" in second.stdout
    assert "store grew by (every writer during the run, this one included): rule versions 0," in second.stdout
    assert f"holds {sent} message(s), 0 new this run" in second.stdout
    assert re.search(rf"alerts: delivered {sent}\b", second.stdout)  # the totals, labelled as such


def test_demo_status_and_watchdog_print_every_instant_to_the_second(tmp_path):
    """Every instant ``demo``, ``status`` and ``watchdog`` print is to the whole second. Before, the
    run summary printed ``last fresh 2026-12-02 15:28:34.551555+00:00`` and the checks ``every alert
    due before 2026-12-02T14:58:36.212183+00:00``: each message formatted its own instant. The real
    clock (no ``--as-of``, which refuses a fraction) puts one in every instant derived from it."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"} | {"DEADLINE_HOME": str(tmp_path / "h")}
    outputs = []
    for command in (["demo"], ["status"], ["watchdog"]):
        done = subprocess.run([sys.executable, "-m", "deadline_pipeline.cli", *command], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr + done.stdout
        outputs.append(done.stdout + done.stderr)
    text = "\n".join(outputs)
    second = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00"
    assert re.search(rf"last fresh {second}\n", text)  # the run summary's sources, as the checks write it
    assert re.search(rf"status as of {second}\n", text) and re.search(rf"watchdog as of {second}\n", text)
    assert not re.search(r"\.\d{6}", text), [line for line in text.splitlines() if re.search(r"\.\d{6}", line)]


@pytest.mark.parametrize("command", [["run", "--config", "deadlines.yaml"], ["demo"], ["status"], ["watchdog"],
                                     ["snapshots", "prune", "--keep-days", "1", "--dry-run"]])
def test_an_instant_with_a_fraction_of_a_second_is_refused_not_cut(tmp_path, command):
    """``--as-of 2026-05-01T12:00:00.750Z`` ran at .750 while the summary said ``as of
    2026-05-01T12:00:00+00:00`` (every instant is printed to the second): the fraction was dropped
    without a word. It is refused before anything is opened, naming the option, the fraction and the
    whole second it falls in; a zero fraction is a whole second."""
    (tmp_path / "deadlines.yaml").write_text("sources: []\n")
    home = tmp_path / "home"
    res = CliRunner().invoke(main, [*command, "--as-of", "2026-05-01T14:00:00.750+02:00"],
                             env={"DEADLINE_HOME": str(home), "DEADLINE_CONFIG": str(tmp_path / "deadlines.yaml")})
    assert res.exit_code == 2, res.output
    assert res.output.strip() == (
        "error: --as-of '2026-05-01T14:00:00.750+02:00': has a fraction of a second (.75); instants are taken "
        "and shown to the whole second, so write the second you mean, e.g. 2026-05-01T12:00:00Z"), res.output
    assert not home.exists()


def test_preview_window_with_a_fraction_of_a_second_is_refused(tmp_path):
    from deadline_pipeline.commands.common import option_instant
    from deadline_pipeline.instants import parse_instant

    assert option_instant("2026-05-01T12:00:00.000Z") == parse_instant("2026-05-01T12:00:00Z")
    res = CliRunner().invoke(main, ["preview", "--subscriber", "x", "--from", "2027-01-01T00:00:00.5Z",
                                    "--to", "2027-01-02T00:00:00Z"])
    assert res.exit_code == 2, res.output
    assert "error: --from '2027-01-01T00:00:00.5Z': has a fraction of a second (.5)" in res.output


def test_alert_actions_name_missing_ids_blocking_states_and_the_os_user(engine, db_url, tmp_path, monkeypatch):
    _store_with_sunday_deadline(tmp_path, engine)
    with engine.begin() as conn:
        ids = conn.execute(select(alerts.c.id).order_by(alerts.c.id)).scalars().all()
        conn.execute(update(alerts).where(alerts.c.id == ids[0]).values(status="delivered"))
    monkeypatch.setenv("LOGNAME", "carol")  # getpass.getuser() reads LOGNAME first
    res = CliRunner().invoke(main, ["alerts", "cancel", str(ids[0]), str(ids[1]), "999999", "--db-url", db_url,
                                    "--as-of", "2027-01-10T00:00:00Z"])
    assert res.exit_code == 1
    assert f"cancelled 1 of 3 alert(s) as carol: {ids[1]}" in res.output
    assert f"alert {ids[0]}: it is delivered" in res.output and "alert 999999: no such alert" in res.output
    with engine.connect() as conn:
        assert conn.execute(select(alerts.c.status_reason).where(alerts.c.id == ids[1])).scalar() == \
            "cancelled by carol"
    res = CliRunner().invoke(main, ["alerts", "acknowledge", str(ids[1]), "--by", "dave", "--db-url", db_url])
    assert res.exit_code == 1 and f"alert {ids[1]}: it is cancelled" in res.output
    assert "the others are not escalated or were already acknowledged" in res.output
    # Only a missing id left alone: no sentence about "the others", which read as if some existed.
    res = CliRunner().invoke(main, ["alerts", "acknowledge", "999999", "--by", "dave", "--db-url", db_url])
    assert res.exit_code == 1 and "alert 999999: no such alert" in res.output
    assert "the others" not in res.output, res.output


def test_occurrences_at_the_cap_exits_1_and_counts_what_it_left_out():
    res = CliRunner().invoke(main, ["occurrences", "--dtstart", "20260101T000000Z", "--rrule", "FREQ=HOURLY",
                                    "--after", "2026-01-01T00:00:00Z", "--before", "2027-01-01T00:00:00Z"])
    assert res.exit_code == 1
    assert len([ln for ln in res.stdout.splitlines() if ln.endswith("Z")]) == 5000
    # 8,761 hourly instants in [1 Jan 2026, 1 Jan 2027] inclusive, 5,000 printed.
    assert "stopped at 5000 occurrences; 3761 more in the window were not printed" in res.stderr
    ok = CliRunner().invoke(main, ["occurrences", "--dtstart", "20260101T000000Z", "--rrule", "FREQ=DAILY",
                                   "--after", "2026-01-01T00:00:00Z", "--before", "2027-01-01T00:00:00Z"])
    assert ok.exit_code == 0


def test_version():
    from importlib.metadata import version

    res = CliRunner().invoke(main, ["--version"])
    assert res.exit_code == 0
    assert res.output.startswith(f"deadline-pipeline {version('deadline_pipeline')} (dagster {version('dagster')}")


def test_local_ui_command_and_code_location_load_without_avoidable_warnings():
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Browse it in the Dagster UI")[1].split("```bash")[1].split("```")[0]
    assert "dg dev -m deadline_pipeline.definitions -a defs" in block and "dagster dev" not in block
    # Loading the code location with every warning shown prints none (Dagster's beta notices for the
    # APIs it uses on purpose are silenced there, by category).
    out = subprocess.run([sys.executable, "-W", "always", "-c", "import deadline_pipeline.definitions"],
                         cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert "BetaWarning" not in out.stderr and "PreviewWarning" not in out.stderr, out.stderr


def test_a_reminder_sent_after_its_deadline_says_how_long_ago_it_passed():
    """Delivery still sends within its grace after a deadline; ten minutes after it, "due now" read
    as if there were still time. Within a minute it is still "due now"."""
    from deadline_pipeline.deliver.render import render

    due = datetime(2026, 5, 7, 11, 59, 59, tzinfo=UTC)
    late = render(_notification(offset_seconds=0, planned_at=due, sent_at=due + timedelta(minutes=10)))
    assert "(passed 10 minutes ago)" in late.subject and "due now" not in late.subject
    assert "The deadline passed 10 minutes ago." in late.text and "It is due now." not in late.text
    on_time = render(_notification(offset_seconds=0, planned_at=due, sent_at=due + timedelta(seconds=30)))
    assert "(due now)" in on_time.subject and "It is due now." in on_time.text
