"""Hostile payloads stay the problem of the payload: bounded time and memory, a positioned error.

Every limit tested here is stated in docs/source-formats.md. The fuzz test at the end feeds
generated payloads to every parser in a child process with a CPU-time and address-space bound.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, inspect, select

from deadline_pipeline.cli import main
from deadline_pipeline.config import ConfigError, load_config
from deadline_pipeline.ingest.parsers import ParseError, parse_payload
from deadline_pipeline.ingest.parsers.limits import MAX_CSV_ROWS, MAX_DEPTH
from deadline_pipeline.plan.recurrence import to_instant
from deadline_pipeline.rules import parse_local
from deadline_pipeline.store.db import make_engine
from deadline_pipeline.store.schema import subscribers
from deadline_pipeline.timezones import resolve_zone
from deadline_pipeline_tests.factories import ai_deadlines, write_config

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


# --- hostile text in the configuration and the subscriber file ------------------------------------

HOSTILE_CSV_HEADER = "id,tenant,email,webhook_url,timezone,apprise_target\n"
GOOD_ROWS = "ann,t1,ann@example.org,,Europe/Berlin,\nbob,t1,bob@example.org,,America/New_York,\n"


def _hostile_world(tmp_path: Path, *, csv_rows: str = "", **changes) -> Path:
    """A configuration of one ai-deadlines source, two good subscribers in ``subs.csv`` (plus
    ``csv_rows``) and one maildir channel; ``changes`` maps a dotted key path (``subscriptions.0.name``,
    ``channels``) to the value written there by ``yaml.safe_dump``, which writes a NUL or a lone
    surrogate as a double-quoted escape ("\\0", "\\uD800"), as a hand-edited file would."""
    (tmp_path / "conf.yml").write_text(ai_deadlines({"id": "conf27", "title": "Conf", "year": 2027,
                                                     "deadline": "2027-01-20 23:59", "timezone": "UTC"}))
    (tmp_path / "subs.csv").write_text(HOSTILE_CSV_HEADER + GOOD_ROWS + csv_rows)
    cfg = {"sources": [{"name": "confs", "format": "ai-deadlines", "location": "conf.yml", "tenant": "t1"}],
           "subscribers": [], "subscribers_csv": "subs.csv",
           "subscriptions": [{"name": "s", "sources": ["confs"], "offsets": ["-P30D", "-P1D"], "channels": ["box"]}],
           "channels": {"box": {"type": "maildir", "path": str(tmp_path / "maildir")}}}
    for dotted, value in changes.items():
        *parents, last = [int(k) if k.isdigit() else k for k in dotted.split(".")]
        target = cfg
        for k in parents:
            target = target[k]
        target[last] = value
    return write_config(tmp_path, **cfg)


def _run_cli(tmp_path: Path, config: Path, db_url: str):
    env = {"DEADLINE_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    return CliRunner().invoke(main, ["run", "--config", str(config), "--db-url", db_url,
                                     "--as-of", "2027-01-10T00:00:00Z"], env=env)


def _stored_subscribers(db_url: str) -> int:
    """Subscriber rows in the store (0 when the run stopped before creating its tables)."""
    eng = make_engine(db_url)
    try:
        if not inspect(eng).has_table("subscribers"):
            return 0
        with eng.connect() as conn:
            return conn.execute(select(func.count()).select_from(subscribers)).scalar_one()
    finally:
        eng.dispose()


@pytest.mark.parametrize(("key", "value", "shown"), [
    # Each of these once passed loading and then failed the planning transaction of EVERY subscriber
    # (UnicodeEncodeError on both engines for a surrogate, PostgreSQL's NUL refusal), or every send.
    ("subscribers", [{"id": "eve", "tenant": "t1\ud800", "timezone": "UTC"}], r"subscribers\[0\]\.tenant: the "
     r"unpaired UTF-16 surrogate U\+D800"),
    ("subscribers", [{"id": "eve", "tenant": "t1", "email": "eve\x00@example.org", "timezone": "UTC"}],
     r"subscribers\[0\]\.email: a NUL character \(U\+0000\)"),
    ("subscriptions.0.name", "s\x00", r"subscriptions\[0\]\.name: a NUL character"),
    ("subscriptions.0.rules", ["*\ud800", "*"], r"subscriptions\[0\]\.rules\[0\]: the unpaired UTF-16 surrogate"),
    ("channels.box.sender", "re\ud800@example.org", r"channels\.box\.sender: the unpaired UTF-16 surrogate"),
    ("sources.0.location", "conf.yml\x00", r"sources\[0\]\.location: a NUL character"),
], ids=["subscriber-tenant-surrogate", "subscriber-email-nul", "subscription-name-nul",
        "rule-pattern-surrogate", "channel-sender-surrogate", "source-location-nul"])
def test_text_that_is_not_text_in_the_configuration_is_refused_naming_the_key(tmp_path, db_url, key, value, shown):
    """A NUL ("\\0") or a lone surrogate ("\\ud800") anywhere in the YAML is refused when the file is
    read, with its line, column and key path, before anything is written to the store."""
    config = _hostile_world(tmp_path, **{key: value})
    assert "\\0" in config.read_text() or "\\uD800" in config.read_text(), "the YAML itself carries the escape"
    res = _run_cli(tmp_path, config, db_url)
    assert res.exit_code == 2, res.output
    assert re.search(rf"{re.escape(str(config))}: line \d+, column \d+: {shown}", res.output), res.output
    assert "Traceback" not in res.output and _stored_subscribers(db_url) == 0


@pytest.mark.parametrize(("row", "shown"), [
    ("eve,t1\x00,eve@example.org,,UTC,\n", r"column tenant: 't1\\x00' contains the control character U\+0000"),
    ("eve,t1,eve\x07@example.org,,UTC,\n", r"column email: 'eve\\x07@example.org' contains the control character "
                                           r"U\+0007"),
    ("eve,t1,eve@example.org,,UTC,a\x00b\n", r"column apprise_target: 'a\\x00b' contains the control character"),
    (f"eve,{'t' * 201},eve@example.org,,UTC,\n", r"column tenant: String should have at most 200 characters"),
], ids=["tenant-nul", "email-bel", "apprise-target-nul", "tenant-over-200"])
def test_a_subscriber_row_with_hostile_text_is_refused_naming_its_line(tmp_path, db_url, row, shown):
    """A NUL in a tenant failed every subscriber's planning on PostgreSQL, as did a tenant longer than
    its column; a control character in an address was escalated at every send. Refused like any other
    bad row: the whole file, naming the line and column, before anything is written."""
    config = _hostile_world(tmp_path, csv_rows=row)
    res = _run_cli(tmp_path, config, db_url)
    assert res.exit_code == 2, res.output
    assert re.search(rf"{re.escape(str(tmp_path / 'subs.csv'))}: line 4 \(id 'eve'\), {shown}", res.output), res.output
    assert "Traceback" not in res.output and _stored_subscribers(db_url) == 0


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("subscriptions.0.name", "s" * 201, r"subscriptions\[0\]\.name: String should have at most 200 characters"),
    ("channels", {"b" * 101: {"type": "maildir", "path": "md"}}, r"channels\.b+\.\[key\]: String should have at most "
                                                                  r"100 characters"),
], ids=["subscription-name-over-200", "channel-name-over-100"])
def test_a_name_longer_than_its_column_is_refused_at_load(tmp_path, db_url, key, value, shown):
    """Stored with every subscription or alert, such a name failed the planning of every subscriber on
    PostgreSQL ("value too long for type character varying")."""
    changes = {key: value}
    if key == "channels":
        changes["subscriptions.0.channels"] = list(value)
    config = _hostile_world(tmp_path, **changes)
    res = _run_cli(tmp_path, config, db_url)
    assert res.exit_code == 2, res.output
    assert re.search(rf"{re.escape(str(config))}: {shown}", res.output), res.output
    assert _stored_subscribers(db_url) == 0


@pytest.mark.parametrize("tenant", ["t1\x1b", "acme corp", "t" * 64, ""])
def test_a_source_tenant_that_cannot_tag_its_assets_is_refused_at_load(tmp_path, tenant):
    """The tenant tags the source's Dagster assets: any other text stopped every command with
    DagsterInvalidDefinitionError, naming neither the file nor the key. An empty one loaded and
    then planned for nobody (no subscriber has the tenant '')."""
    config = _hostile_world(tmp_path, **{"sources.0.tenant": tenant})
    with pytest.raises(ConfigError, match=rf"{re.escape(str(config))}: sources\[0\]\.tenant: String should"):
        load_config(config)


@pytest.mark.parametrize(("changes", "shown"), [
    # A line break in the sender loaded, then every send of the channel failed (the e-mail library
    # refuses a header with one) and every reminder on it was escalated.
    ({"channels.box.sender": "ops@example.org\r\nBcc: all@example.org"},
     r"channels\.box\.sender: 'ops@example\.org\\r\\nBcc: all@example\.org' contains the control character "
     r"U\+000D; a sender address is one line"),
    ({"subscriptions.0.name": "s\x1b[31m"}, r"subscriptions\[0\]\.name: 's\\x1b\[31m' contains the control character "
                                            r"U\+001B; a name is one line"),
    ({"channels": {"b\x1bx": {"type": "maildir", "path": "m"}}, "subscriptions.0.channels": ["b\x1bx"]},
     r"channels\..*\.\[key\]: 'b\\x1bx' contains the control character U\+001B; a name is one line"),
])
def test_a_sender_or_name_with_a_control_character_is_refused_at_load(tmp_path, changes, shown):
    config = _hostile_world(tmp_path, **changes)
    with pytest.raises(ConfigError, match=rf"{re.escape(str(config))}: {shown}"):
        load_config(config)


@pytest.mark.parametrize(("encode", "shown"), [
    (lambda t: t.encode("latin-1"), r"line \d+, column 6: byte 0xe9 is not UTF-8 \(invalid continuation byte\); "
                                    r"save the file as UTF-8"),
    (lambda t: t.encode("utf-16"), r"the file is UTF-16 \(it starts with a UTF-16 byte order mark\); save it as UTF-8"),
    # Without the mark it passed the UTF-8 check (a NUL is UTF-8) and YAML refused "character U+0000".
    (lambda t: t.encode("utf-16-le"), r"line 1: the file looks like UTF-16-LE without a byte order mark \(a NUL byte "
                                      r"beside every character\); save it as UTF-8"),
], ids=["latin-1", "utf-16-with-mark", "utf-16-without-mark"])
def test_a_configuration_that_is_not_utf8_names_line_and_column(tmp_path, encode, shown):
    """Python's codec message gave a byte offset from the start of the file, which no editor shows."""
    config = _hostile_world(tmp_path)
    config.write_bytes(encode(config.read_text(encoding="utf-8") + "# René's deadlines\n"))
    with pytest.raises(ConfigError, match=rf"{re.escape(str(config))}: {shown}"):
        load_config(config)


