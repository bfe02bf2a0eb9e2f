"""The configuration file and the command line: clear errors naming file, key and problem."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import UTC
from pathlib import Path

import pytest

from deadline_pipeline.config import ConfigError, load_config, parse_duration

REPO = Path(__file__).resolve().parents[1]


def _write(tmp_path, text: str) -> Path:
    p = tmp_path / "deadlines.yaml"
    p.write_text(text)
    return p


def test_examples_config_is_valid():
    cfg, _ = load_config(REPO / "examples" / "deadlines.yaml")
    assert {s.name for s in cfg.sources} == {"us-federal-tax", "ai-conferences"}
    assert len(cfg.subscribers) >= 5
    assert {"-P90D", "-P7D", "-P1D"} <= set(cfg.subscriptions[0].offsets)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sources: [", "line 1, column"),
        ("- a\n- b\n", "(top level): expected a mapping"),
        ("sources:\n  - {name: x, format: pdf, location: a.pdf}\n", "sources[0].format"),
        ("sources:\n  - {name: x, format: ics, location: a.ics, freshness: soon}\n", "sources[0].freshness"),
        ("subscribers:\n  - {id: a, timezone: Mars/Olympus}\n", "subscribers[0].timezone: unknown time zone"),
        ("subscribers:\n  - {id: a, email: 'x@y.org\\r\\nBcc: z@evil.org'}\n", "subscribers[0].email"),
        ("sources:\n  - {name: x, format: ics, location: a.ics}\nsubscriptions:\n"
         "  - {name: s, sources: [x], offsets: [P7D], channels: []}\n", "subscriptions[0].offsets"),
        ("sources:\n  - {name: x, format: ics, location: a.ics}\nsubscriptions:\n"
         "  - {name: s, sources: [y], channels: [m]}\nchannels: {m: {type: maildir, path: m}}\n",
         "unknown source 'y'"),
        ("sources:\n  - {name: x, format: ics, location: a.ics}\nsubscriptions:\n"
         "  - {name: s, sources: [x], channels: []}\n", "subscriptions[0].channels"),
        ("sources:\n  - {name: x, format: ics, location: a.ics}\nsubscribers: [{id: ann}]\nsubscriptions:\n"
         "  - {name: s, sources: [x], subscribers: [ann, anne], channels: [m]}\n"
         "channels: {m: {type: maildir, path: m}}\n",
         "subscriptions[0].subscribers[1]: subscription 's': unknown subscriber 'anne' (got 'anne') [line 5]"),
        ("sources:\n  - {name: x, format: ics, location: a.ics}\nsubscriptions:\n"
         "  - {name: s, sources: [x], rules: [], channels: [m]}\nchannels: {m: {type: maildir, path: m}}\n",
         "subscriptions[0].rules: an empty list plans nothing; omit `rules`"),
        ("sources:\n  - {name: x, format: ics, location: a.ics}\nsubscriptions:\n"
         "  - {name: s, sources: [x], subscribers: [], channels: [m]}\nchannels: {m: {type: maildir, path: m}}\n",
         "subscriptions[0].subscribers: an empty list plans nothing; omit `subscribers`"),
        ("sources:\n  - {name: x, format: ics, location: 'ftp://example.org/a.ics'}\n", "scheme 'ftp'"),
        ("", "sources: none configured"),

        ("channels:\n  mail: {type: pigeon}\n", "channels.mail"),
        ("sorces: []\n", "sorces: unknown key; did you mean `sources`?"),
        ("subscribers_csv: missing.csv\n", "subscribers_csv: file"),
    ],
)
def test_bad_configuration_is_named(tmp_path, text, expected):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(path) in str(err.value)
    assert expected in str(err.value)


_ONE_SOURCE = """sources:
  - {name: conf, format: ics, location: a.ics}
channels:
  mail: {type: maildir, path: box}
subscribers:
  - {id: ana, email: ana@example.org}
