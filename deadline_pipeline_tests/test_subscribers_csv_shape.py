"""The shape of the subscriber file: every row has the header's fields, and there is at least one row.

A row cut short once took defaults for its missing cells (the subscriber got timezone UTC), and a file
with a header only (or nothing) passed the loader and failed at planning inside a Dagster step."""

from __future__ import annotations

import pytest

from deadline_pipeline.config import ConfigError, load_config

HEADER = "id,tenant,email,webhook_url,timezone\n"


def _load(tmp_path, csv_text: str):
    """``load_config`` of a configuration naming ``subs.csv`` holding ``csv_text``; returns the
    configuration, its path and the CSV file's path as the loader names them."""
    config = (tmp_path / "deadlines.yaml").resolve()
    config.write_text("sources:\n  - {name: conf, format: ics, location: a.ics, tenant: demo}\n"
                      "subscribers_csv: subs.csv\n")
    csv_path = config.parent / "subs.csv"
    csv_path.write_text(csv_text)
    return config, csv_path


def _error(tmp_path, csv_text: str) -> tuple[str, object, object]:
    config, csv_path = _load(tmp_path, csv_text)
    with pytest.raises(ConfigError) as err:
        load_config(config)
    return str(err.value), config, csv_path


def test_a_row_with_fewer_fields_than_the_header_is_refused(tmp_path):
    message, _, csv_path = _error(tmp_path, HEADER + "a,demo,a@example.org\n")
    assert message == f"{csv_path}: line 2: 3 fields, the header has 5"


def test_short_and_long_rows_are_each_named_by_the_line_they_start_on(tmp_path):
    message, _, csv_path = _error(tmp_path, HEADER + "\nb,demo,b@example.org,,UTC\nc,demo\n\n"
                                            "d,demo,d@example.org,,UTC,extra\n")
    assert message == (f"{csv_path}: line 4: 2 fields, the header has 5\n"
                       f"{csv_path}: line 6: 6 fields, the header has 5")


def test_empty_cells_and_blank_lines_are_still_accepted(tmp_path):
    config, _ = _load(tmp_path, HEADER + "\na,,a@example.org,,UTC\n\n   \nb,demo,,,Europe/Paris\n")
    cfg, _ = load_config(config)
    assert [(s.id, s.tenant, s.email, s.timezone) for s in cfg.subscribers] == [
        ("a", "default", "a@example.org", "UTC"), ("b", "demo", None, "Europe/Paris")]


def test_an_empty_timezone_cell_is_refused(tmp_path):
    """The timezone column is required, yet an empty cell gave the subscriber UTC without a word: a
    date-only deadline fell due at 23:59 UTC, half a day late for a subscriber in Auckland. Refused,
    naming each row's line and id."""
    message, _, csv_path = _error(tmp_path, HEADER + "a,demo,a@example.org,,\nb,demo,,,Europe/Paris\nc,demo,,, \n")
    assert message == "\n".join(
        f"{csv_path}: line {line} (id {sid!r}), column timezone: empty; write the subscriber's IANA zone (UTC if "
        "that is meant): date-only and floating deadlines fall due in it" for line, sid in ((2, "a"), (4, "c")))


@pytest.mark.parametrize("text", [HEADER, HEADER.rstrip("\n"), HEADER + "\n\n  \n", "\ufeff" + HEADER])
def test_a_file_with_a_header_and_no_rows_is_refused(tmp_path, text):
    message, config, csv_path = _error(tmp_path, text)
    assert message == (f"{csv_path}: holds no subscriber rows, only its header; "
                       f"add rows, or remove subscribers_csv from {config}")


@pytest.mark.parametrize("text", ["", "\n", "  \n\n"])
def test_an_empty_file_is_refused_as_empty(tmp_path, text):
    message, config, csv_path = _error(tmp_path, text)
    assert message == (f"{csv_path}: is empty; add a header line and subscriber rows, "
                       f"or remove subscribers_csv from {config}")
