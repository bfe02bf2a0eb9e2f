"""Zone names as sources write them: IANA, AoE, offsets, abbreviations, Windows names — never silently UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, available_timezones

import pytest

from deadline_pipeline.timezones import ABBREVIATIONS, WINDOWS_ZONES, UnknownTimeZone, resolve_zone


def offset(name: str, when: datetime = datetime(2026, 1, 15, 12)) -> timedelta:
    return resolve_zone(name).utcoffset(when)


@pytest.mark.parametrize("name, hours", [
    ("AoE", -12), ("aoe", -12), ("UTC-12", -12), ("UTC+5:30", 5.5), ("UTC+0530", 5.5), ("GMT+8", 8),
    ("GMT-5", -5), ("+02:00", 2), ("-03:30", -3.5), ("UTC", 0), ("Z", 0), ("PDT", -7), ("PST", -8),
    ("CEST", 2), ("IST", 5.5), ("NZDT", 13),
])
def test_fixed_offsets_and_abbreviations(name, hours):
    assert offset(name) == timedelta(hours=hours)


@pytest.mark.parametrize("name, hours", [
    ("Anywhere on Earth", -12), ("anywhere-on-earth", -12), ("UTC\u221212", -12), ("UTC\u201312", -12),
    ("GMT\u22125:30", -5.5), ("\u221203:00", -3),
])
def test_spelt_out_aoe_and_a_minus_sign_are_read(name, hours):
    """Calls for papers spell AoE out, and word processors put the minus sign U+2212 or an en dash for the
    hyphen; refused as unknown zones, every deadline written so went unplanned."""
    assert offset(name) == timedelta(hours=hours)


@pytest.mark.parametrize("name, iana", [
    ("europe/berlin", "Europe/Berlin"), ("AMERICA/NEW_YORK", "America/New_York"), ("Asia/calcutta", "Asia/Calcutta"),
    ("etc/gmt+5", "Etc/GMT+5"),
])
def test_iana_names_are_read_in_any_case(name, iana):
    """No two IANA names differ only in case, so ``europe/berlin`` (an ICS TZID or X-WR-TIMEZONE, a YAML
    or CSV zone as some exporters write them) can mean one zone; it was refused, the deadline unplanned."""
    assert resolve_zone(name) == ZoneInfo(iana)


@pytest.mark.parametrize("name", ["UTC+5:75", "GMT+1:60", "UTC+123", "UTC-12345", "GMT+1:2", "+5:3"])
def test_an_offset_with_impossible_minutes_or_digits_is_refused_not_read(name):
    """Minutes are 00-59, and a compact offset is hhmm: read loosely, "UTC+5:75" was +06:15 and
    "UTC+123" +01:23, a typo planned as an instant without a word."""
    with pytest.raises(UnknownTimeZone, match="unknown time zone"):
        resolve_zone(name)


@pytest.mark.parametrize("name, hours", [("UTC-0930", -9.5), ("+0545", 5.75), ("UTC+05:45", 5.75), ("GMT+08", 8)])
def test_offsets_in_every_well_formed_spelling_are_read(name, hours):
    assert offset(name) == timedelta(hours=hours)


def test_an_as_of_offset_with_impossible_minutes_is_refused():
    """Python's own reader takes "+05:75" as +06:15; a replayed now is refused instead."""
    from deadline_pipeline.instants import parse_instant

    with pytest.raises(ValueError, match="minutes are out of range"):
        parse_instant("2026-05-01T12:00:00+05:75")
    assert parse_instant("2026-05-01T12:00:00+05:45") == datetime(2026, 5, 1, 6, 15, tzinfo=UTC)


def test_gmt_plus_means_ahead_of_utc_not_posix_inverted():
    assert offset("GMT+8") == timedelta(hours=8)
    assert ZoneInfo("Etc/GMT+8").utcoffset(datetime(2026, 1, 1)) == timedelta(hours=-8)


def test_daylight_abbreviation_is_that_fixed_offset_even_in_winter():
    assert offset("PDT", datetime(2026, 1, 15)) == timedelta(hours=-7)


def test_iana_zone_observes_dst():
    zone = resolve_zone("America/Los_Angeles")
    assert zone.utcoffset(datetime(2026, 1, 15)) == timedelta(hours=-8)
    assert zone.utcoffset(datetime(2026, 7, 15)) == timedelta(hours=-7)


@pytest.mark.parametrize("windows, iana", [
    ("W. Europe Standard Time", "Europe/Berlin"), ("Eastern Standard Time", "America/New_York"),
    ("AUS Eastern Standard Time", "Australia/Sydney"), ("India Standard Time", "Asia/Kolkata"),
    ("Pacific SA Standard Time", "America/Santiago"), ("Iran Standard Time", "Asia/Tehran"),
    ("w. europe standard time", "Europe/Berlin"),
])
def test_windows_zone_names(windows, iana):
    assert resolve_zone(windows) == ZoneInfo(iana)


