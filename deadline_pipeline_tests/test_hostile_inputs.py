"""Hostile payloads stay the problem of the payload: bounded time and memory, a positioned error.

Every limit tested here is stated in docs/source-formats.md. The fuzz test at the end feeds
generated payloads to every parser in a child process with a CPU-time and address-space bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deadline_pipeline.config import ConfigError, load_config
from deadline_pipeline.ingest.parsers import ParseError, parse_payload
from deadline_pipeline.ingest.parsers.limits import MAX_CSV_ROWS, MAX_DEPTH
from deadline_pipeline.plan.recurrence import to_instant
from deadline_pipeline.rules import parse_local
from deadline_pipeline.timezones import resolve_zone

REPO = Path(__file__).resolve().parents[1]

BOMB = b"".join(
    [b"- &a [x, x, x, x, x, x, x, x, x]\n"]
    + [f"- &{n} [{', '.join(['*' + p] * 9)}]\n".encode() for p, n in zip("abcdefgh", "bcdefghi", strict=True)]
    + [b"- id: bomb\n  title: *i\n  deadline: '2030-01-01 00:00'\n  timezone: UTC\n"]
)


# --- class 6: YAML 1.1 surprises ----------------------------------------------------------------


def test_b03_unquoted_offsets_mean_what_the_author_wrote(shared_dir):
    content = (shared_dir / "cases" / "calendar-and-yaml" / "b03_sexagesimal.yml").read_bytes()
    result = parse_payload("ai-deadlines", content, source="b03")
    assert not result.problems, result.problems
    due = {r.extra["edition_id"]: to_instant(parse_local(r.start), resolve_zone(r.tz)) for r in result.rules}
    assert {k: v.strftime("%Y-%m-%dT%H:%M:%SZ") for k, v in due.items()} == {
        "exconf26": "2026-05-05T11:59:59Z", "otherconf26": "2026-06-10T18:29:00Z",
        "thirdconf26": "2026-07-01T15:30:00Z"}


def test_yaml_numbers_that_are_not_base_60_stay_numbers():
    content = b"- id: x\n  year: 2026\n  deadline: '2026-01-01 00:00'\n  timezone: UTC\n  hindex: 1.5\n"
    (rule,) = parse_payload("ai-deadlines", content, source="s").rules
    assert rule.extra["year"] == 2026


# --- alias bomb, nesting, unfolding, row and byte limits -------------------------------------------


def test_yaml_alias_bomb_is_refused_at_once():
    assert len(BOMB) < 500
    t0 = time.perf_counter()
    with pytest.raises(ParseError, match=r"source 'bomb': line 1, column 1: YAML aliases expand .* refused"):
        parse_payload("ai-deadlines", BOMB, source="bomb")
    assert time.perf_counter() - t0 < 1


def test_small_aliases_are_still_read():
    content = (b"- &base {id: a, deadline: '2026-01-01 00:00', timezone: UTC}\n"
               b"- {<<: *base, id: b}\n")
    assert sorted(r.rule_id for r in parse_payload("ai-deadlines", content, source="s").rules) == [
        "a/submission/deadline", "b/submission/deadline"]


def test_deep_yaml_nesting_is_a_positioned_error():
    content = b"- id: x\n  note: " + b"[" * 500 + b"]" * 500 + b"\n"
    with pytest.raises(ParseError, match=rf"source 'deep': line 2, column \d+: invalid YAML: nesting deeper "
                                         rf"than {MAX_DEPTH} levels"):
        parse_payload("ai-deadlines", content, source="deep")


def test_deep_json_nesting_is_a_positioned_error():
    content = b'{"england-and-wales": {"events": ' + b"[" * 500 + b"]" * 500 + b"}}"
    with pytest.raises(ParseError, match=rf"source 'deep': line 1, column \d+: JSON nests deeper than {MAX_DEPTH}"):
        parse_payload("govuk-bank-holidays", content, source="deep")


def test_csv_row_limit():
    rows = "".join(f"t{i},2030-01-01,UTC\n" for i in range(MAX_CSV_ROWS + 1))
    with pytest.raises(ParseError, match=r"more than 200,000 data rows"):
        parse_payload("csv", ("title,due,timezone\n" + rows).encode(), source="big")


def test_subscribers_csv_dev_zero_fails_fast(tmp_path):
    path = tmp_path / "deadlines.yaml"
    path.write_text("subscribers_csv: /dev/zero\n")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"subscribers_csv: /dev/zero is larger than"):
        load_config(path)
    assert time.perf_counter() - t0 < 5


# --- fuzz: every parser, bounded per input ------------------------------------------------------

FORMATS = ("ics", "ai-deadlines", "csv", "govuk-bank-holidays")
SEEDS = {
    "ics": b"BEGIN:VCALENDAR\r\nBEGIN:VEVENT\r\nUID:a\r\nDTSTART;TZID=Europe/Berlin:20260101T100000\r\n"
           b"RRULE:FREQ=WEEKLY;COUNT=3\r\nEXDATE:20260108T090000Z\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n",
    "ai-deadlines": b"- id: a\n  title: A\n  deadline: '2026-01-01 23:59'\n  timezone: -12:00\n",
    "csv": b"title,due,timezone,rrule\nA,2026-01-01 10:00,UTC,FREQ=MONTHLY\n",
    "govuk-bank-holidays": b'{"england-and-wales": {"division": "e", '
                           b'"events": [{"title": "x", "date": "2026-01-01"}]}}',
}

_CHILD = r"""
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (500 * 2**20, 500 * 2**20))
resource.setrlimit(resource.RLIMIT_CPU, (5, 5))
from deadline_pipeline.ingest.parsers import ParseError, parse_payload
for line in sys.stdin:
    case = json.loads(line)
    t0 = time.perf_counter()
    try:
        parse_payload(case["fmt"], bytes.fromhex(case["hex"]), source="fuzz")
    except ParseError:
        pass
    took = time.perf_counter() - t0
    print(json.dumps({"took": took}), flush=True)
"""


def _mutations():
    fmt = st.sampled_from(FORMATS)

    def build(args):
        name, cut, insert, times = args
        seed = SEEDS[name]
        cut = cut % (len(seed) + 1)
        # Repetition of a fragment is what makes payloads expensive (nesting, aliases, folds, rows).
        return name, seed[:cut] + insert * times + seed[cut:]

    return st.tuples(fmt, st.integers(0, 400), st.binary(min_size=0, max_size=12) | st.sampled_from([
        b"[", b"{", b"&a [*a]", b"\r\n ", b"\xc3\r\n \xbc", b"*a ", b"- ", b"\n", b",", b'"', b"BEGIN:VEVENT\r\n",
        b"RRULE:FREQ=SECONDLY\r\n", b"\x00", b"\xff"]), st.integers(1, 3000)).map(build)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases=st.lists(_mutations(), min_size=20, max_size=20))
def test_fuzz_parsers_never_traceback_and_stay_bounded(cases):
    # One child per batch of 20 inputs: a crash, a traceback other than ParseError, more than 5 s of
    # CPU or more than 500 MiB of address space kills the child and fails the example.
    payload = "".join(json.dumps({"fmt": f, "hex": c.hex()}) + "\n" for f, c in cases)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=payload, capture_output=True, text=True,
                          env=env, timeout=20 * 6)
    assert proc.returncode == 0, proc.stderr[-2000:]
    took = [json.loads(line)["took"] for line in proc.stdout.splitlines()]
    assert len(took) == len(cases) and max(took) < 5
