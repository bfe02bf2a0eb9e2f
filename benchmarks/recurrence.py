"""Expansion throughput: our ``expand`` next to plain python-dateutil on the same rules, in one run.

A mix of rules as deadline feeds carry them (yearly tax dates, monthly and weekly reminders, the
last business day of a month, daily check-ins, some with EXDATEs or a COUNT/UNTIL, DTSTARTs in past
years, a dozen zones) is expanded over the 366-day planning horizon. Plain dateutil means
``rrulestr`` + ``rruleset`` for the EXDATEs + ``between`` + the conversion of each local time to UTC —
the least that yields the same instants, without our validation, UNTIL normalisation, DST policy
or period labels. Goal: ours costs at most 1.3× plain dateutil.

    python benchmarks/recurrence.py            # 10,000 rules
    python benchmarks/recurrence.py --quick    # 1,000 rules, under a minute

Both run interleaved in rounds (``benchmarks/rounds.py``): median and min-max of occurrences per
CPU second, the cost ratio of the medians, a summary line, and one line of JSON last.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dateutil.rrule import rruleset, rrulestr

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rounds import MIN_ROUNDS, goal_line, json_line, ratio, run_rounds, table  # noqa: E402

from deadline_pipeline.plan.occurrences import expand, window  # noqa: E402
from deadline_pipeline.rules import RuleRecord, parse_local  # noqa: E402
from deadline_pipeline.timezones import resolve_zone  # noqa: E402

ZONES = ["America/New_York", "Europe/London", "Europe/Berlin", "Australia/Sydney", "America/Santiago",
         "Asia/Tehran", "Asia/Kolkata", "America/Los_Angeles", "Pacific/Auckland", "UTC", "AoE", "Asia/Tokyo"]
PATTERNS = [
    (30, "FREQ=YEARLY;BYMONTH={m};BYMONTHDAY={d}"),
    (20, "FREQ=MONTHLY;BYMONTHDAY={d}"),
    (15, "FREQ=WEEKLY;BYDAY=MO,TH"),
    (10, "FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1"),
    (10, "FREQ=DAILY"),
    (5, "FREQ=MONTHLY;INTERVAL=3;BYMONTHDAY=15;COUNT=40"),
    (5, "FREQ=WEEKLY;INTERVAL=2;UNTIL={until}"),
    (5, "FREQ=MONTHLY;BYDAY=3MO"),
]


def make_rules(n: int, now: datetime, seed: int = 7) -> list[RuleRecord]:
    rng = random.Random(seed)
    weights = [w for w, _ in PATTERNS]
    rules = []
    for i in range(n):
        _w, pattern = rng.choices(PATTERNS, weights)[0]
        start = datetime(rng.randint(now.year - 3, now.year), rng.randint(1, 12), rng.randint(1, 28),
                         rng.choice([0, 9, 12, 17, 23]), rng.choice([0, 30, 59]))
        until = (now + timedelta(days=rng.randint(30, 500))).strftime("%Y%m%dT%H%M%SZ")
        text = pattern.format(m=rng.randint(1, 12), d=rng.randint(1, 28), until=until)
        all_day = rng.random() < 0.3
        exdates = ()
        if rng.random() < 0.2:  # some series skip an occurrence (a date for an all-day series)
            skipped = start + timedelta(days=7 * rng.randint(1, 150))
            exdates = (skipped.date().isoformat() if all_day else skipped.isoformat(),)
        rules.append(RuleRecord(f"r{i}", "t", start.date().isoformat() if all_day else start.isoformat(),
                                rng.choice(ZONES), text, exdates))
    return rules


def ours(rules: list[RuleRecord], lo: datetime, hi: datetime) -> int:
    total = 0
    for rule in rules:
        total += len(expand(rule, resolve_zone(rule.tz), after=lo, before=hi))
    return total


def plain_dateutil(rules: list[RuleRecord], lo: datetime, hi: datetime) -> int:
    total = 0
    for rule in rules:
        zone = resolve_zone(rule.tz)
        start = rule.start_local()
        text = rule.rrule
        if "UNTIL=" in text:  # dateutil needs UNTIL in DTSTART's (naive) frame
            head, _, value = text.partition("UNTIL=")
            local = datetime.strptime(value[:16], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).astimezone(zone)
            text = head + "UNTIL=" + local.strftime("%Y%m%dT%H%M%S") + value[16:]
        rs = rruleset()
        rs.rrule(rrulestr(text, dtstart=start))
        for x in rule.exdates:
            rs.exdate(parse_local(x))  # a date means 23:59:59, the time an all-day series has
        a = lo.astimezone(zone).replace(tzinfo=None)
        b = hi.astimezone(zone).replace(tzinfo=None)
        total += len([d.replace(tzinfo=zone).astimezone(UTC) for d in rs.between(a, b, inc=True)])
    return total


def timed(fn, rules, lo, hi) -> tuple[float, int]:
    # CPU time of this process: the machine is shared, and wall time would charge other processes'
    # bursts to whichever side happened to run during them.
    t0 = time.process_time()
    count = fn(rules, lo, hi)
    return time.process_time() - t0, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 rules instead of 10,000 (under a minute)")
    parser.add_argument("--rules", type=int, help="number of rules (overrides --quick)")
    parser.add_argument("--rounds", type=int, default=5, help=f"rounds (at least {MIN_ROUNDS}; default 5)")
    args = parser.parse_args()
    n = args.rules or (1_000 if args.quick else 10_000)
    now = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    lo, hi = window(now)
    rules = make_rules(n, now)
    ours(rules[:50], lo, hi)  # warm caches (zone resolution) for both sides alike
    plain_dateutil(rules[:50], lo, hi)
    counts: dict[str, int] = {}

    def contender(name, fn):
        def run() -> float:
            t, counts[name] = timed(fn, rules, lo, hi)
            return counts[name] / t  # occurrences per CPU second
        return run

    # Interleaved rounds (dateutil, ours, dateutil, ours, ...): a burst of load on a shared machine
    # lands on both sides alike; the medians are compared.
    figs = run_rounds({"dateutil": contender("dateutil", plain_dateutil), "ours": contender("ours", ours)},
                      rounds=args.rounds)
    cost = ratio(figs, "dateutil", "ours")  # ours' time / dateutil's time = dateutil's rate / ours'
    print(f"rules: {n}, horizon: 366 days from {now.isoformat()}, {args.rounds} rounds, occurrences per CPU second")
    print(table(figs, labels={"dateutil": "plain dateutil", "ours": "ours (expand)"}))
    print(goal_line("cost ours / dateutil", cost, "<=", 1.3))
    if counts["dateutil"] != counts["ours"]:
        print(f"note: occurrence counts differ by {counts['ours'] - counts['dateutil']}: ours compares a UTC UNTIL of "
              "an all-day series by date (inclusive), plain dateutil against 23:59:59 local")
    print(f"SUMMARY rules={n} ours={figs['ours'].median:,.0f}/s dateutil={figs['dateutil'].median:,.0f}/s "
          f"cost ratio={cost:.2f}x (goal <= 1.3x)")
    print(json_line(figs, extra={"cost_ratio_x": round(cost, 3), "rules": n, "rounds": args.rounds}))


if __name__ == "__main__":
    main()