"""


@pytest.mark.parametrize(("text", "expected"), [
    # Two subscriptions blocks: YAML kept the second, and every reminder of the first vanished.
    (_ONE_SOURCE + "subscriptions:\n  - {name: one-day, sources: [conf], channels: [mail], offsets: [-P1D]}\n"
     "subscriptions:\n  - {name: month, sources: [conf], channels: [mail], offsets: [-P30D]}\n",
     "line 9, column 1: subscriptions: written twice in one mapping (first at line 7)"),
    (_ONE_SOURCE + "subscriptions:\n  - {name: s, sources: [conf], channels: [mail], offsets: [-P1D], "
     "offsets: [-P2D]}\n",
     "line 8, column 67: subscriptions[0].offsets: written twice in one mapping (first at line 8)"),
])
def test_a_key_written_twice_is_refused_not_half_dropped(tmp_path, text, expected):
    """YAML's loader keeps the last of two equal keys and drops the first without a word: a second
    `subscriptions:` block (or `offsets` written twice) made the first one's reminders disappear
    while the run and every check stayed green."""
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert expected in str(err.value) and str(path) in str(err.value)


def test_a_merged_key_set_again_is_yamls_override_not_a_repetition(tmp_path):
    cfg, _ = load_config(_write(tmp_path, _ONE_SOURCE + (
        "subscriptions:\n  - &base {name: a, sources: [conf], channels: [mail], offsets: [-P1D]}\n"
        "  - {<<: *base, name: b, offsets: [-P2D]}\n")))
    assert [(s.name, s.offsets) for s in cfg.subscriptions] == [("a", ["-P1D"]), ("b", ["-P2D"])]


def test_a_missing_subscriber_file_is_reported_with_the_other_errors(tmp_path):
    """A missing ``subscribers_csv`` and a misspelt key: both are reported at once, the file's error
    naming the key, its line and the path (it was raised alone, and the misspelling came to light
    only once the file was there). A subscription naming a subscriber the unread file may hold is not
    reported as unknown. The same lines from the command line (``run`` refuses the file first)."""
    path = _write(tmp_path, "sources:\n  - {name: x, format: ics, location: a.ics}\n"
                            "subscribers_csv: people.csv\n"
                            "subscriptions:\n  - {name: s, sources: [x], subscribers: [carl], channels: [m], "
                            "offsetz: [-P1D]}\n"
                            "channels: {m: {type: maildir, path: m}}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    lines = str(err.value).splitlines()
    assert lines[0] == f"{path}: subscribers_csv: file {tmp_path / 'people.csv'} does not exist [line 3]", lines
    assert any("subscriptions[0].offsetz" in line and "unknown key" in line for line in lines[1:]), lines
    assert not any("unknown subscriber" in line for line in lines), lines
    res = subprocess.run([sys.executable, "-m", "deadline_pipeline.cli", "run", "--config", str(path),
                          "--db-url", f"sqlite:///{tmp_path / 's.sqlite3'}"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})
    assert res.returncode != 0
    assert lines[0] in res.stderr + res.stdout and "offsetz" in res.stderr + res.stdout, res.stderr


def test_two_source_names_with_one_asset_key_are_both_named_with_their_lines(tmp_path):
    """``a-b`` and ``a_b`` are both Dagster's ``source/a_b``: refused when the definitions were built,
    the message printed the two identical keys (``['source/a_b', 'source/a_b']``) and named neither
    source nor line. Now at load, naming both names, the later one's line and why they clash; the same
    from the command line (``run`` loads the definitions)."""
    path = _write(tmp_path, "sources:\n"
                            "  - {name: a-b, format: ics, location: a.ics}\n"
                            "  - {name: c, format: ics, location: c.ics}\n"
                            "  - {name: a_b, format: ics, location: b.ics}\n"  # line 4
                            "subscribers:\n  - {id: a, email: a@example.org}\n"
                            "subscriptions:\n  - {name: s, sources: [a-b, a_b, c], subscribers: [a], channels: [m]}\n"
                            "channels: {m: {type: maildir, path: m}}\n")
    expected = (f"{path}: sources[2].name: source names 'a-b' (sources[0].name) and 'a_b' give the same Dagster asset "
                "key source/a_b (each character other than a letter, digit or '_' becomes '_'); rename one of them "
                "(got 'a_b') [line 4]")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == expected
    res = _cli("run", "--config", str(path), "--db-url", f"sqlite:///{tmp_path / 's.sqlite3'}", cwd=tmp_path)
    assert res.returncode == 2 and expected in res.stderr + res.stdout, res.stderr


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_subscribers_csv_bad_row_names_the_csv(tmp_path):
    (tmp_path / "subs.csv").write_text("id,tenant,email,webhook_url,timezone\na,t,a@example.org,,Nowhere/Land\n")
    path = _write(tmp_path, "subscribers_csv: subs.csv\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "subs.csv: line 2 (id 'a'), column timezone" in str(err.value) and "Nowhere/Land" in str(err.value)


TENANTS = ("sources:\n  - {name: conf, format: ics, location: a.ics, tenant: acme}\n"
           "  - {name: cal, format: ics, location: b.ics, tenant: ACME}\n"
           "  - {name: other, format: ics, location: c.ics, tenant: beta}\n")


def test_a_tenant_differing_from_a_source_tenant_only_in_case_is_refused(tmp_path):
    """bob of tenant ``Acme`` beside sources of ``acme`` and ``ACME`` only: never planned for either
    (tenants compare exactly), while ann of ``acme`` kept the "reaches no subscriber" problem away.
    Refused at load, naming where bob is written, his tenant and the tenants he nearly matches."""
    subscribers = ("subscribers:\n  - {id: ann, tenant: acme}\n  - {id: bob, tenant: Acme}\n"
                   "  - {id: cid, tenant: Beta}\n")
    path = _write(tmp_path, TENANTS + subscribers)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    lines = str(err.value).splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{path}: subscribers[1]: subscriber 'bob': tenant 'Acme' is no source's tenant"), lines
    assert "source(s) ['cal'] have tenant 'ACME'; source(s) ['conf'] have tenant 'acme'" in lines[0], lines
    assert lines[0].endswith("tenants are compared exactly, so this subscriber would get none of their "
                             "reminders; did you mean 'ACME' or 'acme'?"), lines
    assert lines[1].startswith(f"{path}: subscribers[2]: subscriber 'cid': tenant 'Beta'"), lines
    assert lines[1].endswith("did you mean 'beta'?"), lines
    # From the subscriber file: named by its line.
    (tmp_path / "subs.csv").write_text("id,tenant,timezone\nann,acme,UTC\nbob,Acme,UTC\n")
    path = _write(tmp_path, TENANTS + "subscribers_csv: subs.csv\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{tmp_path / 'subs.csv'}: line 3: subscriber 'bob': tenant 'Acme' "), err.value
    res = _cli("run", "--config", str(path), cwd=tmp_path)
    assert res.returncode == 2 and "did you mean 'ACME' or 'acme'?" in res.stderr, res.stderr


def test_a_tenant_matching_exactly_or_no_source_at_all_is_accepted(tmp_path):
    """``ACME`` matches a source's tenant exactly (another's differs in case: not a near miss); a
    tenant with no source even ignoring case is a tenant without sources, not a misspelling."""
    path = _write(tmp_path, TENANTS + "subscribers:\n  - {id: ann, tenant: ACME}\n  - {id: bob, tenant: gamma}\n")
    cfg, _ = load_config(path)
    assert [s.tenant for s in cfg.subscribers] == ["ACME", "gamma"]


@pytest.mark.parametrize(("text", "seconds"), [("-P7D", -604800), ("PT0S", 0), ("-PT90M", -5400),
                                               ("P1DT2H", 93600), ("-P1W", -604800)])
def test_parse_duration(text, seconds):
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["P1M", "P1Y", "7 days", "P", "-PT", ""])
def test_parse_duration_refuses(text):
    with pytest.raises(ValueError, match="ISO 8601 duration"):
        parse_duration(text)


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "deadline_pipeline.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_cli_bad_config_exits_2_without_traceback(tmp_path):
    path = _write(tmp_path, "subscribers:\n  - {id: a, timezone: Mars/Olympus}\n")
    res = _cli("run", "--config", str(path), cwd=tmp_path)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert "subscribers[0].timezone" in res.stderr and str(path) in res.stderr


def test_cli_bad_as_of_exits_2(tmp_path):
    res = _cli("run", "--as-of", "yesterday", cwd=tmp_path)
    assert res.returncode == 2 and "--as-of" in res.stderr and "Traceback" not in res.stderr


def test_cli_run_twice_sends_nothing_new(tmp_path):
    """`run` on the examples as of a fixed instant: mail lands once, the second run adds none."""
    env_home = tmp_path / "home"
    import os

    env = dict(os.environ, DEADLINE_HOME=str(env_home), DAGSTER_HOME="")
    env.pop("DAGSTER_HOME")
    cmd = [sys.executable, "-m", "deadline_pipeline.cli", "run", "--config", str(REPO / "examples" / "deadlines.yaml"),
           "--as-of", "2026-12-01T00:00:00Z"]
    first = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr + first.stdout
    assert re.search(r"alerts_reconciled +PASS", first.stdout) and " FAIL " not in first.stdout, first.stdout
    box = env_home / "maildir" / "new"
    sent = len(list(box.iterdir()))
    assert sent > 0
    second = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert len(list(box.iterdir())) == sent
    # The Dagster home persisted both runs' history for `dagster dev`.
    assert (env_home / "dagster_home" / "history").exists()


def test_planning_refuses_a_configuration_without_subscribers(tmp_path):
    from deadline_pipeline.plan.service import NothingToPlan, plan_all
    from deadline_pipeline.store.db import make_engine, upgrade

    engine = make_engine(f"sqlite:///{tmp_path / 's.db'}")
    upgrade(engine)
    cfg, _ = load_config(_write(tmp_path, "sources:\n  - {name: x, format: ics, location: a.ics}\n"))
    from datetime import datetime

    with pytest.raises(NothingToPlan, match="would withdraw every planned reminder"):
        plan_all(engine, cfg, datetime(2027, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize(("calendar", "expected"), [("XX-BOGUS", "Country XX not available"),
                                                    ("source:nosuch/x", "unknown source 'nosuch'")])
def test_business_day_calendar_is_checked_at_load(tmp_path, calendar, expected):
    path = _write(tmp_path, "sources:\n  - {name: x, format: csv, location: a.csv, business_days: {calendar: '"
                  + calendar + "'}}\n")
    with pytest.raises(ConfigError, match=expected):
        load_config(path)


@pytest.mark.parametrize(("kind", "needed"), [("maildir", "email"), ("webhook", "webhook_url")])
def test_an_escalation_channel_without_its_recipient_is_refused_at_load(tmp_path, kind, needed):
    """Accepted at load, the first page failed ("has no usable e-mail address") while every check
    was green: the on-call would learn of nothing."""
    from deadline_pipeline_tests.factories import write_config

    channel = {"type": kind, "path": str(tmp_path / "box")} if kind == "maildir" else {"type": kind}
    (tmp_path / "cal.ics").write_text("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nEND:VCALENDAR\r\n")
    path = write_config(tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
                        subscribers=[], subscriptions=[], channels={"oncall": channel},
                        escalation={"channels": ["oncall"]})
    with pytest.raises(ConfigError, match=rf"escalation\.channels\[0\]: channel 'oncall' \({kind}\) needs "
                                          rf"escalation\.{needed}.* \[line \d+\]"):
        load_config(path)
