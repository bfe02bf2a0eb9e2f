"""Booking at most once across process deaths: sweep processes on PostgreSQL book alerts into a real
Radicale calendar and are SIGKILLed right after a PUT landed and before its result was recorded.
Later sweeps find the dead senders' unfinished attempts after their lease expired and ask the server
(GET on the UID) instead of booking blindly or escalating: the calendar ends with exactly one event
per alert and no alert is escalated.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections import Counter
from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, select, update

from deadline_pipeline.config import CaldavChannel, DeadlinesConfig
from deadline_pipeline.deliver.channels.caldav import CaldavSender
from deadline_pipeline.deliver.sweep import sweep
from deadline_pipeline.store.db import make_engine, upgrade
from deadline_pipeline.store.schema import alerts, delivery_attempts, subscribers
from deadline_pipeline_tests.caldav_server import PASSWORD, USER, Radicale
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK, loopback_policy
from deadline_pipeline_tests.test_delivery_sweep import T0, expire_leases, seed

LEASE = 60


def _config(batch_size: int) -> DeadlinesConfig:
    return DeadlinesConfig(
        channels={"cal": CaldavChannel(type="caldav", username_env="CAL_USER", password_env="CAL_PASS",
                                       timeout_seconds=5, max_concurrency=4)},
        delivery={"batch_size": batch_size, "lease_seconds": LEASE, "time_budget_seconds": LEASE - 10},
        network=LOOPBACK_NETWORK)  # Radicale listens on loopback, which the outbound guard refuses by default


class _StopAfterPut(CaldavSender):
    """The real channel; after its ``kill_after``-th booking PUT has returned (and before the sweep
    can record it) it tells the test, which SIGKILLs this process, and waits."""

    def __init__(self, kill_after: int, landed) -> None:
        super().__init__("cal", _config(1).channels["cal"], network=loopback_policy())
        self.kill_after, self.landed, self.count = kill_after, landed, 0

    def _book(self, n):
        result = super()._book(n)
        self.count += 1
        if self.count == self.kill_after:
            self.landed.set()
            time.sleep(120)  # the SIGKILL arrives here
        return result


def _sweeper(url: str, now_iso: str, batch_size: int, kill_after: int, landed) -> None:
    """Child process: one sweep with its own engine and the stopping channel."""
    os.environ["CAL_USER"], os.environ["CAL_PASS"] = USER, PASSWORD
    engine = make_engine(url)
    sweep(engine, _config(batch_size), datetime.fromisoformat(now_iso),
          channels={"cal": _StopAfterPut(kill_after, landed)})
    engine.dispose()


@pytest.fixture
def radicale(tmp_path):
    server = Radicale(tmp_path / "radicale")
    yield server
    server.stop()


def _seed_calendar(engine, radicale, n: int) -> tuple[list[int], str]:
    ids = seed(engine, n, channel="cal")
    cal = radicale.make_calendar()
    with engine.begin() as conn:
        conn.execute(update(subscribers).values(caldav_url=cal))
    return ids, cal


def _kill_after_put(ctx, pg_url: str, now: datetime, batch_size: int, kill_after: int) -> None:
    landed = ctx.Event()
    proc = ctx.Process(target=_sweeper, args=(pg_url, now.isoformat(), batch_size, kill_after, landed))
    proc.start()
    assert landed.wait(120), "the sweeper booked an event"
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL


def _lookup_figures(engine) -> dict[str, int]:
    with engine.connect() as conn:
        unknown = set(conn.execute(select(delivery_attempts.c.alert_id)
                                   .where(delivery_attempts.c.outcome == "unknown")).scalars())
        pmid = dict(conn.execute(select(alerts.c.id, alerts.c.provider_message_id)).all())
    return {"unknown_alerts": len(unknown),
            "found_by_lookup": sum(1 for a in unknown if (pmid[a] or "").startswith("found by lookup")),
            "absent_then_booked": sum(1 for a in unknown if (pmid[a] or "").startswith("booked"))}


def test_kill_between_put_and_recording_is_resolved_by_lookup(pg_url, radicale, monkeypatch):
    engine = make_engine(pg_url)
    upgrade(engine)
    [a], cal = _seed_calendar(engine, radicale, 1)
    _kill_after_put(multiprocessing.get_context("spawn"), pg_url, T0, 1, 1)
    assert len(radicale.events(cal)) == 1, "the PUT landed"
    with engine.connect() as conn:
        assert conn.execute(select(alerts.c.status).where(alerts.c.id == a)).scalar_one() == "claimed"
    monkeypatch.setenv("CAL_USER", USER)
    monkeypatch.setenv("CAL_PASS", PASSWORD)
    expire_leases(engine)  # leases run on the database clock, which the test does not advance
    out = sweep(engine, _config(1), T0 + timedelta(seconds=LEASE + 1))
    assert (out.recovered_unknown, out.unknown_found, out.unknown_absent, out.delivered) == (1, 1, 0, 1)
    assert len(radicale.events(cal)) == 1, "not booked twice"
    with engine.connect() as conn:
        status, pmid = conn.execute(select(alerts.c.status, alerts.c.provider_message_id)
                                    .where(alerts.c.id == a)).one()
    assert status == "delivered" and pmid.startswith('found by lookup, ETag "')
    engine.dispose()


def test_ten_sigkills_leave_exactly_one_event_per_alert(pg_url, radicale, monkeypatch):
    engine = make_engine(pg_url)
    upgrade(engine)
    n, batch, kills = 60, 6, 10
    ids, cal = _seed_calendar(engine, radicale, n)
    ctx = multiprocessing.get_context("spawn")
    rng = random.Random(2027)
    now = T0
    for _ in range(kills):
        # Each sweeper starts after the previous one's lease expired, so it inherits the killed batch.
        _kill_after_put(ctx, pg_url, now, batch, rng.randint(1, batch))
        expire_leases(engine)  # leases run on the database clock, which the test does not advance
        now += timedelta(seconds=LEASE + 1)
    monkeypatch.setenv("CAL_USER", USER)
    monkeypatch.setenv("CAL_PASS", PASSWORD)
    final = sweep(engine, _config(batch), now)
    events = radicale.events(cal)
    with engine.connect() as conn:
        keys = set(conn.execute(select(alerts.c.dedup_key)).scalars())
        states = dict(conn.execute(select(alerts.c.status, func.count()).group_by(alerts.c.status)).all())
    uids = Counter(str(e["UID"]) for e in events)
    figures = {"kills": kills, "alerts": n, "events_on_server": len(events),
               "duplicates": sum(c - 1 for c in uids.values()), **_lookup_figures(engine),
               "final_sweep_found": final.unknown_found}
    print("booking fault matrix:", figures)
    assert states == {"delivered": n}, states
    assert len(events) == n and figures["duplicates"] == 0
    assert set(uids) == {f"{k}@deadline-pipeline" for k in keys}, "one event per alert, none foreign"
    # Every kill came right after a PUT that was never recorded: each left one alert for a lookup.
    assert figures["found_by_lookup"] >= kills
    engine.dispose()
