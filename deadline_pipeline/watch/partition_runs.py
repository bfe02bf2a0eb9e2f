"""Which partitions of a partitioned job are failing: those whose latest finished run failed and
that no later finished run covered.

Judging a partitioned job by its latest finished run alone missed failed months: the run for March
fails, the run for April succeeds a moment later, and March stays unplanned with nobody paged until
a run covering March happens to succeed. Each run covers a *scope*: one partition, a range of
partitions (a single-run backfill, the hourly horizon run) or, with no partition at all, the whole
job. A partition is failing when the newest finished run whose scope holds it failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

# The label of a failed run that named no partition: it covered (and failed for) the whole job.
WHOLE_JOB = "every partition"


@dataclass(frozen=True)
class FinishedRun:
    """A finished run of one job: ``run_id``; ``failed`` (False for a success or a cancellation);
    ``scope``: ``(first, last)`` partition keys it ran, both included (``first == last`` for one
    partition), or ``None`` when it named no partition (the whole job)."""

    run_id: str
    failed: bool
    scope: tuple[str, str] | None


def failed_partitions(failures: Sequence[FinishedRun], runs: Iterable[FinishedRun],
                      keys_of: Callable[[tuple[str, str]], Sequence[str]]) -> dict[str, str]:
    """Failing partition key → id of the latest finished run holding it, which failed.

    ``runs``: the job's finished runs, newest first (read lazily: reading ends as soon as no
    failure still to come can change the answer). ``failures``: the failed ones among them, newest
    first. ``keys_of``: the partition keys of a ``(first, last)`` scope, in order. A failed run
    without a scope is reported under :data:`WHOLE_JOB` unless a newer finished run covered the
    whole job; it covers every older run."""
    covered: set[str] = set()
    failing: dict[str, str] = {}
    # The failures not reached yet and what each could still report: once none could, older runs
    # change nothing and the rest of the history is not read.
    ahead = {f.run_id: (None if f.scope is None else set(keys_of(f.scope))) for f in failures}
    if not ahead:
        return failing
    for run in runs:
        if run.scope is None:
            if run.failed:
                failing[WHOLE_JOB] = run.run_id
            break  # every older run is covered by this one
        keys = keys_of(run.scope)
        if run.failed:
            ahead.pop(run.run_id, None)
            for key in keys:
                if key not in covered:
                    failing[key] = run.run_id
        covered.update(keys)
        ahead = {rid: rest for rid, rest in ahead.items() if rest is None or not rest <= covered}
        if not ahead:
            break
    return failing