def test_an_escalation_address_with_a_control_character_is_refused_at_load(tmp_path):
    """It passed loading, and the notice announcing an undelivered reminder then failed on it."""
    config = _hostile_world(tmp_path, escalation={"channels": ["box"], "email": "ops\x07@example.org"})
    with pytest.raises(ConfigError, match=rf"{re.escape(str(config))}: escalation\.email: 'ops\\x07@example.org' "
                                          r"contains the control character U\+0007"):
        load_config(config)


def test_a_subscriber_file_that_is_not_utf8_names_line_and_column(tmp_path):
    """pandas named a byte offset from the start of the file ("position 97"), which no editor shows."""
    config = _hostile_world(tmp_path)
    csv_file = tmp_path / "subs.csv"
    csv_file.write_bytes(csv_file.read_bytes() + b"eve,t1\xff\xfe,eve@example.org,,UTC,\n")
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert str(err.value) == (f"{csv_file}: line 4, column 2 (tenant): byte 0xff is not UTF-8 (invalid start "
                              "byte); save the file as UTF-8")
    # A byte order mark (which a spreadsheet writes) moves nothing; the header itself may be the bad line.
    csv_file.write_bytes(b"\xef\xbb\xbf" + (HOSTILE_CSV_HEADER + GOOD_ROWS).encode().replace(b"tenant", b"ten\xffant"))
    with pytest.raises(ConfigError, match=r"subs\.csv: line 1, column 2: byte 0xff is not UTF-8"):
        load_config(config)
    csv_file.write_bytes(csv_file.read_bytes().decode("utf-8", "replace").encode("utf-16"))
    with pytest.raises(ConfigError, match=r"subs\.csv: the file is UTF-16 .*; save it as UTF-8"):
        load_config(config)



