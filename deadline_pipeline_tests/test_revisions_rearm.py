"""Revisions never cost a reminder: a moved deadline re-arms its reminders for the new instant (the
ones delivered for the old instant stay in history), one correction per subscriber per move, and a
flapping source costs corrections, never repeats. Run through ingest, planning and a real maildir
sweep, on SQLite and PostgreSQL."""

from __future__ import annotations

import mailbox
from datetime import UTC, datetime

from sqlalchemy import select

from deadline_pipeline.config import load_config
from deadline_pipeline.store.schema import alerts, obligations
from deadline_pipeline_tests.factories import ai_deadlines, write_config
from deadline_pipeline_tests.test_watch_checks import cycle


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def entry(deadline: str, **extra) -> dict:
    return {"title": "X", "year": 2026, "id": "x26", "deadline": deadline, "timezone": "AoE", **extra}


def setup(tmp_path, *entries, offsets=("-P7D", "-P1D", "PT0S")):
    (tmp_path / "conf.yml").write_text(ai_deadlines(*entries))
    path = write_config(
        tmp_path,
        sources=[{"name": "conf", "format": "ai-deadlines", "location": "conf.yml", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["conf"], "offsets": list(offsets), "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    )
    return load_config(path)[0]


def mails(tmp_path) -> list[str]:
    """Subjects of every message in the maildir, oldest first."""
    box = mailbox.Maildir(tmp_path / "maildir", create=False)
    return [str(box[k]["Subject"]) for k in sorted(box.keys(), key=lambda k: box[k].get_date())]


def kinds(engine) -> list[tuple]:
    with engine.connect() as conn:
        return sorted(conn.execute(
            select(alerts.c.kind, alerts.c.due_at, alerts.c.offset_seconds, alerts.c.status)
            .join(obligations, obligations.c.id == alerts.c.obligation_id)).all())


def test_extended_deadline_gets_its_reminders_at_the_new_date(engine, tmp_path):
    cfg = setup(tmp_path, entry("2026-02-18 23:59:59"))
    for day in ("2026-02-12", "2026-02-18", "2026-02-19"):
        cycle(engine, cfg, at(f"{day}T12:00:00"))
    assert len(mails(tmp_path)) == 3
    (tmp_path / "conf.yml").write_text(ai_deadlines(entry("2026-03-18 23:59:59")))
    for day in ("2026-02-20", "2026-03-12", "2026-03-18", "2026-03-19"):
        cycle(engine, cfg, at(f"{day}T12:00:00"))
    sent = mails(tmp_path)
    assert len(sent) == 7, sent  # 3 for the old date, 1 correction, 3 for the new date
    new_due = at("2026-03-19T11:59:59")
    rows = kinds(engine)
    assert sum(1 for k, due, _o, st in rows if k == "reminder" and due == new_due and st == "delivered") == 3
    assert sum(1 for k, due, _o, st in rows if k == "reminder" and due != new_due and st == "delivered") == 3
    assert sum(1 for k, *_ in rows if k == "correction") == 1


def test_moving_back_sends_no_reminder_twice(engine, tmp_path):
    """A flapping source (A → B → A) costs one correction per move, never a second reminder."""
    cfg = setup(tmp_path, entry("2026-03-18 23:59:59"), offsets=("-P7D",))
    cycle(engine, cfg, at("2026-03-12T12:00:00"))  # the -P7D reminder for 03-18 goes out
    (tmp_path / "conf.yml").write_text(ai_deadlines(entry("2026-03-25 23:59:59")))
    cycle(engine, cfg, at("2026-03-13T12:00:00"))  # correction
    (tmp_path / "conf.yml").write_text(ai_deadlines(entry("2026-03-18 23:59:59")))
    cycle(engine, cfg, at("2026-03-14T12:00:00"))  # correction; 03-18's reminder was already delivered
    for day in ("2026-03-18", "2026-03-19", "2026-03-26"):
        cycle(engine, cfg, at(f"{day}T12:00:00"))
    rows = kinds(engine)
    delivered = [(k, due) for k, due, _o, st in rows if st == "delivered"]
    assert sorted(delivered) == sorted([("reminder", at("2026-03-19T11:59:59")),
                                        ("correction", at("2026-03-26T11:59:59")),
                                        ("correction", at("2026-03-19T11:59:59"))]), rows
    assert len(mails(tmp_path)) == 3
