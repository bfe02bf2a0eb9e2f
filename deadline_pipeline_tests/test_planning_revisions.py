"""The real 2020 revisions of the paperswithcode ai-deadlines feed, replayed in order through ingest
and planning, on SQLite and PostgreSQL: exactly the deadlines that moved are moved, a delivered
reminder gets exactly one correction, and replaying a revision changes nothing."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime

from sqlalchemy import select, update

from deadline_pipeline.config import load_config
from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.plan.service import plan_all
from deadline_pipeline.store.schema import alerts, obligations
from deadline_pipeline_tests.factories import write_config

UTC = UTC

# (rule id, old due instant, new due instant), read off the three published files by hand:
# e.g. uai20 was 2020-02-20 23:59:59 America/New_York and became 23:59:59 UTC+1 (six hours earlier).
MOVED = {
    "2020-01-28": [],
    "2020-02-19": [
        ("eccv20/submission/deadline", "2020-03-05T07:00:00+00:00", "2020-03-05T23:59:00+00:00"),
        ("miccai2020/submission/deadline", "2020-03-04T07:59:59+00:00", "2020-03-18T06:59:59+00:00"),
        ("uai20/submission/deadline", "2020-02-21T04:59:59+00:00", "2020-02-20T22:59:59+00:00"),
    ],
    "2020-04-17": [
        ("coling20/submission/deadline", "2020-04-09T11:59:59+00:00", "2020-07-02T11:59:59+00:00"),
        ("emnlp20/submission/deadline", "2020-05-12T11:59:00+00:00", "2020-06-02T11:59:00+00:00"),
        ("interspeech20/submission/deadline", "2020-03-30T11:59:59+00:00", "2020-05-09T11:59:59+00:00"),
        ("mm20/submission/deadline", "2020-03-29T11:59:00+00:00", "2020-04-26T11:59:00+00:00"),
        ("neurips20/abstract/abstract_deadline", "2020-05-05T20:00:00+00:00", "2020-05-27T20:00:00+00:00"),
        ("neurips20/submission/deadline", "2020-05-12T20:00:00+00:00", "2020-06-03T20:00:00+00:00"),
    ],
}
# 2020-04-17: ten new deadlines ahead, and ismir20's abstract deadline (due 2020-04-11T11:59:59Z),
# first seen already past. This replay fetches only at the revision dates, so nothing fetched the
# source within its 1-day freshness window before that deadline: it is judged missed while unwatched
# and gets the obligation whose reminder the sweep escalates (plan.first_seen). Fetched daily,
# the same history is a late publication and pages nobody (test_first_seen_passed).
ADDED_COUNT = {"2020-01-28": 16, "2020-02-19": 7, "2020-04-17": 11}
MISSED_WHILE_UNWATCHED = {"2020-01-28": 0, "2020-02-19": 0, "2020-04-17": 1}
# Only uai20 had a reminder delivered (its 30-day reminder, sent late on 28 January) before it moved.
CORRECTED = {"2020-01-28": [], "2020-02-19": ["uai20/submission/deadline"], "2020-04-17": []}


def _due(engine):
    with engine.connect() as conn:
        return {r[0]: r[1].isoformat() for r in conn.execute(select(obligations.c.rule_id, obligations.c.due_at))}


def _non_reminders(engine):
    with engine.connect() as conn:
        return sorted(conn.execute(
            select(obligations.c.rule_id, alerts.c.kind, alerts.c.previous_due_at)
            .join(obligations, obligations.c.id == alerts.c.obligation_id).where(alerts.c.kind != "reminder")
        ).all())


def test_pwc_revisions_replayed_in_order(shared_dir, engine, tmp_path):
    revisions = sorted((shared_dir / "data" / "ai-deadlines-pwc" / "revisions").glob("conferences.*.yml"),
                       key=lambda p: p.name.split(".")[2])
    assert [p.name.split(".")[2] for p in revisions] == list(MOVED)
    corrected_so_far: list[str] = []
    for rev in revisions:
        date = rev.name.split(".")[2]
        now = datetime.fromisoformat(date).replace(tzinfo=UTC)
        shutil.copy(rev, tmp_path / "conferences.yml")
        cfg = load_config(write_config(
            tmp_path, sources=[{"name": "pwc", "format": "ai-deadlines", "location": "conferences.yml",
                                "tenant": "t"}],
            subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
            subscriptions=[{"name": "s", "sources": ["pwc"], "offsets": ["-P30D", "-P7D", "-P1D"],
                            "channels": ["mail"]}],
            channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
        ))[0]
        before = _due(engine)
        for replay in range(2):
            for src in cfg.sources:
                fetch_snapshot(engine, src, now)
                apply_latest_snapshot(engine, src, now)
            out = plan_all(engine, cfg, now)
            assert out.missed_while_unwatched == (0 if replay else MISSED_WHILE_UNWATCHED[date]), date
            if replay:
                # The same revision again: nothing moves, nothing is written, no second correction.
                assert (out.obligations_inserted, out.obligations_moved, out.obligations_updated,
                        out.alerts_written, out.corrections) == (0, 0, 0, 0, 0), date
        after = _due(engine)
        moved = sorted((k, before[k], after[k]) for k in before if k in after and before[k] != after[k])
        assert moved == MOVED[date], date
        assert len(set(after) - set(before)) == ADDED_COUNT[date], date
        corrected_so_far += CORRECTED[date]
        assert [r[0] for r in _non_reminders(engine)] == sorted(corrected_so_far), date
        # Everything due by now goes out before the next revision arrives.
        with engine.begin() as conn:
            conn.execute(update(alerts).where(alerts.c.status == "pending", alerts.c.send_at <= now)
                         .values(status="delivered", delivered_at=now))
    (uai,) = _non_reminders(engine)
    assert uai[1] == "correction" and uai[2] == datetime(2020, 2, 21, 4, 59, 59, tzinfo=UTC)