@pytest.mark.parametrize(("row", "shown"), [
    # Two subscriber files saved with a byte order mark and concatenated: the second one's mark
    # starts a row, inside that subscriber's id, which then matched no `subscribers: [eve]`.
    ("\ufeffeve,t1,eve@example.org,,UTC,\n", r"\(id '\\ufeffeve'\), column id: '\\ufeffeve' contains the invisible "
                                             r"character U\+FEFF \(a byte order mark\) at character 1; an id is"),
    ("eve,t1\u200b,eve@example.org,,UTC,\n", r"\(id 'eve'\), column tenant: 't1\\u200b' contains the invisible "
                                             r"character U\+200B \(a zero-width space\) at character 3"),
    ("eve,t1,eve\u2060@example.org,,UTC,\n", r"\(id 'eve'\), column email: 'eve\\u2060@example.org' contains the "
                                             r"invisible character U\+2060 \(a word joiner\) at character 4"),
    ("eve,t1,eve@example.org,,UTC,ab\u200d\n", r"\(id 'eve'\), column apprise_target: 'ab\\u200d' contains the "
                                               r"invisible character U\+200D \(a zero-width joiner\)"),
], ids=["id-bom-of-a-concatenated-file", "tenant-zero-width-space", "email-word-joiner", "apprise-target-zwj"])
def test_an_invisible_character_in_a_subscriber_row_is_refused_naming_line_and_column(tmp_path, row, shown):
    """An id, tenant or address that differs from the intended one by a character that shows as
    nothing; the byte order mark at the very start of the file is still the file's own, and read."""
    config = _hostile_world(tmp_path)
    csv_file = tmp_path / "subs.csv"
    csv_file.write_bytes(b"\xef\xbb\xbf" + csv_file.read_bytes())
    cfg, _ = load_config(config)
    assert [s.id for s in cfg.subscribers] == ["ann", "bob"]
    csv_file.write_bytes(csv_file.read_bytes() + row.encode())
    with pytest.raises(ConfigError, match=rf"{re.escape(str(csv_file))}: line 4 {shown}"):
        load_config(config)


