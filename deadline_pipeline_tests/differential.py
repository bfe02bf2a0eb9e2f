"""Differential expansion: our ``occurrences --ics`` path next to ``recurring-ical-events``.

Both sides read the same bytes and answer the same question — which (UID, due instant) pairs fall in
one fixed window, and how often each — and :func:`compare` reports what only one side has. Pairs are
counted, not collected in a set: a pair one side yields twice and the other once is a difference (a
gap that maps two local occurrences onto one instant yields two reminders for one deadline). The
reference is an
independent implementation (its own RRULE/RDATE/EXDATE/RECURRENCE-ID handling on top of
``icalendar``), so agreement means our parser, override folding, zone handling and DST policy give
the instants another engine gives.

Shared conventions (so that a difference is a real one):

* due instant: a VEVENT's DTSTART, a VTODO's DUE (else DTSTART); an all-day date is due at 23:59:59
  local; floating times and dates are read in the calendar's X-WR-TIMEZONE, else in UTC;
* window: :data:`WINDOW` (inclusive), applied to the due instant on both sides;
* cancelled: an occurrence whose component says ``STATUS:CANCELLED`` is not due (the reference
  lists it, with that status; we never plan it);
* completed: a to-do occurrence whose component says ``STATUS:COMPLETED`` is not due either (the
  reference lists it, with that status; we withdraw it).

Run as a script to print a per-file summary::

    python -m deadline_pipeline_tests.differential [FILE...]
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, tzinfo
from pathlib import Path

WINDOW = (datetime(2000, 1, 1, tzinfo=UTC), datetime(2031, 1, 1, tzinfo=UTC))
END_OF_DAY = time(23, 59, 59)

Pair = tuple[str, str]  # (UID or "", due instant as ISO …Z)


@dataclass
class Outcome:
    """Each side's pairs with how often it yields each (empty on that side's error)."""

    ours: Counter[Pair] = field(default_factory=Counter)
    reference: Counter[Pair] = field(default_factory=Counter)
    ours_error: str | None = None
    reference_error: str | None = None

    @property
    def only_ours(self) -> list[Pair]:
        """The pairs ours yields more often than the reference, each as many times as it is extra, sorted."""
        return sorted((self.ours - self.reference).elements())

    @property
    def only_reference(self) -> list[Pair]:
        """The pairs the reference yields more often than ours, each as many times as it is extra, sorted."""
        return sorted((self.reference - self.ours).elements())

    @property
    def identical(self) -> bool:
        return not self.only_ours and not self.only_reference


def _iso(instant: datetime) -> str:
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _floating_zone(cal) -> tzinfo:
    from deadline_pipeline.timezones import UnknownTimeZone, resolve_zone

    name = cal.get("X-WR-TIMEZONE")
    if name is not None:
        try:
            return resolve_zone(str(name).strip())
        except UnknownTimeZone:
            pass
    return UTC


def ours(content: bytes, window: tuple[datetime, datetime] = WINDOW) -> Counter[Pair]:
    """Pairs as ``deadline-pipeline occurrences --ics FILE --tz UTC`` computes them, counted."""
    from deadline_pipeline.ingest.parsers.ics import parse_ics
    from deadline_pipeline.plan.occurrences import expand
    from deadline_pipeline.plan.recurrence import apply_overrides
    from deadline_pipeline.timezones import resolve_zone

    result = parse_ics(content, source="differential", default_tz="UTC")
    out: Counter[Pair] = Counter()
    lo, hi = window
    for rule in apply_overrides(result.rules):
        zone = resolve_zone(rule.tz) if rule.tz else UTC
        uid = str((rule.extra or {}).get("uid") or "")
        for occ in expand(rule, zone, after=lo, before=hi, strict=False):
            out[uid, _iso(occ.due_at)] += 1
    return out


def reference(content: bytes, window: tuple[datetime, datetime] = WINDOW) -> Counter[Pair]:
    """Pairs as ``recurring-ical-events`` computes them (X-WR-TIMEZONE applied by ``x-wr-timezone``),
    counted."""
    import icalendar
    import recurring_ical_events
    import x_wr_timezone

    from deadline_pipeline.ingest.parsers.ics_library import own_zones

    # Read in its own VTIMEZONEs only, as ours is: the library's process-wide cache of them would give
    # a file without a VTIMEZONE the definition another file of the corpus gave its TZID, and the
    # reference's reading would depend on the order the files are read in.
    with warnings.catch_warnings(), own_zones():
        warnings.simplefilter("ignore")
        cal = icalendar.Calendar.from_ical(content)
    floating = _floating_zone(cal)
    cal = x_wr_timezone.to_standard(cal)
    lo, hi = window
    out: Counter[Pair] = Counter()
    query = recurring_ical_events.of(cal, components=["VEVENT", "VTODO"])
    # Widened by a day each side: the library selects by overlap, we select by due instant below.
    for comp in query.between(lo.replace(year=lo.year - 1), hi.replace(year=hi.year + 1)):
        status = str(comp.get("STATUS") or "").strip().upper()
        if status == "CANCELLED" or (status == "COMPLETED" and comp.name == "VTODO"):
            continue
        prop = comp.get("DUE") if comp.name == "VTODO" and comp.get("DUE") is not None else comp.get("DTSTART")
        if prop is None:
            continue
        value = prop.dt
        if isinstance(value, datetime):
            instant = value if value.tzinfo is not None else value.replace(tzinfo=floating)
        elif isinstance(value, date):
            instant = datetime.combine(value, END_OF_DAY).replace(tzinfo=floating)
        else:
            continue
        if lo <= instant <= hi:
            out[str(comp.get("UID") or ""), _iso(instant)] += 1
    return out


def compare(content: bytes, window: tuple[datetime, datetime] = WINDOW) -> Outcome:
    """Both sides for one payload; an exception on a side is recorded as that side's error (no pairs)."""
    outcome = Outcome()
    try:
        outcome.ours = ours(content, window)
    except Exception as exc:  # noqa: BLE001 — a refusal is an outcome to compare, not a crash
        outcome.ours_error = f"{exc.__class__.__name__}: {exc}"
    try:
        outcome.reference = reference(content, window)
    except Exception as exc:  # noqa: BLE001
        outcome.reference_error = f"{exc.__class__.__name__}: {exc}"
    return outcome


