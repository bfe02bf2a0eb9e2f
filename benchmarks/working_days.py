"""Weekend working days: how many dates a Saturday/Sunday-only roll gets wrong, and ours none.

Some governments make a Saturday or Sunday a working day when they move a working day to bridge a
holiday (the Russian government's production calendar for 2024: Saturday 27 April worked, Monday
29 April off). The ``holidays`` library lists these days (``HolidayBase.weekend_workdays``) and
answers ``HolidayBase.is_working_day``. For five countries that have them, over every date of
2024-2027, this prints per country:

* ``weekend workdays`` — the library's weekend working days in the period;
* ``naive != library`` — dates whose ``following`` roll differs between the naive roll
  (Saturday/Sunday and the library's holidays only, the behaviour before business days came from
  the library) and the library's own (``get_nth_working_day(date, 0)``);
* ``ours != library`` — dates whose ``following`` or ``preceding`` roll by
  :func:`deadline_pipeline.plan.business_days.adjust` differs from the library's: must be 0.

Counts, not timings: a single pass, no rounds.

    python benchmarks/working_days.py            # 2024-2027
    python benchmarks/working_days.py --quick    # 2024 only

Exits 1 when ours disagrees with the library on any date. The last line is a one-line summary.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import holidays

# This checkout's code, not whichever one the environment has installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deadline_pipeline.plan.business_days import adjust, calendar, calendar_data_version  # noqa: E402

COUNTRIES = ("RU", "CN", "BY", "KZ", "UZ")  # Ukraine has suspended its transfers since 2022: none to count
SATURDAY_SUNDAY = frozenset({5, 6})


@dataclass
class Counts:
    country: str
    weekend_workdays: int
    naive_differs: int
    ours_differs: int


def naive_following(day: date, lib: holidays.HolidayBase) -> date:
    """The roll before business days came from the library: skip Saturdays, Sundays and holidays."""
    while day.weekday() in SATURDAY_SUNDAY or day in lib:
        day += timedelta(days=1)
    return day


def library_roll(day: date, lib: holidays.HolidayBase, convention: str) -> date:
    """The library's own roll: ``following`` or ``preceding`` by ``is_working_day``."""
    if convention == "following":
        return lib.get_nth_working_day(day, 0)
    return day if lib.is_working_day(day) else lib.get_nth_working_day(day, -1)


def count(country: str, days: list[date]) -> Counts:
    lib = holidays.country_holidays(country, years=range(days[0].year, days[-1].year + 1))
    ours = calendar(country)
    workdays = sum(1 for d in lib.weekend_workdays if days[0] <= d <= days[-1])
    naive = sum(1 for d in days if naive_following(d, lib) != library_roll(d, lib, "following"))
    wrong = sum(1 for d in days for conv in ("following", "preceding")
                if adjust(d, conv, ours) != library_roll(d, lib, conv))
    return Counts(country, workdays, naive, wrong)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2024 only instead of 2024-2027")
    args = parser.parse_args()
    first, last = date(2024, 1, 1), date(2024 if args.quick else 2027, 12, 31)
    days = [first + timedelta(days=i) for i in range((last - first).days + 1)]
    rows = [count(c, days) for c in COUNTRIES]
    print(f"{calendar_data_version()}, {first}..{last} ({len(days)} dates per country)")
    print(f"{'country':<8}{'weekend workdays':>18}{'naive != library':>18}{'ours != library':>17}")
    for r in rows:
        print(f"{r.country:<8}{r.weekend_workdays:>18}{r.naive_differs:>18}{r.ours_differs:>17}")
    total = Counts("total", *(sum(getattr(r, f) for r in rows)
                              for f in ("weekend_workdays", "naive_differs", "ours_differs")))
    print(f"{total.country:<8}{total.weekend_workdays:>18}{total.naive_differs:>18}{total.ours_differs:>17}")
    print(f"SUMMARY countries={','.join(COUNTRIES)} period={first.year}-{last.year} "
          f"weekend_workdays={total.weekend_workdays} naive_following_differs={total.naive_differs} "
          f"ours_disagree={total.ours_differs} (must be 0)")
    return 1 if total.ours_differs else 0


if __name__ == "__main__":
    sys.exit(main())