def test_an_invisible_character_in_a_configured_name_is_refused_naming_the_key(tmp_path):
    """The same check for every field that is one line of text: a channel name with a zero-width
    space is not the name the subscription lists."""
    config = _hostile_world(tmp_path, **{"channels": {"box\u200b": {"type": "maildir", "path": "m"}},
                                         "subscriptions.0.channels": ["box\u200b"]})
    with pytest.raises(ConfigError, match=rf"{re.escape(str(config))}: channels\..*\.\[key\]: 'box\\u200b' contains "
                                          r"the invisible character U\+200B"):
        load_config(config)


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_a_subscriber_file_in_utf16_without_a_byte_order_mark_is_named(tmp_path, encoding):
    """ASCII text in UTF-16 is valid UTF-8 (each NUL a character): such a file was refused for
    "unknown column 'i\\x00d\\x00'" and so on, column by column, which no one reads as an encoding."""
    config = _hostile_world(tmp_path)
    csv_file = tmp_path / "subs.csv"
    csv_file.write_bytes(csv_file.read_text(encoding="utf-8").encode(encoding))
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert str(err.value) == (f"{csv_file}: line 1: the file looks like {encoding.upper()} without a byte order "
                              "mark (a NUL byte beside every character); save it as UTF-8")


@pytest.mark.parametrize(("zone", "why"), [
    ("localtime", "it is the zone of the machine reading the file, which differs between machines; write the "
                  "zone itself, e.g. Europe/Berlin"),
    ("posixrules", "it is the rule file for POSIX TZ strings"),
    ("Factory", "it is IANA's placeholder for a machine whose zone is not set"),
    ("posix/Europe/Berlin", "it is a copy of 'Europe/Berlin' in a machine's zoneinfo folder; write 'Europe/Berlin'"),
    ("right/UTC", "it is a leap-second-counting variant of 'UTC' in a machine's zoneinfo folder; write 'UTC'"),
])
def test_a_zone_key_that_is_no_iana_zone_is_refused_in_the_csv_and_the_configuration(tmp_path, zone, why):
    """Keys of this machine's zoneinfo folder that are no IANA zone: `localtime` was accepted (it is
    in available_timezones() on Debian) and meant the planning machine's own zone, so the same due
    date was another instant on the machine reviewing it; posix/… and right/… were opened as files."""
    shown = re.escape(f"time zone {zone!r} is not an IANA zone name: {why}")
    config = _hostile_world(tmp_path, csv_rows=f"eve,t1,eve@example.org,,{zone},\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(tmp_path / 'subs.csv'))}: line 4 \(id 'eve'\), "
                                          rf"column timezone: {shown}"):
        load_config(config)
    config = _hostile_world(tmp_path, **{"sources.0.timezone": zone})
    with pytest.raises(ConfigError, match=rf"{re.escape(str(config))}: sources\[0\]\.timezone: {shown}"):
        load_config(config)


def test_iana_names_and_their_aliases_stay_accepted(tmp_path):
    """The rule refuses machine-specific keys only: IANA's zones, its `backward` aliases (US/Eastern),
    Etc/ zones and the vendor-prefixed TZIDs of calendar exports still resolve."""
    rows = "".join(f"s{i},t1,s{i}@example.org,,{zone},\n" for i, zone in enumerate(
        ["UTC", "Etc/GMT+5", "America/Argentina/Buenos_Aires", "US/Eastern", "EST5EDT", "Etc/UTC"]))
    cfg, _ = load_config(_hostile_world(tmp_path, csv_rows=rows))
    assert [s.timezone for s in cfg.subscribers][2:] == ["UTC", "Etc/GMT+5", "America/Argentina/Buenos_Aires",
                                                        "US/Eastern", "EST5EDT", "Etc/UTC"]
    assert str(resolve_zone("/mozilla.org/20050126_1/Europe/Berlin")) == "Europe/Berlin"
    assert resolve_zone("Etc/GMT+5").utcoffset(datetime(2027, 1, 1)) == -timedelta(hours=5)  # POSIX sign
