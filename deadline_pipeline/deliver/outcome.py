"""What one delivery sweep did: its counts (:class:`SweepOutcome`) and the ``deliver`` heartbeat's
outcome and detail written from them. Pure data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SweepOutcome:
    """Counts of one sweep run.

    ``lateness_seconds``: per delivered alert, sent time minus ``send_at`` in seconds.
    ``released``: claimed but given back unsent (budget or lease ran out before their turn).
    ``recovered_unknown``: alerts found with an unfinished attempt of a previous holder (a dead
    sender, or this sweep's own earlier claim whose lease expired).
    ``retry_after_capped``: failures whose ``Retry-After`` exceeded ``delivery.retry_after_cap_seconds``.
    ``results_unstorable``: alerts whose result could not be stored as reported and was recorded as
    their own failure (or sanitised) instead of failing the batch.
    ``unknown_found`` / ``unknown_absent``: of those on booking channels, the ones the provider lookup
    found booked (recorded delivered, not resent) / proved absent (booked again with the same key).
    ``escalation_notices`` / ``escalation_notice_failures``: notices sent to escalation channels /
    notices that failed or were not tried because their channel had failed
    :data:`~deadline_pipeline.deliver.sweep.ESCALATION_NOTICE_BREAKER` times in a row in this sweep.
    ``batch_failures``: batches that failed as a whole (database or bookkeeping error), plus worker
    processes that ended without a result.
    ``processes``: how many processes swept (``delivery.processes``; 1 on SQLite).
    ``event_loop``: the event loop the sweep ran on, ``"uvloop"`` or ``"asyncio"`` (``"asyncio"``
    where ``delivery.event_loop`` is uvloop but uvloop cannot be imported, a fallback that is logged).
    """

    claimed: int = 0
    delivered: int = 0
    failed: int = 0
    escalated: int = 0
    lease_lost: int = 0
    released: int = 0
    recovered_unknown: int = 0
    unknown_found: int = 0
    unknown_absent: int = 0
    batches: int = 0
    batch_failures: int = 0
    escalation_notices: int = 0
    escalation_notice_failures: int = 0
    retry_after_capped: int = 0
    results_unstorable: int = 0
    processes: int = 1
    event_loop: str = "asyncio"
    lateness_seconds: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def sweep_beat_outcome(out: SweepOutcome) -> str:
    """The ``deliver`` heartbeat's outcome: ``notices_failed`` when an escalation notice could not be
    sent (the on-call may not know of an escalated alert: the outcome an operator must see first),
    else ``escalations`` when alerts were escalated, else ``ok``. Readers treat only ``crashed``
    (and, for planning, ``partial``) specially; any other value is shown as written."""
    if out.escalation_notice_failures:
        return "notices_failed"
    return "escalations" if out.escalated else "ok"


def sweep_beat_detail(out: SweepOutcome) -> str:
    """The ``deliver`` heartbeat's detail: ``"delivered 3, failed 0, escalated 2, released 0,
    recovered unknown 0"``, plus ``", escalation notices not sent 2 of 2"`` when notices failed or
    were skipped (``ESCALATION_NOTICE_BREAKER``)."""
    text = (f"delivered {out.delivered}, failed {out.failed}, escalated {out.escalated}, "
            f"released {out.released}, recovered unknown {out.recovered_unknown}")
    if out.escalation_notice_failures:
        tried = out.escalation_notices + out.escalation_notice_failures
        text += f", escalation notices not sent {out.escalation_notice_failures} of {tried}"
    return text
