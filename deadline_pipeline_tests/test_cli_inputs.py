"""Commands and configuration on inputs a new user meets: each error names the input (file and line,
key path, option) with the documented exit code (0 ok, 1 red, 2 bad input), never a bare exception."""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from deadline_pipeline.cli import main, ui_command
from deadline_pipeline.config import ConfigError, load_config
from deadline_pipeline.deliver.channels.environment import unresolved_env
from deadline_pipeline.store import health
from deadline_pipeline.store.db import make_engine
from deadline_pipeline.store.schema import delivery_attempts
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK, free_port, ics, write_config
from deadline_pipeline_tests.test_watch_checks import EVENT_A

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
HEADER = "id,tenant,email,webhook_url,timezone\n"


def _examples_copy(tmp_path: Path) -> Path:
    for f in EXAMPLES.iterdir():
        shutil.copy(f, tmp_path / f.name)
    return tmp_path / "deadlines.yaml"


def _run(args, tmp_path, **env):
    base = {"DEADLINE_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    return CliRunner().invoke(main, args, env={**base, **env})


# --------------------------------------------------------------------------- configuration YAML


def test_deeply_nested_configuration_is_refused_with_file_and_line(tmp_path):
    path = _examples_copy(tmp_path)
    lines = path.read_text().count("\n")
    with path.open("a") as fh:
        fh.write("x: " + "[" * 900 + "]" * 900 + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert re.match(rf"{re.escape(str(path))}: line {lines + 1}, column \d+: invalid YAML: nesting deeper than 64",
                    str(err.value)), str(err.value)
    res = _run(["preview", "--config", str(path), "--subscriber", "x", "--from", "2027-01-01T00:00Z",
                "--to", "2027-02-01T00:00Z"], tmp_path)
    assert res.exit_code == 2, res.output
    assert "RecursionError" not in res.output and f"{path}: line {lines + 1}" in res.output


def test_unquoted_offset_zone_in_configuration_is_the_offset(tmp_path):
    """YAML 1.2 scalars, as in the sources: ``timezone: -12:00`` is UTC-12, not the integer -720."""
    path = _examples_copy(tmp_path)
    text = path.read_text()
    assert "    # timezone: America/New_York" in text
    path.write_text(text.replace("    # timezone: America/New_York", "    timezone: -12:00 #", 1))
    cfg = load_config(path)[0]
    assert cfg.sources[0].timezone == "-12:00"


def test_forbidden_character_in_configuration_is_positioned(tmp_path):
    path = tmp_path / "deadlines.yaml"
    path.write_text("sources:\n  - name: \x01\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(path))}: line 2, column 11: .*U\+0001"):
        load_config(path)


# --------------------------------------------------------------------------- a store without schema


def test_status_and_watchdog_on_a_store_that_was_never_initialised(tmp_path, db_url):
    """SQLite: the file is not created by looking. Both stores: status exits 2 with one line;
    watchdog reports one red row (exit 1), without the SQL statement."""
    home = tmp_path / "never"
    args = [] if db_url.startswith("sqlite") else ["--db-url", db_url]
    env = {"DEADLINE_HOME": str(home), "DEADLINE_DB_URL": None}
    status = CliRunner().invoke(main, ["status", *args], env=env)
    assert status.exit_code == 2, status.output
    lines = [ln for ln in status.output.splitlines() if ln.strip() and not ln.startswith("note: ")]
    assert len(lines) == 1 and lines[0].startswith("error: the store at ") and "has no schema yet" in lines[0]
    assert "deadline-pipeline db upgrade" in lines[0] and "OperationalError" not in status.output
    watchdog = CliRunner().invoke(main, ["watchdog", *args], env=env)
    assert watchdog.exit_code == 1, watchdog.output
    fail_rows = [ln for ln in watchdog.output.splitlines() if ln.startswith("FAIL")]
    assert len(fail_rows) == 1 and "has no schema yet" in fail_rows[0]
    assert "SELECT" not in watchdog.output and "no such table" not in watchdog.output
    if db_url.startswith("sqlite"):
        assert not home.exists()  # neither the folder nor an empty store file


@pytest.mark.parametrize("command", [["db", "upgrade"], ["status"], ["watchdog"], ["run"]])
@pytest.mark.parametrize(("url", "expected"), [
    ("mysql://ops:s3cret@db.example/deadlines",
     "store mysql://ops:***@db.example/deadlines: 'mysql' is not supported; the store runs on PostgreSQL or SQLite"),
    ("not a url", "'not a url' is not a database URL"),
    # Unparsed, the URL was printed with its password in full.
    ("postgresql//ops:s3cret@db.example/deadlines", "'postgresql//ops:***@db.example/deadlines' is not a database URL"),
    # A port that is not a number: it was "ValueError: invalid literal for int() with base 10".
    ("postgresql://ops:s3cret@db.example:notaport/deadlines",
     "ops:***@db.example:notaport/deadlines' is not a database URL"),
    # In memory: each connection is a database of its own; run failed deep inside with 500 lines.
    ("sqlite://", "store sqlite://: an in-memory SQLite database keeps nothing between connections or commands"),
    ("sqlite:///:memory:", "store sqlite:///:memory:: an in-memory SQLite database keeps nothing"),
    # SQLite does not expand '~': the store failed later on its lock file, without naming the URL.
    ("sqlite:///~/store.sqlite3", "store sqlite:///~/store.sqlite3: '~' is not expanded in a SQLite URL"),
])
def test_store_url_that_cannot_be_a_store_is_refused_naming_it(tmp_path, command, url, expected):
    """A URL that cannot be a store is refused before any driver is imported or file opened, in one
    line with its password hidden: another database raised ``ModuleNotFoundError: No module named
    'MySQLdb'`` (with a traceback) before."""
    args = [*command, "--db-url", url]
    if command != ["db", "upgrade"]:
        args += ["--config", str(EXAMPLES / "deadlines.yaml")]
    res = _run(args, tmp_path)
    assert res.exit_code == 2, res.output
    assert expected in res.output
    assert "s3cret" not in res.output and "Traceback" not in res.output
    assert "ModuleNotFoundError" not in res.output and "MySQLdb" not in res.output


def test_db_upgrade_says_whether_it_created_migrated_or_found_the_store_current(tmp_path):
    """`db upgrade` printed "is at the latest migration" whether it had just migrated the store or
    found nothing to do: an operator checking a deploy could not tell which happened."""
    from deadline_pipeline.store.db import migration_heads, upgrade

    (tmp_path / "home").mkdir()
    url = f"sqlite:///{tmp_path / 'home' / 'store.sqlite3'}"
    latest = _run(["db", "upgrade", "--db-url", url], tmp_path)
    assert latest.exit_code == 0, latest.output
    heads = ", ".join(migration_heads(make_engine(url)))
    assert f"created at the latest migration ({heads})" in latest.output
    again = _run(["db", "upgrade", "--db-url", url], tmp_path)
    assert again.exit_code == 0, again.output
    assert f"was already at the latest migration ({heads}); nothing to apply" in again.output

    older = f"sqlite:///{tmp_path / 'home' / 'older.sqlite3'}"
    upgrade(older, "0015")
    migrated = _run(["db", "upgrade", "--db-url", older], tmp_path)
    assert migrated.exit_code == 0, migrated.output
    assert f"migrated from 0015 to the latest migration ({heads})" in migrated.output


@pytest.mark.parametrize("uri", [False, True])
@pytest.mark.parametrize("command", [["db", "upgrade"], ["run"]])
def test_sqlite_store_in_a_missing_folder_names_the_folder(tmp_path, command, uri):
    """A command that creates the store names the missing folder; it raised ``FileNotFoundError`` on
    the migration lock file (``store.sqlite3.migrate.lock``) before. Also for a URI filename."""
    folder = tmp_path / "no" / "such"
    url = (f"sqlite:///file:{folder / 'store.sqlite3'}?uri=true" if uri
           else f"sqlite:///{folder / 'store.sqlite3'}")
    args = [*command, "--db-url", url]
    if command != ["db", "upgrade"]:
        args += ["--config", str(EXAMPLES / "deadlines.yaml")]
    res = _run(args, tmp_path)
    assert res.exit_code == 2, res.output
    assert f"the folder {folder} does not exist" in res.output
    assert "migrate.lock" not in res.output and "FileNotFoundError" not in res.output
    assert not folder.exists()  # not created behind the user's back
    if not uri:
        # The read-only commands say the same, not "no schema yet: run db upgrade" (which refuses it).
        status = _run(["status", "--db-url", url, "--config", str(EXAMPLES / "deadlines.yaml")], tmp_path)
        assert status.exit_code == 2, status.output
        assert f"does not exist: its folder {folder} does not exist" in status.output
        assert "db upgrade" not in status.output


# --------------------------------------------------------------------------- preview window


@pytest.mark.parametrize(("window", "option"), [
    (["--from", "0001-01-01T00:00Z", "--to", "9999-12-31T00:00Z"], "--from '0001-01-01T00:00Z'"),
    (["--from", "2027-01-01T00:00Z", "--to", "9999-12-31T00:00Z"], "--to '9999-12-31T00:00Z'"),
    (["--from", "0001-01-01T00:00+01:00", "--to", "2027-01-01T00:00Z"], "--from '0001-01-01T00:00+01:00'"),
])
def test_preview_window_out_of_range_names_the_option(tmp_path, window, option):
    res = _run(["preview", "--config", str(EXAMPLES / "deadlines.yaml"), "--subscriber", "ops-new-york",
                *window], tmp_path)
    assert res.exit_code == 2, res.output
    assert f"error: {option}: out of range (years 1900 to 9000)" in res.output
    assert "OverflowError" not in res.output


@pytest.mark.parametrize("command", [["run"], ["status"], ["watchdog"], ["source", "accept", "1"]])
@pytest.mark.parametrize(("value", "reason"), [
    ("now", "not an ISO 8601 instant; write e.g. 2026-05-01T12:00:00Z"),
    # Empty (a cron line's unset $ASOF): status and watchdog took it for "now", run refused it.
    ("", "not an ISO 8601 instant; write e.g. 2026-05-01T12:00:00Z"),
    ("2026-12-01T15:00:00+25:00", "its UTC offset is out of range (-23:59 to +23:59)"),
    ("9999-12-31T23:59:59Z", "out of range (years 1900 to 9000)"),
    ("2026-12-01T15:00:00", "has no offset; write e.g. 2026-05-01T12:00:00Z"),
    # ISO 8601 in form, so "not an ISO 8601 instant" sent the reader looking for a typo in the format.
    ("2026-02-30T00:00:00Z", "no such date: 2026-02 has 28 days"),
    ("2026-13-01T00:00:00Z", "month 13 is out of range (01 to 12)"),
    ("2026-12-01T24:00:01Z", "hour 24 is out of range (00 to 23); write 24:00 as 00:00 of the next day"),
])
def test_as_of_gets_one_answer_from_every_command(tmp_path, command, value, reason):
    """One parser for every command: ``status --as-of 9999-12-31T23:59:59Z`` failed with
    ``OverflowError: date value out of range`` where ``run`` said "out of range", ``+25:00`` answered
    with Python's timedelta repr and ``now`` with ``Invalid isoformat string``."""
    res = _run([*command, "--as-of", value, "--config", str(EXAMPLES / "deadlines.yaml")], tmp_path)
    assert res.exit_code == 2, res.output
    assert f"error: --as-of {value!r}: {reason}" in res.output
    assert "Error" not in res.output.replace("error:", "") and "timedelta" not in res.output


# --------------------------------------------------------------------------- the UI command


def test_ui_command_works_from_any_folder(tmp_path, monkeypatch):
    """The printed command names absolute paths and the code location by module; its environment
    and module load the definitions from an unrelated folder (a relative ``-w workspace.yaml`` did
    not exist there)."""
    monkeypatch.setenv("DEADLINE_HOME", str(tmp_path / "state"))
    (tmp_path / "state" / "dagster_home").mkdir(parents=True)  # `run` creates it
    command = ui_command(tmp_path / "state" / "dagster_home", EXAMPLES / "deadlines.yaml")
    cd, rest = command.split(" && ", 1)
    words = shlex.split(rest)
    env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
    args = [w for w in words if "=" not in w or w.startswith("-")]
    assert cd == f"cd {tmp_path / 'state'}"
    assert args == ["dg", "dev", "-m", "deadline_pipeline.definitions", "-a", "defs"]
    assert all(Path(v).is_absolute() for v in env.values()), env
    assert env["DEADLINE_CONFIG"] == str(EXAMPLES / "deadlines.yaml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # `dg dev` with a target runs Dagster's own loader; `definitions validate` loads the same way and exits.
    out = subprocess.run(["dagster", "definitions", "validate", *args[2:]], cwd=elsewhere, capture_output=True,
                         text=True, timeout=300,
                         env={**os.environ, **env, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    # A store named by --db-url reaches the UI too, its password masked.
    with_store = ui_command(tmp_path / "state" / "dagster_home", EXAMPLES / "deadlines.yaml",
                            "postgresql+psycopg://ops:s3cret@db.example/deadlines")
    assert "DEADLINE_DB_URL='postgresql+psycopg://ops:***@db.example/deadlines' dg dev" in with_store
    assert "s3cret" not in with_store
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Browse it in the Dagster UI")[1].split("```bash")[1].split("```")[0]
    assert "workspace.yaml" not in block and "-m deadline_pipeline.definitions -a defs" in block


# --------------------------------------------------------------------------- rules diff help


def test_rules_diff_help_lists_every_kind_it_reports():
    res = CliRunner().invoke(main, ["rules", "diff", "--help"])
    text = " ".join(res.output.split())
    assert res.exit_code == 0
    for kind in ("added", "moved", "withdrawn", "reworded", "renamed", "unparsed (kept in force"):
        assert kind in text, kind
    assert "A renamed id shows as withdrawn plus added" not in text


# --------------------------------------------------------------------------- subscribers


@pytest.mark.parametrize("host", ["2130706433", "127.1", "0x7f000001", "0177.0.0.1"])
def test_legacy_ipv4_webhook_host_is_refused_at_load_naming_the_line(tmp_path, host):
    (tmp_path / "subs.csv").write_text(HEADER + "ok,demo,,http://127.0.0.1:9/h,UTC\n"
                                       f"bad,demo,,http://{host}:9/hook,UTC\n")
    path = _write_with_csv(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"subs.csv: line 3 (id 'bad'), column webhook_url: host '{host}' is a legacy spelling of the IPv4 " \
           "address 127.0.0.1" in str(err.value)


def test_subscriber_row_with_more_fields_than_the_header(tmp_path):
    (tmp_path / "subs.csv").write_text(HEADER + "ann,demo,ann@example.org,,UTC\n"
                                       "bob,demo,bob@example.org,,UTC,Europe/Berlin\n")
    path = _write_with_csv(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{tmp_path / 'subs.csv'}: line 3: 6 fields, the header has 5"


def test_subscriber_csv_values_lose_their_padding_and_repeated_ids_name_the_csv_lines(tmp_path, caplog):
    """``carl ,…`` stored the id ``carl `` that ``subscribers: [carl]`` did not find; a repeated id
    was reported against the configuration file, which does not hold it."""
    (tmp_path / "subs.csv").write_text(HEADER + "carl ,demo, carl@example.org ,,Europe/Berlin \n")
    path = _write_with_csv(tmp_path)
    with caplog.at_level(logging.WARNING, logger="deadline_pipeline.config"):
        cfg = load_config(path)[0]
    (carl,) = cfg.subscribers
    assert (carl.id, carl.email, carl.timezone) == ("carl", "carl@example.org", "Europe/Berlin")
    assert f"{tmp_path / 'subs.csv'}: line 2: column id: spaces around 'carl ' removed" in caplog.text
    (tmp_path / "subs.csv").write_text(HEADER + "bob,demo,,,UTC\nann,demo,,,UTC\nbob,demo,,,UTC\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{tmp_path / 'subs.csv'}: line 4: id 'bob' repeats line 2"


def test_subscriber_csv_header_names_lose_their_padding(tmp_path, caplog):
    """``tenant `` was an unknown column skipped without a word: the subscriber fell to tenant
    ``default`` and was never planned; `` timezone`` read as a missing column, `` webhook_url`` lost
    the URL."""
    (tmp_path / "subs.csv").write_text("id,tenant , webhook_url, timezone\nann,demo,http://127.0.0.1:9/h,UTC\n")
    path = _write_with_csv(tmp_path)
    with caplog.at_level(logging.WARNING, logger="deadline_pipeline.config"):
        (ann,) = load_config(path)[0].subscribers
    assert (ann.tenant, ann.webhook_url, ann.timezone) == ("demo", "http://127.0.0.1:9/h", "UTC")
    assert f"{tmp_path / 'subs.csv'}: line 1: column name 'tenant ': spaces around it removed" in caplog.text


def test_subscriber_csv_unknown_column_is_refused_naming_the_file_and_the_known_columns(tmp_path):
    (tmp_path / "subs.csv").write_text("id,tenat,email,webhook_url,timezone\nann,demo,,,UTC\n")
    path = _write_with_csv(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    csv_file = tmp_path / "subs.csv"
    assert str(err.value) == (
        f"{csv_file}: line 1: column 2: unknown column 'tenat'; did you mean `tenant`?\n"
        f"{csv_file}: the columns a subscriber file may have are id, tenant, email, webhook_url, timezone, "
        "quiet_hours, caldav_url, apprise_target")


def test_subscriber_csv_messages_name_file_lines_past_blank_lines_and_multi_line_values(tmp_path, caplog):
    """pandas skips blank lines and reads a quoted value across lines: counting its records put
    every later message on the wrong line."""
    csv_file = tmp_path / "subs.csv"
    csv_file.write_text(HEADER + '\nann,demo,"ann\n@example.org",,UTC\n\nbob,demo,,,Nowhere/Land\n')
    path = _write_with_csv(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"{csv_file}: line 3 (id 'ann'), column email" in str(err.value)
    assert f"{csv_file}: line 6 (id 'bob'), column timezone" in str(err.value)
    csv_file.write_text(HEADER + '\nann,demo,,,"Europe/\nBerlin"\n\ncarl ,demo,,,UTC\n\nann,demo,,,UTC\n')
    with caplog.at_level(logging.WARNING, logger="deadline_pipeline.config"), pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"{csv_file}: line 6: column id: spaces around 'carl ' removed" in caplog.text
    assert str(err.value) == f"{csv_file}: line 8: id 'ann' repeats line 3"


def test_subscriber_in_the_csv_and_inline_names_the_csv_line(tmp_path):
    (tmp_path / "subs.csv").write_text(HEADER + "ann,demo,,,UTC\nbob,demo,,,UTC\n")
    path = _write_with_csv(tmp_path)
    path.write_text(path.read_text() + "subscribers:\n  - {id: bob, tenant: demo}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (f"{tmp_path / 'subs.csv'}: line 3: id 'bob' is also in the configuration's "
                              f"`subscribers:` list ({path}: subscribers[0])")


def test_subscriber_id_with_a_line_break_is_refused(tmp_path):
    (tmp_path / "subs.csv").write_text(HEADER + '"car\nl",demo,,,UTC\n')
    path = _write_with_csv(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (f"{tmp_path / 'subs.csv'}: line 2 (id 'car\\nl'), column id: 'car\\nl' contains "
                              "the control character U+000A; an id is one line of printable text")


def test_freshness_that_is_not_a_duration_gets_freshness_examples(tmp_path):
    (tmp_path / "cal.ics").write_text(ics(EVENT_A), newline="")
    path = tmp_path / "deadlines.yaml"
    path.write_text("sources:\n  - {name: cal, format: ics, location: cal.ics, tenant: demo, freshness: 1d}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "'1d' is not an ISO 8601 duration such as 'P1D', 'PT6H' or 'P7D'" in str(err.value)
    assert "-P7D" not in str(err.value)  # a freshness window is never negative


def _write_with_csv(tmp_path: Path) -> Path:
    (tmp_path / "cal.ics").write_text(ics(EVENT_A), newline="")
    path = tmp_path / "deadlines.yaml"
    path.write_text("sources:\n  - {name: cal, format: ics, location: cal.ics, tenant: demo}\n"
                    "subscribers_csv: subs.csv\n")
    return path


TOKEN_VAR = "DP_T_CLI_HOOK_TOKEN"


def _hook_config(tmp_path, **extra):
    (tmp_path / "cal.ics").write_text(ics(EVENT_A), newline="")
    return write_config(
        tmp_path,
        sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1"}],
        subscribers=[{"id": "ann", "tenant": "t1", "webhook_url": "http://127.0.0.1:9/hook?token=${" + TOKEN_VAR + "}",
                      "timezone": "Europe/Berlin"}],
        subscriptions=[{"name": "all", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["hook"]}],
        channels={"hook": {"type": "webhook"}},
        **extra,
    )


def test_webhook_url_variable_is_resolved_at_start_up(tmp_path, monkeypatch):
    """An unset ``${VAR}`` in a webhook_url stops the run before sending (exit 2, naming the variable
    and the subscriber); the alert planned earlier stays pending, nothing is attempted or escalated."""
    path = _hook_config(tmp_path)
    cfg = load_config(path)[0]
    problems = unresolved_env(cfg, environ={})
    assert [str(p) for p in problems] == [
        f"subscribers (ann).webhook_url: environment variable {TOKEN_VAR} (referenced in webhook_url) is not set"]
    assert unresolved_env(cfg, environ={TOKEN_VAR: "t"}) == []
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    first = _run(["run", "--config", str(path), "--db-url", url, "--as-of", "2027-01-10T00:00:00Z"], tmp_path,
                 **{TOKEN_VAR: "t0ken"})
    assert first.exit_code == 0, first.output
    monkeypatch.delenv(TOKEN_VAR, raising=False)
    res = _run(["run", "--config", str(path), "--db-url", url, "--as-of", "2027-01-14T12:00:00Z"], tmp_path,
               **{TOKEN_VAR: None})
    assert res.exit_code == 2, res.output
    assert f"subscribers (ann).webhook_url: environment variable {TOKEN_VAR}" in res.output
    engine = make_engine(url)
    with engine.connect() as conn:
        assert health.alerts_by_state(conn) == {"pending": 1}
        assert conn.execute(select(func.count()).select_from(delivery_attempts)).scalar_one() == 0
    engine.dispose()


def test_run_counts_failed_sends_and_the_red_check_says_why(tmp_path):
    """A webhook on a closed port: the run's own line counts the failed attempt ("sent 0"
    alone read like a run with nothing due) and the red alerts_reconciled row carries the receiver's
    error, which was only in the sweep's log lines; the URL's token stays masked."""
    port = free_port()  # nothing listens on it
    path = _hook_config(tmp_path, network=LOOPBACK_NETWORK)
    path.write_text(path.read_text().replace("127.0.0.1:9/", f"127.0.0.1:{port}/"))
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"

    def run(as_of: str):
        res = _run(["run", "--config", str(path), "--db-url", url, "--as-of", as_of], tmp_path,
                   **{TOKEN_VAR: "t0ken"})
        assert res.exit_code in (0, 1), res.output
        assert "t0ken" not in res.output
        return res.output

    run("2027-01-10T00:00:00Z")
    sending = run("2027-01-14T11:05:00Z")
    assert "this run: sent 0, failed attempts 1, escalated 0" in sending
    later = run("2027-01-14T12:00:00Z")
    row = next(ln for ln in later.splitlines() if ln.strip().startswith("alerts_reconciled"))
    assert "FAIL" in row and "(retry_wait; attempt 2 failed: channel 'hook' (webhook " in row, row
    assert f"Cannot connect to host 127.0.0.1:{port}" in row, row
    # The watchdog (cron, no Dagster) says the same; its row gave the oldest instant alone.
    watchdog = _run(["watchdog", "--config", str(path), "--db-url", url, "--as-of", "2027-01-14T12:00:00Z"],
                    tmp_path, **{TOKEN_VAR: "t0ken"})
    assert watchdog.exit_code == 1, watchdog.output
    row = next(ln for ln in watchdog.output.splitlines() if "alerts_reconciled" in ln and "overdue" in ln)
    assert "(retry_wait; attempt 2 failed: channel 'hook' (webhook " in row, row
    assert f"Cannot connect to host 127.0.0.1:{port}" in row and "t0ken" not in watchdog.output, row


# --------------------------------------------------------------------------- occurrences


def test_output_into_a_closed_pipe_is_not_reported_as_an_error(tmp_path):
    """``… | head -3``: the reader leaves; the command printed "error: BrokenPipeError" before."""
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "deadline_pipeline.cli", "occurrences", "--dtstart",
                             "20270101T000000Z", "--rrule", "FREQ=DAILY;COUNT=3000", "--after", "2027-01-01T00:00:00Z",
                             "--before", "2036-01-01T00:00:00Z"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    proc.stdout.close()  # before the command writes: every write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert "BrokenPipeError" not in err and "Traceback" not in err and "error:" not in err, err


def test_occurrences_logs_the_cap_once_while_counting_the_rest(caplog):
    caplog.set_level(logging.ERROR, logger="deadline_pipeline.plan.occurrences")
    # 43,200 minutes in the window: the first 5,000 printed, the rest counted in ~8 capped batches.
    res = CliRunner().invoke(main, ["occurrences", "--dtstart", "20260101T000000Z", "--rrule", "FREQ=MINUTELY",
                                    "--after", "2026-01-01T00:00:00Z", "--before", "2026-01-31T00:00:00Z"])
    assert res.exit_code == 1
    assert "stopped at 5000 occurrences; 38201 more in the window were not printed" in res.stderr
    caps = [r for r in caplog.records if "occurrences in" in r.getMessage()]
    assert len(caps) == 1, [r.getMessage() for r in caps]


# --------------------------------------------------------------------------- documentation


def test_documented_source_formats_match_the_parsers():
    from deadline_pipeline.ingest.parsers import PARSERS
    from deadline_pipeline.ingest.parsers.csv_format import OPTIONAL, REQUIRED, parse_csv

    readme = (REPO / "README.md").read_text()
    listed = re.search(r"format: \S+\s+# (.+)", readme).group(1)
    assert sorted(listed.split(" | ")) == sorted(PARSERS)
    doc = (REPO / "docs" / "source-formats.md").read_text()
    section = doc.split("### CSV (`parsers/csv_format.py`)")[1].split("\n### ")[0]
    columns = re.findall(r"^\| `(\w+)` \| (yes|no)", section, flags=re.MULTILINE)
    assert [c for c, req in columns if req == "yes"] == list(REQUIRED)
    assert [c for c, req in columns if req == "no"] == list(OPTIONAL)
    example = section.split("```csv\n")[1].split("```")[0]
    result = parse_csv(example.encode(), source="doc")
    assert not result.problems and len(result.rules) == example.count("\n") - 1


@pytest.mark.parametrize(("args", "message"), [
    (["--ping-url", "not-a-url"], "error: --ping-url: not an http(s) URL with a host"),
    (["--ping-url", "ftp://hc-ping.example/abc"], "error: --ping-url: not an http(s) URL with a host"),
    (["--state", "/nonexistent-dp-folder/wd.json"], "error: --state /nonexistent-dp-folder/wd.json: the folder "
                                                     "/nonexistent-dp-folder does not exist"),
])
def test_watchdog_refuses_a_bad_ping_url_or_state_folder_before_checking(tmp_path, args, message):
    """Exit 2 (bad input) before any check runs, not "healthy" followed by exit 1 or a traceback."""
    res = _run(["watchdog", *args], tmp_path)
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "healthy" not in res.output and "watchdog as of" not in res.output
