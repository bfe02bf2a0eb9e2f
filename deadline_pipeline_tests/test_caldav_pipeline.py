"""The caldav channel end to end through the store (SQLite and PostgreSQL): configuration → planning
→ sweep → a real Radicale calendar; the deadline moves (a correction rewrites the same event with
SEQUENCE + 1) and is then withdrawn (a cancellation marks it CANCELLED); a subscriber without a
calendar is reported by planning instead of being planned silently."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from deadline_pipeline.config import load_config
from deadline_pipeline.deliver.sweep import sweep
from deadline_pipeline.store.schema import alerts, subscribers
from deadline_pipeline_tests.caldav_server import PASSWORD, USER, Radicale
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK, ics, write_config
from deadline_pipeline_tests.test_planning import T0, A, B, C, D, _ingest_plan


@pytest.fixture(scope="module")
def radicale(tmp_path_factory):
    server = Radicale(tmp_path_factory.mktemp("radicale"))
    yield server
    server.stop()


def _configure(tmp_path, events, cal_url: str):
    (tmp_path / "cal.ics").write_text(ics(*events), newline="")
    path = write_config(
        tmp_path,
        sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "timezone": "Europe/Berlin", "caldav_url": cal_url},
                     {"id": "bob", "tenant": "t", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P7D", "-P1D"], "channels": ["cal"]}],
        channels={"cal": {"type": "caldav", "username_env": "CAL_USER", "password_env": "CAL_PASS"}},
        network=LOOPBACK_NETWORK,  # Radicale listens on loopback, which the outbound guard refuses by default
    )
    return load_config(path)[0]


def test_booked_moved_and_withdrawn_deadline(engine, tmp_path, radicale, monkeypatch):
    monkeypatch.setenv("CAL_USER", USER)
    monkeypatch.setenv("CAL_PASS", PASSWORD)
    cal = radicale.make_calendar()
    cfg = _configure(tmp_path, [A, B, C, D], cal)
    out = _ingest_plan(engine, cfg, T0)
    assert any("bob has no caldav_url for channel 'cal'" in p.message for p in out.problems)
    with engine.connect() as conn:
        assert conn.execute(select(subscribers.c.caldav_url).where(subscribers.c.external_id == "ann")) \
            .scalar_one() == cal
    # A (15 Jan 12:00 Berlin) has its -P7D reminder in the past: sent at once, i.e. booked now.
    first = sweep(engine, cfg, T0)
    assert first.delivered == 1
    [ev] = radicale.events(cal)
    uid = str(ev["UID"])
    assert ev.decoded("DTSTART") == datetime(2027, 1, 15, 11, tzinfo=UTC) and int(ev["SEQUENCE"]) == 0
    assert ev.walk("VALARM")[0].decoded("TRIGGER") == timedelta(days=-7)

    cfg = _configure(tmp_path, [dict(A, dtstart="20270122T120000"), B, C, D], cal)
    assert _ingest_plan(engine, cfg, T0 + timedelta(hours=1)).corrections == 1
    assert sweep(engine, cfg, T0 + timedelta(hours=1)).delivered == 1
    [ev] = radicale.events(cal)
    assert str(ev["UID"]) == uid and int(ev["SEQUENCE"]) == 1
    assert ev.decoded("DTSTART") == datetime(2027, 1, 22, 11, tzinfo=UTC)

    cfg = _configure(tmp_path, [B, C, D], cal)
    assert _ingest_plan(engine, cfg, T0 + timedelta(hours=2)).cancellation_notices == 1
    assert sweep(engine, cfg, T0 + timedelta(hours=2)).delivered == 1
    [ev] = radicale.events(cal)
    assert str(ev["UID"]) == uid and str(ev["STATUS"]) == "CANCELLED" and int(ev["SEQUENCE"]) == 2
    with engine.connect() as conn:
        done = dict(conn.execute(select(alerts.c.kind, alerts.c.provider_message_id)
                                 .where(alerts.c.status == "delivered")).all())
    assert done["correction"] == "corrected 1 of 1 event(s)" and done["cancellation"] == "cancelled 1 of 1 event(s)"
