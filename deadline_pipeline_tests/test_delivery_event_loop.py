"""The sweep's event loop (``delivery.event_loop``): uvloop by default, the standard library's loop
when configured, and a loud fallback to it when uvloop cannot be imported; every sweep process
(``delivery.processes``) runs on the configured loop and the outcome names it.

The loop is observed from inside the sweep: a channel whose ``send_async`` records the class of the
running loop.
"""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from deadline_pipeline.config import DeadlinesConfig, WebhookChannel
from deadline_pipeline.deliver.notification import SendResult
from deadline_pipeline.deliver.sweep import sweep
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK
from deadline_pipeline_tests.test_delivery_sweep import T0, receiver, seed, states  # noqa: F401 (fixture)

OWNER = "test#1#loop"


class LoopRecordingChannel:
    """A channel that sends nothing and records the module of the event loop each send ran on."""

    name = "fake"
    idempotency_class = None

    def __init__(self) -> None:
        self.loops: set[str] = set()

    async def send_async(self, n) -> SendResult:
        self.loops.add(type(asyncio.get_running_loop()).__module__.split(".")[0])
        return SendResult(provider_message_id="ok")

    def send(self, n) -> SendResult:  # pragma: no cover - the sweep prefers send_async
        raise AssertionError("the sweep must use send_async")

    def close(self) -> None:
        pass


def _config(**delivery) -> DeadlinesConfig:
    return DeadlinesConfig(network=LOOPBACK_NETWORK, delivery={"batch_size": 10, **delivery})


def test_the_sweep_runs_on_uvloop_by_default(engine):
    seed(engine, 25, channel="fake")
    ch = LoopRecordingChannel()
    out = sweep(engine, _config(), T0, owner=OWNER, channels={"fake": ch})
    assert ch.loops == {"uvloop"}
    assert out.event_loop == "uvloop" and out.delivered == 25


def test_the_standard_loop_when_configured(engine):
    seed(engine, 5, channel="fake")
    ch = LoopRecordingChannel()
    out = sweep(engine, _config(event_loop="asyncio"), T0, owner=OWNER, channels={"fake": ch})
    assert ch.loops == {"asyncio"}
    assert out.event_loop == "asyncio" and out.delivered == 5


def test_uvloop_missing_falls_back_to_the_standard_loop_loudly(engine, monkeypatch, caplog):
    # A None entry makes `import uvloop` raise ImportError, as on a platform without it.
    monkeypatch.setitem(sys.modules, "uvloop", None)
    caplog.set_level(logging.WARNING, logger="deadline_pipeline.deliver.sweep")
    seed(engine, 5, channel="fake")
    ch = LoopRecordingChannel()
    out = sweep(engine, _config(), T0, owner=OWNER, channels={"fake": ch})
    assert ch.loops == {"asyncio"} and out.event_loop == "asyncio" and out.delivered == 5
    assert any("delivery.event_loop is uvloop, but it cannot be imported" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)


def test_an_unknown_event_loop_is_refused_by_the_configuration():
    with pytest.raises(ValueError, match="event_loop"):
        _config(event_loop="trio")


def test_every_worker_process_runs_on_the_configured_loop(pg_url, receiver):  # noqa: F811 (fixture)
    """Two processes on PostgreSQL, real webhook sends: the merged outcome names the one loop all used."""
    from deadline_pipeline.store.db import make_engine, upgrade

    server, base = receiver
    engine = make_engine(pg_url)
    upgrade(engine)
    try:
        for loop in ("uvloop", "asyncio"):
            seed(engine, 40, webhook_url=f"{base}/ok")
            cfg = DeadlinesConfig(network=LOOPBACK_NETWORK,
                                  channels={"hook": WebhookChannel(type="webhook", timeout_seconds=30)},
                                  delivery={"processes": 2, "batch_size": 5, "event_loop": loop})
            out = sweep(engine, cfg, T0, owner=OWNER)
            assert out.processes == 2 and out.event_loop == loop, out
        assert states(engine) == {"delivered": 80}
    finally:
        engine.dispose()
