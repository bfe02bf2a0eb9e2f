"""The steps of the delivery sweep's loop (``Sweep.run``) one at a time, on a real store: the pause
after a failed round, the decision to start another round, a round that finds nothing claimable while
a batch is still in flight, and the drain at the end that records every batch even after a failed
recording. The whole loop is covered end to end in ``test_delivery_sweep.py``."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from deadline_pipeline.config import MaildirChannel
from deadline_pipeline.deliver.lanes import Batch
from deadline_pipeline.deliver.sweep import FAILURE_PAUSE_CAP_SECONDS, Sweep, _failure_pause
from deadline_pipeline_tests.test_delivery_sweep import T0, FakeChannel, config, seed, states


@pytest.fixture
def make_runner(engine):
    """``make_runner(max_batches=None, **delivery)``: a :class:`Sweep` on the test store with a
    ``fake`` channel; its thread pools are shut down at the end of the test."""
    made: list[Sweep] = []

    def make(max_batches: int | None = None, **delivery) -> Sweep:
        cfg = config({"fake": MaildirChannel(type="maildir", path="/nonexistent")}, **delivery)
        runner = Sweep(engine, cfg, T0, "steps#1#r", lambda: T0, max_batches, {"fake": FakeChannel()})
        made.append(runner)
        return runner

    yield make
    for runner in made:
        runner.pool.shutdown(wait=False)
        runner.gate_pool.shutdown(wait=True)


def _claimed_batch(runner: Sweep, owner: str, at=T0) -> Batch:
    """A claimed batch (claimed as of ``at``) whose sends have ended with every alert released unsent
    (as past the budget)."""
    _rows, results = runner._claim(at, owner)
    for r in results:
        r.released = True
    sends = asyncio.get_running_loop().create_future()
    sends.set_result(None)
    return Batch(owner, results, sends)


# --------------------------------------------------------------------------- the pause after a failure


def test_failure_pause_doubles_from_one_second_up_to_the_cap():
    pause, waits = 1.0, []
    for _ in range(8):
        wait, pause = _failure_pause(pause, remaining=3600.0)
        waits.append(wait)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert FAILURE_PAUSE_CAP_SECONDS == 30.0


def test_failure_pause_never_waits_past_the_time_budget():
    # The budget ends in 2.5 s: wait that long, not the full 8 s; the next pause still doubles.
    assert _failure_pause(8.0, remaining=2.5) == (2.5, 16.0)
    # The budget is already spent (the clock moved on during the failed round): no wait at all.
    assert _failure_pause(4.0, remaining=-1.0) == (0.0, 8.0)


# --------------------------------------------------------------------------- another round or not


def test_another_round_only_within_the_budget_and_max_batches(make_runner):
    limited = make_runner(max_batches=2)
    assert limited._may_claim()
    limited.out.batches = 1
    assert limited._may_claim()
    limited.out.batches = 2
    assert not limited._may_claim(), "max_batches reached"
    unlimited = make_runner()
    unlimited.out.batches = 10_000
    assert unlimited._may_claim(), "no max_batches: only the budget ends the rounds"
    unlimited.deadline -= unlimited.d.time_budget_seconds + 1
    assert not unlimited._may_claim(), "the time budget is spent"


def test_nothing_claimable_with_a_batch_in_flight_records_it_before_the_loop_stops(engine, make_runner):
    # Due half an hour after the runner's clock (T0), claimed by the batch as of an hour later: once
    # its recording has released them they are still not due for the runner's own claims. Due at T0,
    # a recording that finished before the second round's claim made that claim take them again.
    seed(engine, 2, channel="fake", send_at=T0 + timedelta(minutes=30))
    runner = make_runner()

    async def rounds() -> list[tuple[bool, bool]]:
        runner.sending = [_claimed_batch(runner, "steps#1#r#c0.aaaaaa", at=T0 + timedelta(hours=1))]
        seen = [await runner._round()]  # nothing claimable, but a batch in flight: its recording starts
        assert runner.sending == [] and runner.pending_write is not None
        seen.append(await runner._round())  # nothing claimable; the recording is seen through
        assert runner.pending_write is None
        return seen

    assert asyncio.run(rounds()) == [(False, False), (False, True)]
    assert runner.out.released == 2 and states(engine) == {"pending": 2}


def test_a_round_with_two_batches_in_flight_finishes_one_before_claiming(engine, make_runner):
    # Not due for the runner's own claim (see the test above): the first batch's recording runs in a
    # thread beside that claim, and alerts it released in time would otherwise be claimed again.
    seed(engine, 4, channel="fake", send_at=T0 + timedelta(minutes=30))
    runner = make_runner(batch_size=2)
    later = T0 + timedelta(hours=1)

    async def one_round() -> tuple:
        runner.sending = [_claimed_batch(runner, "steps#1#r#c0.aaaaaa", at=later),
                          _claimed_batch(runner, "steps#1#r#c0.bbbbbb", at=later)]
        seen = await runner._round()
        after_round = (seen, len(runner.sending), runner.claims, runner.out.released)
        await runner._await_pending_write()
        return after_round

    # Nothing claimable is left: the round claims nothing (its claim is still counted), and both
    # batches are finished - the first recorded before the claim's round ends (never three claimed at
    # once), the second's recording started and left pending for the next round.
    assert asyncio.run(one_round()) == ((False, True), 0, 1, 2)
    assert runner.out.released == 4 and states(engine) == {"pending": 4}


# --------------------------------------------------------------------------- the drain


def test_drain_records_every_batch_after_a_failed_recording(engine, make_runner):
    seed(engine, 4, channel="fake")
    runner = make_runner(batch_size=2)

    async def drain():
        async def failed_recording():
            raise RuntimeError("recording failed: database down")

        runner.pending_write = asyncio.create_task(failed_recording())
        runner.sending = [_claimed_batch(runner, "steps#1#r#c1.aaaaaa"), _claimed_batch(runner, "steps#1#r#c2.bbbbbb")]
        return await runner._drain(None)

    last_error = asyncio.run(drain())
    assert isinstance(last_error, RuntimeError), "the sweep ends failed with the recording's error"
    assert runner.out.batch_failures == 1
    assert runner.sending == [] and runner.pending_write is None
    assert runner.out.released == 4 and states(engine) == {"pending": 4}, "both batches recorded"


def test_drain_keeps_the_rounds_error_when_every_recording_succeeds(engine, make_runner):
    seed(engine, 2, channel="fake")
    runner = make_runner()
    earlier = ConnectionError("a round failed before the budget ended")

    async def drain():
        runner.sending = [_claimed_batch(runner, "steps#1#r#c1.aaaaaa")]
        return await runner._drain(earlier)

    assert asyncio.run(drain()) is earlier
    assert runner.out.batch_failures == 0 and runner.out.released == 2
