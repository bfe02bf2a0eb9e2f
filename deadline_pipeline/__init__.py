"""deadline_pipeline: ingest dates, plan obligations, deliver reminders, never miss one silently.

Importing the package fixes the time-zone database of the process (:mod:`deadline_pipeline.zone_data`)
before any zone is read, so the planner, the sweeper, the watchdog and a Celery worker compute
instants with the same rules whatever the machine's zoneinfo folder holds.
"""

from deadline_pipeline import zone_data as _zone_data

try:
    _zone_data.activate()
except _zone_data.ZoneDataError as _exc:
    # A setting that cannot be honoured must stop the process at start, not plan with another
    # database; exit 2, the code of every other bad input.
    import sys as _sys

    print(f"deadline-pipeline: {_exc}", file=_sys.stderr)
    raise SystemExit(2) from None
