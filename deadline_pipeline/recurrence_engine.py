"""The library that expands recurrence rules (RRULE, RDATE, EXDATE) into dates: python-dateutil,
named by its version so each obligation a recurrence decided says which expansion planned it.

Why: an upgrade of python-dateutil that expands a rule differently (a fixed BYSETPOS or BYWEEKNO
edge, an RDATE/EXDATE matching change) moves deadlines like a zone-data or holiday-calendar upgrade
does, and the correction a subscriber received named no cause. The version is recorded beside the
zone data and the calendar release on every obligation whose instant an expansion decided, and a
move under a new version with nothing else changed is named in the correction
(``plan.notices.time_data_cause``).
"""

from __future__ import annotations

# The distribution name, as ``pip`` and ``importlib.metadata`` know it.
DISTRIBUTION = "python-dateutil"


def recurrence_engine_version() -> str:
    """Which expansion engine planning uses: ``"python-dateutil 2.9.0.post0"``.

    The distribution name and ``dateutil.__version__``: the version of the module this process has
    imported, which is the code that expanded. The installed distribution's metadata
    (``importlib.metadata``) would name a package upgraded under a running process that still
    expands with the old module."""
    import dateutil

    return f"{DISTRIBUTION} {dateutil.__version__}"