def corpus(shared: Path, repo_root: Path) -> list[tuple[str, Path]]:
    """``(name, path)`` of every .ics under the shared icalendar-tests folder, the shared bug-report
    cases and the repo's own fixtures."""
    files = [(f"icalendar-tests/{p.relative_to(shared / 'data' / 'icalendar-tests')}", p)
             for p in sorted((shared / "data" / "icalendar-tests").rglob("*.ics"))]
    files += [(f"cases/{p.name}", p) for p in sorted((shared / "cases" / "calendar-and-yaml").glob("*.ics"))]
    files += [(f"repo/{p.relative_to(repo_root)}", p) for p in sorted(repo_root.rglob("*.ics"))
              if ".git" not in p.parts and ".venv" not in p.parts]
    return files


def main(argv: list[str]) -> int:
    import os

    repo = Path(__file__).resolve().parents[1]
    shared = Path(os.environ.get("DEADLINE_SHARED_DIR", repo.parent / "shared"))
    files = [(a, Path(a)) for a in argv] or corpus(shared, repo)
    identical = differing = 0
    for name, path in files:
        o = compare(path.read_bytes())
        if o.identical:
            identical += 1
            continue
        differing += 1
        print(f"{name}: ours={o.ours.total()} ref={o.reference.total()} only_ours={o.only_ours[:4]} "
              f"only_ref={o.only_reference[:4]} ours_err={o.ours_error} ref_err={o.reference_error}")
    print(f"files={len(files)} identical={identical} differing={differing}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