def test_every_windows_table_entry_is_a_real_iana_zone():
    known = available_timezones()
    assert {v for v in WINDOWS_ZONES.values() if v not in known} == set()
    assert len(WINDOWS_ZONES) > 130


def test_every_abbreviation_is_inside_utc_minus_14_plus_14():
    assert all(-14 <= h <= 14 for h in ABBREVIATIONS.values())


@pytest.mark.parametrize("name", ["", "   ", "Mars/Olympus", "XYZ", "Europe/Berln", "UTC+15", "Central Time"])
def test_unknown_names_are_refused_never_utc(name):
    with pytest.raises(UnknownTimeZone) as info:
        resolve_zone(name)
    assert repr(name.strip() if name.strip() else name)[1:-1] in str(info.value) or name.strip() == ""


def test_an_unknown_name_is_refused_on_every_lookup_not_only_the_first():
    # Answers are cached, unknown ones too; each lookup still raises, with its own exception.
    errors = []
    for _ in range(3):
        with pytest.raises(UnknownTimeZone, match="Mars/Cached_Crater") as info:
            resolve_zone("Mars/Cached_Crater")
        errors.append(info.value)
    assert errors[0] is not errors[1] and str(errors[0]) == str(errors[2])
    assert errors[2].__traceback__ is not None and errors[2].__context__ is None


def test_unknown_time_zone_is_a_value_error():
    assert issubclass(UnknownTimeZone, ValueError)
    assert resolve_zone("UTC") is UTC


@pytest.mark.parametrize("name, winter, summer", [
    ("CET", 1, 2), ("EET", 2, 3), ("MET", 1, 2), ("WET", 0, 1), ("EST5EDT", -5, -4), ("PST8PDT", -8, -7),
    ("cet", 1, 2),
])
def test_iana_zones_named_like_abbreviations_observe_dst(name, winter, summer):
    # These are real IANA zones with daylight saving; a fixed abbreviation offset is an hour off in summer.
    assert offset(name, datetime(2026, 1, 15, 12)) == timedelta(hours=winter)
    assert offset(name, datetime(2026, 7, 15, 12)) == timedelta(hours=summer)


@pytest.mark.parametrize("name, iana", [
    ("/mozilla.org/20050126_1/Asia/Tokyo", "Asia/Tokyo"),
    ("/softwarestudio.org/Olson_20011030_5/America/New_York", "America/New_York"),
    ("/citadel.org/20190914_1/Europe/Berlin", "Europe/Berlin"),
])
def test_vendor_prefixed_tzids_name_the_iana_zone(name, iana):
    assert resolve_zone(name) == ZoneInfo(iana)


def test_a_custom_vtimezone_is_matched_to_its_iana_zone_once_across_parses():
    """Each calendar is read with its own VTIMEZONE objects (ics_library.own_zones), so the match of a
    custom zone against every IANA zone is cached by the definition's transitions: the second parse of
    the same definition, a new tzinfo object, is answered from the cache (it was compared anew, about
    0.15 s per zone and parse, when the cache was keyed by the object)."""
    import icalendar

    from deadline_pipeline import timezones
    from deadline_pipeline.ingest.parsers.ics_library import own_zones

    vtimezone = "\r\n".join((
        "BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//t//t//EN",
        "BEGIN:VTIMEZONE", "TZID:(GMT+01.00) Sarajevo/Warsaw/Zagreb",
        "BEGIN:STANDARD", "DTSTART:16010101T030000", "TZOFFSETFROM:+0200", "TZOFFSETTO:+0100",
        "RRULE:FREQ=YEARLY;BYDAY=-1SU;BYMONTH=10", "END:STANDARD",
        "BEGIN:DAYLIGHT", "DTSTART:16010101T020000", "TZOFFSETFROM:+0100", "TZOFFSETTO:+0200",
        "RRULE:FREQ=YEARLY;BYDAY=-1SU;BYMONTH=3", "END:DAYLIGHT",
        "END:VTIMEZONE", "END:VCALENDAR", ""))

    def parsed_zone():
        with own_zones():
            return icalendar.Calendar.from_ical(vtimezone).walk("VTIMEZONE")[0].to_tz()

    first, second = parsed_zone(), parsed_zone()
    assert first is not second
    tzid = "(GMT+01.00) Sarajevo/Warsaw/Zagreb"
    timezones._equivalent_to_signature.cache_clear()
    assert timezones.equivalent_iana_zone(first, tzid) == "Europe/Sarajevo"
    before = timezones._equivalent_to_signature.cache_info()
    assert timezones.equivalent_iana_zone(second, tzid) == "Europe/Sarajevo"
    assert timezones._equivalent_to_signature.cache_info().hits == before.hits + 1
